#!/usr/bin/env bash
# A copy window against the fake libcuda, with the engine played by
# phos-agent-tool and no pool: once the window is open, the process's write
# to a chunk not yet copied waits until the engine has copied that chunk
# (the engine's first claim is that chunk: the urgent list), and a call whose
# write set phos does not read waits until the window closes; the agent's
# account at the close counts both.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[copy_window] FAIL: $*"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

LD_PRELOAD=$libphos PHOS_SPECULATE=1 "$dir/copy_window_client" "$work/go" > "$work/out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^ready' "$work/out" && break; sleep 0.05; done
read -r _ _ buffer _ < <(grep '^ready' "$work/out") || fail "the client did not start: $(cat "$work/out")"
hold_ms=400
"$dir/phos-agent-tool" copy-window "$pid" "$work/go" "$hold_ms" > "$work/tool" 2>&1 || fail "phos-agent-tool: $(cat "$work/tool")"
for _ in $(seq 100); do grep -q '^unknown' "$work/out" && break; sleep 0.05; done
sed 's/^/[copy_window] /' "$work/out" "$work/tool"

read -r _ memset_ms memset_rc < <(grep '^memset' "$work/out") || fail "no memset line"
read -r _ unknown_ms < <(grep '^unknown' "$work/out") || fail "no unknown line"
[ "$memset_rc" = 0 ] || fail "the memset failed (CUresult $memset_rc)"
[ "$memset_ms" -ge $((hold_ms * 3 / 4)) ] || fail "the write did not wait for the engine ($memset_ms ms)"
[ "$unknown_ms" -ge $((hold_ms * 3 / 4)) ] || fail "the call with an unknown set did not wait for the close ($unknown_ms ms)"
line=$(grep '^window:' "$work/tool") || fail "no account"
grep -q ' aborted=0 ' <<< "$line" || fail "the window was given up: $line"
grep -q ' saved=0 ' <<< "$line" || fail "chunks saved without a pool: $line"
read -r _ told _ < <(grep '^transfers' "$work/out") || fail "no transfers line"
grep -q " transfers=$told\$" <<< "$line" || fail "the table did not see the $told transfers that cross the link: $line"
waited=$(grep -o 'waited=[0-9]*' <<< "$line" | cut -d= -f2)
unknown=$(grep -o 'unknown=[0-9]*' <<< "$line" | cut -d= -f2)
[ "$waited" -ge 2 ] && [ "$unknown" -ge 1 ] || fail "the account does not count both waits: $line"
written=$(grep -o 'written=0x[0-9a-f]*' <<< "$line" | cut -d= -f2)
# The memset wrote at buffer + 4096, in the buffer's first 64 KiB chunk.
[ "$((written))" = "$((buffer))" ] || fail "the engine's first claim was $written, not the chunk written at $buffer + 4096"
# The agent names the calls that waited longest: the memset, which waited for
# its one chunk, and the call with an unknown set, which waited for the close.
longest=$(grep '^longest:' "$work/tool") || fail "no longest waits"
grep -qE ' cuMemsetD32_v2:[0-9]+:1:0( |$)' <<< "$longest" || fail "the memset's wait (1 chunk) is not named: $longest"
grep -qE ' cuStreamBatchMemOp_v2:[0-9]+:0:0( |$)' <<< "$longest" || fail "the unknown set's wait is not named: $longest"
echo "[copy_window] PASS: the write waited $memset_ms ms for its chunk (claimed first), the unknown set $unknown_ms ms for the close; $line"
