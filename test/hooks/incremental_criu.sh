#!/usr/bin/env bash
# Incremental images through real criu dumps and restores (issue 32): the
# plugin's engine on the fake libcuda with real memory (FAKE_CUDA_MEMORY=1),
# in chunks of 1 MiB; the workload is dead_client.c --no-dead (L, 2 MiB, and
# F's middle written every step; F's first MiB a pattern it checks every step).
#   1. img1: a full dump (leave-running); img2, steps later, against
#      ../img1 (PHOS_PARENT_IMAGE: criu's own --prev-images-dir needs a
#      parent dumped with --track-mem, which a kernel without soft-dirty
#      tracking refuses, as this CI's and the GPU host's do): phos stores
#      only the chunks that changed (fewer bytes than img1) and references
#      img1 for the rest (size, CRC-32C and fingerprint equal; format 7);
#      `phosctl show` prints the chain
#      A parent directory without an image of the process: dumped whole.
#      img1 with its fingerprints flipped (phos-image-edit): a dump against
#      it references no chunk, though sizes and CRC-32C are equal; with its
#      fingerprints dropped (an older phos's image): restores, and a dump
#      against it stores every chunk and names no parent, saying why.
#   2. killed, restored from img2: the program's checks pass (its pattern
#      read from img1's data file, L and M from img2's)
#   3. a flipped byte in each chunk of img1's data files: the restore from
#      img2 is refused, naming ../img1
#   4. img1's phos files replaced by those of a later dump: refused, naming it
#   5. img1 missing: refused, naming it
#   6. `phosctl merge img2 img4` (with criu's files of img2 copied): img4
#      names no parent and restores, img1 gone
#   7. a chain of three through the other protocols: img5 against img4 by
#      copy-on-write (leave-running), img6 against img5 by a dump that stops
#      the program (soft recopy); restored from img6
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/dead_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_RECOPY_MIN_MIB=0 PHOS_CHUNK_MIB=1 CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
verdict() { state_field 3; }
# json DIR KEYS: a field of the one process image in DIR (phosctl show --json).
json() { "$PHOSCTL" show --json "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['images'][0]$2)"; }
MIB=$((1 << 20))

restore_from() {  # restore_from DIR [PATTERN]: DIR restores (no PATTERN), or is refused saying PATTERN
  kill -9 "$WORKLOAD_PID" 2>/dev/null || true
  wait_pid_free
  IMG=$1
  if [ -n "${2:-}" ]; then
    restore_refused "$2" "$1"
    return
  fi
  criu_restore || fail "restore from $1 failed: $(criu_errors "$WORK/restore.log")"
  WORKLOAD_PID=$(restored_pid) || fail "no restored process from $1"
  local at
  at=$(state_counter)
  wait_counter_above $((at + 20))
  [ "$(verdict)" = ok ] || fail "restored from $1, the program found its memory wrong: $(verdict)"
}

# 1. A full image, then an incremental one.
start_workload --preload --no-dead
wait_counter_above 5
IMG=$WORK/img1 && mkdir -p "$IMG"
criu_dump --leave-running || fail "img1: criu dump failed: $(criu_errors "$WORK/dump.log")"
at=$(state_counter)
wait_counter_above $((at + 5))
IMG=$WORK/img2 && mkdir -p "$IMG"
PHOS_PARENT_IMAGE=../img1 criu_dump --leave-running ||
  fail "img2: criu dump against ../img1 failed: $(criu_errors "$WORK/dump.log")"
grep -q "incremental dump against parent image ../img1" "$WORK/dump.log" || fail "img2: the dump was not incremental"
stored1=$(json "$WORK/img1" "['size']['stored_bytes']")
stored2=$(json "$WORK/img2" "['size']['stored_bytes']")
refs=$(json "$WORK/img2" "['chain'][0]['referenced_chunks']")
[ "$(json "$WORK/img2" "['format_version']")" = 7 ] || fail "img2: format version not 7 (fingerprints)"
grep -q "every chunk's fingerprint taken on the GPU" "$WORK/dump.log" ||
  fail "img2: not every chunk fingerprinted by the engine's kernel: $(grep -o 'phos: process [0-9]*: [0-9]* of [0-9]* chunk copies. fingerprints.*' "$WORK/dump.log")"
