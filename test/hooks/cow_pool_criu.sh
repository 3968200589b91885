#!/usr/bin/env bash
# The copy-on-write pool through real criu dumps (leave-running), criu's
# plugin running its engine on the fake libcuda with real memory
# (FAKE_CUDA_MEMORY=1: a 16 GiB GPU with 8 GiB free) in chunks of 1 MiB,
# slowed (PHOS_FAULT=slow-copy) so that the window stays open a while. The
# workload (pool_client.c) has 32 MiB of device memory on a GPU it sees as
# 64 MiB (FAKE_CUDA_BUDGET_MIB), writes all of it every step and allocates
# 16 MiB: that fits beside its memory, not beside a pool as large as it.
#   1. default settings (cow_pool_mib=auto): the pool takes what is free less
#      the program's reserve, bounded by the process's memory (logged with
#      the figures); the program's allocation in the window finds the GPU
#      full, the pool is given back (criu's log says so), the allocation
#      succeeds (the program counts no failure); the log names the memset as
#      the call that saved the most into the pool; the image restores intact
#   2. an explicit cow_pool_mib=40, the program's allocation a pitched one
#      (cuMemAllocPitch, its only allocation in the window): the pool is the
#      setting, given back the same way, the pitched allocation succeeds;
#      restores intact
#   3. cow_pool_mib=0: no pool, nothing to give back; restores intact
#   4. two processes of one dump on the GPU (the workload and a child of
#      it, 32 MiB each), auto, criu's GPU showing 2100 MiB free
#      (FAKE_CUDA_FREE_MIB) with two copy workers: the room past the
#      reserve and both processes' bounce buffers is split between them
#      (each pool bounded by its share, where alone it would take its 32
#      MiB), both logged; both images complete, no allocation failed, the
#      tree restores intact
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/pool_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 PHOS_FAULT=slow-copy CRIU_TIMEOUT=60
unset PHOS_COW_POOL_MIB
source "$(dirname "$0")/../e2e/lib.sh"
failed_allocations() { state_field 4; }

