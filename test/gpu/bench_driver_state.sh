#!/usr/bin/env bash
# What the driver's checkpoint moves into a process once phos's memory is
# released (issue 30, part 2): for each variant of a child process
# (driver_state_probe list: a bare context, limits lowered, a stack grown by
# local memory, modules, lazy/eager loading, cuBLAS, cuBLASLt, streams,
# memory freed before, libphos.so with and without PHOS_SHRINK_DRIVER_STATE),
# the child's resident memory before and after the driver's checkpoint and
# the checkpoint's and the restore's times. Each variant runs in processes
# of its own (driver_state_probe measure), bounded by --timeout, on one GPU
# (CUDA_VISIBLE_DEVICES=$GPU, default 0). After the restore the child runs
# its work again; a variant whose work fails is marked FAIL.
#
# Columns: RSS before (MiB, VmRSS), delta (VmRSS after the checkpoint -
# before: the driver's device state, now CPU pages criu would dump), anon
# delta (smaps_rollup Anonymous), lock/checkpoint/restore ms, GPU used
# (cudaMemGetInfo at the child's ready, the whole GPU), the stack limit at
# ready and after the restore, the limits the variant set (what the driver
# took), the mappings that grew most.
#
# usage: bench_driver_state.sh [--variants V,V...] [--reps N] [--timeout S]
#   (after `source test/gpu/run-on-host.sh`; default: every variant, 1 rep,
#   120 s each). With $OUT set, the results, the table and each run's
#   stderr (bench_driver_state-logs/) go there; else to /tmp.
# Run time: ~2-4 s a variant (CUDA start, checkpoint, restore, verify);
# 28 variants ~1.5-2 min a rep.
set -uo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
: "${PHOS_BUNDLE:?run 'source test/gpu/run-on-host.sh' first}" "${PHOS_BUILD:?}"
probe=$PHOS_BUNDLE/gpu/driver_state_probe
tool=$PHOS_BUILD/test/hooks/phos-agent-tool
libphos=$PHOS_BUILD/cuda_hooks/libphos.so
VARIANTS='' REPS=1 TIMEOUT=120
die() { echo "bench_driver_state: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --variants) VARIANTS=${2:?}; shift 2 ;;
    --reps) REPS=${2:?}; shift 2 ;;
    --timeout) TIMEOUT=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
[ -x "$probe" ] || die "no $probe: build the bundle (test/gpu/make-bundle.sh)"
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "--reps: $REPS is not a count"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--timeout: $TIMEOUT is not a number of seconds"
export CUDA_VISIBLE_DEVICES=${GPU:-0}
all=$("$probe" list | cut -f1)
if [ -z "$VARIANTS" ]; then VARIANTS=$(tr '\n' ',' <<<"$all"); fi
IFS=, read -r -a VARIANTS <<<"$VARIANTS"
for v in "${VARIANTS[@]}"; do grep -qx -- "$v" <<<"$all" || die "no variant $v ($probe list)"; done
results=${OUT:-/tmp}/bench_driver_state.txt
logs=${OUT:-/tmp}/bench_driver_state-logs   # each run's stderr (the child's, libphos's, the tool's)
: > "$results"
rm -rf "$logs" && mkdir -p "$logs"
echo "bench_driver_state: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i "${CUDA_VISIBLE_DEVICES%%,*}" 2>/dev/null | head -n1); ${#VARIANTS[@]} variants x $REPS reps; results in $results"

for rep in $(seq "$REPS"); do
  for v in "${VARIANTS[@]}"; do
    err=$logs/$v-$rep.err
    line=$(timeout -k 5 "$TIMEOUT" "$probe" measure "$v" --libphos "$libphos" --agent-tool "$tool" 2>"$err")
    rc=$?
    row=$(grep -m1 '^result ' <<<"$line")
    if [ -z "$row" ]; then
      why=$([ $rc -ge 124 ] && echo "timed_out_after_${TIMEOUT}s" || tail -n1 "$err" | tr ' ' _ | cut -c1-160)
      row="result variant=$v status=FAIL note=${why:-exit_$rc}"
    fi
    echo "rep=$rep $row" >> "$results"
    echo "  $v (rep $rep): $(sed 's/^result variant=[^ ]* //' <<<"$row")"
    [[ $row == *status=ok* ]] || { [ -s "$err" ] && tail -n 3 "$err" | sed 's/^/      /'; }
  done
done

# The table: medians over the reps (delta, anon delta, checkpoint, restore).
table=${results%.txt}.md
{
  echo
  echo "| variant | RSS before MiB | RSS delta MiB | anon delta MiB | checkpoint ms | restore ms | GPU used MiB | stack (ready -> after restore) | limits set | grew most | ok/n |"
  echo "|---|---:|---:|---:|---:|---:|---:|---|---|---|---|"
  awk '
    function val(k,   i, kv) { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == k) return substr($i, length(k) + 2) } return "-" }
    function median(s,   n, a, i, j, t) { n = split(s, a, " "); if (!n) return "-"
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : sprintf("%.1f", (a[n / 2] + a[n / 2 + 1]) / 2) }
    function add(v, k,   x) { x = val(k); if (x != "-") m[v, k] = m[v, k] " " x }
    {
      v = val("variant"); if (!(v in n)) order[++count] = v; n[v]++
      if (val("status") != "ok") { note[v] = val("note"); next }
      ok[v]++
      add(v, "rss_before_mib"); add(v, "delta_mib"); add(v, "anon_delta_mib"); add(v, "checkpoint_ms"); add(v, "restore_ms")
      gpu[v] = val("gpu_used_mib"); stack[v] = val("stack") " -> " val("stack_after"); set[v] = val("set"); grew[v] = val("grown")
    }
    END {
      for (i = 1; i <= count; i++) {
        v = order[i]
        printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d/%d%s |\n", v, median(m[v, "rss_before_mib"]),
          median(m[v, "delta_mib"]), median(m[v, "anon_delta_mib"]), median(m[v, "checkpoint_ms"]), median(m[v, "restore_ms"]),
          (v in gpu) ? gpu[v] : "-", (v in stack) ? stack[v] : "-", (v in set) ? set[v] : "-", (v in grew) ? grew[v] : "-",
          ok[v], n[v], (v in note) ? " " note[v] : ""
      }
    }' "$results"
} | tee "$table"
exit 0