[ "$(json "$WORK/img2" "['parent']['path']")" = ../img1 ] || fail "img2: its parent is not ../img1"
[ "$refs" -ge 1 ] || fail "img2 references no chunk of img1"
[ "$stored2" -le $((stored1 - refs * MIB)) ] || fail "img2 stores $stored2 bytes, img1 $stored1: not $refs MiB fewer"
"$PHOSCTL" show "$WORK/img2" | grep -q "incremental: a chain of 2 images" || fail "phosctl show prints no chain"
"$PHOSCTL" show "$WORK/img2" | grep -q "^    ../img1: stores" || fail "phosctl show does not name ../img1 in the chain"
"$PHOSCTL" verify "$WORK/img2" >/dev/null || fail "phosctl verify fails on img2"
say "1. img1 stores $stored1 bytes; img2 (against ../img1) $stored2, referencing $refs chunks of img1"
mkdir -p "$WORK/empty" "$WORK/imgx"
IMG=$WORK/imgx PHOS_PARENT_IMAGE=../empty criu_dump --leave-running || fail "imgx: dump against an empty parent failed"
grep -q "parent image ../empty has no phos-1-manifest.img: this image is not incremental" "$WORK/dump.log" ||
  fail "imgx: the dump does not say the parent has no image of the process"
[ "$(json "$WORK/imgx" ".get('parent')")" = None ] || fail "imgx names a parent"
say "1b. against a parent without an image of the process: dumped whole, naming no parent"
# A parent whose chunks' fingerprints are not their bytes' (flipped: as if
# its bytes were others of the same CRC-32C and size): no chunk taken.
EDIT=$PHOS_BUILD/test/tools/phos-image-edit
cp -a "$WORK/img1" "$WORK/img1f" && mkdir -p "$WORK/imgf"
"$EDIT" "$WORK/img1f" 1 fingerprints flip >/dev/null || fail "phos-image-edit could not flip img1f's fingerprints"
IMG=$WORK/imgf PHOS_PARENT_IMAGE=../img1f criu_dump --leave-running || fail "imgf: dump against img1f failed"
[ "$(json "$WORK/imgf" "['parent']['path']")" = ../img1f ] || fail "imgf: its parent is not ../img1f"
[ "$(json "$WORK/imgf" "['chain'][0]['referenced_chunks']")" = 0 ] ||
  fail "imgf took chunks from img1f by CRC-32C and size, though their fingerprints differ"
say "1c. against img1 with its fingerprints flipped (CRC-32C and sizes the same): no chunk referenced ($refs against img1)"
# A parent without fingerprints (as a phos of format version 6 wrote it):
# restores, but is not used as a parent.
cp -a "$WORK/img1" "$WORK/img1v6" && mkdir -p "$WORK/imgv"
"$EDIT" "$WORK/img1v6" 1 fingerprints drop >/dev/null || fail "phos-image-edit could not drop img1v6's fingerprints"
[ "$(json "$WORK/img1v6" "['format_version']")" -lt 7 ] || fail "img1v6 is still format version 7"
IMG=$WORK/imgv PHOS_PARENT_IMAGE=../img1v6 criu_dump --leave-running || fail "imgv: dump against img1v6 failed"
grep -q "parent image ../img1v6 is not used, this image is not incremental: .*records no 64-bit fingerprint" "$WORK/dump.log" ||
  fail "imgv: the dump does not say why img1v6 is not used: $(grep -o 'phos: .*img1v6.*' "$WORK/dump.log" | head -n1)"
[ "$(json "$WORK/imgv" ".get('parent')")" = None ] || fail "imgv names a parent without fingerprints"
restore_from "$WORK/img1v6"
say "1d. img1 without fingerprints (format $(json "$WORK/img1v6" "['format_version']")): restores, and a dump against it stores every chunk, saying why"

# 2. Restored from img2.
restore_from "$WORK/img2"
say "2. restored from img2: the program's memory is right for 20 steps"

# 3. A flipped byte in each chunk of img1's data files.
cp -a "$WORK/img1" "$WORK/img1.good"
for f in "$WORK"/img1/phos-1-data-*.img; do
  python3 - "$f" <<'PY'
