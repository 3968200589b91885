#!/usr/bin/env bash
# The Python SDK (sdk/python) in a program under libphos.so, with the real
# criu and plugin:
#   1. a dump from outside lands on the program's iteration boundary
#      (phos.step()): the plugin's log says the gate closed there;
#   2. phos.status() and phos.interval() answer.
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
say "PASS"
