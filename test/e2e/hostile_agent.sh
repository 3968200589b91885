#!/usr/bin/env bash
# A dumped process whose agent is not to be trusted (hostile_agent.cc): for
# each way it answers a dump wrongly, criu dump with the plugin fails (no
# crash: an exit status, not a signal), the log names what was wrong, no
# GPU image is left, and the process carries on.
PHOS_WORKLOAD=$PHOS_BUILD/test/e2e/phos-hostile-agent
source "$(dirname "$0")/lib.sh"
export PHOS_AGENT_TIMEOUT_MS=1000  # for the agents that never answer

check_mode() {  # check_mode MODE EXPECTED
  local mode=$1 expected=$2 rc=0
  rm -f "$WORK/state"  # the last mode's, whose counter would pass at once
  start_workload "$mode"
  wait_counter_above 5
  local token; token=$(state_token)
  rm -rf "$IMG" && mkdir -p "$IMG"
  criu_dump || rc=$?
  [ $rc -ne 0 ] || fail "$mode: the dump succeeded"
  [ $rc -lt 128 ] || fail "$mode: criu ended by a signal (exit $rc)"
  grep -q "phos: Error: .*$expected" "$WORK/dump.log" ||
    fail "$mode: the log does not say '$expected': $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1)"
  ! ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 || fail "$mode: a completion marker was left"
  local at; at=$(state_counter)
  wait_counter_above $((at + 10))
  [ "$(state_token)" = "$token" ] || fail "$mode: the process changed"
  say "$mode: refused (criu exit $rc): $(grep -o "phos: Error: .*$expected[^;]*" "$WORK/dump.log" | head -n1 | cut -c1-160); carries on"
  kill -9 "$WORKLOAD_PID"; wait_pid_free
}

check_mode overlap "overlaps allocation 1"
check_mode unaligned "not page-aligned"
check_mode proc-mem "agent sent a regular file as the memory of allocation 1"
check_mode regular-file "agent sent a regular file as the memory of allocation 1"
check_mode directory "agent sent a directory as the memory of allocation 1"
check_mode socket "agent sent a socket as the memory of allocation 1"
check_mode huge "more than the 1048576 a dump takes"
check_mode silent "timed out after 1000 ms"
check_mode endless "timed out after 1000 ms"

# stuck-resume: the give-back's resume waits for a lock the main thread
# holds, as an agent's would for a program thread criu keeps stopped (one
# frozen inside dlopen or an fprintf). The plugin says so after a second of
# it (not at the agent timeout, 20 s here), naming the futex and where the
# other threads are; the image is not completed (a restore would wait the
# same) and criu's dump fails; the process carries on.
start_workload stuck-resume
wait_counter_above 5
rm -rf "$IMG" && mkdir -p "$IMG"
t0=$(date +%s%N)
rc=0
PHOS_AGENT_TIMEOUT_MS=20000 criu_dump --leave-running || rc=$?
took_ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "stuck-resume: criu dump exited $rc, not failing on its own"

[ "$took_ms" -lt 5000 ] || fail "stuck-resume: the dump took $took_ms ms"
grep -q "phos: Error: process $WORKLOAD_PID: agent: no answer to resume can come: the agent's thread ([0-9]*) has waited [0-9]* ms in futex(.* at .*; code on its stack: .*They were stopped at: " "$WORK/dump.log" ||
  fail "stuck-resume: the log does not name the agent's wait: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1 | cut -c1-300)"
grep -q "phos: Error: process $WORKLOAD_PID: .*its GPU state was not given back .*not completed" "$WORK/dump.log" ||
  fail "stuck-resume: the log does not say the image is not completed"
! ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 || fail "stuck-resume: a completion marker was left"
at=$(state_counter)
wait_counter_above $((at + 10))
say "stuck-resume: dump done in $took_ms ms: $(grep -o "no answer to resume can come: [^:]*" "$WORK/dump.log" | head -n1); image not completed; carries on"
say "PASS"
