// The device memory that known calls read and write, from their arguments
// alone: memcpy and memset, the cuBLAS GEMM family, NCCL collectives. Exact
// where the call's semantics say exactly; pure arithmetic (no CUDA calls), so
// that it is unit-tested without a GPU.
//
// Conventions: a matrix is column-major, rows x cols with leading dimension
// ld (>= rows), and spans ((cols-1)*ld + rows) elements; a transposed operand
// is stored with rows and cols swapped. A pitched (2D/3D) copy is recorded as
// its enclosing extent, from its first byte to its last: the bytes between
// rows (pitch - width) are inside the range although the copy leaves them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace phos::hooks::ranges {

enum Access : uint8_t {
  kRead = 1,
  kWrite = 2,
  // The range is an array of device pointers (batched GEMM); the matrices
  // behind them are read or written as the other bits say.
  kPointerArray = 4,
  // The address is known, its extent is not (bytes is 0).
  kExtentUnknown = 8,
  // Every byte of the range is written (a linear copy's destination, a
  // memset without pitch), none read: an on-demand restore need not fill it.
  kWholeWrite = 16,
};

struct BufferRange {
  uint64_t address = 0;
  uint64_t bytes = 0;
  uint8_t access = 0;
};

// The ranges of one call; at most kMax (cublasLtMatmul: A, B, C, D,
// workspace; a cuBLAS call adds what the library writes beside its
// arguments, library_memory.h, in the room left).
struct RangeList {
  static constexpr size_t kMax = 8;
  BufferRange items[kMax];
  uint8_t count = 0;
  void add(uint64_t address, uint64_t bytes, uint8_t access);
  // A range whose size could not be computed (bad arguments): kept with an
  // unknown extent, the call is still recorded.
  void add(uint64_t address, std::optional<uint64_t> bytes, uint8_t access);
};

// Bits per element; 0 for a type not known here.
uint32_t cuda_data_type_bits(int cuda_data_type);  // cudaDataType (library_types.h)
uint32_t nccl_data_type_bits(int nccl_data_type);  // ncclDataType_t

// Elements to bytes, rounding sub-byte types (4- and 6-bit) up.
std::optional<uint64_t> elements_to_bytes(uint64_t elements, uint32_t bits);

// The bytes a column-major rows x cols matrix spans; 0 for an empty one,
// nullopt for arguments the library refuses (negative, ld < rows) or sizes
// that overflow.
std::optional<uint64_t> matrix_bytes(int64_t rows, int64_t cols, int64_t ld, uint32_t bits);
// op(X) is rows x cols; a transposed X is stored cols x rows.
std::optional<uint64_t> operand_bytes(bool transposed, int64_t rows, int64_t cols, int64_t ld, uint32_t bits);

// A range relative to a base address (offset may be negative: a negative
// batch stride).
struct Extent {
  int64_t offset = 0;
  uint64_t bytes = 0;
};
// `batch` matrices of `one_bytes` each, `stride` elements apart.
std::optional<Extent> strided_batch(uint64_t one_bytes, int64_t stride, int64_t batch, uint32_t bits);

// Pitched copies and sets, as their enclosing extent: the first byte is at
// (z*height_of_allocation + y)*pitch + x.
Extent pitched_2d(uint64_t x_bytes, uint64_t y, uint64_t pitch, uint64_t width_bytes, uint64_t height);
Extent pitched_3d(uint64_t x_bytes, uint64_t y, uint64_t z, uint64_t pitch, uint64_t allocation_height,
                  uint64_t width_bytes, uint64_t height, uint64_t depth);

// C = op(A) op(B) (+ C): A and B read, C read and written (beta may be
// nonzero; it can live on the device, so it is not looked at).
struct GemmShape {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  uint32_t bits_a = 0, bits_b = 0, bits_c = 0;
};
RangeList gemm(const GemmShape& s, uint64_t a, uint64_t b, uint64_t c);
RangeList gemm_strided_batched(const GemmShape& s, uint64_t a, int64_t stride_a, uint64_t b, int64_t stride_b,
                               uint64_t c, int64_t stride_c, int64_t batch);
// The arrays of `batch` device pointers; the matrices are behind them.
RangeList gemm_batched(uint64_t a_array, uint64_t b_array, uint64_t c_array, int64_t batch);

// A cublasLt matrix layout as cublasLtMatrixLayoutGetAttribute reports it.
struct MatrixLayout {
  bool known = false;       // all attributes read
  bool column_major = true; // CUBLASLT_ORDER_COL; false: CUBLASLT_ORDER_ROW
  bool other_order = false; // a tiled order (COL32, ...): extent not computed
  uint32_t bits = 0;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t batch_stride = 0;  // elements
};
std::optional<Extent> layout_extent(const MatrixLayout& l);
RangeList lt_matmul(uint64_t a, const MatrixLayout& la, uint64_t b, const MatrixLayout& lb, uint64_t c,
                    const MatrixLayout& lc, uint64_t d, const MatrixLayout& ld, uint64_t workspace,
                    uint64_t workspace_bytes);

enum class Collective { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv, kAlltoAll, kGather, kScatter };
struct CollectiveCall {
  Collective op = Collective::kAllReduce;
  uint64_t send = 0, recv = 0;
  // As passed: sendcount (AllGather), recvcount (ReduceScatter), the count
  // to or from each rank (AlltoAll, Gather, Scatter).
  uint64_t count = 0;
  uint32_t bits = 0;
  int nranks = 0;      // AllGather, ReduceScatter, AlltoAll, Gather, Scatter
  // Broadcast, Reduce, Gather, Scatter: -1 when unknown (then both sides are recorded)
  int rank = -1, root = -1;
};
RangeList collective(const CollectiveCall& c);

}  // namespace phos::hooks::ranges
