#!/usr/bin/env bash
# criu's dump writing the tasks' pages with several threads (the patch
# contrib/criu/0002-*): a tree as init of its own pid namespace, a launcher
# (sh) and three children with 256 MiB of private memory each in 4 VMAs with
# holes (many page runs) and 8 threads, the shape of a torchrun job, is
#   1. dumped with criu's defaults: criu's log says the pages were written by
#      2 or more threads (on a machine with 2 or more CPUs), all 4 tasks'
#      pages, each child's image through a shared mapping (0006), 4 or
#      more page pipes filled per call to a parasite (0007); restored,
#      every child finds every page as it was;
#   2. dumped with --leave-running: the children run on with their memory
#      intact, and the image restores intact once they are gone;
#   3. dumped with --page-write-threads 1: the log says the main thread wrote
#      the pages (the old path), and the image restores intact;
#   4. where an unpatched criu 4.2.1 is at hand (CRIU_UNPATCHED, or the one
#      `PHOS_CRIU_UNPATCHED=1 install-criu.sh` builds): the patched criu's
#      image restored by it;
#   5. dumped into a tmpfs too small for its images: criu exits 1 naming
#      the failed write (no SIGBUS from the mapped image), the tree runs on.
# Each child checks every page against its pattern when asked (SIGUSR1).
# PHOS_DUMP_PAGES_MIB sets each child's memory (default 256; e.g. 1024 for a
# few GB in all).
source "$(dirname "$0")/lib.sh"

HOG=$BUILD/test/bench/phos-criu-pages-hog
[ -x "$HOG" ] || fail "no $HOG"
if ! "$CRIU" --help 2>&1 | grep -q -- --page-write-threads; then
  say "SKIP: $CRIU has no --page-write-threads (not the patched criu: contrib/scripts/install-criu.sh)"
  exit 77
fi
unpatched=${CRIU_UNPATCHED:-/var/cache/phos-criu/unpatched/sbin/criu}
CHILDREN=3
MIB=${PHOS_DUMP_PAGES_MIB:-256}
MATCH="^sh -c .*$WORK/result"
CHILD_MATCH="^$HOG $MIB $WORK/result"

start_tree() {
  local i cmd=""
  rm -f "$WORK"/result.*
  for i in $(seq "$CHILDREN"); do cmd+="$HOG $MIB $WORK/result.$i 4 8 7 & "; done
  (unshare --pid --fork setsid sh -c "${cmd}wait" </dev/null >/dev/null 2>&1 &)
  for i in $(seq "$CHILDREN"); do
    for _ in $(seq 600); do [ "$(cat "$WORK/result.$i" 2>/dev/null)" = ready ] && break; sleep 0.05; done
    [ "$(cat "$WORK/result.$i" 2>/dev/null)" = ready ] || fail "child $i did not start"
  done
  WORKLOAD_PID=$(pgrep -o -f "$MATCH") || fail "no launcher process"
}
# check_children WHAT: every child finds every page as it was.
check_children() {
  local i p
  [ "$(pgrep -f "$CHILD_MATCH" | wc -l)" -eq "$CHILDREN" ] || fail "$1: not $CHILDREN children running"
  for i in $(seq "$CHILDREN"); do echo ready > "$WORK/result.$i"; done
  for p in $(pgrep -f "$CHILD_MATCH"); do kill -USR1 "$p"; done
  for i in $(seq "$CHILDREN"); do
    for _ in $(seq 600); do [ "$(cat "$WORK/result.$i")" != ready ] && break; sleep 0.05; done
    [ "$(cat "$WORK/result.$i")" = ok ] || fail "$1: child $i: memory differs: $(cat "$WORK/result.$i")"
  done
}
stop_tree() {
  local p
  for p in $(workload_pids) $(pgrep -f "$CHILD_MATCH"); do kill -9 "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do [ -z "$(pgrep -f "$CHILD_MATCH")" ] && break; sleep 0.05; done
}
# restore_check WHAT RESTORE_CRIU: restore the image, check, stop the tree.
restore_check() {
  CRIU=$2 criu_restore || fail "$1: criu restore failed: $(criu_errors "$WORK/restore.log")"
  restored_pid >/dev/null || fail "$1: no restored launcher"
  check_children "$1"
  stop_tree
}
# dump_tree WHAT [DUMP OPTIONS...]
dump_tree() {
  local what=$1
  shift
  rm -rf "$IMG" && mkdir -p "$IMG"
  criu_dump "$@" || fail "$what: criu dump failed: $(criu_errors "$WORK/dump.log")"
}
writers() { sed -n 's/.*Wrote [0-9]* bytes of pages of \([0-9]*\) tasks with \([0-9]*\) threads.*/\1 \2/p' "$WORK/dump.log"; }

