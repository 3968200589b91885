// The ranges known calls read and write (cuda_hooks/include/phos/hooks/call_ranges.h).
#include <catch2/catch.hpp>
#include <library_types.h>

#include "phos/hooks/call_ranges.h"

using namespace phos::hooks::ranges;

namespace {

constexpr uint32_t kF32 = 32, kF64 = 64, kF16 = 16;

// Finds the range at `address`; fails the test where there is none.
BufferRange at(const RangeList& l, uint64_t address) {
  for (uint8_t i = 0; i < l.count; i++)
    if (l.items[i].address == address) return l.items[i];
  FAIL("no range at " << address);
  return {};
}

bool has(const RangeList& l, uint64_t address) {
  for (uint8_t i = 0; i < l.count; i++)
    if (l.items[i].address == address) return true;
  return false;
}

}  // namespace

TEST_CASE("matrix extent: packed column-major matrix", "[ranges]") {
  CHECK(matrix_bytes(4, 3, 4, kF32) == 4u * 3 * 4);
}

TEST_CASE("matrix extent: leading dimension larger than rows stops at the last row", "[ranges]") {
  // Columns 0 and 1 take ld elements each; the last column only rows.
  CHECK(matrix_bytes(4, 3, 10, kF32) == (2u * 10 + 4) * 4);
}

TEST_CASE("matrix extent: a single column ignores ld", "[ranges]") {
  CHECK(matrix_bytes(7, 1, 1024, kF64) == 7u * 8);
}

TEST_CASE("matrix extent: empty matrices span nothing", "[ranges]") {
  CHECK(matrix_bytes(0, 5, 1, kF32) == 0u);
  CHECK(matrix_bytes(5, 0, 5, kF32) == 0u);
}

TEST_CASE("matrix extent: arguments cuBLAS refuses give no extent", "[ranges]") {
  CHECK_FALSE(matrix_bytes(8, 2, 4, kF32).has_value());   // ld < rows
  CHECK_FALSE(matrix_bytes(-1, 2, 4, kF32).has_value());
  CHECK_FALSE(matrix_bytes(2, 2, 0, kF32).has_value());
  CHECK_FALSE(matrix_bytes(4, 4, 4, 0).has_value());      // unknown element type
}

TEST_CASE("matrix extent: overflow gives no extent", "[ranges]") {
  CHECK_FALSE(matrix_bytes(INT64_MAX, 3, INT64_MAX, kF64).has_value());
}

TEST_CASE("matrix extent: sub-byte elements round up to whole bytes", "[ranges]") {
  CHECK(matrix_bytes(3, 1, 3, 4) == 2u);  // 12 bits
  CHECK(matrix_bytes(4, 1, 4, 6) == 3u);  // 24 bits
}

TEST_CASE("operand extent: transposition swaps rows and cols", "[ranges]") {
  // op(A) is 4 x 3; A^T stored 3 x 4 with ld 5: 3 columns of 5 and one of 3.
  CHECK(operand_bytes(true, 4, 3, 5, kF32) == (3u * 5 + 3) * 4);
  CHECK(operand_bytes(false, 4, 3, 5, kF32) == (2u * 5 + 4) * 4);
  CHECK_FALSE(operand_bytes(true, 4, 3, 2, kF32).has_value());  // ld < stored rows
}

TEST_CASE("data types: element bits of cudaDataType", "[ranges]") {
  CHECK(cuda_data_type_bits(CUDA_R_32F) == 32);
  CHECK(cuda_data_type_bits(CUDA_R_16BF) == 16);
  CHECK(cuda_data_type_bits(CUDA_C_64F) == 128);
  CHECK(cuda_data_type_bits(CUDA_C_16F) == 32);
  CHECK(cuda_data_type_bits(CUDA_R_8F_E4M3) == 8);
  CHECK(cuda_data_type_bits(CUDA_R_4F_E2M1) == 4);
  CHECK(cuda_data_type_bits(CUDA_R_6F_E3M2) == 6);
  CHECK(cuda_data_type_bits(12345) == 0);
}

TEST_CASE("data types: element bits of ncclDataType_t", "[ranges]") {
  CHECK(nccl_data_type_bits(0) == 8);    // ncclInt8
  CHECK(nccl_data_type_bits(5) == 64);   // ncclUint64
  CHECK(nccl_data_type_bits(6) == 16);   // ncclFloat16
  CHECK(nccl_data_type_bits(7) == 32);   // ncclFloat32
  CHECK(nccl_data_type_bits(9) == 16);   // ncclBfloat16
  CHECK(nccl_data_type_bits(11) == 8);   // ncclFloat8e5m2
  CHECK(nccl_data_type_bits(12) == 0);
  CHECK(nccl_data_type_bits(-1) == 0);
}

