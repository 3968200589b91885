#!/usr/bin/env bash
# The checkpoint benchmark, on a GPU host (after
# `source test/gpu/run-on-host.sh`): criu 4.1.1 with the phos plugin and
# criu 4.1.1 with its own cuda plugin, side by side in one run, on the same
# CUDA process (gpu_counter) holding SIZE MiB of device memory, with the
# images on memory-backed storage (shm: a directory on /dev/shm) and on disk
# (disk: a directory on a disk file system, PHOS_BENCH_DISK, by default
# phos-bench under the disk scratch directory below).
#
# For each (tool, size, storage):
#   1. start the workload (with LD_PRELOAD=libphos.so for phos; without for
#      the cuda plugin, which runs cuda-checkpoint from PATH);
#   2. criu dump --leave-running: criu's wall time, and the stall the program
#      saw (the longest gap between two of its state writes, which it
#      measures itself: gpu_counter's 6th state field); it must carry on;
#   3. criu dump (the process ends): wall time, on disk also until the image
#      is synced; image size (du);
#   4. criu restore (from disk after dropping the page cache): wall time until
#      criu returns, and until the restored process has made progress; then
#      every byte of device memory is re-verified by the process itself.
# One CSV row per measurement is appended to the CSV, so that several calls
# fill one file; test/gpu/plot_bench.py prints the table and draws the plot.
#
# usage: bench_checkpoint.sh [--sizes MIB,...] [--storage shm,disk] [--tools phos,cuda_plugin]
#          [--csv FILE] [--png FILE] [--budget SECONDS] [--resume] [--plan] [--logs DIR]
#          [--disk-gbps GBPS] [--kill-stale]
#   --sizes     device memory of the workload, MiB (default 1024,8192,32768,65536)
#   --storage   where the images go: shm, disk (default both)
#   --tools     phos, cuda_plugin (default both)
#   --csv       results, appended (default $PHOS_BENCH_RESULTS/bench.csv:
#               outside the bundle, which make-bundle.sh replaces)
#   --png       the plot (default: the CSV's name with .png)
#   --budget    do not start a case whose estimate does not fit in what is
#               left of this many seconds (default 500: one 10-minute call
#               with room for estimates that are short); it is listed as
#               DEFERRED. Estimates grow by what each (tool, storage) took
#               over its estimate earlier in the run.
#   --resume    skip cases that already have a result (ok or failed) in the CSV
#   --plan      print the cases, their estimates and SKIPs; run nothing
#   --logs      criu's logs of every case, gzipped (default ${OUT:-$PHOS_BENCH_RESULTS}/logs)
#   --disk-gbps disk speed assumed by the estimates (default 1.0)
#   --kill-stale  kill workloads an earlier run left behind (a call cut off
#               at its time limit); without it they are only named
# PHOS_BENCH_SHM / PHOS_BENCH_DISK override the two image directories.
# With $OUT set, the CSV, the table, the plot and the logs are copied there
# after every case, so a call cut off at its time limit still returns them.
#
# Run time per case (estimate_s below; measured on an H200 with compare.sh:
# phos 32 GiB ~15 s per dump or restore, the cuda plugin 32 GiB ~36 s dump and
# ~24 s restore, its leave-running dump both; the workload starts in a few
# seconds and fills memory at ~1 TB/s; re-verification after a restore reads
# one 64 MiB slice per ~10 ms step, ~0.17 s per GiB), roughly, shm:
#             1 GiB   8 GiB   32 GiB   64 GiB
#   phos       17 s    28 s     68 s    122 s
#   cuda      19 s    47 s    141 s    SKIP (host RAM: 64 process + 64 image)
# disk adds 3 x SIZE / disk speed (two dumps written and synced, one restore
# read); at 1 GB/s: +3 s, +26 s, +103 s; 64 GiB does not fit the disk. So
# shm, both tools, all sizes is ~7.5 min: one call; disk ~10 min: two calls
# (the same command with --resume; --budget decides where a call stops).
set -uo pipefail
export LC_ALL=C   # a '.' in EPOCHREALTIME and printf
here=$(cd "$(dirname "$0")" && pwd)

