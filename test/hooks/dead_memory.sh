#!/usr/bin/env bash
# Dead memory through real criu dumps and restores: the program's allocator's
# free block, handed at the iteration boundary a dump closes at
# (phos_step_pending + phos_step_dead, as the SDK's phos.step() does), is not
# stored, and a restore leaves it unfilled; the rest restores bitwise. The
# plugin's engine runs on the fake libcuda with real memory
# (FAKE_CUDA_MEMORY=1), in chunks of 1 MiB; the workload is dead_client.c
# (M: 6.5 MiB free at each boundary, 6 whole chunks of it; 4 MiB live).
#   1. copy-on-write (leave-running): 6 chunks (6 MiB) dead in the manifest
#      (format version 4, `phosctl show` says so); the program's writes to
#      M in the window saved nothing into the pool; restored, the program
#      finds M unfilled once, and its live memory intact
#   2. the control (the program hands no free memory): nothing dead, the
#      image 6 MiB larger, M's chunks saved into the pool as it writes them
#   3. a stale list (handed once at a step no dump waited for, M live since):
#      not used: nothing dead, and restored M holds its pattern
#   4. a dump that stops the program (soft recopy, its final closing at a
#      step with the free block), restored on demand (lazy_restore=on): M's
#      chunks dead and left unfilled, the rest intact
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/dead_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_RECOPY_MIN_MIB=0 PHOS_CHUNK_MIB=1 PHOS_COW_POOL_MIB=64 PHOS_FAULT=slow-copy CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
verdict() { state_field 3; }
unfilled() { state_field 4; }
# image KEYS: a field of the one process image in $IMG (phosctl show --json).
image() { "$PHOSCTL" show --json "$IMG" | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]$1)"; }
MIB=$((1 << 20))

# restored_unfilled WHAT WANT_UNFILLED: lib.sh's restored_ok, and the
# program found M unfilled WANT_UNFILLED times.
restored_unfilled() {
  restored_ok "$1"
  [ "$(unfilled)" = "$2" ] || fail "$1: the restored program found M unfilled $(unfilled) times, not $2"
}
fresh_start() {  # fresh_start [CLIENT ARGS...]
  rm -rf "${IMG:?}"/*
  kill -9 "$WORKLOAD_PID" 2>/dev/null || true
  wait_pid_free
  start_workload --preload "$@"
  wait_counter_above 5
}

# 1. Copy-on-write with the free block.
start_workload --preload
wait_counter_above 5
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "copy-on-write: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "gate closed at the program's iteration boundary" "$WORK/dump.log" || fail "copy-on-write: the dump did not close at a step"
line=$(grep -o "1 free ranges of its allocator at its iteration boundary (6.5 MiB): 6 whole chunks (6.0 MiB) dead, not stored" \
  "$WORK/dump.log") || fail "copy-on-write: no dead chunks: $(grep -o 'phos: process [0-9]*: .*\(free\|dead\).*' "$WORK/dump.log" | head -n2)"
[ -e "$IMG/phos-1-complete.img" ] || fail "copy-on-write: no completion marker"
[ "$(image "['size']['dead_bytes']")" = $((6 * MIB)) ] || fail "copy-on-write: phosctl show: dead_bytes $(image "['size']['dead_bytes']")"
# 7: its chunks' fingerprints (4 would hold its dead chunks).
[ "$(image "['format_version']")" = 7 ] || fail "copy-on-write: format version $(image "['format_version']"), not 7"
"$PHOSCTL" show "$IMG" | grep -q "6 dead chunks (6.0 MiB), free in the program's allocator, not stored" ||
  fail "copy-on-write: phosctl show does not say what was dead: $("$PHOSCTL" show "$IMG" | grep size)"
stored_dead=$(image "['size']['stored_bytes']")
saved=$(image "['statistics']['cow_saved_bytes']")
# L (2 chunks) and F's chunk 7 (M's last half chunk, stored) are written
# every step; M's 6 dead chunks are not protected.
[ "$saved" -le $((3 * MIB)) ] || fail "copy-on-write: $saved bytes saved into the pool: writes to dead chunks were saved"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(verdict)" = ok ] || fail "copy-on-write: the program was harmed by the dump: $(verdict)"
restored_unfilled "copy-on-write" 1
say "1. copy-on-write: $line; $stored_dead bytes stored, $saved saved into the pool; restored: M unfilled, the rest intact"

# 2. The control: no free memory handed.
fresh_start --no-dead
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "control: criu dump failed: $(criu_errors "$WORK/dump.log")"
[ "$(image "['size']['dead_bytes']")" = 0 ] || fail "control: dead bytes without a free block handed"
stored_all=$(image "['size']['stored_bytes']")
saved=$(image "['statistics']['cow_saved_bytes']")
[ "$stored_all" -ge $((stored_dead + 6 * MIB - 64 * 1024)) ] ||
  fail "control: $stored_all bytes stored, against $stored_dead with 6 MiB dead"
[ "$saved" -gt $((3 * MIB)) ] || fail "control: only $saved bytes saved into the pool: the window protected no M chunk, case 1 shows nothing"
restored_unfilled "control" 0
say "2. control: nothing dead, $stored_all bytes stored ($(( (stored_all - stored_dead) / 1024 )) KiB more), $saved saved into the pool"

# 3. A stale list: handed once where no dump waited; M live since.
fresh_start --stale
criu_dump --leave-running || fail "stale: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "gate closed at the program's iteration boundary" "$WORK/dump.log" || fail "stale: the dump did not close at a step"
! grep -q "dead, not stored" "$WORK/dump.log" || fail "stale: the dump used a free-block list of an earlier step"
[ "$(image "['size']['dead_bytes']")" = 0 ] || fail "stale: dead bytes in the image"
restored_unfilled "stale" 0
say "3. stale list: not used; restored, M holds its pattern"

# 4. A dump that stops the program, restored on demand.
fresh_start
criu_dump || fail "stopped: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "first pass copied" "$WORK/dump.log" || fail "stopped: no soft recopy: $(grep -o 'no soft recopy.*' "$WORK/dump.log" | head -n1)"
grep -q "6 whole chunks (6.0 MiB) dead, not stored" "$WORK/dump.log" || fail "stopped: no dead chunks at the final closing"
[ "$(image "['size']['dead_bytes']")" = $((6 * MIB)) ] || fail "stopped: dead_bytes $(image "['size']['dead_bytes']")"
PHOS_LAZY_RESTORE=on restored_unfilled "on-demand restore" 1
grep -q "6 dead chunks (6.0 MiB), free in its allocator at the checkpoint, left unfilled" "$WORK/restore.log" ||
  fail "on-demand restore: the restore does not say it left the dead chunks unfilled"
grep -q "on-demand fill" "$WORK/restore.log" || fail "on-demand restore: the restore was not on demand"
say "4. stopped dump (soft recopy): 6 chunks dead; restored on demand: M unfilled, the rest intact"
say "PASS"
