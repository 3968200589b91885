#!/usr/bin/env bash
# The call counter (PHOS_CALL_CYCLES=on) against the fake libcuda and
# libcublas: call_cycles_client's known calls are counted by kind, the same
# through the agent (phosctl status, text and JSON) and in the stats file; a
# query handed out unwrapped is not counted; the time the fake driver takes
# in a forwarded call (sleeping copies) is not phos's; cuBLAS's own driver
# call counts as its own kind. Off (unset, "off", "0"), nothing is counted
# or shown.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
phosctl=$BUILD/plugin/phosctl
fail() { echo "[call_cycles] FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME [VAR=VALUE...]: the client under libphos.so, asked for its status
# (text, JSON) while it waits; its stats file written at its exit.
run() {
  local name=$1 pid
  shift
  mkfifo "$work/$name.in"
  env "$@" FAKE_COPY_SLEEP_MS=30 PHOS_STATS_FILE="$work/$name.stats" LD_PRELOAD="$libphos" \
    "$dir/call_cycles_client" < "$work/$name.in" > "$work/$name.out" 2>&1 &
  pid=$!
  exec 3> "$work/$name.in"
  for _ in $(seq 200); do grep -q '^ready' "$work/$name.out" && break; sleep 0.05; done
  grep -q '^ready' "$work/$name.out" || fail "$name: the client never got ready: $(cat "$work/$name.out")"
  "$phosctl" status "$pid" > "$work/$name.status" 2>&1 || fail "$name: phosctl status: $(cat "$work/$name.status")"
  "$phosctl" status "$pid" --json > "$work/$name.json" 2>&1 || fail "$name: phosctl status --json: $(cat "$work/$name.json")"
  echo >&3
  exec 3>&-
  wait "$pid" || fail "$name: the client failed: $(cat "$work/$name.out")"
  grep -qx "calls failed 0" "$work/$name.out" || fail "$name: a call failed through libphos.so"
}

run on PHOS_CALL_CYCLES=on
sed 's/^/[call_cycles] /' "$work/on.out"
grep -E '^call_(cycles|cost) ' "$work/on.stats" | sed 's/^/[call_cycles] stats: /'
grep -A20 'time inside phos' "$work/on.status" | sed 's/^/[call_cycles] status: /'

expected=$(cat <<'LINES'
cuCtxSetCurrent calls=11
cuInit calls=1
cuLaunchKernel calls=7
cuMemcpyHtoD_v2 calls=3
cuMemsetD32_v2 calls=2
cuModuleGetFunction calls=1
cuModuleLoadData calls=1
cublasSgemm_v2 calls=2
LINES
)
diff <(echo "$expected") <(awk '/^call_cost / {print $2, $3}' "$work/on.stats" | sort) ||
  fail "the stats' calls by kind differ from the client's (above)"
grep -Eqx 'call_cycles cycles_per_second=[0-9]+ calls=28 cycles=[0-9]+ ns=[0-9]+ floor_ns_per_call=[0-9.]+' \
  "$work/on.stats" ||
  fail "the stats' total is not 28 calls: $(grep '^call_cycles' "$work/on.stats")"

# The three copies slept 90 ms in the fake driver: not phos's time.
copies_ms=$(sed -n 's/^copies_ms=//p' "$work/on.out")
copy_ns=$(awk '/^call_cost cuMemcpyHtoD_v2 / {sub("ns=", "", $5); print $5}' "$work/on.stats")
awk -v ms="$copies_ms" 'BEGIN {exit !(ms >= 90)}' || fail "the copies took $copies_ms ms, not the 90 the fake sleeps"
[ "$copy_ns" -gt 0 ] && [ "$copy_ns" -lt 5000000 ] ||
  fail "phos counted $copy_ns ns in 3 copies that slept 90 ms in the driver: the forwarded call was counted"

# The agent says the same, per kind with its mean.
grep -Eq "^  time inside phos \(PHOS_CALL_CYCLES, clock [0-9.]+ GHz\): 28 calls, [0-9.]+ ms, [0-9.]+ ns a call \(of which the counter's own: [0-9.]+\)$" \
  "$work/on.status" || fail "status has no total of 28 calls: $(tr '\n' '|' < "$work/on.status")"
grep -Eq '^    cuLaunchKernel: 7 calls, [0-9.]+ ms, [0-9.]+ ns a call \([0-9]+ cycles\)$' "$work/on.status" ||
  fail "status does not list cuLaunchKernel's 7 calls: $(tr '\n' '|' < "$work/on.status")"
python3 - "$work/on.json" "$work/on.stats" <<'PY' || fail "status --json differs from the stats file"
import json, sys
j = json.load(open(sys.argv[1]))["call_cycles"]
stats = {l.split()[1]: int(l.split()[2][6:]) for l in open(sys.argv[2]) if l.startswith("call_cost ")}
got = {c["call"]: c["calls"] for c in j["calls"]}
assert got == stats, (got, stats)
assert j["total"]["calls"] == 28, j["total"]
assert j["cycles_per_second"] > 1e8, j["cycles_per_second"]
assert 0 < j["floor_ns_per_call"] < 1000, j["floor_ns_per_call"]
assert all(c["ns"] > 0 and abs(c["mean_ns"] - c["ns"] / c["calls"]) < 1e-6 for c in j["calls"]), j["calls"]
PY

for off in unset off 0; do
  if [ "$off" = unset ]; then run off_$off; else run off_$off PHOS_CALL_CYCLES=$off; fi
  ! grep -Eq '^call_(cycles|cost) ' "$work/off_$off.stats" ||
    fail "PHOS_CALL_CYCLES=$off: the stats hold call counts: $(grep -E '^call_' "$work/off_$off.stats" | head -n 2)"
  ! grep -q 'time inside phos' "$work/off_$off.status" || fail "PHOS_CALL_CYCLES=$off: status shows call counts"
  python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["call_cycles"] is None' "$work/off_$off.json" ||
    fail "PHOS_CALL_CYCLES=$off: status --json has call counts"
  grep -q '^launches 7$' "$work/off_$off.stats" || fail "PHOS_CALL_CYCLES=$off: the launches were not seen"
done
echo "[call_cycles] ok"
