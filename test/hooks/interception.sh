#!/usr/bin/env bash
# The interception without a GPU, against a fake libcuda.so.1: whichever way a
# program reaches the driver (dlsym, cuGetProcAddress, cuGetProcAddress asked
# for itself, direct linking) it gets libphos.so's wrapper, the call still
# reaches libcuda, RTLD_NEXT keeps its meaning for other libraries, and a
# closed gate holds driver calls until it opens. Queries
# (cuda_hooks/src/driver/query_functions.txt) are handed out unwrapped, and a closed
# gate does not hold them.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
client=$dir/driver_client
libphos=$BUILD/cuda_hooks/libphos.so
status=1
fail() { echo "[interception] FAIL: $*"; exit 1; }

native=$("$client" where)
grep -q "^dlsym libcuda.so.1$" <<< "$native" || fail "without libphos.so the fake driver should answer: $native"

out=$(LD_PRELOAD=$libphos "$client" where)
echo "$out" | sed 's/^/[interception] /'
for way in "dlsym" "cuGetProcAddress" "cuGetProcAddress(cuMemcpyHtoD)" "cuGetProcAddress(cuGetProcAddress)" \
           "that(cuMemcpyHtoD)" "direct"; do
  grep -qxF "$way libphos.so" <<< "$out" || fail "$way does not reach libphos.so"
done
grep -qx "missing none" <<< "$out" || fail "a function libcuda lacks must stay missing"
for way in "query dlsym" "query cuGetProcAddress"; do
  grep -qxF "$way libcuda.so.1" <<< "$out" || fail "$way: a query must be libcuda's own function"
done
grep -qxF "query direct libphos.so" <<< "$out" || fail "a query linked directly must reach libphos.so's forwarder"
grep -qx "calls reached libcuda 4" <<< "$out" || fail "calls through the wrappers did not reach libcuda"
grep -qx "RTLD_NEXT from a library 2" <<< "$out" || fail "dlsym(RTLD_NEXT) from a library found the wrong symbol"

state=$(mktemp)
trap 'kill -9 $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$state" "$state.tmp"; exit $status' EXIT
LD_PRELOAD=$libphos "$client" loop "$state" & pid=$!
count() { cat "$state" 2>/dev/null || echo 0; }
# Waits (2 s at most) until phos-agent-tool says the gate is closed (the
# agent answers one connection at a time: it cannot be asked meanwhile).
closed_seen() {
  for _ in $(seq 200); do
    grep -qx quiesced "$state.hold" 2>/dev/null && return 0
    sleep 0.01
  done
  fail "the gate did not close"
}
for _ in $(seq 100); do [ "$(count)" -gt 10 ] && break; sleep 0.02; done
[ "$(count)" -gt 10 ] || fail "driver calls do not run"
"$dir/phos-agent-tool" hold "$pid" 600 > "$state.hold" &
hold=$!
# Sampled once the gate is closed (the tool's start takes its time on a
# loaded machine), within its 600 ms.
closed_seen
a=$(count); sleep 0.3; b=$(count)
wait "$hold" || fail "agent tool failed"
[ "$a" = "$b" ] || fail "driver calls ran while the gate was closed ($a -> $b)"
for _ in $(seq 100); do c=$(count); [ "$c" -gt "$b" ] && break; sleep 0.02; done
[ "$c" -gt "$b" ] || fail "driver calls did not resume after the gate opened"
echo "[interception] gate: calls held at $a while closed, $c after it opened; $(tail -n1 "$state.hold")"
rm -f "$state.hold"
kill -9 $pid; wait $pid 2>/dev/null || true

LD_PRELOAD=$libphos "$client" query-loop "$state" & pid=$!
for _ in $(seq 100); do [ "$(count)" -gt 10 ] && break; sleep 0.02; done
"$dir/phos-agent-tool" hold "$pid" 600 > "$state.hold" &
hold=$!
sleep 0.2; a=$(count); sleep 0.3; b=$(count)
wait "$hold" || fail "agent tool failed"
[ "$b" -gt "$a" ] || fail "queries were held by the closed gate ($a -> $b)"
echo "[interception] queries ran on while the gate was closed: $a -> $b"
rm -f "$state.hold"
echo "[interception] PASS"
status=0
