#!/usr/bin/env bash
# A program whose GPU work failed for good is not checkpointed: the dump is
# refused at the quiesce (the drain says why) and the program is left as it
# is. A supervisor that dumped such a program in the moments it takes to
# exit would restore it into the same failure at every restart (seen on the
# GPU host: "restored from .../000002 in 0.095 s ... exited with status 1",
# twice, then the supervisor gave up). The injected fault (PHOS_FAULT=
# gpu-error) stands for a lost device; supervised_client with
# SUPERVISED_LINGER=1 stays alive after its CUDA error, as a program does
# while it unwinds.
#   1. before the fault: the dump goes through (the control)
#   2. after it: criu fails, naming the failed GPU work; no completion marker
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/supervised_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 CRIU_TIMEOUT=60
export PHOS_FAULT=gpu-error SUPERVISED_LINGER=1
source "$(dirname "$0")/../e2e/lib.sh"
export PHOS_FAULT_FILE=$WORK/gpu-fault

# 1. The control.
start_workload --preload "$WORK/run.out" 100000 20
wait_counter_above 5
criu_dump --leave-running || fail "before the fault: criu dump failed: $(criu_errors "$WORK/dump.log")"
[ -e "$IMG/phos-1-complete.img" ] || fail "before the fault: no completion marker"
say "1. before the fault: the leave-running dump complete"

# 2. After it.
rm -rf "${IMG:?}"/* "$WORK/dump.log"
touch "$WORK/gpu-fault"
for _ in $(seq 100); do [ -s "$WORK/state.error" ] && break; sleep 0.05; done
grep -q "failed with CUDA error 700" "$WORK/state.error" || fail "the program did not fail on the fault: $(cat "$WORK/state.error" 2>/dev/null)"
kill -0 "$WORKLOAD_PID" || fail "the program did not linger after its error"
rc=0
criu_dump --leave-running || rc=$?
[ "$rc" -ne 0 ] || fail "after the fault: criu dumped a program whose GPU work failed"
why=$(grep -o "the program's GPU work failed[^;]*" "$WORK/dump.log" | head -n1)
[ -n "$why" ] || fail "after the fault: the refusal does not say why: $(criu_errors "$WORK/dump.log")"
[ ! -e "$IMG/phos-1-complete.img" ] || fail "after the fault: a completion marker"
kill -0 "$WORKLOAD_PID" || fail "the refused dump ended the program"
say "2. after the fault: refused ($why)"
say "PASS"
