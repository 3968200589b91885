#!/usr/bin/env bash
# A leave-running dump of a preloaded process tree (parent and child, both
# with agents): both keep running, their gates open again, and the image
# holds one manifest per process.
source "$(dirname "$0")/lib.sh"

start_workload --preload --fork
wait_counter_above 5
criu_dump --leave-running || fail "criu dump --leave-running failed"
at_dump=$(state_counter)
child_at_dump=$(state_child_counter)
wait_counter_above $((at_dump + 10))
[ "$(state_child_counter)" -gt "$child_at_dump" ] || fail "child stopped counting"
pids=$(pgrep -f "^$COUNTER $WORK/state" | sort)
[ "$(echo "$pids" | wc -l)" = 2 ] || fail "expected 2 processes, have: $pids"
for p in $pids; do
  "$PHOSCTL" status "$p" | grep -q "gate: open" || fail "process $p: gate not open after leave-running dump"
done
n=$(ls "$IMG"/phos-*-manifest.img | wc -l)
[ "$n" = 2 ] || fail "expected 2 manifests, found $n"
"$PHOSCTL" show "$IMG"
say "leave-running ok: 2 processes kept running, gates open, $n manifests"
say "PASS"
