#!/usr/bin/env bash
# The launch record against fake libcuda, libcublas and libnccl: with
# PHOS_RECORD_LAUNCHES=1 every copy, set, GEMM and NCCL call carries the exact
# ranges it reads and writes, work issued inside a library call names it, and
# NCCL is found behind a library opened with RTLD_LOCAL; loaded modules are
# listed with kind, size and hash, and kernel launches name their module (in
# the stats file and through the agent, phosctl status). Without recording
# nothing is recorded, and every call reaches the real (fake) library either way.
# NCCL communicators' creations and destructions are tracked with their
# layout; those with ranks in other processes are listed as what a dump
# of this process alone cannot take.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[record] FAIL: $*"; exit 1; }
stats=$(mktemp)
trap 'rm -f "$stats"' EXIT

out=$(LD_PRELOAD=$libphos PHOS_RECORD_LAUNCHES=1 PHOS_STATS_FILE=$stats "$dir/record_client" "$dir/libnccl_user.so")
echo "$out" | sed 's/^/[record] /'
grep -qx "calls failed 0" <<< "$out" || fail "a call failed through libphos.so"
grep -qx "reached copies 10 cublas 5 nccl 9" <<< "$out" || fail "calls did not all reach the libraries"
grep '^record ' "$stats" | sed 's/^/[record] /'

expected=$(cat <<'LINES'
record 0 copy cuMemcpyDtoD_v2 r:0x200000+4096 w:0x100000+4096
record 1 copy cuMemcpyDtoHAsync_v2 r:0x300000+64
record 2 copy cuMemcpyPeer r:0x500000+100 w:0x400000+100
record 3 copy cuMemcpy2D_v2 w:0x600410+1636
record 4 copy cuMemcpy3DPeerAsync r:0x700a00+3136
record 5 set cuMemsetD32_v2 w:0x800000+40
record 6 set cuMemsetD2D16Async w:0x900000+2248
record 7 set cuStreamWriteValue32_v2 w:0x910000+4
record 8 copy cuMemcpyBatchAsync_v2 r:0x940000+64 w:0x920000+64
record 9 copy cuMemcpyBatchAsync_v2 r:0x950000+128 w:0x930000+128
record 10 library cublasSgemm_v2 r:0xa00000+48 r:0xb00000+68 rw:0xc00000+80
record 11 set cuMemsetD32_v2 within=11 w:0xc00000+16
record 12 library cublasDgemmStridedBatched r:0xd00000+144 r:0xe00000+144 rw:0xf00000+96
record 13 library cublasGemmEx r:0x1000000+128 r:0x1100000+128 rw:0x1200000+256
record 14 library cublasGemmBatchedEx r*:0x1300000+40 r*:0x1400000+40 rw*:0x1500000+40
record 15 library cublasLtMatmul r:0x1600000+4096 r:0x1700000+2016 r?:0x1800000+0 w?:0x1800000+0 rw:0x1900000+1048576
record 16 library ncclAllReduce r:0x10000+400 w:0x20000+400
record 17 library ncclBroadcast w:0x21000+80
record 18 library ncclReduce r:0x12000+80 w:0x22000+80
record 19 library ncclAllGather r:0x13000+16 w:0x23000+64
record 20 library ncclReduceScatter r:0x14000+256 w:0x24000+64
record 21 library ncclSend r:0x15000+3
record 22 library ncclRecv w:0x25000+12
record 23 library ncclAllReduce r:0x10000+400 w:0x20000+400
record 24 library ncclSend r:0x15000+3
record 25 kernel vec_add module=1
record 26 kernel vec_add module=1
record 27 kernel lib_kernel module=2
LINES
)
diff <(echo "$expected") <(grep '^record ' "$stats") || fail "the record differs from the expected ranges (above)"

grep '^module ' "$stats" | sed 's/^/[record] /'
grep -Eqx "module 1 fatbin 216 [0-9a-f]{16} cuModuleLoadData functions=vec_add,scale globals=table" "$stats" ||
  fail "the fatbin module is not listed as expected"
grep -Eqx "module 2 fatbin 216 [0-9a-f]{16} cuLibraryLoadData functions=lib_kernel globals=" "$stats" ||
  fail "the library is not listed as expected"
