#!/usr/bin/env bash
# What libphos.so adds to each driver call on this CPU (phos-launch-path-bench,
# against test/hooks' fake libcuda): PHOS_BENCH_RUNS (5) alternating runs
# natively, with libphos.so and nothing on, recording launches, speculating,
# and with the call counter on (PHOS_CALL_CYCLES=on: "cycles", "cycles_spec"
# speculating too; the counter's own cost is cycles - phos) (and with
# PHOS_BENCH_BASELINE_LIB=another libphos.so, the build before a change, that
# one with nothing on and speculating: the counter's cost while off is phos -
# before); per figure the median in ns, [min-max], and the difference of the
# medians to native. A measurement to read, not a test.
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
  LD_PRELOAD=$libphos PHOS_CALL_CYCLES=on "$bench" >> "$log/cycles"
  LD_PRELOAD=$libphos PHOS_CALL_CYCLES=on PHOS_SPECULATE=1 "$bench" >> "$log/cycles_spec"
  if [ -n "${PHOS_BENCH_BASELINE_LIB:-}" ]; then
    LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB "$bench" >> "$log/before"
    LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB PHOS_SPECULATE=1 "$bench" >> "$log/before_speculate"
  fi
done
cfgs="phos record speculate cycles cycles_spec${PHOS_BENCH_BASELINE_LIB:+ before before_speculate}"
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
# The counter's own cost per call: on minus off, and off minus the build
# before it (where given): what PHOS_CALL_CYCLES=on adds to a step's figures.
print("call counter, ns per call: on - off (cycles - phos)" +
      (" | off - before (phos - before)" if "before" in cfgs else ""))
for name, by in runs.items():
    if "phos" not in by or "cycles" not in by:
        continue
    off = statistics.median(by["phos"])
    line = f"  {name:16s} {statistics.median(by['cycles']) - off:+7.1f}"
    if "before" in by:
        line += f" | {off - statistics.median(by['before']):+7.1f}"
    print(line)
PY
