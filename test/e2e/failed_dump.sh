#!/usr/bin/env bash
# A dump that fails after the plugin closed the agent's gate (here: the GPU
# manifest cannot be written) leaves the application running as it was: the
# dump says why, the process keeps counting, its gate is open again, and no
# complete-looking GPU image is left behind.
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
token=$(state_token)
mkdir "$IMG/phos-1-manifest.img.tmp"   # the manifest's temporary file cannot be created
if criu_dump; then fail "dump succeeded although the manifest could not be written"; fi
grep -q "phos: Error: checkpoint_devices($WORKLOAD_PID): create phos-1-manifest.img.tmp: Is a directory" "$WORK/dump.log" ||
  fail "the dump log does not say why the GPU image failed"
grep -q "phos: process $WORKLOAD_PID: gate reopened" "$WORK/dump.log" || fail "the plugin did not reopen the gate"
at_failure=$(state_counter)
wait_counter_above $((at_failure + 10))
[ "$(state_token)" = "$token" ] || fail "the process changed"
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "gate: open" || fail "gate not open after the failed dump"
[ ! -e "$IMG/phos-1-complete.img" ] || fail "a completion marker was left behind"
say "failed dump: $(grep -o "phos: Error: .*" "$WORK/dump.log" | head -n1)"
say "process $WORKLOAD_PID kept running (counter $at_failure -> $(state_counter)), gate open, no marker"
say "PASS"