TEST_CASE("strided batch: adds (batch-1) strides", "[ranges]") {
  auto e = strided_batch(64, 100, 3, kF32);
  REQUIRE(e);
  CHECK(e->offset == 0);
  CHECK(e->bytes == 2u * 100 * 4 + 64);
}

TEST_CASE("strided batch: stride 0 reuses one matrix", "[ranges]") {
  auto e = strided_batch(64, 0, 8, kF32);
  REQUIRE(e);
  CHECK(e->bytes == 64u);
}

TEST_CASE("strided batch: a negative stride reaches below the base", "[ranges]") {
  auto e = strided_batch(64, -100, 3, kF32);
  REQUIRE(e);
  CHECK(e->offset == -800);
  CHECK(e->bytes == 864u);
}

TEST_CASE("strided batch: empty batch and overflow", "[ranges]") {
  CHECK(strided_batch(64, 10, 0, kF32)->bytes == 0u);
  CHECK_FALSE(strided_batch(64, INT64_MAX, 3, kF32).has_value());
  CHECK_FALSE(strided_batch(64, 10, -1, kF32).has_value());
}

TEST_CASE("pitched 2D: enclosing extent from the first to the last byte", "[ranges]") {
  Extent e = pitched_2d(16, 2, 512, 100, 4);
  CHECK(e.offset == 2 * 512 + 16);
  CHECK(e.bytes == 3u * 512 + 100);
}

TEST_CASE("pitched 2D: one row is its width", "[ranges]") {
  CHECK(pitched_2d(0, 0, 4096, 300, 1).bytes == 300u);
}

TEST_CASE("pitched 3D: slices are allocation_height rows apart", "[ranges]") {
  Extent e = pitched_3d(8, 1, 2, 256, 10, 64, 3, 4);
  CHECK(e.offset == (2 * 10 + 1) * 256 + 8);
  CHECK(e.bytes == ((4u - 1) * 10 + (3 - 1)) * 256 + 64);
}

TEST_CASE("pitched 3D: zero width touches nothing", "[ranges]") {
  CHECK(pitched_3d(0, 0, 0, 256, 10, 0, 3, 4).bytes == 0u);
}

TEST_CASE("gemm: NN reads A and B, reads and writes C", "[ranges]") {
  GemmShape s{false, false, 4, 5, 3, 4, 3, 4, kF32, kF32, kF32};
  RangeList l = gemm(s, 0x1000, 0x2000, 0x3000);
  REQUIRE(l.count == 3);
  CHECK(at(l, 0x1000).bytes == 4u * 3 * 4);  // A 4x3
  CHECK(at(l, 0x1000).access == kRead);
  CHECK(at(l, 0x2000).bytes == 3u * 5 * 4);  // B 3x5
  CHECK(at(l, 0x3000).bytes == 4u * 5 * 4);  // C 4x5
  CHECK(at(l, 0x3000).access == (kRead | kWrite));
}

TEST_CASE("gemm: TN stores A as k x m", "[ranges]") {
  GemmShape s{true, false, 4, 5, 3, 8, 3, 4, kF64, kF64, kF64};
  RangeList l = gemm(s, 0x1000, 0x2000, 0x3000);
  CHECK(at(l, 0x1000).bytes == (3u * 8 + 3) * 8);  // A^T: 3 rows, 4 cols, ld 8
}

TEST_CASE("gemm: NT stores B as n x k", "[ranges]") {
  GemmShape s{false, true, 4, 5, 3, 4, 6, 4, kF16, kF16, kF16};
  RangeList l = gemm(s, 0x1000, 0x2000, 0x3000);
  CHECK(at(l, 0x2000).bytes == (2u * 6 + 5) * 2);  // B^T: 5 rows, 3 cols, ld 6
}

TEST_CASE("gemm: mixed element types (GemmEx)", "[ranges]") {
  GemmShape s{false, false, 2, 2, 2, 2, 2, 2, kF16, kF16, kF32};
  RangeList l = gemm(s, 0x1000, 0x2000, 0x3000);
  CHECK(at(l, 0x1000).bytes == 8u);
  CHECK(at(l, 0x3000).bytes == 16u);
}