import os, sys
path = sys.argv[1]
size = os.path.getsize(path)
with open(path, "r+b") as f:
    for off in range(4096 + 100, size, 4096):  # every 4 KiB extent: each chunk's bytes
        f.seek(off); b = f.read(1); f.seek(off); f.write(bytes([b[0] ^ 0x5a]))
PY
done
restore_from "$WORK/img2" "parent image ../img1"
grep -q "parent image ../img1: phos-1-data-[0-9]*.img" "$WORK/restore.log" || fail "flipped: the refusal does not name img1's data file"
rm -rf "$WORK/img1" && mv "$WORK/img1.good" "$WORK/img1"
say "3. img1's data damaged: the restore from img2 refused, naming it"

# 4. img1's phos files replaced by a later dump's.
restore_from "$WORK/img2"
IMG=$WORK/img3 && mkdir -p "$IMG"
criu_dump --leave-running || fail "img3: criu dump failed: $(criu_errors "$WORK/dump.log")"
cp -a "$WORK/img1" "$WORK/img1.good"
cp "$WORK"/img3/phos-* "$WORK/img1/"
restore_from "$WORK/img2" "parent image ../img1 of phos-1-manifest.img: its phos-1-manifest.img is not the one"
rm -rf "$WORK/img1" && mv "$WORK/img1.good" "$WORK/img1"
say "4. img1's manifest replaced: refused, naming it"

# 5. img1 missing.
mv "$WORK/img1" "$WORK/img1.away"
restore_from "$WORK/img2" "parent image ../img1"
say "5. img1 missing: refused, naming it"

# 6. The chain folded into one image.
mv "$WORK/img1.away" "$WORK/img1"
mkdir -p "$WORK/img4"
find "$WORK/img2" -maxdepth 1 -type f ! -name 'phos-*' -exec cp {} "$WORK/img4/" \;
"$PHOSCTL" merge "$WORK/img2" "$WORK/img4" >"$WORK/merge.log" 2>&1 || fail "phosctl merge failed: $(cat "$WORK/merge.log")"
mv "$WORK/img1" "$WORK/img1.away"
[ "$(json "$WORK/img4" "['chain'][0]['referenced_chunks']")" = 0 ] || fail "img4 still references chunks"
[ "$(json "$WORK/img4" ".get('parent')")" = None ] || fail "img4 names a parent"
[ "$(json "$WORK/img4" "['format_version']")" = 7 ] || fail "img4 does not keep the fingerprints (format version 7)"
"$PHOSCTL" verify "$WORK/img4" >/dev/null || fail "phosctl verify fails on img4"
restore_from "$WORK/img4"
say "6. merged into img4 ($(json "$WORK/img4" "['size']['stored_bytes']") bytes): restored without img1, memory right"

# 7. Copy-on-write, then soft recopy, each against the image before.
IMG=$WORK/img5 && mkdir -p "$IMG"
PHOS_COPY_ON_WRITE=always PHOS_COW_POOL_MIB=64 PHOS_PARENT_IMAGE=../img4 criu_dump --leave-running ||
  fail "img5: copy-on-write dump against img4 failed: $(criu_errors "$WORK/dump.log")"
[ "$(json "$WORK/img5" "['protocol']")" = soft-copy-on-write ] || fail "img5: protocol $(json "$WORK/img5" "['protocol']")"
[ "$(json "$WORK/img5" "['chain'][0]['referenced_chunks']")" -ge 1 ] || fail "img5 references no chunk of img4"
at=$(state_counter)
wait_counter_above $((at + 5))
IMG=$WORK/img6 && mkdir -p "$IMG"
PHOS_PARENT_IMAGE=../img5 criu_dump || fail "img6: stopped dump against img5 failed: $(criu_errors "$WORK/dump.log")"
[ "$(json "$WORK/img6" "['protocol']")" = soft-recopy ] || fail "img6: protocol $(json "$WORK/img6" "['protocol']")"
[ "$(json "$WORK/img6" "['chain'][2]['directory']")" = ../img5/../img4 ] ||
  fail "img6: not a chain of 3"
restore_from "$WORK/img6"
say "7. copy-on-write against img4, soft recopy against that: a chain of 3, restored, memory right"
say "PASS"
