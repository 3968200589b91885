#!/usr/bin/env bash
# Copy-on-write and soft recopy of a process on two GPUs through real criu
# dumps: criu's plugin runs its engine on the fake libcuda with real memory
# and two devices (FAKE_CUDA_MEMORY=1 FAKE_CUDA_DEVICES=2); the workload
# (multi_gpu_client.c) writes 4 MiB on GPU 0 and 4 MiB on GPU 1 every step
# and checks after every call a dump can freeze it at that its memory is what
# it was before, so a restored image holding a write made after its freeze,
# on either GPU, is caught.
#   1. copy-on-write (leave-running): one window over both GPUs' memory, a
#      pool on each GPU; the program's writes on both GPUs save chunks into
#      the pools while the engine copies; the image completes, restores, and
#      the program's checks pass (it was the stopped copy before)
#   2. soft recopy (a dump that stops the program): its first pass over both
#      GPUs' memory while the program runs; the image restores intact
#   3. the same dump with recopy_min_mib at its default (1024 MiB, more than
#      the program's 8): no first pass; criu's CUDA starts beside the gate
#      and the driver's checkpoint, the copier maps the memory the process
#      let go of once it is up, with one worker (a worker per 8 chunks)
#      and that worker's staging only; the image restores intact
#   4. the same dump on a driver whose checkpoint calls want cuInit first:
#      criu asks once without it, then goes with it
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/multi_gpu_client
export FAKE_CUDA_MEMORY=1 FAKE_CUDA_DEVICES=2 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_RECOPY_MIN_MIB=0 PHOS_CHUNK_MIB=1 PHOS_COW_POOL_MIB=64 PHOS_FAULT=slow-copy CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
export FAKE_CUDA_LOG=$WORK/fake-cuda.log
image() { "$PHOSCTL" show --json "$IMG" | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]$1)"; }


# 1. Copy-on-write over two GPUs.
start_workload --preload
wait_counter_above 5
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "copy-on-write: criu dump failed: $(criu_errors "$WORK/dump.log")"
window=$(grep -o "copy-on-write window over [0-9.]* MiB in 8 chunks of 1024 KiB, on 2 GPUs; a pool per GPU: GPU 0: [0-9]* slots ([0-9.]* MiB); GPU 1: [0-9]* slots ([0-9.]* MiB)" \
  "$WORK/dump.log") || fail "copy-on-write: no window with a pool per GPU: $(grep -o 'phos: process [0-9]*: .*\(window\|copy-on-write\).*' "$WORK/dump.log" | head -n3)"
! grep -q "no copy-on-write" "$WORK/dump.log" || fail "copy-on-write: the stopped copy: $(grep -o 'no copy-on-write.*' "$WORK/dump.log" | head -n1)"
grep -q "copy window opened" "$WORK/dump.log" || fail "copy-on-write: the process did not open the window: $(criu_errors "$WORK/dump.log")"
[ -e "$IMG/phos-1-complete.img" ] || fail "copy-on-write: no completion marker"
saved=$(image "['statistics']['cow_saved_bytes']")
# A and B are written every 10 ms and the engine copies a chunk in 20 ms
# (slow-copy): the program writes both GPUs' first chunks before the engine
# reaches them, so each GPU's pool held at least one. The fake fails a copy
# that leaves its context's GPU: each chunk was saved on its own GPU.
[ "$saved" -ge $((2 << 20)) ] || fail "copy-on-write: $saved bytes saved into the pools: the writes on both GPUs were not saved"
! grep -q "cross-gpu copy" "$FAKE_CUDA_LOG" || fail "copy-on-write: $(grep -m1 'cross-gpu copy' "$FAKE_CUDA_LOG")"
devices=$(image "['allocations']" | grep -o "'device': [0-9]*" | sort -u | tr '\n' ' ')
[ "$devices" = "'device': 0 'device': 1 " ] || fail "copy-on-write: the image's allocations are not on GPUs 0 and 1: $devices"
restored_ok "copy-on-write"
say "1. copy-on-write: $window; $saved bytes saved into the pools; restored, its checks on both GPUs pass"

