#!/usr/bin/env bash
# Migration's downtime against a stop-the-world dump and restore through
# host memory, side by side in one run, on a GPU host (after `source
# test/gpu/run-on-host.sh`); images on a tmpfs of huge pages (warmed first).
#
# Per job (--jobs, comma-separated KIND:GIB; torch_loop.py's infer and train
# loops, a fresh process per dump), in turns:
#   stop      recopy=off: `criu dump` into the image directory (the gate
#             closes, every byte goes to host memory), then `criu restore`
#   migrate   `phosctl migrate PID --to GPU` (--to, default 0): soft recopy
#             to the target GPU while the program runs, the final pass, the
#             memory kept by phos-keeper, `criu restore -d`. To the GPU the
#             program is on, its memory stays in place (no copy)
#   migrate_copy  the same with migrate_copy=always: copied device to device
#             even to the same GPU (the path a move to another GPU takes,
#             peer to peer there; on a 1-GPU host, over HBM)
# Per dump: the downtime, from the gate closing for good on the source (the
# manifest's gate_closed_unix_ns) to the end of the first step the program
# finished after it (its STATE.steps, so the step in flight and its first
# kernels on the target are inside it); criu's dump and restore times (the
# restore's from the moment the source's pid is free: without a pid
# namespace the restored process needs it, in every mode); what
# recopy's first pass copied and what it copied again. --reps dumps per
# mode, after one unmeasured warm-up migration per job.
# One CSV row per dump (--csv); a table (medians) to stdout, with each
# migration's downtime as a share of the stopped one's.
# usage: bench_migrate.sh [--jobs KIND:GIB,...] [--to GPU] [--reps N] [--csv FILE]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# Under a subreaper that reaps at once (subreaper.py says why): PID 1 of the
# test hosts takes 1.5-2 s, which every restore here would wait for.
[ -n "${PHOS_SUBREAPER:-}" ] || PHOS_SUBREAPER=1 exec python3 "$here/subreaper.py" bash "$0" "$@"
jobs=infer:16,train:8 to=0 reps=2 csv=${OUT:-/tmp}/bench_migrate.csv
usage="usage: bench_migrate.sh [--jobs KIND:GIB,...] [--to GPU] [--reps N] [--csv FILE]"
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --to) to=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
python=$(python3 -c 'import sys; print(sys.executable)')
export PHOS_NO_PIDNS=1 PHOS_WORKLOAD=$here/torch_loop.py PHOS_WORKLOAD_RUNNER=$python
gib=$(tr ',' '\n' <<<"$jobs" | awk -F: '{g = $2 * 1.3; if (g > m) m = g} END {printf "%d", m + 1}')
source "$here/bench_lib.sh"
bench_tmpfs bench-migrate "$gib"
export PHOS_CRIU_TIMEOUT=300 CUBLAS_WORKSPACE_CONFIG=:4096:8
source "$here/../e2e/lib.sh"
TEST_NAME=bench_migrate
# first_step_after T STEPS: the end (unix s) of the first step that ended after T.
first_step_after() { awk -v t="$1" '$2 > t {print $2; exit}' "$2"; }
wait_steps_after() {  # wait_steps_after T: the restored program finishes a step after T
  for _ in $(seq 1200); do
    [ -n "$(first_step_after "$1" "$WORK/state.steps")" ] && return 0
    sleep 0.05
  done
  fail "no step after the restore: $(tail -n 2 "$WORK/state.error" 2>/dev/null)"
}

