#!/usr/bin/env bash
# What libphos.so adds to each driver call on this CPU (phos-launch-path-bench,
# against test/hooks' fake libcuda): PHOS_BENCH_RUNS (5) alternating runs
# natively, with libphos.so and nothing on, recording launches, and
# speculating (and with PHOS_BENCH_BASELINE_LIB=another libphos.so, the build
# before a change, that one with nothing on and speculating); per figure the
# median in ns, [min-max], and the difference of the medians to native. A
# measurement to read, not a test.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
bench=$BUILD/test/bench/phos-launch-path-bench
libphos=$BUILD/cuda_hooks/libphos.so
export LD_LIBRARY_PATH=$BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
for _ in $(seq "${PHOS_BENCH_RUNS:-5}"); do
  "$bench" >> "$log/native"
  LD_PRELOAD=$libphos "$bench" >> "$log/phos"
  LD_PRELOAD=$libphos PHOS_RECORD_LAUNCHES=1 "$bench" >> "$log/record"
  LD_PRELOAD=$libphos PHOS_SPECULATE=1 "$bench" >> "$log/speculate"
  if [ -n "${PHOS_BENCH_BASELINE_LIB:-}" ]; then
    LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB "$bench" >> "$log/before"
    LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB PHOS_SPECULATE=1 "$bench" >> "$log/before_speculate"
  fi
done
cfgs="phos record speculate${PHOS_BENCH_BASELINE_LIB:+ before before_speculate}"
echo "launch path, ns per call: native | $(sed 's/ / (+ns) | /g' <<< "$cfgs") (+ns)"
python3 - "$log" $cfgs <<'PY'
import statistics, sys
runs = {}
cfgs = sys.argv[2:]
for cfg in ["native"] + cfgs:
    for line in open(f"{sys.argv[1]}/{cfg}"):
        _, name, ns = line.split()
        runs.setdefault(name, {}).setdefault(cfg, []).append(float(ns))
for name, by in runs.items():
    base = statistics.median(by["native"])
    cells = [f"{base:7.1f} [{min(by['native']):.1f}-{max(by['native']):.1f}]"]
    for cfg in cfgs:
        if cfg not in by:
            cells.append("-")
            continue
        m = statistics.median(by[cfg])
        cells.append(f"{m:7.1f} [{min(by[cfg]):.1f}-{max(by[cfg]):.1f}] {m - base:+7.1f}")
    print(f"  {name:16s} " + " | ".join(cells))
PY
