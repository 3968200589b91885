#!/usr/bin/env bash
# cuBLAS's workspace through real criu dumps with copy-on-write and the
# default trust (cow_trust=checksum): criu's plugin runs its engine on the
# fake libcuda with real memory (FAKE_CUDA_MEMORY=1); the workload
# (cublas_client.c) calls cublasGemmEx every 10 ms, and the fake cuBLAS
# writes memory beside C, allocated last so that the copy reaches it last:
#   1. the workspace cublasSetWorkspace set: each GEMM's exact set holds it,
#      so its chunk is saved before the first GEMM in the window; the image
#      completes (every copy equal to the freeze), restores, and the
#      program's checks pass
#   2. the memory cublasCreate allocated for the handle: the same
#   3. the control: a buffer the library writes without phos being told of
#      it (as cuBLAS's workspace was before phos followed
#      cublasSetWorkspace): the image is refused, naming the chunk; the
#      program runs on intact
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/cublas_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 PHOS_COW_POOL_MIB=64 PHOS_FAULT=slow-copy CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
unset PHOS_COW_TRUST  # the default: checksum

# cow_case MODE WHAT: a leave-running dump with copy-on-write of the
# workload in MODE: complete, chunks saved into the pool, restored with
# its checks passing.
cow_case() {
  rm -rf "${IMG:?}"/*
  kill -9 "${WORKLOAD_PID:-}" 2>/dev/null || true
  wait_pid_free
  start_workload --preload "$1"
  wait_counter_above 5
  PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
    fail "$2: criu dump failed: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1 | cut -c1-600)"
  [ -e "$IMG/phos-1-complete.img" ] || fail "$2: no completion marker"
  grep -q "copy-on-write window closed" "$WORK/dump.log" || fail "$2: no copy-on-write window"
  saved=$(grep -o '[0-9]* chunks ([0-9.]* MiB) saved' "$WORK/dump.log" | head -n1)
  [ "${saved%% *}" -ge 1 ] 2>/dev/null || fail "$2: no chunk saved copy-on-write: ${saved:-none}"
  equal=$(grep -o "checksum: [0-9]* chunks equal to the freeze" "$WORK/dump.log") || fail "$2: no copy checked by checksum"
  restored_ok "$2"
}

cow_case workspace "workspace"
say "1. cublasSetWorkspace's workspace written by every GEMM in the window: $saved; $equal; restored, its checks pass"

cow_case own "own memory"
say "2. the memory cublasCreate allocated, written by every GEMM: $saved; $equal; restored, its checks pass"

# 3. The control: written behind phos's back.
rm -rf "${IMG:?}"/*
kill -9 "$WORKLOAD_PID" && wait_pid_free
start_workload --preload side-door
wait_counter_above 5
token=$(state_token)
rc=0
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || rc=$?
[ "$rc" -ne 0 ] || fail "control: the image of a library writing memory phos was not told of completed: the test sees nothing"
refusal=$(grep -o "phos: Error: process [0-9]*: .*" "$WORK/dump.log" | head -n1)
grep -qF "differs from its content at the freeze" <<< "$refusal" || fail "control: refused for another reason: $refusal"
[ ! -e "$IMG/phos-1-complete.img" ] || fail "control: a refused image has a completion marker"
at=$(state_counter)
wait_counter_above $((at + 20))
[ "$(state_token)" = "$token" ] && [ "$(state_field 3)" = ok ] || fail "control: the program was harmed: $(cat "$WORK/state")"
say "3. control, the library's write not told to phos: refused ($(cut -c1-300 <<< "$refusal")); the program ran on intact"
say "PASS"
