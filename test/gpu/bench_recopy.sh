#!/usr/bin/env bash
# Soft recopy against the stopped copy, side by side in one run, on a GPU
# host (after `source test/gpu/run-on-host.sh`); images on a tmpfs of huge
# pages (warmed first: the host's memory grows on first use).
#
# Dumps without --leave-running (migration: the image is the latest state,
# criu ends the process) of each workload, in turns:
#   stop    recopy=off: the gate closes, then the whole memory is copied
#   recopy  recopy=auto, cow_trust=speculated: a first pass copies the
#           memory while the program runs; the gate closes; only what it
#           wrote meanwhile is copied again
# Workloads (--jobs, comma-separated KIND:SIZE):
#   pattern:MIB  gpu_counter: MIB MiB filled once, read a slice per step
#   infer:GIB    torch_loop.py infer: fp16 weights read, a KV-cache slot
#                written per step
#   train:GIB    torch_loop.py train: weights, gradients and AdamW's states
#                all written every step
# Per dump: the downtime (from the gate closing for good to criu's
# "Dumping finished successfully", after which the process is gone), the
# time criu took, what the first pass copied and in how long, what was
# copied again. A fresh process per dump (criu ends it); --reps dumps per
# mode, the first dump of each job unmeasured.
# One CSV row per dump (--csv); a table (medians) to stdout.
# usage: bench_recopy.sh [--jobs KIND:SIZE,...] [--reps N] [--csv FILE]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jobs=pattern:32768,infer:16,train:16 reps=2 csv=${OUT:-/tmp}/bench_recopy.csv
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    *) echo "usage: bench_recopy.sh [--jobs KIND:SIZE,...] [--reps N] [--csv FILE]" >&2; exit 2 ;;
  esac
done
python=$(python3 -c 'import sys; print(sys.executable)')
export PHOS_NO_PIDNS=1 PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter
# The largest image, in GiB, on a tmpfs of huge pages (bench_lib.sh).
gib=$(tr ',' '\n' <<<"$jobs" | awk -F: '{g = $1 == "pattern" ? $2 / 1024 : $2 * 1.3; if (g > m) m = g} END {printf "%d", m + 1}')
source "$here/bench_lib.sh"
bench_tmpfs bench-recopy "$gib"
export PHOS_CRIU_TIMEOUT=300 CUBLAS_WORKSPACE_CONFIG=:4096:8
source "$here/../e2e/lib.sh"
TEST_NAME=bench_recopy
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }


echo "job,size,mode,downtime_ms,criu_s,first_pass_mib,first_pass_ms,recopied_mib,final_pass_ms,raw_mib" > "$csv"
for job in ${jobs//,/ }; do
  kind=${job%%:*} size=${job#*:}
  case $kind in
    pattern) COUNTER=$PHOS_BUNDLE/gpu/gpu_counter RUNNER= args=("$size") ;;
    infer|train) COUNTER=$here/torch_loop.py RUNNER=$python args=("$kind" --gib "$size") ;;
    *) fail "unknown job $job" ;;
  esac
  MATCH="^${RUNNER:+$RUNNER }$COUNTER $WORK/state"
  for mode in warmup $(for _ in $(seq "$reps"); do echo stop recopy; done); do
    rm -f "$WORK/state" "$WORK/state.error"
    start_workload --preload "${args[@]}"
    wait_counter_above 20 180 || fail "$job: the workload does not run: $(tail -n 2 "$WORK/state.error" 2>/dev/null)"
    sleep 1
    rm -rf "$IMG" && mkdir -p "$IMG"
    recopy=off; [ "$mode" = stop ] || recopy=auto
    t0=$(now)
    PHOS_RECOPY=$recopy PHOS_COW_TRUST=speculated criu_dump || fail "$job, recopy=$recopy: criu dump failed"
    t1=$(now)
    cp "$WORK/dump.log" "${OUT:-/tmp}/bench_recopy.$kind.$mode.log" 2>/dev/null || true
    if [ "$mode" = recopy ]; then
      grep -q "first pass copied" "$WORK/dump.log" || fail "$job: no soft recopy: $(grep -o 'no soft recopy.*' "$WORK/dump.log" | head -n1)"
    fi
    stats=$("$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
s = json.load(sys.stdin)["images"][0]["statistics"]
mib = lambda b: "%.0f" % (b / 2**20)
ms = lambda n: "%.0f" % (n / 1e6)
print(",".join([mib(s["recopy_first_pass_bytes"]), ms(s["recopy_first_pass_ns"]), mib(s["recopied_bytes"]),
                ms(s["final_pass_ns"]), mib(s["raw_bytes"])]))') || fail "$job: phosctl show"
    wait_pid_free
    [ "$mode" = warmup ] && continue
    echo "$kind,$size,$mode,$(downtime_ms "$WORK/dump.log"),$(dt "$t0" "$t1"),$stats" >> "$csv"
  done
done

echo "## soft recopy against the stopped copy: dumps without --leave-running (images on a tmpfs of huge pages)"
echo "medians of $reps dumps each; downtime: from the gate closing for good to criu's end (the process gone)"
echo "| job | mode | downtime | criu in all | first pass (while running) | copied again | device memory |"
echo "|---|---|---|---|---|---|---|"
awk -F, "$awk_median"'
  NR > 1 {
    key = $1 ":" $2 "," $3
    if (!(key in seen)) { seen[key] = 1; order[++k] = key }
    for (c = 4; c <= 10; c++) vals[key, c] = vals[key, c] " " $c
  }
  END {
    for (i = 1; i <= k; i++) {
      split(order[i], f, ",")
      first = f[2] == "recopy" ? sprintf("%s MiB in %s ms", median(order[i], 6), median(order[i], 7)) : "-"
      again = f[2] == "recopy" ? sprintf("%s MiB", median(order[i], 8)) : "-"
      printf "| %s | %s | %s ms | %s s | %s | %s | %s MiB |\n", f[1], f[2], median(order[i], 4), median(order[i], 5),
        first, again, median(order[i], 10)
    }
  }' "$csv"
# Downtime of recopy against the stopped copy's, per job.
awk -F, 'NR > 1 {k = $1 ":" $2; if ($3 == "stop") s[k] = s[k] " " $4; else r[k] = r[k] " " $4; if (!(k in o)) {o[k] = ++n; name[n] = k}}
  function med(list,   v, m, i, j, t) { m = split(list, v, " "); for (i = 2; i <= m; i++) for (j = i; j > 1 && v[j-1] + 0 > v[j] + 0; j--) {t = v[j]; v[j] = v[j-1]; v[j-1] = t}; return v[int((m + 1) / 2)] }
  END {for (i = 1; i <= n; i++) {k = name[i]; if (s[k] != "" && r[k] != "") printf "%s: recopy downtime %.0f%% of the stopped copy'"'"'s\n", k, 100 * med(r[k]) / med(s[k])}}' "$csv"
exit 0
