#!/usr/bin/env bash
# A --leave-running dump that lets the tasks go once their pages are copied
# (the patch contrib/criu/0005-*), on phos-test-pages-writer: a process that
# rewrites its MIB MiB (default 1024) of private memory pass after pass,
# without pause, with a cursor that says which pass each page holds, so that
# the memory of one instant can be told from a mix:
#   1. with criu's defaults criu's log says it copied every page with its
#      writer threads, "the tasks may resume" before it unfroze the task and
#      wrote the copies after; the process ran on while they were written
#      (its cursor moved) and is intact; killed, its image restored with
#      --leave-stopped holds exactly the memory of the freeze (every page of
#      the pass the restored cursor says, read through /proc/PID/mem), and
#      it runs on from there;
#   2. with --leave-running-copy-limit MIB/4 the log says where the copies
#      stopped, the pages past it were written before the resume, and the
#      image restores as exactly;
#   3. with the images on a tmpfs too small for the pages, the copies are
#      made, the task resumes, the write fails: criu fails the dump, says
#      why, removes inventory.img (as no failed dump has one) and a restore
#      is refused; the process runs on intact.
source "$(dirname "$0")/lib.sh"

WRITER=$BUILD/test/e2e/phos-test-pages-writer
[ -x "$WRITER" ] || fail "no $WRITER"
if ! "$CRIU" --help 2>&1 | grep -q -- --leave-running-copy-limit; then
  say "SKIP: $CRIU has no --leave-running-copy-limit (not the patched criu: contrib/scripts/install-criu.sh)"
  exit 77
fi
MIB=${PHOS_RESUME_COPIES_MIB:-1024}
MATCH="^$WRITER $MIB $WORK/result"
SMALL=$WORK/small
trap 'umount "$SMALL" 2>/dev/null || true; cleanup' EXIT

