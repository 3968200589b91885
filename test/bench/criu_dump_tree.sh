#!/usr/bin/env bash
# criu's leave-running dump of a process tree with gigabytes of private
# pages, unpatched criu 4.2.1 beside the patched one (contrib/criu/*.patch),
# in one run: a launcher (sh) with PROCS children (phos-criu-pages-hog, MIB
# MiB of dirty anonymous memory each in 4 VMAs, 8 threads), the shape of a
# torchrun job, is dumped with --leave-running into a tmpfs, PHOS_BENCH_RUNS
# times (default 3) alternating three criu runs:
#   unpatched      criu 4.2.1 as released
#   serial         the patched criu with --page-write-threads 1 (its old path)
#   written        the patched criu with --leave-running-copy-limit 0: writer
#                  threads, the tasks frozen until every page is written
#                  (0002-*); only where the criu has the option (0005-*)
#   patched        the patched criu with its defaults (writer threads; the
#                  tasks resume once their pages are copied, 0005-*)
# After every dump each child checks every page of its memory (the dump must
# leave it as it was) before the tree is killed.
#
# Figures are criu's own: the stall is what --display-stats calls freezing
# time + frozen time (from the first task stopped to the last one running
# again); dump s is the log's timestamp of "Dumping finished successfully";
# GB/s = bytes of pages-*.img / stall; criu CPU s = user + system time of
# the criu process, its threads included (the parasite's work is the
# target's). The table gives the median run and [min-max].
#
#   test/bench/criu_dump_tree.sh [PROCS [MIB]]      (default 4 1024)
#
# Environment: CRIU, CRIU_UNPATCHED, PHOS_BUILD, PHOS_BENCH_DIR (default
# /dev/shm), PHOS_BENCH_RUNS, PATCHED_ARGS (extra dump options for the
# patched row, e.g. "--page-write-threads 16"), as in criu_pages.sh.
# Needs root. A measurement to read, not a test.
set -euo pipefail
# shellcheck source=criu_bench_lib.sh
source "$(dirname "$0")/criu_bench_lib.sh"
criu_bench_init criu_dump_tree
procs=${1:-4}
mib=${2:-1024}

if ! "$CRIU" --help 2>&1 | grep -q -- --page-write-threads; then
  echo "criu_dump_tree: $CRIU has no --page-write-threads (not the patched criu: contrib/scripts/install-criu.sh)" >&2
  exit 1
fi
avail_kib=$(sed -n 's/^MemAvailable: *\([0-9]*\) kB/\1/p' /proc/meminfo)
need_kib=$(( (2 * procs * mib + 1024) * 1024 ))
if [ "$avail_kib" -lt "$need_kib" ]; then
  echo "criu_dump_tree: $procs x $mib MiB needs $((need_kib >> 20)) GiB of available memory (have $((avail_kib >> 20)))" >&2
  exit 1
fi

