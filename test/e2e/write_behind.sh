#!/usr/bin/env bash
# A leave-running dump finishes its GPU image at criu's exit, after criu let
# the process go (write-behind): the image is whole when criu returns. A
# failure at that point (injected) makes criu exit non-zero, leaves no
# completion marker, the process runs on, and a restore refuses the image.
# With write_behind=off the image is finished before the process runs again.
source "$(dirname "$0")/lib.sh"

line_of() { grep -n "$1" "$WORK/dump.log" | head -n1 | cut -d: -f1; }

start_workload --preload
wait_counter_above 5
token=$(state_token)

# 1. Written behind: the plugin says so, and finishes after criu's last line.
criu_dump --leave-running || fail "criu dump --leave-running failed"
grep -q "phos: criu leaves the processes running" "$WORK/dump.log" || fail "no write-behind for a --leave-running dump"
finished=$(line_of "Dumping finished successfully")
behind=$(line_of "phos: process $WORKLOAD_PID: image written behind the running process")
[ -n "$finished" ] && [ -n "$behind" ] && [ "$behind" -gt "$finished" ] ||
  fail "the image was not finished after criu's dump (lines: finished '$finished', written behind '$behind')"
[ -e "$IMG/phos-1-complete.img" ] || fail "no completion marker after criu returned"
"$PHOSCTL" verify "$IMG" > "$WORK/verify.txt" 2>&1 || fail "phosctl verify: $(cat "$WORK/verify.txt")"
say "written behind: $(grep -o "phos: process $WORKLOAD_PID: image written behind.*" "$WORK/dump.log")"
# criu's threads yield the CPUs to the running process (behind_nice=10).
grep -qE "phos: criu's [1-9][0-9]* threads at nice 10 while they finish behind the running processes" "$WORK/dump.log" ||
  fail "criu's threads were not lowered to behind_nice=10 once the process ran again"

# 2. write_behind=off: finished inside the freeze, as without -R.
rm -rf "${IMG:?}"/*
PHOS_WRITE_BEHIND=off PHOS_BEHIND_NICE=0 criu_dump --leave-running || fail "criu dump --leave-running (write_behind=off) failed"
! grep -q "written behind\|criu leaves the processes running" "$WORK/dump.log" || fail "write_behind=off wrote behind"
! grep -q "threads at nice" "$WORK/dump.log" || fail "behind_nice=0 lowered criu's threads"
grep -q "write_behind=off" "$WORK/dump.log" || fail "the settings line does not show write_behind=off"
[ -e "$IMG/phos-1-complete.img" ] || fail "no completion marker with write_behind=off"

# 3. A failure after the process ran again (short option -R this time).
rm -rf "${IMG:?}"/*
rc=0
PHOS_FAULT=fail-write-behind criu_dump -R || rc=$?
[ $rc -ne 0 ] || fail "criu exited 0 although the image could not be finished"
grep -q "phos: Error: process $WORKLOAD_PID: its image could not be written after it ran again: fault injection" \
  "$WORK/dump.log" || fail "the dump log does not say why: $(grep -o "phos: Error: .*" "$WORK/dump.log" | head -n1)"
[ ! -e "$IMG/phos-1-complete.img" ] || fail "a completion marker was left behind"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(state_token)" = "$token" ] || fail "the process changed"
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "gate: open" || fail "gate not open after the failed write-behind"
"$PHOSCTL" show "$IMG" | grep -q "complete: no" || fail "phosctl show does not call the image incomplete"
say "failed write-behind: criu exit $rc, $(grep -o "phos: Error: .*" "$WORK/dump.log" | head -n1); process kept counting"

# ... and a restore refuses that image rather than run the process without
# its GPU state.
kill -9 "$WORKLOAD_PID"
wait_pid_free
restore_refused "incomplete image" "an image whose GPU part was never finished"
say "restore refused: $(grep -o "phos: Error: .*" "$WORK/restore.log" | head -n1)"
say "PASS"
