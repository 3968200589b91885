#!/usr/bin/env bash
# criu's dump and restore of a CPU process's private pages, unpatched criu
# 4.2.1 beside the patched one (contrib/criu/*.patch), in one run: for each
# size (GiB; default 1 4 16) a process (phos-criu-pages-hog) with that much
# dirty anonymous memory in 4 VMAs and 16 threads is dumped into a tmpfs and
# restored, PHOS_BENCH_RUNS times (default 3) alternating the two criu
# binaries, and its memory is checked after each restore. Times are criu's
# own, from its log's timestamps: dump = "Dumping finished successfully",
# restore = "Restore finished successfully" (both include criu's fixed costs,
# tens of ms); GB/s = bytes of pages written / that time. The table gives the
# median run and [min-max].
#
#   test/bench/criu_pages.sh [GIB...]
#
# Environment:
#   CRIU            the patched criu (default /usr/local/sbin/criu)
#   CRIU_UNPATCHED  unpatched criu 4.2.1 (default: the one install-criu.sh
#                   builds with PHOS_CRIU_UNPATCHED=1, under
#                   /var/cache/phos-criu/unpatched, or the bundle's)
#   PHOS_BUILD      build tree with test/bench/phos-criu-pages-hog (default build)
#   PHOS_BENCH_DIR  where the images go (default /dev/shm: a tmpfs)
#   PHOS_BENCH_RUNS runs per size and binary (default 3)
#   PATCHED_ARGS    extra options for the patched criu's restore, e.g.
#                   "--page-read-threads 16" (default: none, i.e. automatic)
# A size that does not fit (twice its size in available memory, and its size
# in the image directory's free space, plus 1 GiB) is skipped with a note.
# Needs root. A measurement to read, not a test.
set -euo pipefail
# shellcheck source=criu_bench_lib.sh
source "$(dirname "$0")/criu_bench_lib.sh"
criu_bench_init criu_pages
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1 4 16)

work=$(mktemp -d "$dir/phos-criu-pages.XXXXXX")
hog_pid=
cleanup() {
  if [ -n "$hog_pid" ]; then kill -9 "$hog_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

cpus=$(nproc)
echo "criu_pages: $(uname -r), $cpus CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)), images in $dir ($(stat -f -c %T "$dir"))"
echo "  unpatched: $CRIU_UNPATCHED ($(criu_bench_ver "$CRIU_UNPATCHED"))"
echo "  patched:   $CRIU ($(criu_bench_ver "$CRIU"))${PATCHED_ARGS:+, restore with $PATCHED_ARGS}"


# one_run KIND GIB OUT: dump and restore once, append "KIND GIB dump_s restore_s bytes" to OUT
one_run() {
  local kind=$1 gib=$2 out=$3 criu rargs=() d=$work/run
  if [ "$kind" = patched ]; then
    criu=$CRIU
    # shellcheck disable=SC2206
    rargs=(${PATCHED_ARGS:-})
  else
    criu=$CRIU_UNPATCHED
  fi
  rm -rf "$d" && mkdir -p "$d/img"
  setsid "$hog" $((gib * 1024)) "$d/result" 4 16 </dev/null >/dev/null 2>&1 &
  hog_pid=$!
  disown  # no "Killed" notice when the dump ends it; the shell still reaps it
  local waited=0
  until [ "$(cat "$d/result" 2>/dev/null)" = ready ]; do
    sleep 0.1; waited=$((waited + 1))
    if [ $waited -gt 3000 ] || ! kill -0 "$hog_pid" 2>/dev/null; then echo "criu_pages: the hog did not start" >&2; return 1; fi
  done
  if ! "$criu" dump -t "$hog_pid" -D "$d/img" -v4 -o "$d/dump.log"; then
    echo "criu_pages: $kind dump failed: $(grep Error "$d/dump.log" | head -n3)" >&2; return 1
  fi
  # Its pid must be free again for the restore.
  waited=0
  while [ -e "/proc/$hog_pid" ] && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited + 1)); done
  local bytes
  bytes=$(du -bc "$d"/img/pages-*.img | tail -n1 | cut -f1)
  if ! "$criu" restore "${rargs[@]}" -D "$d/img" -d -v4 -o "$d/restore.log"; then
    echo "criu_pages: $kind restore failed: $(grep Error "$d/restore.log" | grep -v RLIMIT_NOFILE | head -n3)" >&2; return 1
  fi
  kill -USR1 "$hog_pid"
  waited=0
  while [ "$(cat "$d/result")" = ready ]; do
    sleep 0.1; waited=$((waited + 1))
    if [ $waited -gt 3000 ]; then echo "criu_pages: the restored process did not answer" >&2; return 1; fi
  done
  if [ "$(cat "$d/result")" != ok ]; then
    echo "criu_pages: $kind: memory differs after restore: $(cat "$d/result")" >&2; return 1
  fi
  kill -9 "$hog_pid" 2>/dev/null || true
  hog_pid=
  echo "$kind $gib $(criu_bench_stamp "$d/dump.log" 'Dumping finished successfully') $(criu_bench_stamp "$d/restore.log" 'Restore finished successfully') $bytes" >> "$out"
  rm -rf "$d"
}

results=$work/results
: > "$results"
for gib in "${sizes[@]}"; do
  avail_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
  free_kib=$(df -k --output=avail "$dir" | tail -n1 | tr -d ' ')
  need_mem=$(( (2 * gib + 1) * 1024 * 1024 )) need_disk=$(( (gib + 1) * 1024 * 1024 ))
  if [ "$avail_kib" -lt "$need_mem" ] || [ "$free_kib" -lt "$need_disk" ]; then
    echo "skip $gib GiB: needs $((2 * gib + 1)) GiB of available memory (have $((avail_kib / 1048576))) and $((gib + 1)) GiB free in $dir (have $((free_kib / 1048576)))" >> "$results.notes"
    continue
  fi
  for _ in $(seq "$runs"); do
    one_run unpatched "$gib" "$results"
    one_run patched "$gib" "$results"
  done
done

python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, gib, d, r, b = line.split()
    rows.setdefault((int(gib), kind), []).append((float(d), float(r), int(b)))
def cell(vals, nbytes):
    m = statistics.median(vals)
    return f"{m:6.2f} [{min(vals):.2f}-{max(vals):.2f}]", f"{nbytes / m / 1e9:5.2f}"
print()
print("| GiB | criu | dump s [min-max] | dump GB/s | restore s [min-max] | restore GB/s |")
print("| ---: | --- | ---: | ---: | ---: | ---: |")
for gib in sorted({g for g, _ in rows}):
    med = {}
    for kind in ("unpatched", "patched"):
        v = rows.get((gib, kind))
        if not v:
            continue
        nbytes = statistics.median([x[2] for x in v])
        ds, dg = cell([x[0] for x in v], nbytes)
        rs, rg = cell([x[1] for x in v], nbytes)
        med[kind] = (statistics.median([x[0] for x in v]), statistics.median([x[1] for x in v]))
        print(f"| {gib} | {kind} | {ds} | {dg} | {rs} | {rg} |")
    if len(med) == 2:
        u, p = med["unpatched"], med["patched"]
        print(f"| {gib} | patched / unpatched | {u[0] / p[0]:.2f}x faster | | {u[1] / p[1]:.2f}x faster | |")
PY
if [ -f "$results.notes" ]; then cat "$results.notes"; fi
