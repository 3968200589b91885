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
#
# --traffic: PhOS §5's traffic control instead (traffic=off|order|auto),
# with the job transfer:GIB by default (torch_loop.py transfer: GIB GiB,
# mostly fp16 weights read, and per step --transfer-mib MiB in from pinned
# host memory and as much out, a kernel, a 32 MiB slot of a ring written;
# --pace-ms between steps). Modes, each a fresh process:
#   recopy:off|order|auto  a dump without --leave-running, soft recopy
#   cow:off|auto           a dump with --leave-running, copy_on_write=always
# Per dump: the program's step time (its own, without the pace) before the
# dump and while the engine copied beside it (recopy's first pass; the
# copy-on-write copy), the engine's pauses and their time (summed over its
# workers), the transfers the hooks saw, what the first pass copied, its
# bytes written after their copy (wasted), recopy's downtime, criu's time.
# usage: bench_recopy.sh [--jobs KIND:SIZE,...] [--reps N] [--csv FILE]
#                        [--traffic [--transfer-mib MIB] [--pace-ms MS]]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
jobs='' reps=2 csv='' traffic='' transfer_mib=256 pace_ms=20
usage="usage: bench_recopy.sh [--jobs KIND:SIZE,...] [--reps N] [--csv FILE] [--traffic [--transfer-mib MIB] [--pace-ms MS]]"
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --traffic) traffic=1; shift ;;
    --transfer-mib) transfer_mib=$2; shift 2 ;;
    --pace-ms) pace_ms=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ -n "$traffic" ]; then
  jobs=${jobs:-transfer:16} csv=${csv:-${OUT:-/tmp}/bench_recopy_traffic.csv}
else
  jobs=${jobs:-pattern:32768,infer:16,train:16} csv=${csv:-${OUT:-/tmp}/bench_recopy.csv}
fi
python=$(python3 -c 'import sys; print(sys.executable)')
export PHOS_NO_PIDNS=1 PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter
# The largest image, in GiB, on a tmpfs of huge pages (bench_lib.sh).
gib=$(tr ',' '\n' <<<"$jobs" | awk -F: '{g = $1 == "pattern" ? $2 / 1024 : $2 * 1.3; if (g > m) m = g} END {printf "%d", m + 1}')
source "$here/bench_lib.sh"
bench_tmpfs bench-recopy "$gib"
export PHOS_CRIU_TIMEOUT=300 CUBLAS_WORKSPACE_CONFIG=:4096:8
source "$here/../e2e/lib.sh"
TEST_NAME=bench_recopy
add() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.6f", a + b}'; }
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f", (b - a) * 1000}'; }

