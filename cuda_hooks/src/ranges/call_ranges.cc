#include "phos/hooks/call_ranges.h"

#include <library_types.h>

#include <algorithm>
#include <iterator>

namespace phos::hooks::ranges {

void RangeList::add(uint64_t address, uint64_t bytes, uint8_t access) {
  if (bytes == 0 && !(access & kExtentUnknown)) return;  // nothing touched
  if (count < kMax) items[count++] = {address, bytes, access};
}

void RangeList::add(uint64_t address, std::optional<uint64_t> bytes, uint8_t access) {
  if (bytes) return add(address, *bytes, access);
  add(address, 0, uint8_t(access | kExtentUnknown));
}

uint32_t cuda_data_type_bits(int type) {
  switch (cudaDataType(type)) {
    case CUDA_R_4I: case CUDA_R_4U: case CUDA_R_4F_E2M1: return 4;
    case CUDA_R_6F_E2M3: case CUDA_R_6F_E3M2: return 6;
    case CUDA_R_8I: case CUDA_R_8U: case CUDA_C_4I: case CUDA_C_4U:
    case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: case CUDA_R_8F_UE8M0: return 8;
    case CUDA_R_16F: case CUDA_R_16BF: case CUDA_R_16I: case CUDA_R_16U: case CUDA_C_8I: case CUDA_C_8U: return 16;
    case CUDA_R_32F: case CUDA_R_32I: case CUDA_R_32U: case CUDA_C_16F: case CUDA_C_16BF: case CUDA_C_16I:
    case CUDA_C_16U: return 32;
    case CUDA_R_64F: case CUDA_R_64I: case CUDA_R_64U: case CUDA_C_32F: case CUDA_C_32I: case CUDA_C_32U: return 64;
    case CUDA_C_64F: case CUDA_C_64I: case CUDA_C_64U: return 128;
    default: return 0;
  }
}

// ncclDataType_t by value (nccl.h): int8, uint8, int32, uint32, int64,
// uint64, float16, float32, float64, bfloat16, float8 e4m3, float8 e5m2.
uint32_t nccl_data_type_bits(int type) {
  static constexpr uint32_t kBits[] = {8, 8, 32, 32, 64, 64, 16, 32, 64, 16, 8, 8};
  return type >= 0 && size_t(type) < std::size(kBits) ? kBits[type] : 0;
}

std::optional<uint64_t> elements_to_bytes(uint64_t elements, uint32_t bits) {
  if (bits == 0) return std::nullopt;
  uint64_t total_bits;
  if (__builtin_mul_overflow(elements, uint64_t(bits), &total_bits)) return std::nullopt;
  return total_bits / 8 + (total_bits % 8 != 0);
}

std::optional<uint64_t> matrix_bytes(int64_t rows, int64_t cols, int64_t ld, uint32_t bits) {
  if (rows < 0 || cols < 0 || ld < std::max<int64_t>(rows, 1)) return std::nullopt;
  if (rows == 0 || cols == 0) return uint64_t(0);
  uint64_t elements;
  if (__builtin_mul_overflow(uint64_t(cols - 1), uint64_t(ld), &elements) ||
      __builtin_add_overflow(elements, uint64_t(rows), &elements))
    return std::nullopt;
  return elements_to_bytes(elements, bits);
}

std::optional<uint64_t> operand_bytes(bool transposed, int64_t rows, int64_t cols, int64_t ld, uint32_t bits) {
  return transposed ? matrix_bytes(cols, rows, ld, bits) : matrix_bytes(rows, cols, ld, bits);
}

std::optional<Extent> strided_batch(uint64_t one_bytes, int64_t stride, int64_t batch, uint32_t bits) {
  if (batch < 0) return std::nullopt;
  if (batch == 0 || one_bytes == 0) return Extent{0, 0};
  // The distance between the first and the last matrix, in bytes.
  int64_t last;
  if (__builtin_mul_overflow(batch - 1, stride, &last)) return std::nullopt;
  auto reach = elements_to_bytes(uint64_t(last < 0 ? -last : last), bits);
  if (!reach || *reach > uint64_t(INT64_MAX)) return std::nullopt;
  uint64_t bytes;
  if (__builtin_add_overflow(*reach, one_bytes, &bytes)) return std::nullopt;
  return Extent{last < 0 ? -int64_t(*reach) : 0, bytes};
}

Extent pitched_2d(uint64_t x_bytes, uint64_t y, uint64_t pitch, uint64_t width_bytes, uint64_t height) {
  return pitched_3d(x_bytes, y, 0, pitch, 0, width_bytes, height, 1);
}

Extent pitched_3d(uint64_t x_bytes, uint64_t y, uint64_t z, uint64_t pitch, uint64_t allocation_height,
                  uint64_t width_bytes, uint64_t height, uint64_t depth) {
  if (width_bytes == 0 || height == 0 || depth == 0) return {int64_t((z * allocation_height + y) * pitch + x_bytes), 0};
  uint64_t first = (z * allocation_height + y) * pitch + x_bytes;
  uint64_t last_row = (depth - 1) * allocation_height + (height - 1);
  return {int64_t(first), last_row * pitch + width_bytes};
}

namespace {

std::optional<uint64_t> a_bytes(const GemmShape& s) { return operand_bytes(s.transpose_a, s.m, s.k, s.lda, s.bits_a); }
std::optional<uint64_t> b_bytes(const GemmShape& s) { return operand_bytes(s.transpose_b, s.k, s.n, s.ldb, s.bits_b); }
std::optional<uint64_t> c_bytes(const GemmShape& s) { return matrix_bytes(s.m, s.n, s.ldc, s.bits_c); }

// A strided operand: its extent from `base`, or an unknown one.
void add_strided(RangeList& out, uint64_t base, std::optional<uint64_t> one, int64_t stride, int64_t batch,
                 uint32_t bits, uint8_t access) {
  auto e = one ? strided_batch(*one, stride, batch, bits) : std::nullopt;
  if (!e) return out.add(base, std::nullopt, access);
  out.add(base + uint64_t(e->offset), e->bytes, access);
}

}  // namespace

RangeList gemm(const GemmShape& s, uint64_t a, uint64_t b, uint64_t c) {
  RangeList out;
  // k == 0: C = beta*C, A and B are not read.
  if (s.k > 0) {
    out.add(a, a_bytes(s), kRead);
    out.add(b, b_bytes(s), kRead);
  }
  out.add(c, c_bytes(s), kRead | kWrite);
  return out;
}

RangeList gemm_strided_batched(const GemmShape& s, uint64_t a, int64_t stride_a, uint64_t b, int64_t stride_b,
                               uint64_t c, int64_t stride_c, int64_t batch) {
  RangeList out;
  if (s.k > 0) {
    add_strided(out, a, a_bytes(s), stride_a, batch, s.bits_a, kRead);
    add_strided(out, b, b_bytes(s), stride_b, batch, s.bits_b, kRead);
  }
  add_strided(out, c, c_bytes(s), stride_c, batch, s.bits_c, kRead | kWrite);
  return out;
}

RangeList gemm_batched(uint64_t a_array, uint64_t b_array, uint64_t c_array, int64_t batch) {
  RangeList out;
  std::optional<uint64_t> bytes;
  if (batch >= 0 && uint64_t(batch) <= UINT64_MAX / sizeof(void*)) bytes = uint64_t(batch) * sizeof(void*);
  out.add(a_array, bytes, kRead | kPointerArray);
  out.add(b_array, bytes, kRead | kPointerArray);
  out.add(c_array, bytes, kRead | kWrite | kPointerArray);
  return out;
}

std::optional<Extent> layout_extent(const MatrixLayout& l) {
  if (!l.known || l.other_order || l.rows > uint64_t(INT64_MAX) || l.cols > uint64_t(INT64_MAX)) return std::nullopt;
  // Row-major is the transposed column-major matrix: ld strides rows.
  auto one = l.column_major ? matrix_bytes(int64_t(l.rows), int64_t(l.cols), l.ld, l.bits)
                            : matrix_bytes(int64_t(l.cols), int64_t(l.rows), l.ld, l.bits);
  if (!one) return std::nullopt;
  return strided_batch(*one, l.batch_stride, std::max(l.batch, 1), l.bits);
}

RangeList lt_matmul(uint64_t a, const MatrixLayout& la, uint64_t b, const MatrixLayout& lb, uint64_t c,
                    const MatrixLayout& lc, uint64_t d, const MatrixLayout& ld, uint64_t workspace,
                    uint64_t workspace_bytes) {
  RangeList out;
  auto add = [&](uint64_t base, const MatrixLayout& l, uint8_t access) {
    if (!base) return;
    auto e = layout_extent(l);
    if (!e) return out.add(base, std::nullopt, access);
    out.add(base + uint64_t(e->offset), e->bytes, access);
  };
  add(a, la, kRead);
  add(b, lb, kRead);
  add(c, lc, kRead);
  add(d, ld, kWrite);
  if (workspace && workspace_bytes) out.add(workspace, workspace_bytes, kRead | kWrite);
  return out;
}

RangeList collective(const CollectiveCall& c) {
  RangeList out;
  auto one = elements_to_bytes(c.count, c.bits);
  std::optional<uint64_t> all;  // nranks times the count
  if (c.nranks > 0 && c.count <= UINT64_MAX / uint64_t(c.nranks)) all = elements_to_bytes(c.count * uint64_t(c.nranks), c.bits);
  bool root_known = c.rank >= 0 && c.root >= 0;
  bool is_root = root_known && c.rank == c.root;
  switch (c.op) {
    case Collective::kAllReduce:
      out.add(c.send, one, kRead);
      out.add(c.recv, one, kWrite);
      break;
    case Collective::kBroadcast:  // only the root's sendbuff is read
      if (is_root || !root_known) out.add(c.send, one, kRead);
      out.add(c.recv, one, kWrite);
      break;
    case Collective::kReduce:  // only the root's recvbuff is written
      out.add(c.send, one, kRead);
      if (is_root || !root_known) out.add(c.recv, one, kWrite);
      break;
    case Collective::kAllGather:  // count is each rank's sendcount
      out.add(c.send, one, kRead);
      out.add(c.recv, all, kWrite);
      break;
    case Collective::kReduceScatter:  // count is each rank's recvcount
      out.add(c.send, all, kRead);
      out.add(c.recv, one, kWrite);
      break;
    case Collective::kSend:
      out.add(c.send, one, kRead);
      break;
    case Collective::kRecv:
      out.add(c.recv, one, kWrite);
      break;
    case Collective::kAlltoAll:  // count to and from each rank
      out.add(c.send, all, kRead);
      out.add(c.recv, all, kWrite);
      break;
    case Collective::kGather:  // only the root's recvbuff is written, a count from each rank
      out.add(c.send, one, kRead);
      if (is_root || !root_known) out.add(c.recv, all, kWrite);
      break;
    case Collective::kScatter:  // only the root's sendbuff is read, a count for each rank
      if (is_root || !root_known) out.add(c.send, all, kRead);
      out.add(c.recv, one, kWrite);
      break;
  }
  return out;
}

}  // namespace phos::hooks::ranges
