#!/usr/bin/env bash
# A cuBLAS GEMM that began before a copy window opened, against the fake
# libcuda and libcublas (cublas_client.c --window), the engine played by
# phos-agent-tool without a pool: libphos.so's hook found no window at the
# call's entry; the fake holds the call through the gate's close, the
# window's opening and the gate's reopening, then launches its kernel
# (covered by the call's exact set). That kernel must check the set against
# the window: the GEMM waits for C's chunk (the engine's first claim) and
# for the workspace's, and the account names it. Unchecked, C and the
# workspace would be written unsaved.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
fail() { echo "[cublas_window] FAIL: $*"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

LD_PRELOAD=$BUILD/cuda_hooks/libphos.so PHOS_SPECULATE=1 "$dir/cublas_client" --window "$work/go" > "$work/out" 2>&1 &
pid=$!
# Inside the GEMM, past libphos.so's hook, before the tool closes the gate.
for _ in $(seq 100); do grep -q '^fake_cublas: waiting' "$work/out" && break; sleep 0.05; done
grep -q '^fake_cublas: waiting' "$work/out" || fail "the GEMM did not begin: $(cat "$work/out")"
read -r _ _ c w < <(grep '^ready' "$work/out") || fail "no ready line: $(cat "$work/out")"
hold_ms=300
"$dir/phos-agent-tool" copy-window "$pid" "$work/go" "$hold_ms" > "$work/tool" 2>&1 || fail "phos-agent-tool: $(cat "$work/tool")"
for _ in $(seq 100); do grep -q '^gemm' "$work/out" && break; sleep 0.05; done
sed 's/^/[cublas_window] /' "$work/out" "$work/tool"
grep -qx 'gemm 0' "$work/out" || fail "the GEMM did not return, or failed"
line=$(grep '^window:' "$work/tool") || fail "no account"
grep -q ' aborted=0 ' <<< "$line" || fail "the window was given up: $line"
waited=$(grep -o 'waited=[0-9]*' <<< "$line" | cut -d= -f2)
[ "$waited" -ge 1 ] || fail "no call waited: the GEMM's kernel ran unchecked inside the window: $line"
written=$(grep -o 'written=0x[0-9a-f]*' <<< "$line" | cut -d= -f2)
[ "$((written))" -le "$((c))" ] && [ "$((c))" -lt "$((written + 65536))" ] ||
  fail "the engine's first claim was $written, not the chunk of C at $c: $line"
# The GEMM waited for C's chunk, then (the engine copying the rest a hold
# later) for the workspace's: a wait for each.
longest=$(grep '^longest:' "$work/tool") || fail "no longest waits"
chunks=$(grep -oE ' cublasGemmEx:[0-9]+:[0-9]+:' <<< "$longest" | cut -d: -f3) ||
  fail "the GEMM's wait is not named: $longest"
[ "$chunks" -ge 2 ] || fail "the GEMM waited for $chunks chunks, not C's and the workspace's: $longest"
echo "[cublas_window] PASS: the GEMM begun before the window waited for $chunks chunks (C at $c first, workspace at $w); $line"
