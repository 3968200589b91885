#!/usr/bin/env bash
# The Python SDK (sdk/python) in a program under libphos.so, with the real
# criu and plugin:
#   1. a dump from outside lands on the program's iteration boundary
#      (phos.step()): the plugin's log says the gate closed there;
#   2. phos.status() and phos.interval() answer;
#   3. the program checkpoints itself (phos.checkpoint, leave_running,
#      through a criu service's RPC): criu answers success, the image is
#      complete, and the program counts on with its gate open;
#   4. the program checkpoints itself periodically (phos.Periodic, every
#      0.3 s, --keep 2): after 4 checkpoints the last 2 are there, complete
#      (marker and GPU image), the first 2 gone; restored from the last.
export PHOS_WORKLOAD=$(cd "$(dirname "$0")" && pwd)/sdk_program.py
# The interpreter itself: a launcher such as pyenv's would exec it under another name.
export PHOS_WORKLOAD_RUNNER=$(python3 -c 'import sys; print(sys.executable)')
export PYTHONPATH=$(cd "$(dirname "$0")/../../sdk/python" && pwd)
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
token=$(state_token)
criu_dump --leave-running || fail "criu dump failed"
grep -q "phos: process $WORKLOAD_PID: gate closed at the program's iteration boundary (phos_step)" "$WORK/dump.log" ||
  fail "the dump did not land on the program's iteration boundary"
at=$(state_counter)
wait_counter_above $((at + 5))
[ "$(state_token)" = "$token" ] || fail "the process changed"
say "dump from outside: the gate closed at the program's iteration boundary; counting on ($at -> $(state_counter))"

out=$(PHOSCTL=$PHOSCTL LD_PRELOAD= python3 -c "
import phos, sys
s = phos.status($WORKLOAD_PID)
steps = dict((c['name'], c['value']) for c in s['counters']).get('steps', 0) if isinstance(s.get('counters'), list) else s['counters'].get('steps', 0)
print('steps', steps, 'interval', round(phos.interval(3600, 2), 1))
") || fail "phos.status: $out"
read -r _ steps _ interval <<<"$out"
[ "$steps" -gt 5 ] || fail "phos.status counted $steps steps"
[ "$interval" = 120.0 ] || fail "phos.interval(3600, 2) = $interval"
say "phos.status: $steps steps counted; phos.interval(3600 s, 2 s) = $interval s"
kill -9 "$WORKLOAD_PID"; wait_pid_free

# The workload is the init of its own pid namespace here: a criu it started
# would come back to it as an orphan, inside the tree it dumps. It asks a
# criu service running outside instead (as a container's program would).
rm -rf "$IMG" && mkdir -p "$IMG"
printf 'lib %s\n' "$PLUGIN_DIR" > "$WORK/rpc.conf"
rm -f "$WORK/state"
"$CRIU" service --address "$WORK/criu.sock" -d --pidfile "$WORK/criu-service.pid" -o "$WORK/service.log" -v4 ||
  fail "criu service did not start"
trap 'kill "$(cat "$WORK/criu-service.pid" 2>/dev/null)" 2>/dev/null; cleanup' EXIT
PHOS_CRIU_SERVICE=$WORK/criu.sock start_workload --preload --self-checkpoint "$IMG" "$WORK/rpc.conf"
for _ in $(seq 200); do [ -s "$WORK/state.checkpoint" ] && break; sleep 0.05; done
[ -s "$WORK/state.checkpoint" ] || fail "the program's self-checkpoint did not return: $(tail -n 3 "$IMG/dump.log" 2>/dev/null)"
grep -q '"success": true' "$WORK/state.checkpoint" ||
  fail "phos.checkpoint: $(cat "$WORK/state.checkpoint"); $(grep -o 'phos: Error: .*' "$IMG/dump.log" | head -n1)"
ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 || fail "the self-checkpoint's image is not complete"
at=$(state_counter)
gate_opens "$WORKLOAD_PID" || fail "gate not open after the self-checkpoint: $(cat "$IMG/phos-keeper.log" 2>/dev/null)"
wait_counter_above $((at + 5))
say "phos.checkpoint from inside: criu answered success; image complete; counting on ($at -> $(state_counter))"
kill -9 "$WORKLOAD_PID"; wait_pid_free

PHOS_CRIU_SERVICE=$WORK/criu.sock start_workload --preload --periodic "$WORK/series" "$WORK/rpc.conf"
for _ in $(seq 200); do [ -s "$WORK/state.periodic" ] && break; sleep 0.05; done
[ -s "$WORK/state.periodic" ] || fail "phos.Periodic made no 4 checkpoints: $(ls "$WORK/series" 2>/dev/null | tr '\n' ' ')"
read -r _ _ third fourth < "$WORK/state.periodic"
[ "$(ls "$WORK/series" | tr '\n' ' ')" = "000003 000004 " ] || fail "phos.Periodic kept $(ls "$WORK/series" | tr '\n' ' ')"
for d in "$third" "$fourth"; do
  [ -f "$d/phos-series-complete" ] || fail "$d has no completion marker"
  ls "$d"/phos-*-complete.img >/dev/null 2>&1 || fail "$d's GPU image is not complete"
done
kill -9 "$WORKLOAD_PID"; wait_pid_free
token=$(state_token)
IMG=$fourth criu_restore || fail "restore from $fourth failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "no process restored from $fourth"
at=$(state_counter)
wait_counter_above $((at + 5))
[ "$(state_token)" = "$token" ] || fail "the restored process is another"
say "phos.Periodic: 4 checkpoints, 000003 and 000004 kept, complete; restored from 000004, counting on"
say "PASS"
