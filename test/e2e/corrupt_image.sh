#!/usr/bin/env bash
# (c) A damaged GPU image makes restore fail with a message that says what is
# wrong, and no process is left running: a flipped byte in the manifest's
# contents, a missing completion marker, a damaged manifest header. (Unit
# tests cover the rest: versions, truncation, data chunks.)
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
criu_dump || fail "criu dump failed"
cp -a "$IMG" "$WORK/pristine"

# try_restore CASE EXPECTED_MESSAGE
try_restore() {
  if criu_restore; then fail "$1: restore succeeded on a damaged image"; fi
  grep -q "$2" "$WORK/restore.log" || fail "$1: restore log does not say '$2'"
  sleep 0.2
  [ -z "$(workload_pids)" ] || fail "$1: a process is running after the failed restore"
  say "$1: restore refused: $(grep -o "phos: Error: .*" "$WORK/restore.log" | head -n1)"
  rm -rf "$IMG" && cp -a "$WORK/pristine" "$IMG"
}

size=$(stat -c %s "$IMG/phos-1-manifest.img")
printf '\xff' | dd of="$IMG/phos-1-manifest.img" bs=1 seek=$((size - 3)) conv=notrunc status=none
try_restore "flipped byte" "phos-1-manifest.img: manifest: payload checksum mismatch"

rm "$IMG/phos-1-complete.img"
try_restore "missing marker" "incomplete image: phos-1-complete.img is missing"

printf '\x09' | dd of="$IMG/phos-1-manifest.img" bs=1 seek=8 conv=notrunc status=none
try_restore "damaged header" "phos-1-manifest.img: manifest: header checksum mismatch"

# The pristine image still restores.
criu_restore || fail "restore of the undamaged image failed"
restored_pid >/dev/null || fail "no process after restoring the undamaged image"
say "undamaged image restores"
say "PASS"