TEST_CASE("gemm: k = 0 only scales C", "[ranges]") {
  GemmShape s{false, false, 4, 4, 0, 4, 1, 4, kF32, kF32, kF32};
  RangeList l = gemm(s, 0x1000, 0x2000, 0x3000);
  REQUIRE(l.count == 1);
  CHECK(at(l, 0x3000).bytes == 64u);
}

TEST_CASE("gemm: a bad leading dimension keeps the address, extent unknown", "[ranges]") {
  GemmShape s{false, false, 4, 4, 4, 2, 4, 4, kF32, kF32, kF32};
  RangeList l = gemm(s, 0x1000, 0x2000, 0x3000);
  CHECK(at(l, 0x1000).access == (kRead | kExtentUnknown));
  CHECK(at(l, 0x1000).bytes == 0u);
  CHECK(at(l, 0x2000).access == kRead);
}

TEST_CASE("gemm strided batched: each operand spans its batch", "[ranges]") {
  GemmShape s{false, false, 4, 5, 3, 4, 3, 4, kF32, kF32, kF32};
  RangeList l = gemm_strided_batched(s, 0x1000, 12, 0x2000, 15, 0x3000, 20, 4);
  CHECK(at(l, 0x1000).bytes == (3u * 12 + 12) * 4);
  CHECK(at(l, 0x2000).bytes == (3u * 15 + 15) * 4);
  CHECK(at(l, 0x3000).bytes == (3u * 20 + 20) * 4);
}

TEST_CASE("gemm strided batched: batch 1 equals the plain gemm", "[ranges]") {
  GemmShape s{true, true, 6, 7, 5, 5, 7, 6, kF32, kF32, kF32};
  RangeList one = gemm_strided_batched(s, 0x1000, 1 << 20, 0x2000, 1 << 20, 0x3000, 1 << 20, 1);
  RangeList plain = gemm(s, 0x1000, 0x2000, 0x3000);
  REQUIRE(one.count == plain.count);
  for (uint8_t i = 0; i < one.count; i++) CHECK(one.items[i].bytes == plain.items[i].bytes);
}

TEST_CASE("gemm strided batched: broadcast A with stride 0", "[ranges]") {
  GemmShape s{false, false, 4, 4, 4, 4, 4, 4, kF32, kF32, kF32};
  RangeList l = gemm_strided_batched(s, 0x1000, 0, 0x2000, 16, 0x3000, 16, 10);
  CHECK(at(l, 0x1000).bytes == 64u);
}

TEST_CASE("gemm batched: the pointer arrays, the matrices behind them", "[ranges]") {
  RangeList l = gemm_batched(0x1000, 0x2000, 0x3000, 5);
  REQUIRE(l.count == 3);
  CHECK(at(l, 0x1000).bytes == 5 * sizeof(void*));
  CHECK(at(l, 0x1000).access == (kRead | kPointerArray));
  CHECK(at(l, 0x3000).access == (kRead | kWrite | kPointerArray));
}

TEST_CASE("lt matmul: layouts give A, B, C, D and the workspace", "[ranges]") {
  MatrixLayout a{true, true, false, kF16, 64, 32, 64, 1, 0};
  MatrixLayout b{true, false, false, kF16, 32, 16, 32, 1, 0};  // row-major: ld strides rows
  MatrixLayout c{true, true, false, kF32, 64, 16, 64, 2, 64 * 16};
  RangeList l = lt_matmul(0x1000, a, 0x2000, b, 0x3000, c, 0x4000, c, 0x9000, 4096);
  REQUIRE(l.count == 5);
  CHECK(at(l, 0x1000).bytes == 64u * 32 * 2);
  CHECK(at(l, 0x2000).bytes == ((32u - 1) * 32 + 16) * 2);
  CHECK(at(l, 0x3000).bytes == 2u * 64 * 16 * 4);
  CHECK(at(l, 0x3000).access == kRead);
  CHECK(at(l, 0x4000).access == kWrite);
  CHECK(at(l, 0x9000).bytes == 4096u);
}

TEST_CASE("lt matmul: an unreadable or tiled layout is an unknown extent", "[ranges]") {
  MatrixLayout unknown{};
  MatrixLayout tiled{true, true, true, 8, 32, 32, 1024, 1, 0};
  RangeList l = lt_matmul(0x1000, unknown, 0x2000, tiled, 0, unknown, 0x4000, unknown, 0, 0);
  REQUIRE(l.count == 3);  // no C, no workspace
  CHECK(at(l, 0x1000).access == (kRead | kExtentUnknown));
  CHECK(at(l, 0x2000).access == (kRead | kExtentUnknown));
  CHECK(at(l, 0x4000).access == (kWrite | kExtentUnknown));
}

