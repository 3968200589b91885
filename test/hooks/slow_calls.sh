#!/usr/bin/env bash
# PHOS_TRACE_SLOW_CALLS_MS against the fake libcuda: after a checkpoint's
# round trip the gate opens and the program makes four gated calls, the
# first a copy the fake slows to 30 ms (FAKE_COPY_SLEEP_MS). With 20:4 the
# copy is logged as slow (and as the first), the fast ones are not, and the
# fourth call ends the trace with its summary; without the variable nothing
# is logged; a malformed value is said.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
fail() { echo "[slow_calls] FAIL: $*"; exit 1; }
source "$(dirname "$0")/gate_open_lib.sh"

round PHOS_TRACE_SLOW_CALLS_MS=20:4 FAKE_COPY_SLEEP_MS=30
sed 's/^/[slow_calls] /' "$work/err"
grep -qE '^phos: slow call: cuMemcpyHtoD[_v2]* (3[0-9]|[4-9][0-9])\.[0-9]+ ms, call 1 after the gate opened' "$work/err" ||
  fail "the slow copy is not logged as call 1"
[ "$(grep -c '^phos: slow call:' "$work/err")" = 1 ] || fail "fast calls were logged as slow"
grep -qE '^phos: slow-call trace: 4 calls in the first [0-9.]+ ms after the gate opened, (3[0-9]|[4-9][0-9])\.[0-9]+ ms inside them; 1 calls of 20\.000 ms or more took (3[0-9]|[4-9][0-9])\.[0-9]+ ms$' "$work/err" ||
  fail "no summary after the fourth call"

round FAKE_COPY_SLEEP_MS=30
grep -q 'slow' "$work/err" && fail "traced without PHOS_TRACE_SLOW_CALLS_MS: $(cat "$work/err")"

round PHOS_TRACE_SLOW_CALLS_MS=soon
grep -q 'PHOS_TRACE_SLOW_CALLS_MS=soon is not MS\[:CALLS\]' "$work/err" || fail "a malformed value is not said: $(cat "$work/err")"
echo "[slow_calls] PASS"
