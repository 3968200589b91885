#!/usr/bin/env bash
# (a) A process without libphos.so is dumped and restored with the phos plugin
# loaded: the plugin leaves it to CRIU (-ENOTSUP) and it carries on with its
# state (same token, counter continues, 8 MiB of memory intact).
source "$(dirname "$0")/lib.sh"

start_workload
wait_counter_above 5
token=$(state_token)
criu_dump || fail "criu dump failed"
dumped=$(state_counter)
[ -z "$(workload_pids)" ] || fail "process still running after dump without --leave-running"
grep -q "phos: plugin .* initialized for dump" "$WORK/dump.log" || fail "the phos plugin was not loaded"
grep -q "phos: process $WORKLOAD_PID has no phos agent; left to other plugins" "$WORK/dump.log" ||
  fail "the plugin did not hand the process back to CRIU"
ls "$IMG"/phos-* >/dev/null 2>&1 && fail "phos wrote a GPU image for a process without libphos.so"
"$PHOSCTL" show "$IMG" | grep -q "no phos GPU image" || fail "phosctl show did not say the directory has no GPU image"
say "dump ok: counter $dumped, no GPU image, criu images: $(ls "$IMG" | wc -l) files"

sleep 0.3
[ "$(state_counter)" = "$dumped" ] || fail "state changed while the process was dumped"
criu_restore || fail "criu restore failed"
pid=$(restored_pid) || fail "no restored process"
wait_counter_above $((dumped + 10))
[ "$(state_token)" = "$token" ] || fail "token changed: $(state_token) != $token (not the same process state)"
say "restore ok: pid $pid, counter $dumped -> $(state_counter), token $token kept"
say "PASS"
