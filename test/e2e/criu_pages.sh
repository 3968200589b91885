#!/usr/bin/env bash
# criu's restore of private pages with several threads (the patch in
# contrib/criu/): a process with 256 MiB of private memory in 4 VMAs with
# holes (many page runs) and 8 threads, as init of its own pid namespace, is
# dumped and restored
#   1. with criu's defaults: the restorer reads its pages with 2 or more
#      threads (on a machine with 2 or more CPUs), and every page is intact;
#   2. again with --page-read-threads 1 (the one-thread path);
#   3. where an unpatched criu 4.2.1 is at hand (CRIU_UNPATCHED, or the one
#      `PHOS_CRIU_UNPATCHED=1 install-criu.sh` builds): its image restored by
#      the patched criu, and the patched criu's image by it.
# The process checks every page against its pattern after each restore.
source "$(dirname "$0")/lib.sh"

HOG=$BUILD/test/bench/phos-criu-pages-hog
[ -x "$HOG" ] || fail "no $HOG"
if ! "$CRIU" --help 2>&1 | grep -q -- --page-read-threads; then
  say "SKIP: $CRIU has no --page-read-threads (not the patched criu: contrib/scripts/install-criu.sh)"
  exit 77
fi
unpatched=${CRIU_UNPATCHED:-/var/cache/phos-criu/unpatched/sbin/criu}
MATCH="^$HOG 256 $WORK/result"
result() { cat "$WORK/result" 2>/dev/null || true; }

start_hog() {
  rm -f "$WORK/result"
  (unshare --pid --fork setsid "$HOG" 256 "$WORK/result" 4 8 7 </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 600); do [ "$(result)" = ready ] && break; sleep 0.05; done
  [ "$(result)" = ready ] || fail "the hog did not start"
  WORKLOAD_PID=$(pgrep -o -f "$MATCH") || fail "no hog process"
}
# check_restored WHAT: the restored process finds every page as it was.
check_restored() {
  WORKLOAD_PID=$(restored_pid) || fail "$1: no restored process"
  echo ready > "$WORK/result"
  kill -USR1 "$WORKLOAD_PID"
  for _ in $(seq 600); do [ "$(result)" != ready ] && break; sleep 0.05; done
  [ "$(result)" = ok ] || fail "$1: memory differs after the restore: $(result)"
}
# cycle WHAT DUMP_CRIU RESTORE_CRIU [RESTORE OPTIONS...]
cycle() {
  local what=$1 dump_criu=$2 restore_criu=$3
  shift 3
  rm -rf "$IMG" && mkdir -p "$IMG"
  CRIU=$dump_criu criu_dump || fail "$what: criu dump failed: $(criu_errors "$WORK/dump.log")"
  CRIU=$restore_criu criu_restore "$@" || fail "$what: criu restore failed: $(criu_errors "$WORK/restore.log")"
  check_restored "$what"
}

start_hog
cycle "defaults" "$CRIU" "$CRIU"
readers=$(sed -n 's/.*Read [0-9]* bytes of pages in \([0-9]*\) threads.*/\1/p' "$WORK/restore.log")
if [ "$(nproc)" -ge 2 ]; then
  [ -n "$readers" ] && [ "$readers" -ge 2 ] || fail "the restore read the pages in ${readers:-one} thread(s) on $(nproc) CPUs"
fi
say "restore with criu's defaults: pages read by ${readers:-1} threads, all 65536 pages (with holes) intact"

cycle "one thread" "$CRIU" "$CRIU" --page-read-threads 1
grep -q "Read [0-9]* bytes of pages in" "$WORK/restore.log" && fail "--page-read-threads 1 read in several threads"
say "restore with --page-read-threads 1: intact"

if [ -x "$unpatched" ] && ! "$unpatched" --help 2>&1 | grep -q -- --page-read-threads; then
  cycle "unpatched image, patched restore" "$unpatched" "$CRIU"
  cycle "patched image, unpatched restore" "$CRIU" "$unpatched"
  say "images of the unpatched criu restore with the patched one, and the other way round"
else
  say "no unpatched criu at $unpatched: image compatibility not checked"
fi
say "PASS"