SIZES=1024,8192,32768,65536 STORAGES=shm,disk TOOLS=phos,cuda_plugin
# Scratch on a disk (not tmpfs), kept between calls while the host stays up:
# PHOS_BENCH_SCRATCH, else the system's place for such files (FHS /var/tmp).
SCRATCH=${PHOS_BENCH_SCRATCH:-/var/tmp}
RESULTS=${PHOS_BENCH_RESULTS:-$SCRATCH/phos-bench-results}
CSV='' PNG='' BUDGET=500 RESUME='' PLAN='' LOGDIR=${OUT:-$RESULTS}/logs DISK_GBPS=1.0 KILL_STALE=
SHM_DIR=${PHOS_BENCH_SHM:-/dev/shm/phos-bench}
DISK_DIR=${PHOS_BENCH_DISK:-$SCRATCH/phos-bench}

die() { echo "bench: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) SIZES=${2:?}; shift 2 ;;
    --storage) STORAGES=${2:?}; shift 2 ;;
    --tools) TOOLS=${2:?}; shift 2 ;;
    --csv) CSV=${2:?}; shift 2 ;;
    --png) PNG=${2:?}; shift 2 ;;
    --budget) BUDGET=${2:?}; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --plan) PLAN=1; shift ;;
    --logs) LOGDIR=${2:?}; shift 2 ;;
    --disk-gbps) DISK_GBPS=${2:?}; shift 2 ;;
    --kill-stale) KILL_STALE=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