# 2. Soft recopy over two GPUs.
rm -rf "${IMG:?}"/*
criu_dump || fail "recopy: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "soft recopy window over [0-9.]* MiB in 8 chunks of 1024 KiB, on 2 GPUs; no pool" "$WORK/dump.log" ||
  fail "recopy: no window over both GPUs: $(grep -o 'phos: process [0-9]*: .*\(window\|recopy\).*' "$WORK/dump.log" | head -n3)"
line=$(grep -o "first pass copied.*" "$WORK/dump.log" | head -n1) || fail "recopy: no first pass"
restored_ok "recopy"
say "2. soft recopy: $line; restored, its checks on both GPUs pass"

# 3. A small program's stopped dump with the default recopy_min_mib.
rm -rf "${IMG:?}"/*
(unset PHOS_RECOPY_MIN_MIB; criu_dump) || fail "stopped: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "no soft recopy: [0-9.]* MiB of device memory, under recopy_min_mib=1024" "$WORK/dump.log" ||
  fail "stopped: not skipped for its size: $(grep -o 'phos: process [0-9]*: .*recopy.*' "$WORK/dump.log" | head -n2)"
! grep -q "first pass copied" "$WORK/dump.log" || fail "stopped: a first pass ran"
grep -q "criu's CUDA contexts on 2 of the host's 2 GPU(s) made beside the process's gate and the driver's checkpoint" \
  "$WORK/dump.log" || fail "stopped: criu's CUDA did not start beside the gate: $(grep -o "criu's CUDA.*" "$WORK/dump.log" | head -n1)"
mapped=$(grep -o "its memory mapped into criu [0-9.]* ms after the gate closed (criu's CUDA started beside it)" \
  "$WORK/dump.log") || fail "stopped: the copier did not map the memory after the gate: $(criu_errors "$WORK/dump.log")"
# 8 chunks: one worker (a worker per 8 chunks), its staging made for it alone.
grep -q "the stopped copy: the copy's staging made before the gate, in the background: 1 rings of 3 slots" "$WORK/dump.log" ||
  fail "stopped: not one worker's staging: $(grep -o "the copy's staging.*" "$WORK/dump.log" | head -n1)"
grep -q "copied to the image in [0-9.]* ms ([0-9.]* GB/s, 1 workers" "$WORK/dump.log" ||
  fail "stopped: not one worker: $(grep -o "copied to the image in .*" "$WORK/dump.log" | head -n1)"
[ -e "$IMG/phos-1-complete.img" ] || fail "stopped: no completion marker"
restored_ok "stopped"
say "3. stopped, under recopy_min_mib: no first pass; $mapped; restored, its checks on both GPUs pass"

# 4. The same with a driver whose checkpoint calls refuse a caller that has
# not called cuInit (driver 580 does not): criu asks once without it, then
# with it; every later call goes with it. criu's CUDA start-up beside the
# gate held back (PHOS_FAULT=slow-engine-warm-up), so that the dump's first
# question comes before any cuInit: one refusal exactly; the restore's at
# most one.
rm -rf "${IMG:?}"/*
: > "$FAKE_CUDA_LOG"
export FAKE_CUDA_CHECKPOINT_NEEDS_INIT=1
(unset PHOS_RECOPY_MIN_MIB; PHOS_FAULT=slow-engine-warm-up criu_dump) ||
  fail "needs cuInit: criu dump failed: $(criu_errors "$WORK/dump.log")"
dump_refused=$(grep -c "checkpoint call before cuInit" "$FAKE_CUDA_LOG" || true)
restored_ok "needs cuInit"
unset FAKE_CUDA_CHECKPOINT_NEEDS_INIT
refused=$(grep -c "checkpoint call before cuInit" "$FAKE_CUDA_LOG" || true)
[ "$dump_refused" = 1 ] && [ $((refused - dump_refused)) -le 1 ] ||
  fail "needs cuInit: checkpoint calls refused $dump_refused times in the dump, $((refused - dump_refused)) in the restore: $(grep 'before cuInit' "$FAKE_CUDA_LOG" | sort | uniq -c | tr '\n' ' ')"
say "4. a driver that wants cuInit first: $dump_refused refusal(s) in the dump, $((refused - dump_refused)) in the restore; restored, its checks pass"
say "PASS"
