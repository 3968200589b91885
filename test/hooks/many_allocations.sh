#!/usr/bin/env bash
# A process with more allocations than one message carries fds (253) lets go
# of its memory (its handles released, as a dump does) and gets it back
# through the fds the plugin sends in pages: every allocation mapped again,
# none refused for want of a handle that a later page brings.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[many] FAIL: $*"; exit 1; }
log=$(mktemp)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -f "$log"' EXIT
n=300
exec 3< <(FAKE_CUDA_LOG=$log LD_PRELOAD=$libphos "$dir/many_client" $n)
line=
until [ "${line%% *}" = ready ]; do read -r -t 10 line <&3 || fail "the client did not get ready: $line"; done
pid=${line#ready }
out=$("$dir/phos-agent-tool" roundtrip "$pid" --release-handles 2>/dev/null) || fail "round trip failed: $out"
echo "[many] $out"
bytes=$((n * 2 * 1024 * 1024))
grep -q "roundtrip (handles released): $n allocations, $bytes bytes released in .* ms, $bytes bytes mapped back" <<<"$out" ||
  fail "not every allocation came back"
imports=$(grep -c '^import ' "$log" || true)
[ "$imports" = $n ] || fail "$imports allocations imported from their fds, $n expected"
echo "[many] PASS"