[ "$(grep -c '^module ' "$stats")" = 2 ] || fail "the unloaded PTX module is still listed"
hash1=$(awk '$1 == "module" && $2 == 1 {print $5}' "$stats")
hash2=$(awk '$1 == "module" && $2 == 2 {print $5}' "$stats")
[ "$hash1" = "$hash2" ] || fail "the same fatbin has two hashes ($hash1, $hash2)"

# NCCL communicators, made and destroyed behind the RTLD_LOCAL library
# (nccl_user.c): the three left are listed with their layout, the two with
# ranks in other processes make a dump refuse the process, saying so.
grep -qx "nccl_communicators 3" "$stats" || fail "not 3 live NCCL communicators: $(grep nccl "$stats" | tr '\n' '|')"
for l in "rank=1 nranks=4 device=-1 split_from=no single_process=0 calls=2 rebuilds=0" \
         "rank=0 nranks=2 device=0 split_from=no single_process=1 calls=0 rebuilds=0" \
         "rank=1 nranks=2 device=-1 split_from=yes single_process=0 calls=0 rebuilds=0"; do
  grep -qx "nccl_communicator $l" "$stats" || fail "no communicator '$l': $(grep nccl_comm "$stats" | tr '\n' '|')"
done
grep -q "^unsupported 2 NCCL communicator(s) with ranks in other processes" "$stats" ||
  fail "the communicators spanning processes do not make a dump refuse: $(grep unsupported "$stats")"

# The agent reports the same modules.
exec 3< <(LD_PRELOAD=$libphos "$dir/record_client" "$dir/libnccl_user.so" wait)
line=
until [ "${line%% *}" = ready ]; do read -r -t 10 line <&3 || fail "the client did not get ready"; done
pid=${line#ready }
trap 'kill $pid 2>/dev/null || true; rm -f "$stats"' EXIT
status=$("$BUILD/plugin/phosctl" status "$pid" --json)
"$BUILD/plugin/phosctl" status "$pid" | grep '^  module' | sed 's/^/[record] phosctl:/'
kill "$pid"
echo "$status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
m = {x["id"]: x for x in s["modules"]}
assert sorted(m) == [1, 2], m
assert m[1]["kind"] == "fatbin" and m[1]["size"] == 216 and m[1]["functions"] == ["vec_add", "scale"], m[1]
assert m[1]["globals"] == ["table"] and m[1]["source"] == "cuModuleLoadData", m[1]
assert m[2]["functions"] == ["lib_kernel"] and m[2]["function_count"] == 1, m[2]
c = s["nccl_communicators"]
assert [(x["rank"], x["nranks"], x["calls"], x["single_process"]) for x in c] == \
    [(1, 4, 2, False), (0, 2, 0, True), (1, 2, 0, False)], c
assert len({x["job_id"] for x in c}) == 3, c  # the split is named apart from its parent
assert s["counters"]["nccl_communicators"] == 3, s["counters"]
' || fail "phosctl status does not show the modules and the NCCL communicators: $status"

# A rank that sits a split out (NCCL_SPLIT_NOCOLOR) still counts it: the
# next split of the same parent has one job id in both ranks' processes.
late_split_job() {  # late_split_job RANK: the job id of its last communicator
  local line= p
  exec 4< <(LD_PRELOAD=$libphos "$dir/record_client" "$dir/libnccl_user.so" wait late-split "$1")
  until [ "${line%% *}" = ready ]; do read -r -t 10 line <&4 || fail "the late-split client $1 did not get ready"; done
  p=${line#ready }
  "$BUILD/plugin/phosctl" status "$p" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["nccl_communicators"][-1]["job_id"])'
  kill "$p"
}
job0=$(late_split_job 0) && job1=$(late_split_job 1) || fail "phosctl status of the late-split clients"
[ -n "$job0" ] && [ "$job0" = "$job1" ] ||
  fail "a split after one that rank 1 sat out has two job ids: rank 0 $job0, rank 1 $job1"
echo "[record] a split after one a rank sat out: one job id in both ranks ($job0)"

out=$(LD_PRELOAD=$libphos PHOS_STATS_FILE=$stats "$dir/record_client" "$dir/libnccl_user.so")
grep -qx "reached copies 10 cublas 5 nccl 9" <<< "$out" || fail "without recording, calls did not all reach the libraries"
! grep -q '^record ' "$stats" || fail "recorded while recording is off"
echo "[record] PASS"
