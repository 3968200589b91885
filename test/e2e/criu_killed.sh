#!/usr/bin/env bash
# criu killed in the middle of a dump (after the plugin closed the agent's
# gate and took the process's GPU side): phos-keeper, the plugin's helper
# outside criu, notices and gives the process back what was taken. The
# process keeps running with its gate open, and no complete-looking image is
# left. PHOS_FAULT=stall-after-checkpoint holds the dump at a known point.
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
token=$(state_token)
PHOS_FAULT=stall-after-checkpoint criu_dump &
criu_job=$!
for _ in $(seq 200); do
  grep -q "fault injection (PHOS_FAULT)" "$WORK/dump.log" 2>/dev/null && break
  sleep 0.05
done
grep -q "fault injection (PHOS_FAULT)" "$WORK/dump.log" || fail "the dump never reached the injected stall"
grep -q "phos-keeper started" "$WORK/dump.log" || fail "the plugin did not start phos-keeper"
criu_pid=$(pgrep -f "^$CRIU dump -t $WORKLOAD_PID -D $IMG" | head -n1)
[ -n "$criu_pid" ] || fail "criu not found"
kill -9 "$criu_pid"
wait "$criu_job" 2>/dev/null || true
gate_opens "$WORKLOAD_PID" || fail "gate not open 10 s after criu was killed: $(cat "$IMG/phos-keeper.log" 2>/dev/null)"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(state_token)" = "$token" ] || fail "the process changed"
grep -q "given back what the dump took" "$IMG/phos-keeper.log" || fail "phos-keeper.log: $(cat "$IMG/phos-keeper.log")"
ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 && fail "a completion marker was left behind"
say "criu killed mid-dump: $(grep -o "phos: .*given back.*" "$IMG/phos-keeper.log" | head -n1)"
say "process $WORKLOAD_PID kept running (counter $at -> $(state_counter)), gate open, no marker"
say "PASS"