echo "job,gib,mode,downtime_ms,dump_s,restore_s,first_pass_mib,recopied_mib,raw_mib,copy_gbps" > "$csv"
for job in ${jobs//,/ }; do
  kind=${job%%:*} size=${job#*:}
  case $kind in infer|train) ;; *) fail "unknown job $job (infer or train)" ;; esac
  for mode in warmup $(for _ in $(seq "$reps"); do echo stop migrate migrate_copy; done); do
    rm -f "$WORK/state" "$WORK/state.error" "$WORK/state.steps"
    start_workload --preload "$kind" --gib "$size"
    wait_counter_above 20 300 || fail "$job: the workload does not run: $(tail -n 2 "$WORK/state.error" 2>/dev/null)"
    sleep 1
    rm -rf "$IMG" && mkdir -p "$IMG"
    case $mode in
      stop)
        # The tmpfs's pages again just before (a removed image's may have
        # gone back to the host), so the stopped copy runs at its best.
        fallocate -l "$((size + 2))G" "$TMPDIR/warm" && rm -f "$TMPDIR/warm"
        t0=$(now)
        PHOS_RECOPY=off criu_dump || fail "$job: criu dump failed"
        t1=$(now)
        wait_pid_free
        t2=$(now)
        criu_restore || fail "$job: criu restore failed"
        t3=$(now)
        cp "$WORK/dump.log" "${OUT:-/tmp}/bench_migrate.$kind.stop.dump.log" 2>/dev/null || true
        ;;
      *)
        copy=auto; [ "$mode" = migrate_copy ] && copy=always
        t0=$(now)
        out=$(PHOS_MIGRATE_COPY=$copy PHOS_COW_TRUST=speculated "$PHOSCTL" migrate "$WORKLOAD_PID" --to "$to" \
                --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1) ||
          { cp "$IMG"/*.log "${OUT:-/tmp}/" 2>/dev/null; fail "$job, $mode: phosctl migrate failed: $out"; }
        t3=$(now)
        echo "[$job $mode] $out"
        cp "$IMG/migrate-dump.log" "${OUT:-/tmp}/bench_migrate.$kind.$mode.dump.log" 2>/dev/null || true
        cp "$IMG/migrate-restore.log" "${OUT:-/tmp}/bench_migrate.$kind.$mode.restore.log" 2>/dev/null || true
        # phosctl's own figures: the dump, then the wait for the source's
        # pid (the restore starts after it, as the stopped path's does).
        t1=$(awk -v a="$t0" '{for (i = 1; i <= NF; i++) if ($i == "dump") {d = $(i + 1) + 0; printf "%.6f", a + d / 1000; exit}}' <<<"$out")
        t2=$(awk -v a="$t1" '{for (i = 1; i <= NF; i++) if ($i == "after" && $(i - 1) == "free") {printf "%.6f", a + ($(i + 1) + 0) / 1000; exit}}' <<<"$out")
        ;;
    esac
    stats=$(image_stats gate_closed_unix_ns recopy_first_pass_bytes recopied_bytes raw_bytes) || fail "$job: phosctl show"
    gate=${stats%%,*}
    wait_steps_after "$gate"
    first=$(first_step_after "$gate" "$WORK/state.steps")
    pid=$(restored_pid) && kill -9 "$pid" 2>/dev/null
    WORKLOAD_PID=${pid:-$WORKLOAD_PID}
    wait_pid_free
    [ "$mode" = warmup ] && continue
    downtime=$(awk -v g="$gate" -v f="$first" 'BEGIN {printf "%.0f", (f - g) * 1000}')
    # The stopped copy's rate to the image (criu's log), for the record.
    gbps=$(grep -a -o 'copied to the image in [0-9.]* ms ([0-9.]* GB/s' "${OUT:-/tmp}/bench_migrate.$kind.stop.dump.log" 2>/dev/null | tail -n1 | sed 's/.*(//; s/ GB.s//')
    [ "$mode" = stop ] || gbps=-
    echo "$kind,$size,$mode,$downtime,$(dt "$t0" "$t1"),$(dt "$t2" "$t3"),${stats#*,},${gbps:--}" >> "$csv"
  done
done

echo "## migration against a stop-the-world dump and restore through host memory (images on a tmpfs of huge pages)"
echo "medians of $reps runs each; downtime: from the gate closing for good on the source to the end of the first step after it (on the target)"
echo "| job | mode | downtime | dump | restore | first pass (while running) | copied again | device memory | stopped copy to the image |"
echo "|---|---|---|---|---|---|---|---|---|"
awk -F, "$awk_median"'
  NR > 1 { gather($1 ":" $2 "," $3, 4, 10) }
  END {
    for (i = 1; i <= k; i++) {
      split(order[i], f, ",")
      printf "| %s | %s | %s ms | %s s | %s s | %s MiB | %s MiB | %s MiB | %s |\n", f[1], f[2], median(order[i], 4),
        median(order[i], 5), median(order[i], 6), median(order[i], 7), median(order[i], 8), median(order[i], 9),
        f[2] == "stop" ? median(order[i], 10) " GB/s" : "-"
    }
  }' "$csv"
awk -F, "$awk_median"'
  NR > 1 { vals[$1 ":" $2, $3] = vals[$1 ":" $2, $3] " " $4; jobs[$1 ":" $2] = 1 }
  END {
    for (j in jobs) {
      s = median(j, "stop")
      if (s + 0 <= 0) continue
      printf "%s: migrate downtime %.0f%% of the stopped dump-and-restore'"'"'s, migrate_copy %.0f%% (target: at most 25%%)\n",
        j, 100 * median(j, "migrate") / s, 100 * median(j, "migrate_copy") / s
    }
  }' "$csv"
echo "CSV: $csv; criu's logs: ${OUT:-/tmp}/bench_migrate.*.log"
exit 0