start_tree
dump_tree "defaults"
read -r tasks threads <<< "$(writers)"
[ "${tasks:-0}" -eq $((CHILDREN + 1)) ] || fail "the writers wrote the pages of ${tasks:-no} tasks, not $((CHILDREN + 1))"
if [ "$(nproc)" -ge 2 ]; then
  [ "${threads:-0}" -ge 2 ] || fail "the pages were written by ${threads:-no} threads on $(nproc) CPUs"
fi
# Many pipes filled per round trip to a parasite (0007): a call follows the
# PPB lines of the pipes it fills.
read -r pipes calls < <(awk '/PPB: / {p++; after = 1; next} /Sent msg to daemon/ {if (after) c++; after = 0; next}
  /^\(/ {after = 0} END {print p + 0, c + 0}' "$WORK/dump.log")
[ "$calls" -gt 0 ] && [ $((pipes / calls)) -ge 4 ] ||
  fail "$pipes page pipes filled in $calls calls to the parasites: not 4 or more a call"
# Each child's image filled through a shared mapping, by any writer (0006).
mapped=$(grep -c "bytes of pages of [0-9]* in [0-9]* segments, 0 of them copied first, into the image mapped" "$WORK/dump.log")
[ "$mapped" -ge "$CHILDREN" ] ||
  fail "$mapped tasks' images were filled through a mapping, not $CHILDREN or more: $(grep -o "page-xfer: .*segments.*" "$WORK/dump.log" | head -n2)"
wait_pid_free
restore_check "defaults" "$CRIU"
say "dump with criu's defaults: $tasks tasks' pages written by $threads threads; restored, every page (with holes) intact"

start_tree
dump_tree "leave-running" --leave-running
check_children "leave-running (running on)"
stop_tree
restore_check "leave-running (restored)" "$CRIU"
say "dump with --leave-running: the children run on intact, and the image restores intact"

start_tree
dump_tree "one thread" --page-write-threads 1
grep -q "Writing pages in the main thread (--page-write-threads 1)" "$WORK/dump.log" \
  || fail "--page-write-threads 1: the log does not say the main thread wrote the pages"
[ -z "$(writers)" ] || fail "--page-write-threads 1 wrote with writer threads"
restore_check "one thread" "$CRIU"
say "dump with --page-write-threads 1 (main thread): restored intact"

if [ -x "$unpatched" ] && ! "$unpatched" --help 2>&1 | grep -q -- --page-write-threads; then
  start_tree
  dump_tree "patched image for the unpatched criu"
  restore_check "patched image, unpatched restore" "$unpatched"
  say "the unpatched criu restores the patched criu's image intact"
else
  say "no unpatched criu at $unpatched: image compatibility not checked"
fi
# 5. Images on a file system too small for them: the mapped writes fail
# with an error (their population), not a SIGBUS in criu; the dump fails and
# the tree runs on intact.
small=$WORK/small
mkdir -p "$small" && mount -t tmpfs -o size=$((MIB / 2))m tmpfs "$small" || fail "cannot mount a small tmpfs"
start_tree
rc=0
"$CRIU" dump -t "$WORKLOAD_PID" -D "$small" -v4 -o "$WORK/small.log" >/dev/null 2>&1 || rc=$?
umount -l "$small"
[ "$rc" -eq 1 ] || fail "a dump onto a full file system exited $rc, not 1 (a signal is above 128)"
grep -q "Can't write pages of [0-9]* into its image" "$WORK/small.log" ||
  fail "a full file system: the log does not say which pages failed: $(grep -m2 Error "$WORK/small.log")"
check_children "a full file system (running on)"
stop_tree
say "a dump onto a file system too small for the images: it fails (exit 1, the write named), the tree runs on intact"
say "PASS"