IFS=, read -r -a SIZES <<<"$SIZES"
IFS=, read -r -a STORAGES <<<"$STORAGES"
IFS=, read -r -a TOOLS <<<"$TOOLS"
for s in "${SIZES[@]}"; do [[ $s =~ ^[1-9][0-9]*$ ]] || die "--sizes: $s is not a size in MiB"; done
for s in "${STORAGES[@]}"; do [[ $s = shm || $s = disk ]] || die "--storage: $s is neither shm nor disk"; done
for t in "${TOOLS[@]}"; do [[ $t = phos || $t = cuda_plugin ]] || die "--tools: $t is neither phos nor cuda_plugin"; done
[[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget: $BUDGET is not a number of seconds"
[[ $DISK_GBPS =~ ^[0-9]*\.?[0-9]+$ ]] || die "--disk-gbps: $DISK_GBPS is not a number"

: "${PHOS_BUNDLE:?run 'source test/gpu/run-on-host.sh' first}" "${PHOS_BUILD:?}" "${CRIU:?}"
CSV=${CSV:-$RESULTS/bench.csv}
PNG=${PNG:-${CSV%.csv}.png}
export PATH=$PHOS_BUILD/test/bench:$PATH   # cuda-checkpoint, for CRIU's cuda plugin
export PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter PHOS_NO_PIDNS=1
CUDA_PLUGIN_SO=$PHOS_BUNDLE/criu/cuda_plugin.so
PHOS_PLUGIN_SO=$PHOS_BUILD/plugin/phos_plugin.so
RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)
GIB=1073741824

# ---------------------------------------------------------------- helpers
now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; }
storage_dir() { if [ "$1" = shm ]; then echo "$SHM_DIR"; else echo "$DISK_DIR"; fi; }
avail_mib() { df -P -BM "$1" 2>/dev/null | awk 'NR == 2 {sub(/M$/, "", $4); print $4}'; }
mem_available_mib() { awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo; }
csv_quote() { local s=${1//\"/\"\"}; printf '"%s"' "${s//$'\n'/ }"; }

csv_init() {
  mkdir -p "$(dirname "$CSV")" || die "cannot create the directory of $CSV"
  [ -s "$CSV" ] || echo "run,tool,size_mib,storage,measurement,value,note" > "$CSV"
}
# record TOOL MIB STORAGE MEASUREMENT VALUE [NOTE]
record() {
  printf '%s,%s,%s,%s,%s,%s,%s\n' "$RUN_ID" "$1" "$2" "$3" "$4" "$5" "$(csv_quote "${6:-}")" >> "$CSV"
}
# has_result TOOL MIB STORAGE: the CSV already holds this case's result, ok
# or failed (a SKIP is decided again: it depends on the host's state).
has_result() {
  [ -f "$CSV" ] && awk -F, -v t="$1" -v m="$2" -v s="$3" \
    '$2 == t && $3 == m && $4 == s && $5 == "result" && $6 != "skip" {found = 1} END {exit !found}' "$CSV"
}

# estimate_s TOOL MIB STORAGE: seconds the case takes, roughly (see the header).
estimate_s() {
  awk -v tool="$1" -v mib="$2" -v storage="$3" -v gbps="$DISK_GBPS" 'BEGIN {
    gib = mib / 1024
    # per GiB: leave-running dump + dump + restore + re-verification
    per = (tool == "phos") ? 0.5 + 0.5 + 0.5 + 0.17 : 1.9 + 1.13 + 0.75 + 0.17
    s = 15 + gib * per
    if (storage == "disk") s += 3 * gib * 1.074 / gbps
    printf "%d", s + 0.5 }'
}

# why_not TOOL MIB STORAGE: prints why the case cannot run on this host
# (nothing when it can). The image needs its size plus criu's own files on
# the storage; with the cuda plugin the driver moves device memory into the
# process, so host RAM holds it too; on shm the image itself is RAM.
why_not() {
  local tool=$1 mib=$2 storage=$3 dir
  dir=$(storage_dir "$storage")
  if [ "$tool" = cuda_plugin ]; then
    [ -f "$CUDA_PLUGIN_SO" ] || { echo "no $CUDA_PLUGIN_SO in the bundle"; return; }
    command -v cuda-checkpoint >/dev/null || { echo "no cuda-checkpoint on PATH"; return; }
  fi
  local image_mib=$((mib + mib / 50 + 1024)) avail mem need_mem=4096
  avail=$(avail_mib "$dir")
  [ -n "$avail" ] || { echo "cannot read the free space of $dir"; return; }
  if [ "$avail" -lt "$image_mib" ]; then
    echo "the image needs ~$((image_mib / 1024)) GiB on $storage ($dir), $((avail / 1024)) GiB free"; return
  fi
  [ "$tool" = cuda_plugin ] && need_mem=$((need_mem + mib))
  [ "$storage" = shm ] && need_mem=$((need_mem + image_mib))
  mem=$(mem_available_mib)
  if [ "$mem" -lt "$need_mem" ]; then
    local parts=""
    [ "$tool" = cuda_plugin ] && parts="$((mib / 1024)) GiB of device memory moved into the process + "
    [ "$storage" = shm ] && parts="$parts$((image_mib / 1024)) GiB of image in RAM + "
    echo "needs ~$((need_mem / 1024)) GiB of host RAM (${parts}4 GiB), $((mem / 1024)) GiB available"
  fi
}

# Everything a case leaves in $OUT, so that a call cut off still returns it.
publish() {
  [ -n "${OUT:-}" ] || return 0
  cp "$CSV" "$OUT/" 2>/dev/null || true
  [ -f "$PNG" ] && cp "$PNG" "$OUT/" 2>/dev/null
  return 0
}

# Workloads of this benchmark (the bundle's gpu_counter on a state file of
# lib.sh's), whatever run started them.
bench_workloads() { pgrep -f "^$PHOS_WORKLOAD /tmp/phos-e2e\.[^/]*/state" || true; }
# After a case: its processes are killed; wait until they are gone, so the
# next case finds their device and host memory free again.
wait_workloads_gone() {
  for _ in $(seq 300); do [ -z "$(bench_workloads)" ] && return 0; sleep 0.1; done
  echo "bench: warning: workload processes still there 30 s after their case: $(bench_workloads | tr '\n' ' ')"
}

# -------------------------------------------------------------- one case
# bench_case TOOL MIB STORAGE, in a subshell of its own (lib.sh's traps and
# `fail` end the case, not the benchmark). Exit status 0: ran (ok or failed
# and recorded), 77: lib.sh cannot run here.
bench_case() (
  tool=$1 mib=$2 storage=$3
  source "$here/../e2e/lib.sh"
  TEST_NAME=bench:$tool:${mib}MiB:$storage
  rec() { record "$tool" "$mib" "$storage" "$@"; }
  local_logs() {  # keeps criu's logs of this case, gzipped
    mkdir -p "$LOGDIR" && for f in "$WORK"/*.log "$WORK"/*.err; do
      [ -s "$f" ] && gzip -c "$f" > "$LOGDIR/$tool-${mib}MiB-$storage-$(basename "$f").gz"
    done
    return 0
  }
  fail() {
    say "FAIL: $*"
    rec result failed "$*"
    for log in "$WORK"/*.err "$WORK"/*.log; do
      [ -s "$log" ] || continue
      echo "---- $(basename "$log") (last 15 lines)"
      tail -n 15 "$log"
    done
    local_logs
    exit 1
  }
  IMG=$(mktemp -d "$(storage_dir "$storage")/img.XXXXXX") || fail "cannot create an image directory on $storage"
  trap 'cleanup; rm -rf "$IMG"' EXIT
  rm -f "$PLUGIN_DIR"/*.so
  local preload=""
  if [ "$tool" = phos ]; then ln -s "$PHOS_PLUGIN_SO" "$PLUGIN_DIR/"; preload=--preload
  else ln -s "$CUDA_PLUGIN_SO" "$PLUGIN_DIR/"; fi
  local slices=$(((mib + 63) / 64))
  # Each criu run is bounded: 60 s + 6 s per GiB (+ 4 s per GiB on disk).
  export CRIU_TIMEOUT=$((60 + mib * 6 / 1024))
  [ "$storage" = disk ] && CRIU_TIMEOUT=$((CRIU_TIMEOUT + mib * 4 / 1024))

  local t0 t1 token
  t0=$(now)
  start_workload $preload "$mib"
  wait_counter_above 5 30
  t1=$(now); rec start_s "$(dt "$t0" "$t1")" "until the workload's 5th step"
  token=$(state_token)

  leave_running_dump
  plain_dump
  restore_and_verify
  rec result ok
  local_logs
)

# The program's own stall meter (gpu_counter's 6th field): reset_gaps
# starts it over and waits until the program took the reset.
reset_gaps() {
  : > "$WORK/state.reset"
  for _ in $(seq 500); do [ -e "$WORK/state.reset" ] || return 0; sleep 0.01; done
  fail "the workload did not take the stall reset in 5 s (a gpu_counter without the 6th field?)"
}
# wait_progress ABOVE SECONDS: until the counter passes ABOVE, polled every
# 10 ms without forking a reader; 1 when it did not in time.
wait_progress() {
  local above=$1 deadline=$((EPOCHSECONDS + $2)) tok cnt rest
  while [ "$EPOCHSECONDS" -lt "$deadline" ]; do
    if read -r tok cnt rest 2>/dev/null <"$WORK/state" && [[ $cnt =~ ^[0-9]+$ ]] && [ "$cnt" -gt "$above" ]; then
      return 0
    fi
    sleep 0.01
  done
  return 1
}
# The state's fields, read at once (the program replaces the file every
# ~10 ms: fields read one by one may come from two versions).
read_state() {
  read -r S_TOKEN S_COUNTER S_DEVICE S_ERRORS S_VERIFIED S_GAP <"$WORK/state" && S_LINE="$S_TOKEN $S_COUNTER $S_DEVICE $S_ERRORS $S_VERIFIED $S_GAP"
}
# Same token, the device counter equals the host counter, nothing failed verification.
consistent() { read_state && [ "$S_TOKEN" = "$token" ] && [ "$S_COUNTER" = "$S_DEVICE" ] && [ "$S_ERRORS" = 0 ]; }
# What a failure message says about the workload.
describe_workload() {
  local pids; pids=$(workload_pids | tr '\n' ' ')
  pids=${pids% }
  if [ ! -d "$WORK" ]; then echo "the work directory $WORK is gone"; return; fi
  echo "state $(cat "$WORK/state" 2>/dev/null || echo '(no state file)'), processes: ${pids:-none}"
}
ms_to_s() { awk -v ms="$1" 'BEGIN {printf "%.4f", ms / 1000}'; }
# phos_rate LOG PHRASE: "GB/s seconds" from the phos plugin's line, if any.
phos_rate() {
  { grep -o "MiB $2 [0-9.]* ms ([0-9.]* GB/s" "$1" 2>/dev/null || true; } | tail -n1 |
    awk '{gsub(/\(/, ""); printf "%s %.3f", $(NF - 1), $(NF - 3) / 1000}'
}
# record_phos_rate LOG PHRASE NAME: NAME_gbps and NAME_s into the CSV, and the line shown.
record_phos_rate() {
  local r; r=$(phos_rate "$1" "$2")
  [ -n "$r" ] || return 0
  rec "${3}_gbps" "${r% *}" "phos plugin's log"
  rec "${3}_s" "${r#* }" "phos plugin's log"
  { grep -o "phos: .*$2.*" "$1" || true; } | sed 's/^/    /'
}
disk_sync() { [ "$storage" = disk ] && sync; return 0; }
criu_error() { { grep -hE "Error|error" "$WORK/$1.err" "$WORK/$1.log" 2>/dev/null || true; } | tail -n 2 | tr '\n' ' '; }

leave_running_dump() {
  local t0 t1 at stall base rc=0
  reset_gaps; sleep 0.3
  read_state; base=$S_GAP
  rec stall_base_s "$(ms_to_s "$base")" "longest gap between state writes over 0.3 s without a dump"
  disk_sync
  reset_gaps
  t0=$(now); criu_dump --leave-running || rc=$?; t1=$(now)
  cp "$WORK/dump.log" "$WORK/dump-leave-running.log" 2>/dev/null || true
  if [ $rc -ne 0 ]; then
    say "leave-running dump FAILED (criu exit $rc): $(criu_error dump)"
    rec leave_running failed "criu exit $rc: $(criu_error dump)"
    restart_if_stuck
    return 0
  fi
  rec dump_leave_running_s "$(dt "$t0" "$t1")" "criu's wall time"
  at=$(state_counter)
  if ! wait_progress $((at + 5)) 30; then
    rec leave_running failed "the process made no progress in 30 s after the dump: $(describe_workload)"
    say "leave-running dump: the process made no progress in 30 s: $(describe_workload)"
    restart_if_stuck
    return 0
  fi
  if consistent; then rec leave_running ok
  else rec leave_running failed "state after the dump: $S_LINE (token before $token)"; fi
  stall=$S_GAP
  rec stall_s "$(ms_to_s "$stall")" "longest gap between the program's state writes (~0.01 s normally)"
  say "leave-running dump $(dt "$t0" "$t1") s, the program stalled $(ms_to_s "$stall") s (normally $(ms_to_s "$base") s), state after: $S_LINE"
  record_phos_rate "$WORK/dump-leave-running.log" "copied to the image in" phos_copy_leave_running
}
# After a failed leave-running dump: a process that no longer makes progress
# is replaced by a fresh one, so the plain dump and the restore still run.
restart_if_stuck() {
  local at; at=$(state_counter 2>/dev/null || echo 0)
  [ -n "$(workload_pids)" ] && wait_progress $((at + 3)) 10 && return 0
  say "the workload stopped; starting a fresh one"
  local p; for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do [ -z "$(workload_pids)" ] && break; sleep 0.1; done
  rm -f "$WORK/state"
  start_workload $preload "$mib"
  wait_counter_above 5 30
  token=$(state_token)
}

plain_dump() {
  local t0 t1 t2 rc=0
  rm -rf "${IMG:?}"/* && disk_sync
  t0=$(now); criu_dump || rc=$?; t1=$(now)
  [ $rc -eq 0 ] || fail "criu dump failed (exit $rc${CRIU_TIMEOUT:+, limit $CRIU_TIMEOUT s}): $(criu_error dump)"
  rec dump_s "$(dt "$t0" "$t1")" "criu's wall time"
  if [ "$storage" = disk ]; then
    sync; t2=$(now)
    rec dump_sync_s "$(dt "$t0" "$t2")" "criu's wall time + sync of the image to disk"
  fi
  dumped=$(state_counter)
  rec image_gib "$(du -sB1 "$IMG" | awk -v g=$GIB '{printf "%.3f", $1 / g}')" "du of the image directory"
  say "dump $(dt "$t0" "$t1") s${t2:+ ($(dt "$t0" "$t2") s until synced)}, image $(du -sh "$IMG" | cut -f1)"
  record_phos_rate "$WORK/dump.log" "copied to the image in" phos_copy
  # Gone and reaped before the restore's clock starts (lib.sh's criu_restore
  # waits for the pid to be free).
  for _ in $(seq 100); do [ -z "$(workload_pids)" ] && [ ! -e "/proc/$WORKLOAD_PID" ] && return 0; sleep 0.1; done
  fail "the process (pid $WORKLOAD_PID) still exists 10 s after the dump"
}

restore_and_verify() {
  local t0 t1 t2 rc=0 note="criu restore -d until it returns"
  if [ "$storage" = disk ]; then
    sync; echo 3 > /proc/sys/vm/drop_caches || fail "cannot drop the page cache"
    note="$note; page cache dropped before (sync; echo 3 > /proc/sys/vm/drop_caches)"
    say "restore from disk: page cache dropped first, the image is read from the disk"
  fi
  : > "$WORK/state.reset"   # no stall measured across the restore
  t0=$(now); criu_restore || rc=$?; t1=$(now)
  [ $rc -eq 0 ] || fail "criu restore failed (exit $rc${CRIU_TIMEOUT:+, limit $CRIU_TIMEOUT s}): $(criu_error restore)"
  rec restore_s "$(dt "$t0" "$t1")" "$note"
  wait_progress "$dumped" $((30 + mib / 1024)) ||
    fail "the restored process made no progress in $((30 + mib / 1024)) s: $(describe_workload)"
  t2=$(now)
  rec restore_running_s "$(dt "$t0" "$t2")" "from the start of criu restore until the restored process made a step"
  say "restore $(dt "$t0" "$t1") s, the process made a step after $(dt "$t0" "$t2") s"
  record_phos_rate "$WORK/restore.log" "restored to device memory in" phos_restore
  # Every slice re-verified by the process itself (~10 ms a step).
  local bound=$((slices / 20 + 10))
  wait_progress $((dumped + slices + 5)) "$bound" ||
    fail "the restored process did not re-verify all $slices slices in $bound s: $(describe_workload)"
  if consistent; then
    rec restored_intact ok "all $slices slices re-verified after the restore"
    say "restored process carries on, all $slices slices re-verified: $S_LINE"
  else
    rec restored_intact failed "state: $S_LINE, token before $token"
    fail "restored process: $S_LINE (token before $token)"
  fi
}

# ----------------------------------------------------------------- main
cases=()
for storage in "${STORAGES[@]}"; do
  for mib in "${SIZES[@]}"; do
    for tool in "${TOOLS[@]}"; do cases+=("$tool $mib $storage"); done
  done
done

if [ -z "$PLAN" ]; then
  [ "$(id -u)" -eq 0 ] || die "needs root (criu, drop_caches)"
  [ -x "$PHOS_WORKLOAD" ] || die "no $PHOS_WORKLOAD: build the bundle (test/gpu/make-bundle.sh)"
fi
mkdir -p "$SHM_DIR" "$DISK_DIR" || die "cannot create $SHM_DIR or $DISK_DIR"
# A call cut off at its time limit leaves images (RAM on shm) and maybe
# workloads behind: the images go, the workloads are named.
if [ -z "$PLAN" ]; then
  for d in "$SHM_DIR"/img.* "$DISK_DIR"/img.*; do
    [ -d "$d" ] && { echo "bench: removing the image $d left by an earlier run"; rm -rf "$d"; }
  done
  stale=$(bench_workloads | tr '\n' ' ')
  if [ -n "$stale" ] && [ -n "$KILL_STALE" ]; then
    echo "bench: killing workloads an earlier run left behind: pids $stale"
    for p in $stale; do kill -9 "$p" 2>/dev/null; done
    wait_workloads_gone
  elif [ -n "$stale" ]; then
    echo "bench: warning: workloads of an earlier run still hold device and host memory: pids $stale(--kill-stale ends them)"
  fi
fi
[ "$(stat -f -c %T "$SHM_DIR")" = tmpfs ] || echo "bench: warning: $SHM_DIR is not on tmpfs"
[ "$(stat -f -c %T "$DISK_DIR")" != tmpfs ] || echo "bench: warning: $DISK_DIR is on tmpfs, not on a disk"
echo "bench: run $RUN_ID: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1 || echo 'no nvidia-smi'); $(nproc) cores; RAM $(awk '/^MemTotal/ {printf "%d GiB", $2 / 1048576}' /proc/meminfo), $(($(mem_available_mib) / 1024)) GiB available"
echo "bench: shm: $SHM_DIR ($(df -P -h "$SHM_DIR" | awk 'NR == 2 {print $1 ", " $4 " free"}'), $(stat -f -c %T "$SHM_DIR")); disk: $DISK_DIR ($(df -P -h "$DISK_DIR" | awk 'NR == 2 {print $1 ", " $4 " free"}'), $(stat -f -c %T "$DISK_DIR"))"
echo "bench: CSV $CSV, plot $PNG, logs $LOGDIR, budget $BUDGET s"
[ -n "$PLAN" ] || csv_init

start=$EPOCHSECONDS deferred=() total=0
declare -A scale   # per "tool:storage": how much longer than estimated cases took, at least 1
for c in "${cases[@]}"; do
  read -r tool mib storage <<<"$c"
  label="$tool $mib MiB $storage"
  if [ -n "$RESUME" ] && has_result "$tool" "$mib" "$storage"; then echo "bench: $label: done in an earlier run"; continue; fi
  reason=$(why_not "$tool" "$mib" "$storage")
  if [ -n "$reason" ]; then
    echo "bench: $label: SKIP: $reason"
    [ -n "$PLAN" ] || record "$tool" "$mib" "$storage" result skip "$reason"
    continue
  fi
  est=$(estimate_s "$tool" "$mib" "$storage")
  est=$(awk -v e="$est" -v f="${scale[$tool:$storage]:-1}" 'BEGIN {printf "%d", e * f + 0.5}')
  total=$((total + est))
  if [ -n "$PLAN" ]; then echo "bench: $label: ~$est s"; continue; fi
  left=$((BUDGET - (EPOCHSECONDS - start)))
  if [ "$est" -gt "$left" ]; then
    echo "bench: $label: DEFERRED: estimated $est s, $left s left of the budget (run again with --resume)"
    deferred+=("$label"); continue
  fi
  echo "bench: $label: start (estimated $est s, $left s left of the budget)"
  t0=$EPOCHSECONDS
  bench_case "$tool" "$mib" "$storage"
  rc=$?
  wait_workloads_gone
  [ $rc -eq 77 ] && die "lib.sh cannot run here (root and $CRIU needed)"
  took=$((EPOCHSECONDS - t0))
  echo "bench: $label: $([ $rc -eq 0 ] && echo 'done' || echo FAILED) in $took s (estimated $est s)"
  scale[$tool:$storage]=$(awk -v f="${scale[$tool:$storage]:-1}" -v t="$took" -v e="$est" 'BEGIN {r = f * t / e; print (r > f) ? r : f}')
  publish
done

if [ -n "$PLAN" ]; then
  rmdir "$SHM_DIR" "$DISK_DIR" 2>/dev/null
  echo "bench: plan: ${#cases[@]} cases, ~$total s for those that run ($(( (total + BUDGET - 1) / BUDGET )) calls of $BUDGET s at least)"
  exit 0
fi
rmdir "$SHM_DIR" "$DISK_DIR" 2>/dev/null
echo
python3 "$here/plot_bench.py" "$CSV" --png "$PNG" | tee "${CSV%.csv}.md" || echo "bench: plot_bench.py failed (the CSV is $CSV)"
[ -n "${OUT:-}" ] && cp "${CSV%.csv}.md" "$OUT/" 2>/dev/null
publish
if [ ${#deferred[@]} -gt 0 ]; then
  echo "bench: ${#deferred[@]} cases DEFERRED for the budget: ${deferred[*]}; run the same command again with --resume"
else
  echo "bench: all cases done"
fi
