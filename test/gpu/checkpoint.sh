#!/usr/bin/env bash
# GPU checkpoint and restore through the real criu and the phos plugin, on a
# GPU host (after test/gpu/run-on-host.sh): a CUDA process holding MIB MiB of
# device memory
#   1. dumped with --leave-running: it carries on with its device state (the
#      image written behind it, from a snapshot on the GPU, where that fits);
#   2. killed and restored from that image: it carries on from the dump, every
#      byte of device memory re-verified (so the image is the memory as it was
#      at the dump, not as the running process changed it after);
#   3. the restored process dumped and restored into a new process: token,
#      host and device counters carry on, every byte re-verified;
#   4. restored from an image with a corrupted chunk: refused, no process left.
# usage: checkpoint.sh [MIB]
MIB=${1:-1024}
PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter
# The driver's fd-exportable memory fails in a pid namespace that sees the
# host's /proc; containers mount their own.
PHOS_NO_PIDNS=1
source "$(dirname "$0")/../e2e/lib.sh"
TEST_NAME=checkpoint_${MIB}MiB
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }
# The device counter equals the host counter and nothing failed verification
# (one read: the workload rewrites the file every step).
consistent() {
  local token host device errors
  read -r token host device errors _ < "$WORK/state"
  [ "$host" = "$device" ] && [ "$errors" = 0 ]
}
phos_log() { grep -o "phos: .*" "$1" | grep -vE "initialized|left to other" | sed 's/^/    /'; }

start_workload --preload "$MIB"
wait_counter_above 5
token=$(state_token)

t0=$(now); criu_dump --leave-running || fail "criu dump --leave-running failed"; t1=$(now)
at=$(state_counter)
wait_counter_above $((at + 20))
consistent || fail "after the leave-running dump: $(cat "$WORK/state")"
"$PHOSCTL" verify "$IMG" > "$WORK/verify.txt" || fail "phosctl verify: $(cat "$WORK/verify.txt")"
say "leave-running dump in $(elapsed "$t0" "$t1") s; the process carries on: $(cat "$WORK/state")"
phos_log "$WORK/dump.log"
"$PHOSCTL" show "$IMG" | sed 's/^/    /'
cat "$WORK/verify.txt" | sed 's/^/    /'
slices=$(( (MIB + 63) / 64 ))

# The leave-running image, restored: its memory is the memory of the dump.
kill -9 "$WORKLOAD_PID"
wait_pid_free
rm -f "$WORK/state"  # what the killed process wrote last is not the restored one's
t2=$(now); criu_restore || fail "criu restore of the leave-running image failed"; t3=$(now)
pid=$(restored_pid) || fail "no process restored from the leave-running image"
for _ in $(seq 200); do [ -s "$WORK/state" ] && break; sleep 0.05; done
at=$(state_counter 2>/dev/null || echo 0)
wait_counter_above $((at + slices + 5)) $((slices / 20 + 10))
[ "$(state_token)" = "$token" ] || fail "token changed after restoring the leave-running image"
consistent || fail "after restoring the leave-running image: $(cat "$WORK/state")"
say "leave-running image restored in $(elapsed "$t2" "$t3") s as pid $pid: all $slices slices re-verified, 0 errors"
phos_log "$WORK/restore.log"
WORKLOAD_PID=$pid

rm -rf "$IMG" && mkdir "$IMG"
t0=$(now); criu_dump || fail "criu dump failed"; t1=$(now)
dumped=$(state_counter)
[ -z "$(workload_pids)" ] || fail "process still running after the dump"
wait_pid_free
t2=$(now); criu_restore || fail "criu restore failed"; t3=$(now)
pid=$(restored_pid) || fail "no restored process"
wait_counter_above $((dumped + slices + 5)) $((slices / 20 + 10))
[ "$(state_token)" = "$token" ] || fail "token changed after restore"
consistent || fail "after restore: $(cat "$WORK/state")"
say "dump in $(elapsed "$t0" "$t1") s, restore in $(elapsed "$t2" "$t3") s; restored as pid $pid: counter $dumped -> $(state_counter), device counter in step, all $slices slices re-verified, 0 errors"
phos_log "$WORK/dump.log"
phos_log "$WORK/restore.log"
kill -9 "$pid"; sleep 0.5

# criu restore leaves the images as they were: damage them in place (no
# copy of a 32 GiB image).
data=$(ls "$IMG"/phos-*-data-0.img 2>/dev/null | head -n1) || true
[ -n "$data" ] || fail "no GPU data file in the image"
printf '\xff' | dd of="$data" bs=1 seek=$((4096 + 12345)) conv=notrunc status=none
restore_refused "checksum mismatch" "a corrupted image"
say "corrupted chunk: restore refused: $(grep -o "phos: Error: .*" "$WORK/restore.log" | head -n1)"
say "PASS"