TEST_CASE("nccl: all-reduce reads count and writes count", "[ranges]") {
  RangeList l = collective({Collective::kAllReduce, 0x1000, 0x2000, 100, 32});
  CHECK(at(l, 0x1000).bytes == 400u);
  CHECK(at(l, 0x2000).bytes == 400u);
  CHECK(at(l, 0x2000).access == kWrite);
}

TEST_CASE("nccl: all-gather writes nranks times sendcount", "[ranges]") {
  RangeList l = collective({Collective::kAllGather, 0x1000, 0x2000, 100, 16, 8});
  CHECK(at(l, 0x1000).bytes == 200u);
  CHECK(at(l, 0x2000).bytes == 1600u);
}

TEST_CASE("nccl: reduce-scatter reads nranks times recvcount", "[ranges]") {
  RangeList l = collective({Collective::kReduceScatter, 0x1000, 0x2000, 100, 64, 4});
  CHECK(at(l, 0x1000).bytes == 3200u);
  CHECK(at(l, 0x2000).bytes == 800u);
}

TEST_CASE("nccl: all-gather without a rank count keeps recvbuff unknown", "[ranges]") {
  RangeList l = collective({Collective::kAllGather, 0x1000, 0x2000, 100, 16, 0});
  CHECK(at(l, 0x2000).access == (kWrite | kExtentUnknown));
}

TEST_CASE("nccl: broadcast reads sendbuff only on the root", "[ranges]") {
  CollectiveCall c{Collective::kBroadcast, 0x1000, 0x2000, 10, 8, 2, 1, 0};
  CHECK_FALSE(has(collective(c), 0x1000));
  CHECK(has(collective(c), 0x2000));
  c.rank = 0;
  CHECK(has(collective(c), 0x1000));
}

TEST_CASE("nccl: reduce writes recvbuff only on the root", "[ranges]") {
  CollectiveCall c{Collective::kReduce, 0x1000, 0x2000, 10, 8, 2, 1, 0};
  CHECK_FALSE(has(collective(c), 0x2000));
  c.rank = 0;
  CHECK(at(collective(c), 0x2000).bytes == 10u);
}

TEST_CASE("nccl: an unknown rank records both sides", "[ranges]") {
  CollectiveCall c{Collective::kReduce, 0x1000, 0x2000, 10, 8, 2, -1, 0};
  CHECK(has(collective(c), 0x2000));
}

TEST_CASE("nccl: send reads, recv writes", "[ranges]") {
  RangeList s = collective({Collective::kSend, 0x1000, 0, 10, 64});
  REQUIRE(s.count == 1);
  CHECK(at(s, 0x1000).access == kRead);
  RangeList r = collective({Collective::kRecv, 0, 0x2000, 10, 64});
  REQUIRE(r.count == 1);
  CHECK(at(r, 0x2000).bytes == 80u);
}

TEST_CASE("nccl: zero count touches nothing", "[ranges]") {
  CHECK(collective({Collective::kAllReduce, 0x1000, 0x2000, 0, 32}).count == 0);
}

TEST_CASE("nccl: all-to-all reads and writes a count for each rank", "[ranges]") {
  RangeList l = collective({Collective::kAlltoAll, 0x1000, 0x2000, 100, 32, 4});
  CHECK(at(l, 0x1000).bytes == 1600u);
  CHECK(at(l, 0x1000).access == kRead);
  CHECK(at(l, 0x2000).bytes == 1600u);
  CHECK(at(l, 0x2000).access == kWrite);
}

TEST_CASE("nccl: gather writes recvbuff only on the root, a count from each rank", "[ranges]") {
  CollectiveCall c{Collective::kGather, 0x1000, 0x2000, 10, 32, 4, 1, 0};
  CHECK(at(collective(c), 0x1000).bytes == 40u);
  CHECK_FALSE(has(collective(c), 0x2000));
  c.rank = 0;
  CHECK(at(collective(c), 0x2000).bytes == 160u);
}

TEST_CASE("nccl: scatter reads sendbuff only on the root, a count for each rank", "[ranges]") {
  CollectiveCall c{Collective::kScatter, 0x1000, 0x2000, 10, 32, 4, 2, 0};
  CHECK_FALSE(has(collective(c), 0x1000));
  CHECK(at(collective(c), 0x2000).bytes == 40u);
  c.rank = -1;  // unknown: both sides
  CHECK(at(collective(c), 0x1000).bytes == 160u);
}
