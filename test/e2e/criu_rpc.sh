#!/usr/bin/env bash
# criu driven through its RPC (criu swrk), as runc and podman drive it, with
# phos loaded from criu's configuration file (swrk takes no command-line
# options):
#   1. a dump with leave_running set in the request, which the plugin cannot
#      see: criu exits, phos-keeper gives the process its GPU side back, its
#      gate opens and it counts on; the image is complete;
#   2. a dump without it: the process ends with criu; the image, restored
#      through the RPC, counts on with the same token, its gate open.
source "$(dirname "$0")/lib.sh"
RPC=$BUILD/test/e2e/phos-criu-rpc
printf 'lib %s\n' "$PLUGIN_DIR" > "$WORK/rpc.conf"

# PHOS_WORKLOAD_ARGS: the workload's arguments (the GPU suite runs this
# with gpu_counter and its MiB).
start_workload --preload ${PHOS_WORKLOAD_ARGS:-}
wait_counter_above 5
token=$(state_token)
out=$("$RPC" "$CRIU" dump "$IMG" "$WORK/rpc.conf" "$WORKLOAD_PID" --leave-running) ||
  fail "RPC dump (leave_running) failed: $out; $(grep -o 'phos: Error: .*' "$IMG/dump.log" | head -n1)"
grep -q "phos: process $WORKLOAD_PID (pid [0-9]* in its namespace): agent" "$IMG/dump.log" ||
  fail "the plugin did not take part in the RPC dump (lib from the config file?)"
ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 || fail "the image of the RPC dump is not complete"
at=$(state_counter)
gate_opens "$WORKLOAD_PID" || fail "gate not open after the RPC dump: $(cat "$IMG/phos-keeper.log" 2>/dev/null)"
wait_counter_above $((at + 5))
[ "$(state_token)" = "$token" ] || fail "the process changed"
grep -q "given back what the dump took" "$IMG/phos-keeper.log" || fail "the keeper did not give the process back"
say "RPC dump with leave_running: $out; the keeper gave the process back, gate open, counting ($at -> $(state_counter))"

rm -rf "$IMG" && mkdir -p "$IMG"
out=$("$RPC" "$CRIU" dump "$IMG" "$WORK/rpc.conf" "$WORKLOAD_PID") || fail "RPC dump failed: $out"
dumped=$(state_counter)
sleep 0.3
[ -z "$(workload_pids)" ] || fail "the process runs after an RPC dump without leave_running"
wait_pid_free
out=$("$RPC" "$CRIU" restore "$IMG" "$WORK/rpc.conf") ||
  fail "RPC restore failed: $out; $(grep -o 'phos: Error: .*' "$IMG/restore.log" | head -n1)"
pid=$(restored_pid) || fail "no restored process"
grep -q "GPU state restored, gate open" "$IMG/restore.log" || fail "the plugin did not resume the restored agent"
wait_counter_above $((dumped + 10))
[ "$(state_token)" = "$token" ] || fail "token changed after the RPC restore"
gate_opens "$pid" || fail "gate not open after the RPC restore"
say "RPC dump and restore: $out; restored as pid $pid, counting ($dumped -> $(state_counter)), gate open"
say "PASS"
