#!/usr/bin/env bash
# What cuBLAS writes beside a GEMM's matrices, in its recorded exact set,
# against the fake libcuda and libcublas (cublas_client.c --record): with
# PHOS_RECORD_LAUNCHES=1 each cublasGemmEx carries A and B read, C read and
# written, and, read and written,
#   1. the memory cublasCreate allocated for the handle (O1)
#   2. with the pool the first GEMM allocated inside the library (L1)
#   3. the workspace cublasSetWorkspace set (W), first
#   4. after cublasDestroy, a new handle of the same value: no W, and
#      nothing of what the destroyed handle's library freed (O1, L1)
#   5. more of the library's own allocations than there is room for: all of
#      them still inside the call's written ranges (neighbours merged)
#   6. a workspace set back to none: no W
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
fail() { echo "[cublas_workspace] FAIL: $*"; exit 1; }
stats=$(mktemp)
trap 'rm -f "$stats"' EXIT

out=$(LD_PRELOAD=$BUILD/cuda_hooks/libphos.so PHOS_RECORD_LAUNCHES=1 PHOS_STATS_FILE=$stats "$dir/cublas_client" --record) ||
  fail "the client failed: $out"
echo "$out" | sed 's/^/[cublas_workspace] /'
grep -qx "calls failed 0" <<< "$out" || fail "a call failed through libphos.so"
grep '^record ' "$stats" | sed 's/^/[cublas_workspace] /'

CLIENT_OUT=$out python3 - "$stats" <<'PY' || fail "the recorded GEMMs do not carry what cuBLAS writes (above)"
import os, re, sys

addr, handles = {}, {}
for line in os.environ["CLIENT_OUT"].splitlines():
    f = line.split()
    if f[0] == "addr":
        addr[f[1]] = (int(f[2], 16), int(f[3]))
    elif f[0] == "handle":
        handles[f[1]] = f[2]
gemms = []
for line in open(sys.argv[1]):
    f = line.split()
    if f[:4] != ["record", f[1], "library", "cublasGemmEx"]:
        continue
    ranges = []
    for tok in f[4:]:
        m = re.fullmatch(r"(r?w?)(\*?)(\??):0x([0-9a-f]+)\+(\d+)", tok)
        assert m, tok
        ranges.append((m.group(1) + m.group(2) + m.group(3), int(m.group(4), 16), int(m.group(5))))
    gemms.append(ranges)
assert len(gemms) == 6, f"{len(gemms)} cublasGemmEx records, expected 6"

def rw(*names):
    return [("rw", *addr[n]) for n in names]

def owned_sorted(names):  # the library's own, in address order
    return sorted(rw(*names), key=lambda r: r[1])

matrices = [("r", *addr["A"]), ("r", *addr["B"]), ("rw", *addr["C"])]

def expect(i, want, what):
    got = gemms[i - 1]
    assert got == want, f"gemm {i} ({what}): got {got}, expected {want}"
    print(f"gemm {i}: {what}")

expect(1, matrices + rw("O1"), "the memory cublasCreate allocated")
expect(2, matrices + owned_sorted(["O1", "L1"]), "and the pool the first GEMM allocated")
expect(3, matrices + rw("W") + owned_sorted(["O1", "L1"]), "the workspace set, first")
assert handles["h1"] == handles["h2"], f"the fake gave h2 another value ({handles}): destroy's forgetting untested"
expect(4, matrices + rw("O2"), "a new handle of a destroyed one's value: no workspace, the freed memory gone")

# 5: O2, L2, O3..O6 in 5 slots: each inside a written range.
got = gemms[4]
assert got[:3] == matrices and len(got) == 8, f"gemm 5: {got}"
written = [(a, a + b) for access, a, b in got[3:] if access == "rw"]
assert len(written) == 5, f"gemm 5: {got}"
for n in ["O2", "L2", "O3", "O4", "O5", "O6"]:
    a, b = addr[n]
    assert any(s <= a and a + b <= e for s, e in written), f"gemm 5: {n} {addr[n]} not inside {written}"
print("gemm 5: six of the library's allocations in five ranges, each inside one")
expect(6, got, "a workspace set back to none")
PY
echo "[cublas_workspace] PASS"
