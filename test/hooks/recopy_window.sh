#!/usr/bin/env bash
# A soft recopy window against the fake libcuda, the engine played by
# phos-agent-tool: the process's write marks exactly the chunk it writes
# dirty, without waiting; a call whose write set phos does not read marks
# every chunk dirty, without waiting either (the gate closing for the final
# copy would wait for it); the window is not given up. The process's own
# copies between host and device are told to the table (PhOS §5: the engine
# gives way to them), each as queued, a synchronous one of 1 MiB too: none
# is held in flight for its call (the fake driver's copy takes
# FAKE_COPY_SLEEP_MS; a window's close must not wait for it);
# device-to-device ones are not told;
# a cold-first claim takes the allocation not written first.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[recopy_window] FAIL: $*"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

LD_PRELOAD=$libphos PHOS_SPECULATE=1 FAKE_COPY_SLEEP_MS=100 "$dir/copy_window_client" "$work/go" "$work/go2" \
  > "$work/out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^ready' "$work/out" && break; sleep 0.05; done
read -r _ _ buffer other < <(grep '^ready' "$work/out") || fail "the client did not start: $(cat "$work/out")"
hold_ms=300
"$dir/phos-agent-tool" recopy-window "$pid" "$work/go" "$work/go2" "$hold_ms" > "$work/tool" 2>&1 ||
  fail "phos-agent-tool: $(cat "$work/tool")"
for _ in $(seq 100); do grep -q '^unknown' "$work/out" && break; sleep 0.05; done
sed 's/^/[recopy_window] /' "$work/out" "$work/tool"

read -r _ memset_ms memset_rc < <(grep '^memset' "$work/out") || fail "no memset line"
read -r _ unknown_ms < <(grep '^unknown' "$work/out") || fail "no unknown line"
[ "$memset_rc" = 0 ] || fail "the memset failed (CUresult $memset_rc)"
[ "$memset_ms" -lt "$hold_ms" ] || fail "the write waited ($memset_ms ms): recopy never waits"
[ "$unknown_ms" -lt "$hold_ms" ] || fail "the unknown set waited ($unknown_ms ms): recopy never waits"
line=$(grep '^recopy:' "$work/tool") || fail "no account"
read -r _ d1 at _ d2 _ total waited aborted transfers bytes queued cold <<< "$line"
[ "${d1#dirty=}" = 1 ] || fail "the write marked ${d1#dirty=} chunks dirty, not 1: $line"
[ "$((${at#at=}))" = "$((buffer))" ] || fail "the dirty chunk is at ${at#at=}, not the one written at $buffer + 4096"
[ "${d2#dirty=}" = "$total" ] || fail "the unknown set left chunks clean: $line"
[ "${waited#waited=}" = 0 ] && [ "${aborted#aborted=}" = 0 ] || fail "$line"
read -r _ told told_bytes < <(grep '^transfers' "$work/out") || fail "no transfers line"
[ "${transfers#transfers=}" = "$told" ] && [ "${bytes#transfer_bytes=}" = "$told_bytes" ] ||
  fail "the table saw ${transfers#transfers=} transfers (${bytes#transfer_bytes=} bytes), not the $told ($told_bytes bytes) that cross the link: $line"
[ "${queued#queued=}" = 1 ] || fail "the asynchronous transfers left no estimate: $line"
[ "$((${cold#cold_first=}))" = "$((other))" ] ||
  fail "a cold-first claim took ${cold#cold_first=}, not the unwritten allocation at $other: $line"
echo "[recopy_window] speculated: the write marked its chunk dirty in $memset_ms ms, the unknown set all $total in $unknown_ms ms; $line"

# cow_trust=checksum: the final pass copies again what changed, whatever the
# marks say, so a call with an unknown set is counted, not marked.
kill "$pid" 2>/dev/null || true
rm -f "$work/go" "$work/go2" "$work/out"
LD_PRELOAD=$libphos PHOS_SPECULATE=1 "$dir/copy_window_client" "$work/go" "$work/go2" > "$work/out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^ready' "$work/out" && break; sleep 0.05; done
grep -q '^ready' "$work/out" || fail "checksum: the client did not start: $(cat "$work/out")"
PHOS_TOOL_TRUST=checksum "$dir/phos-agent-tool" recopy-window "$pid" "$work/go" "$work/go2" "$hold_ms" > "$work/tool" 2>&1 ||
  fail "checksum: phos-agent-tool: $(cat "$work/tool")"
for _ in $(seq 100); do grep -q '^unknown' "$work/out" && break; sleep 0.05; done
line=$(grep '^recopy:' "$work/tool") || fail "checksum: no account"
read -r _ d1 _ _ d2 _ total waited aborted _ _ _ _ unmarked <<< "$line"
[ "${d1#dirty=}" = 1 ] || fail "checksum: the write marked ${d1#dirty=} chunks dirty, not 1: $line"
[ "${d2#dirty=}" = 1 ] || fail "checksum: the unknown set marked chunks dirty: $line"
[ "${unmarked#unmarked=}" = 1 ] || fail "checksum: the unknown set was not counted: $line"
[ "${waited#waited=}" = 0 ] && [ "${aborted#aborted=}" = 0 ] || fail "checksum: $line"
echo "[recopy_window] PASS: speculated as above; checksum: the unknown set left the marks alone, counted; $line"