# --traffic: PhOS §5's traffic control, off against on, for recopy and
# copy-on-write: its own loop, CSV and table.
traffic_run() {
  echo "job,size,protocol,traffic,step_before_ms,step_during_ms,step_during_max_ms,steps_during,copy_ms,transfers,transfer_mib,pauses,paused_ms,first_pass_mib,wasted_mib,recopied_mib,cow_saved_mib,downtime_ms,criu_s" > "$csv"
  local job kind size mode protocol setting t0 t1 log from to stats before during most n downtime
  for job in ${jobs//,/ }; do
    kind=${job%%:*} size=${job#*:}
    case $kind in
      transfer|infer|train) COUNTER=$here/torch_loop.py RUNNER=$python
                            args=("$kind" --gib "$size" --transfer-mib "$transfer_mib" --pace-ms "$pace_ms") ;;
      *) fail "--traffic takes the jobs of torch_loop.py (transfer, infer, train), not $job" ;;
    esac
    MATCH="^$RUNNER $COUNTER $WORK/state"
    for mode in warmup $(for _ in $(seq "$reps"); do echo recopy:off recopy:order recopy:auto cow:off cow:auto; done); do
      rm -f "$WORK/state" "$WORK/state.error" "$WORK/state.steps"
      start_workload --preload "${args[@]}"
      wait_counter_above 20 300 || fail "$job: the workload does not run: $(tail -n 2 "$WORK/state.error" 2>/dev/null)"
      sleep 2  # steps to compare with
      rm -rf "$IMG" && mkdir -p "$IMG"
      protocol=${mode%%:*} setting=${mode#*:}
      [ "$mode" = warmup ] && protocol=recopy setting=auto
      t0=$(now)
      if [ "$protocol" = cow ]; then
        PHOS_COPY_ON_WRITE=always PHOS_COW_TRUST=speculated PHOS_TRAFFIC=$setting criu_dump --leave-running ||
          fail "$job, copy-on-write, traffic=$setting: criu dump failed"
      else
        PHOS_RECOPY=auto PHOS_COW_TRUST=speculated PHOS_TRAFFIC=$setting criu_dump ||
          fail "$job, recopy, traffic=$setting: criu dump failed"
      fi
      t1=$(now)
      log=${OUT:-/tmp}/bench_recopy_traffic.$kind.$protocol-$setting.log
      cp "$WORK/dump.log" "$log" 2>/dev/null || log=$WORK/dump.log
      # The engine's copy beside the running program, in criu's clock
      # (seconds since criu started, about t0): recopy's first pass, or the
      # copy-on-write copy.
      if [ "$protocol" = cow ]; then
        from=$(criu_log_at "$log" 'copy window opened in') to=$(criu_log_at "$log" 'the copy-on-write copy paused')
      else
        from=$(criu_log_at "$log" 'soft recopy: gate reopened') to=$(criu_log_at "$log" "closing its gate for soft recopy's final pass")
      fi
      if [ -z "$from" ] || [ -z "$to" ]; then fail "$job, $mode: criu's log shows no copy beside the running program"; fi
      stats=$(image_stats program_transfers program_transfer_bytes traffic_pauses traffic_paused_ns \
        recopy_first_pass_bytes recopy_wasted_bytes recopied_bytes cow_saved_bytes) || fail "$job: phosctl show"
      downtime=''
      if [ "$protocol" = recopy ]; then downtime=$(downtime_ms "$log"); else kill -9 "$WORKLOAD_PID"; fi
      wait_pid_free
      [ "$mode" = warmup ] && continue
      read -r before during most n < <(step_times_between "$t0" "$(add "$t0" "$from")" "$(add "$t0" "$to")" "$WORK/state.steps")
      echo "$kind,$size,$protocol,$setting,$before,$during,$most,$n,$(ms_between "$from" "$to"),$stats,$downtime,$(dt "$t0" "$t1")" >> "$csv"
    done
  done

  echo "## PhOS §5's traffic control: the program's own transfers ($transfer_mib MiB each way per step, ${pace_ms} ms between steps) while the engine copies beside it"
  echo "medians of $reps dumps each; step: the program's own time per step; pauses: the engine's, their time summed over its workers"
  echo "| job | protocol | traffic | step before | step during the copy (longest) | copy beside the program | transfers seen | pauses (time) | first pass | written after its copy | copied again | saved copy-on-write | downtime |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  awk -F, "$awk_median"'
    NR > 1 { gather($1 ":" $2 "," $3 "," $4, 5, 19) }
    END {
      for (i = 1; i <= k; i++) {
        split(order[i], f, ",")
        key = order[i]
        recopy = f[2] == "recopy"
        printf "| %s | %s | %s | %s ms | %s ms (%s ms) | %s ms | %s (%s MiB) | %s (%s ms) | %s | %s | %s | %s | %s |\n",
          f[1], f[2], f[3], median(key, 5), median(key, 6), median(key, 7), median(key, 9), median(key, 10),
          median(key, 11), median(key, 12), median(key, 13), recopy ? median(key, 14) " MiB" : "-",
          recopy ? median(key, 15) " MiB" : "-", recopy ? median(key, 16) " MiB" : "-",
          recopy ? "-" : median(key, 17) " MiB", recopy ? median(key, 18) " ms" : "-"
      }
    }' "$csv"
  echo "CSV: $csv; criu's logs: ${OUT:-/tmp}/bench_recopy_traffic.*.log"
}
if [ -n "$traffic" ]; then
  traffic_run
  exit 0
fi

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
    stats=$(image_stats recopy_first_pass_bytes recopy_first_pass_ns recopied_bytes final_pass_ns raw_bytes) ||
      fail "$job: phosctl show"
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
  NR > 1 { gather($1 ":" $2 "," $3, 4, 10) }
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
