#!/usr/bin/env bash
# What a launch costs in libphos.so while a dump's copy window is open with
# cow_trust=checksum (soft recopy: each launch on a speculated set counts its
# kernel and the buffers it only read, for a refused image to name): the
# launch path benchmark (phos-launch-path-bench, speculating, against
# test/hooks' fake libcuda) with the window held open by phos-agent-tool
# recopy-window, beside the same without a window; PHOS_BENCH_RUNS (5)
# alternating runs, and with PHOS_BENCH_BASELINE_LIB=another libphos.so (the
# build before a change) that one too. Per figure the median in ns
# [min-max]. A measurement to read, not a test.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
bench=$BUILD/test/bench/phos-launch-path-bench
tool=$BUILD/test/hooks/phos-agent-tool
export LD_LIBRARY_PATH=$BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# window LIB OUT: one run with a checksum recopy window open while it measures.
window() {
  rm -f "$work/go" "$work/go2" "$work/out"
  LD_PRELOAD=$1 PHOS_SPECULATE=1 PHOS_BENCH_GO=$work/go "$bench" > "$work/out" &
  pid=$!
  for _ in $(seq 200); do grep -qs '^ready' "$work/out" && break; sleep 0.05; done
  grep -q '^ready' "$work/out" || { echo "the benchmark did not start: $(cat "$work/out")" >&2; exit 1; }
  # Open long enough for every figure (the tool closes it after twice this).
  PHOS_TOOL_TRUST=checksum "$tool" recopy-window "$pid" "$work/go" "$work/go2" 15000 > "$work/tool" 2>&1 &
  local tool_pid=$!
  wait "$pid" || { echo "the benchmark failed: $(cat "$work/out")" >&2; exit 1; }
  pid=
  kill "$tool_pid" 2>/dev/null || true
  wait "$tool_pid" 2>/dev/null || true
  grep '^bench' "$work/out" >> "$2"
}

libphos=$BUILD/cuda_hooks/libphos.so
cfgs="closed open"
for _ in $(seq "${PHOS_BENCH_RUNS:-5}"); do
  LD_PRELOAD=$libphos PHOS_SPECULATE=1 "$bench" >> "$work/closed"
  window "$libphos" "$work/open"
  if [ -n "${PHOS_BENCH_BASELINE_LIB:-}" ]; then
    window "$PHOS_BENCH_BASELINE_LIB" "$work/before_open"
    cfgs="closed open before_open"
  fi
done
echo "launch path with a checksum copy window, ns per call: $(sed 's/ / | /g' <<< "$cfgs")"
python3 - "$work" $cfgs <<'PY'
import statistics, sys
runs = {}
for cfg in sys.argv[2:]:
    for line in open(f"{sys.argv[1]}/{cfg}"):
        _, name, ns = line.split()
        runs.setdefault(name, {}).setdefault(cfg, []).append(float(ns))
for name, by in runs.items():
    cells = [f"{statistics.median(v):7.1f} [{min(v):.1f}-{max(v):.1f}]" for v in by.values()]
    print(f"  {name:26s} " + " | ".join(cells))
PY
