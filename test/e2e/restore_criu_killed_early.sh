#!/usr/bin/env bash
# criu killed during a restore before RESUME_DEVICES_LATE, while it still
# restores the processes' CPU side (PHOS_FAULT=stall-before-resume holds it
# there): criu gone, the process it forked would resume where it was,
# without its GPU state, holding its pid. phos-keeper watched criu's tree
# from the restore's start: it ends the process, and the next restore of
# the same image takes the pid and succeeds.
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
token=$(state_token)
criu_dump || fail "criu dump failed"
# The dump may catch the counter between opening state.tmp and renaming it
# (it writes its state every 10 ms): the image then holds state.tmp open.
# The half-restored process below runs on a moment after criu is killed and
# renames it away, so the files are kept as the dump left them and put
# back before the next restore.
mkdir -p "$WORK/as_dumped" && cp -p "$WORK"/state* "$WORK/as_dumped/" 2>/dev/null || true
wait_pid_free
PHOS_FAULT=stall-before-resume criu_restore &
criu_job=$!
for _ in $(seq 300); do
  grep -q "fault injection (PHOS_FAULT)" "$WORK/restore.log" 2>/dev/null && break
  sleep 0.05
done
grep -q "fault injection (PHOS_FAULT)" "$WORK/restore.log" || fail "the restore never reached the injected stall"
half=$(workload_pids | head -n1)
[ -n "$half" ] || fail "no forked process at RESUME_DEVICES_LATE"
criu_pid=$(pgrep -f "^$CRIU restore -D $IMG" | head -n1)
[ -n "$criu_pid" ] || fail "criu not found"
kill -9 "$criu_pid"
wait "$criu_job" 2>/dev/null || true
for _ in $(seq 200); do [ -e "/proc/$half" ] || break; sleep 0.05; done
[ -e "/proc/$half" ] && fail "process $half runs on 10 s after criu was killed: $(tail -n 3 "$IMG/phos-keeper.log" 2>/dev/null)"
grep -q "process $half: ended (restored without its GPU state)" "$IMG/phos-keeper.log" ||
  fail "phos-keeper.log does not say it ended process $half: $(tail -n 3 "$IMG/phos-keeper.log" 2>/dev/null)"
cp -p "$WORK"/as_dumped/* "$WORK/" 2>/dev/null || true
criu_restore || fail "the next restore failed: $(grep -v rlimit "$WORK/restore.log" | grep -m1 Error)"
pid=$(restored_pid) || fail "no process after the next restore"
at=$(state_counter)
wait_counter_above $((at + 5))
[ "$(state_token)" = "$token" ] || fail "the restored process is another one"
say "criu killed before RESUME_DEVICES_LATE: $(grep -o "process $half: ended.*" "$IMG/phos-keeper.log" | head -n1)"
say "the next restore took the pid: process $pid counting ($at -> $(state_counter))"
say "PASS"