fresh_start() {  # fresh_start [pitch]
  rm -rf "${IMG:?}"/*
  [ -n "${WORKLOAD_PID:-}" ] && { kill -9 "$WORKLOAD_PID" 2>/dev/null || true; wait_pid_free; }
  start_workload --preload 64 "$@"
  wait_counter_above 5
  [ "$(failed_allocations)" = 0 ] || fail "the program's allocation failed before any dump: $(cat "$WORK/state")"
}
# dumped WHAT: the dump completed, the program's allocations in the window
# all succeeded, and it runs on with its checks passing.
dumped() {
  [ -e "$IMG/phos-1-complete.img" ] || fail "$1: no completion marker"
  local at
  at=$(state_counter)
  wait_counter_above $((at + 20))
  [ "$(state_field 3)" = ok ] || fail "$1: the program found its memory wrong after the dump: $(state_field 3)"
  [ "$(failed_allocations)" = 0 ] || fail "$1: $(failed_allocations) of the program's allocations failed in the window"
}
given_back() {
  grep -q "copy-on-write pool given back ([0-9.]* MiB): an allocation of the program found its GPU full" \
    "$WORK/dump.log" || fail "$1: the pool was not given back: $(grep -o 'phos: process [0-9]*: copy-on-write.*' \
    "$WORK/dump.log" | head -n 4)"
}

# 1. Default settings.
fresh_start
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "auto: criu dump failed: $(criu_errors "$WORK/dump.log")"
sized=$(grep -o "copy-on-write pool on GPU 0: cow_pool_mib=auto: .*" "$WORK/dump.log" | head -n1) ||
  fail "auto: the pool's size is not logged: $(grep -o 'phos: process [0-9]*: .*pool.*' "$WORK/dump.log" | head -n3)"
for want in "8.00 GiB free of 16.00 GiB, 2.0" "GiB kept for the program (5% of the GPU or 2 GiB, the larger" \
            "bounded by the process's memory"; do
  grep -qF -- "$want" <<< "$sized" || fail "auto: the size does not say '$want': $sized"
done
# A (32 MiB), and its step's 16 MiB where the gate closed between that
# allocation and its free (the listing ahead of the gate holds the
# allocator's lock, so the program often reaches the gate right there).
grep -qE "the process's memory there (0.03 GiB: 32|0.05 GiB: 48) slots" <<< "$sized" ||
  fail "auto: the size does not say the process's memory (32 or 48 MiB): $sized"
given_back auto
# Which call wrote the memory: the program's memset, named as the call that
# saved into the pool, or, where the gate reopened just before the
# allocation (the pool given back first), as the call that waited.
saved=$(grep -o "the calls\? that saved \(the most \)\?into the pool: cuMemsetD32_v2 [0-9]* chunks" "$WORK/dump.log" | head -n1) ||
  saved=$(grep -o "the calls\? that waited\( longest\)\?: cuMemsetD32_v2 [0-9.]* ms ([0-9]* chunks waited for" "$WORK/dump.log" | head -n1) ||
  fail "auto: the log names the memset neither as the call that saved into the pool nor as the one that waited: $(grep -o 'copy-on-write: the call.*' "$WORK/dump.log" | head -n1)"
dumped auto
say "1. auto: $sized; $(grep -o 'copy-on-write pool given back ([0-9.]* MiB)' "$WORK/dump.log"); the program's allocations all succeeded; $saved"
restored_ok auto
[ "$(failed_allocations)" = 0 ] || fail "auto: the restored program's allocations failed"

# 2. An explicit size; the program's allocation a pitched one.
fresh_start pitch
PHOS_COPY_ON_WRITE=always PHOS_COW_POOL_MIB=40 criu_dump --leave-running ||
  fail "explicit: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "copy-on-write pool on GPU 0: cow_pool_mib=40: .*: 40 slots (0.04 GiB), bounded by the setting" "$WORK/dump.log" ||
  fail "explicit: not the setting's pool: $(grep -o 'copy-on-write pool on GPU 0: .*' "$WORK/dump.log")"
given_back explicit
dumped explicit
say "2. cow_pool_mib=40: 40 slots, given back when the program's pitched allocation needed the memory"
restored_ok explicit

# 3. No pool.
fresh_start
PHOS_COPY_ON_WRITE=always PHOS_COW_POOL_MIB=0 criu_dump --leave-running ||
  fail "no pool: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "copy-on-write window over .*; no pool" "$WORK/dump.log" || fail "no pool: $(grep -o 'copy-on-write window over.*' "$WORK/dump.log")"
! grep -q "copy-on-write pool given back" "$WORK/dump.log" || fail "no pool: a pool was given back"
dumped "no pool"
restored_ok "no pool"
say "3. cow_pool_mib=0: no pool, every allocation succeeded"

# 4. Two processes of one dump.
rm -rf "${IMG:?}"/*
kill -9 "$WORKLOAD_PID" 2>/dev/null || true; wait_pid_free
rm -f "$WORK/state.2"
start_workload --preload 64 2
wait_counter_above 5
for _ in $(seq 100); do [ -s "$WORK/state.2" ] && break; sleep 0.05; done
child_counter() { cut -d' ' -f"${1:-2}" "$WORK/state.2"; }
FAKE_CUDA_FREE_MIB=2100 PHOS_ENGINE_WORKERS=2 PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
  fail "two processes: criu dump failed: $(criu_errors "$WORK/dump.log")"
mapfile -t sized < <(grep -o "copy-on-write pool on GPU 0: cow_pool_mib=auto: .*" "$WORK/dump.log")
[ "${#sized[@]}" = 2 ] || fail "two processes: ${#sized[@]} pools sized, not 2: ${sized[*]}"
for line in "${sized[@]}"; do
  # 32 MiB each, and the 16 MiB each allocates and frees every step when
  # the status caught it between the two (the other process still runs).
  grep -qE "shared with 1 other process of the dump there \((0\.06|0\.08|0\.09) GiB of memory in all\)" <<< "$line" ||
    fail "two processes: the pool is not sized with the other process: $line"
  grep -q "bounded by its share of free memory$" <<< "$line" || fail "two processes: not bounded by its share: $line"
  # 2100 MiB free, less 2 GiB and each process's bounce buffers, split in
  # proportion to the two processes' memory: 32 MiB each, or 48 for one
  # caught holding its step's 16 MiB (halved where both hold the same).
  bounce=$(grep -o "bounce buffers ([0-9.]* MiB)" <<< "$line" | grep -o "[0-9.]*" || echo 0)
  wants=$(python3 -c "
room = (2100 - 2048 - 2 * float('$bounce')) * 2**20
print(' '.join(sorted({str(int(room * m // (m + o)) // 2**20) for m in (32, 48) for o in (32, 48)})))")
  got=$(grep -oE ": [0-9]+ slots \(" <<< "$line" | grep -oE "[0-9]+")
  [[ " $wants " == *" $got "* ]] || fail "two processes: $got slots, not one of $wants: $line"
done
markers=$(find "$IMG" -name 'phos-*-complete.img' | wc -l)
[ "$markers" = 2 ] || fail "two processes: $markers completion markers, not 2: $(ls "$IMG")"
at=$(state_counter) at2=$(child_counter)
wait_counter_above $((at + 20))
wait_field_above "$WORK/state.2" 2 $((at2 + 20)) || fail "two processes: the child stopped counting after the dump"
[ "$(state_field 3) $(child_counter 3)" = "ok ok" ] || fail "two processes: memory wrong after the dump: $(cat "$WORK/state" "$WORK/state.2")"
[ "$(failed_allocations) $(child_counter 4)" = "0 0" ] ||
  fail "two processes: allocations failed in the window: $(cat "$WORK/state" "$WORK/state.2")"
restored_ok "two processes"
at2=$(child_counter)
wait_field_above "$WORK/state.2" 2 $((at2 + 20)) && [ "$(child_counter 3)" = ok ] ||
  fail "two processes: the restored child does not count on intact: $(cat "$WORK/state.2")"
say "4. two processes: ${sized[0]##*: }, each; both images complete, no allocation failed, restored intact"
say PASS