start_writer() {
  local _
  rm -f "$WORK/result"
  (unshare --pid --fork setsid "$WRITER" "$MIB" "$WORK/result" </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 600); do grep -qs ^ready "$WORK/result" && break; sleep 0.05; done
  grep -qs ^ready "$WORK/result" || fail "the writer did not start"
  WORKLOAD_PID=$(pgrep -o -f "$MATCH") || fail "no writer process"
  read -r _ WRITER_ADDR WRITER_BYTES WRITER_CURSOR < "$WORK/result"
  export WRITER_ADDR WRITER_BYTES WRITER_CURSOR
  PAGES=$(( 16#$WRITER_BYTES / 4096 ))
}
# self_check PID WHAT: the running writer checks its memory against its cursor.
self_check() {
  local _
  echo asked > "$WORK/result"
  kill -USR1 "$1"
  for _ in $(seq 600); do [ "$(cat "$WORK/result")" != asked ] && break; sleep 0.05; done
  grep -q "^ok " "$WORK/result" || fail "$2: the writer's memory is not one instant's: $(cat "$WORK/result")"
}
stop_writer() {
  local p
  for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
  wait_pid_free
}
# restore_exact WHAT: restore stopped; the memory is the freeze's; it runs on.
restore_exact() {
  local pid before after
  criu_restore --leave-stopped || fail "$1: criu restore failed: $(criu_errors "$WORK/restore.log")"
  pid=$(restored_pid) || fail "$1: no restored writer"
  RESTORED=$("$WRITER" check "$pid") || fail "$1: the restored memory is not the freeze's: $RESTORED"
  before=$("$WRITER" state "$pid")
  kill -CONT "$pid"
  sleep 0.3
  after=$("$WRITER" state "$pid")
  [ "$after" -gt "$before" ] || fail "$1: the restored writer does not run on (cursor $before, then $after)"
  self_check "$pid" "$1 (restored, running)"
  stop_writer
}
# log_order A B: criu's log has a line matching A before one matching B
log_order() {
  local a b
  a=$(grep -n -m1 -- "$1" "$WORK/dump.log" | cut -d: -f1)
  b=$(grep -n -m1 -- "$2" "$WORK/dump.log" | cut -d: -f1)
  [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]
}
copied_line() { grep -o "Copied [0-9]* bytes of pages of [0-9]* tasks in .*" "$WORK/dump.log"; }

# 1. Copies, resume, writes.
start_writer
rm -rf "$IMG" && mkdir -p "$IMG"
criu_dump --leave-running || fail "defaults: criu dump failed: $(criu_errors "$WORK/dump.log")"
at_exit=$("$WRITER" state "$WORKLOAD_PID")
line=$(copied_line) || fail "defaults: criu's log has no 'Copied ... bytes of pages' line: $(grep -m2 -E 'Writing pages|resume after' "$WORK/dump.log")"
read -r copied before < <(sed -n 's/^Copied \([0-9]*\) bytes .*(\([0-9]*\) bytes written before).*/\1 \2/p' <<< "$line")
[ "${copied:-0}" -ge $((MIB << 20)) ] || fail "defaults: copied ${copied:-no} bytes, not the writer's $MIB MiB: $line"
[ "${before:-1}" -eq 0 ] || fail "defaults: $before bytes were written before the resume: $line"
log_order "the tasks may resume" "Unfreezing tasks" || fail "defaults: criu unfroze the task before its pages were copied"
log_order "Unfreezing tasks" "Wrote [0-9]* bytes of pages" || fail "defaults: criu wrote the pages before it unfroze the task"
[ ! -e "$IMG/inventory.img" ] && fail "defaults: no inventory.img after a successful dump"
self_check "$WORKLOAD_PID" "defaults (running on)"
stop_writer
restore_exact "defaults"
read -r _ pass page <<< "$RESTORED"
frozen=$(( pass * PAGES + page ))
[ "$at_exit" -gt "$frozen" ] || fail "defaults: the writer did not run while criu wrote its pages (cursor $frozen at the freeze, $at_exit at criu's exit)"
passes=$(awk -v a="$at_exit" -v f="$frozen" -v p="$PAGES" 'BEGIN {printf "%.1f", (a - f) / p}')
say "defaults: $line; the writer rewrote its memory $passes times between the freeze and criu's exit; the image restored holds the freeze's (pass $pass, page $page) and runs on"

# 2. A copy limit: the rest written before the resume.
limit=$((MIB / 4))
start_writer
rm -rf "$IMG" && mkdir -p "$IMG"
criu_dump --leave-running --leave-running-copy-limit "$limit" || fail "limit: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "Copies of pages would pass $limit MiB" "$WORK/dump.log" || fail "limit: the log does not say where the copies stopped"
line=$(copied_line) || fail "limit: no 'Copied' line"
read -r copied before < <(sed -n 's/^Copied \([0-9]*\) bytes .*(\([0-9]*\) bytes written before).*/\1 \2/p' <<< "$line")
[ "${copied:-0}" -gt 0 ] && [ "$copied" -le $((limit << 20)) ] || fail "limit: copied ${copied:-no} bytes, limit $limit MiB: $line"
[ "${before:-0}" -gt 0 ] || fail "limit: nothing written before the resume: $line"
self_check "$WORKLOAD_PID" "limit (running on)"
stop_writer
restore_exact "limit"
say "--leave-running-copy-limit $limit: $line; restored exactly"

# 3. The write fails after the resume.
mkdir -p "$SMALL"
mount -t tmpfs -o size=$((MIB / 2))m phos-e2e-small "$SMALL" || fail "cannot mount a tmpfs at $SMALL"
start_writer
if IMG=$SMALL criu_dump --leave-running; then fail "full tmpfs: criu dump succeeded with $((MIB / 2)) MiB for $MIB MiB of pages"; fi
grep -q "Can't write the copy of pages of .*No space left on device" "$WORK/dump.log" ||
  fail "full tmpfs: the log does not say the copies could not be written: $(criu_errors "$WORK/dump.log")"
log_order "Unfreezing tasks" "Can't write the copy of pages" || fail "full tmpfs: the write failed before the resume"
grep -q "Removed inventory.img" "$WORK/dump.log" || fail "full tmpfs: criu did not remove inventory.img"
[ -e "$SMALL/inventory.img" ] && fail "full tmpfs: the failed dump left inventory.img"
self_check "$WORKLOAD_PID" "full tmpfs (running on)"
stop_writer
IMG=$SMALL restore_refused "inventory" "the failed dump's images"
say "a write failing after the resume: dump failed, inventory.img removed, restore refused; the writer ran on intact"
say "PASS"
