#!/usr/bin/env bash
# What libphos.so adds to each driver call on this CPU (phos-launch-path-bench,
# against test/hooks' fake libcuda): PHOS_BENCH_RUNS (5) alternating runs
# natively, with libphos.so and nothing on, recording launches, and
# speculating; per figure the median in ns, [min-max], and the difference of
# the medians to native. A measurement to read, not a test.
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
done
echo "launch path, ns per call: native | libphos.so (+ns) | recording (+ns) | speculating (+ns)"
python3 - "$log" <<'PY'
import statistics, sys
runs = {}
for cfg in ("native", "phos", "record", "speculate"):
    for line in open(f"{sys.argv[1]}/{cfg}"):
        _, name, ns = line.split()
        runs.setdefault(name, {}).setdefault(cfg, []).append(float(ns))
for name, by in runs.items():
    base = statistics.median(by["native"])
    cells = [f"{base:7.1f} [{min(by['native']):.1f}-{max(by['native']):.1f}]"]
    for cfg in ("phos", "record", "speculate"):
        m = statistics.median(by[cfg])
        cells.append(f"{m:7.1f} [{min(by[cfg]):.1f}-{max(by[cfg]):.1f}] {m - base:+7.1f}")
    print(f"  {name:16s} " + " | ".join(cells))
PY
