#!/usr/bin/env bash
# NCCL communicators through real criu dumps, against the fake libnccl
# (which fails any call on a communicator it destroyed): the plugin's
# quiesce releases the program's four communicators, the dump log says so;
# after a leave-running dump the program goes on calling NCCL through the
# same handles, the four made again; after a dump and a restore, the
# restored program does too.
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/nccl_rank_client FAKE_NCCL_STRICT=1
source "$(dirname "$0")/../e2e/lib.sh"
made() { state_field 3; }

start_workload --preload
wait_counter_above 5
[ "$(made)" = 4 ] || fail "the workload made $(made) communicators, not 4"
criu_dump --leave-running || fail "criu dump --leave-running failed: $(grep -m1 Error "$WORK/dump.log")"
grep -q "4 NCCL communicator(s) released in" "$WORK/dump.log" || fail "the dump log does not say 4 were released"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(made)" = 8 ] || fail "$(made) communicators made after the leave-running dump, not 8"
"$PHOSCTL" status "$WORKLOAD_PID" | grep -c "made again 1 times" | grep -qx 4 ||
  fail "the status does not show 4 communicators made again: $("$PHOSCTL" status "$WORKLOAD_PID" | grep NCCL)"
say "leave-running: $(grep -o '4 NCCL communicator(s) released in [0-9.]* ms' "$WORK/dump.log"), made again, the program went on"

rm -rf "$IMG" && mkdir -p "$IMG"
token=$(state_token)
criu_dump || fail "criu dump failed: $(grep -m1 Error "$WORK/dump.log")"
dumped=$(state_counter)
sleep 0.2
[ -z "$(workload_pids)" ] || fail "the workload still runs after the dump"
criu_restore || fail "criu restore failed: $(grep -m1 Error "$WORK/restore.log")"
pid=$(restored_pid) || fail "no restored process"
wait_counter_above $((dumped + 10))
[ "$(state_token)" = "$token" ] || fail "token changed after restore"
[ "$(made)" = 12 ] || fail "$(made) communicators made after the restore, not 12"
say "dump and restore: the restored program made its 4 communicators again and went on (counter $dumped -> $(state_counter))"
say "PASS"