work=$(mktemp -d "$dir/phos-criu-tree.XXXXXX")
root_pid=
cleanup() {
  if [ -n "$root_pid" ]; then kill -9 -- "-$root_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "criu_dump_tree: $(uname -r), $(nproc) CPUs ($(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1)), images in $dir ($(stat -f -c %T "$dir")), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  tree: sh + $procs x phos-criu-pages-hog with $mib MiB each, --leave-running, $runs runs"
echo "  unpatched: $CRIU_UNPATCHED ($(criu_bench_ver "$CRIU_UNPATCHED"))"
echo "  patched:   $CRIU ($(criu_bench_ver "$CRIU"))${PATCHED_ARGS:+, dump with $PATCHED_ARGS}"

us() { sed -n "s/^$2: \([0-9]*\) us/\1/p" "$1" | head -n1; }

# wait_result FILE =|!= TEXT: until FILE's text is (or is not) TEXT, 300 s at most
wait_result() {
  local waited=0
  until [ "$(cat "$1" 2>/dev/null)" "$2" "$3" ]; do
    sleep 0.1; waited=$((waited + 1))
    [ $waited -le 3000 ] || return 1
  done
}

# start_tree DIR: the launcher and its children, each ready
start_tree() {
  local d=$1 i cmd=""
  for i in $(seq "$procs"); do cmd+="\"$hog\" $mib $d/result.$i 4 8 & "; done
  setsid sh -c "${cmd}wait" </dev/null >/dev/null 2>&1 &
  root_pid=$!
  disown  # no "Killed" notice when the run ends it
  for i in $(seq "$procs"); do
    wait_result "$d/result.$i" = ready || { echo "criu_dump_tree: child $i did not start" >&2; return 1; }
  done
}

# check_tree DIR: every child finds its memory as it was
check_tree() {
  local d=$1 i pid
  for pid in $(pgrep -P "$root_pid"); do kill -USR1 "$pid"; done
  for i in $(seq "$procs"); do
    wait_result "$d/result.$i" != ready || { echo "criu_dump_tree: child $i did not answer" >&2; return 1; }
    if [ "$(cat "$d/result.$i")" != ok ]; then
      echo "criu_dump_tree: child $i: memory differs after the dump: $(cat "$d/result.$i")" >&2; return 1
    fi
  done
}

# one_run KIND OUT: append "KIND stall_s dump_s bytes" to OUT
one_run() {
  local kind=$1 out=$2 criu args=() d=$work/run
  case $kind in
    unpatched) criu=$CRIU_UNPATCHED ;;
    serial) criu=$CRIU; args=(--page-write-threads 1) ;;
    written) criu=$CRIU; args=(--leave-running-copy-limit 0) ;;
    # shellcheck disable=SC2206
    patched) criu=$CRIU; args=(${PATCHED_ARGS:-}) ;;
  esac
  rm -rf "$d" && mkdir -p "$d/img"
  start_tree "$d"
  local TIMEFORMAT="%U %S"  # bash's time: criu's user and system seconds
  if ! { time "$criu" dump -t "$root_pid" -D "$d/img" --leave-running --display-stats "${args[@]}" -v4 -o dump.log \
           > "$d/stats" 2>&1; } 2> "$d/cpu"; then
    echo "criu_dump_tree: $kind dump failed: $(grep Error "$d/img/dump.log" | head -n3)" >&2; return 1
  fi
  check_tree "$d"
  kill -9 -- "-$root_pid" 2>/dev/null || true
  root_pid=
  local bytes freezing frozen
  bytes=$(du -bc "$d"/img/pages-*.img | tail -n1 | cut -f1)
  freezing=$(us "$d/stats" "Freezing time") frozen=$(us "$d/stats" "Frozen time")
  grep -h "Writing pages\|Wrote .* bytes of pages\|Copied .* bytes of pages of" "$d/img/dump.log" | sed "s/^/  $kind: /" | head -n3 >&2 || true
  echo "$kind $(( freezing + frozen )) $(criu_bench_stamp "$d/img/dump.log" 'Dumping finished successfully') $bytes $(awk '{print $1 + $2}' "$d/cpu")" >> "$out"
  rm -rf "$d"
}

kinds=(unpatched serial patched)
"$CRIU" --help 2>&1 | grep -q -- --leave-running-copy-limit && kinds=(unpatched serial written patched)
results=$work/results
: > "$results"
for _ in $(seq "$runs"); do
  for kind in "${kinds[@]}"; do one_run "$kind" "$results"; done
done

python3 - "$results" "$procs" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, stall_us, dump_s, nbytes, cpu_s = line.split()
    rows.setdefault(kind, []).append((int(stall_us) / 1e6, float(dump_s), int(nbytes), float(cpu_s)))
def cell(vals):
    return f"{statistics.median(vals):5.2f} [{min(vals):.2f}-{max(vals):.2f}]"
print()
print(f"| criu ({sys.argv[2]} children) | GB of pages | stall s [min-max] | dump s [min-max] | GB/s (of the stall) | criu CPU s |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
med = {}
for kind in ("unpatched", "serial", "written", "patched"):
    v = rows.get(kind)
    if not v:
        continue
    gb = statistics.median([x[2] for x in v]) / 1e9
    med[kind] = statistics.median([x[0] for x in v])
    cpu = statistics.median([x[3] for x in v])
    print(f"| {kind} | {gb:.2f} | {cell([x[0] for x in v])} | {cell([x[1] for x in v])} | {gb / med[kind]:.2f} | {cpu:.2f} |")
if "unpatched" in med and "patched" in med:
    print(f"| patched / unpatched | | {med['unpatched'] / med['patched']:.2f}x shorter | | | |")
PY
