// The cuBLAS GEMM family and cublasLtMatmul, interposed (LD_PRELOAD puts
// libphos.so's definitions first) so that a recorded GEMM carries exactly the
// memory it reads and writes: its matrices (call_ranges.h), and what cuBLAS
// writes beside them (library_memory.h), read and written: the handle's
// workspace as cublasSetWorkspace last set it (split-K and other
// algorithms keep partial results there; cublasLtMatmul names its own as an
// argument), and the memory cuBLAS allocated for itself inside any call
// interposed here (cublasCreate's default workspace pool; a pool made at a
// handle's first use), on any handle. Batched GEMMs take arrays of device
// pointers in device memory: the arrays are recorded, the matrices behind
// them are not read here. Each hook is a library scope (library_memory.h):
// cublasCreate, cublasLtCreate, cublasSetStream, cublasSetWorkspace and
// cublasDestroy are interposed for that, and cublasCreate,
// cublasSetWorkspace and cublasDestroy to follow the handle's workspace
// (kept across cublasSetStream); they record nothing.
#include <cublasLt.h>
#include <cublas_v2.h>

#include "hooks/library_call.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
namespace ranges = phos::hooks::ranges;

// A cuBLAS hook's count (call_cycles.h), and its scope: device memory
// allocated inside it is the library's (library_memory.h).
#define PHOS_CUBLAS_SCOPE(name) \
  PHOS_LIBRARY_SCOPE(name);     \
  const ::phos::hooks::LibraryMemory::Scope phos_cublas_inside_

namespace {

// What the cuBLAS hooks use beside library_call's: the workspaces and the
// library's own memory.
struct CublasDeps : RuntimeView {
  using RuntimeView::library_memory;
};

// `l` and what cuBLAS writes beside it (the handle's workspace, the
// library's own memory), read and written, in the room left.
ranges::RangeList with_library_writes(const void* handle, ranges::RangeList l) {
  LibraryMemory::Range written[ranges::RangeList::kMax];
  const size_t n = CublasDeps().library_memory().written(handle, written, ranges::RangeList::kMax - l.count);
  for (size_t i = 0; i < n; i++) l.add(written[i].address, written[i].bytes, ranges::kRead | ranges::kWrite);
  return l;
}

constexpr const char* kCublas = "libcublas.so";
constexpr const char* kCublasLt = "libcublasLt.so";

CUstream stream_of(cublasHandle_t h) {
  cudaStream_t s = nullptr;
  auto get = PHOS_NEXT(cublasGetStream_v2, kCublas);
  if (get) get(h, &s);
  return reinterpret_cast<CUstream>(s);
}

// CUBLAS_OP_T and CUBLAS_OP_C transpose; CUBLAS_OP_N and CUBLAS_OP_CONJG do not.
bool transposes(cublasOperation_t op) { return op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

ranges::GemmShape shape(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                        int64_t ldb, int64_t ldc, uint32_t bits_a, uint32_t bits_b, uint32_t bits_c) {
  return {transposes(ta), transposes(tb), m, n, k, lda, ldb, ldc, bits_a, bits_b, bits_c};
}

template <class T>
constexpr uint32_t bits_of() {
  return uint32_t(sizeof(T) * 8);
}

// cublasGemm*Ex: each matrix has its own cudaDataType.
ranges::GemmShape typed_shape(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                              int64_t ldb, int64_t ldc, cudaDataType at, cudaDataType bt, cudaDataType ct) {
  return shape(ta, tb, m, n, k, lda, ldb, ldc, ranges::cuda_data_type_bits(at), ranges::cuda_data_type_bits(bt),
               ranges::cuda_data_type_bits(ct));
}

LibraryCall batched(cublasHandle_t h, const void* a_array, const void* b_array, const void* c_array, int64_t batch) {
  return {stream_of(h), with_library_writes(h, ranges::gemm_batched(address_of(a_array), address_of(b_array),
                                                                    address_of(c_array), batch))};
}

}  // namespace

// The real function with our arguments, or an error where none is loaded.
#define PHOS_FORWARD_AS(name, library, type, args)           \
  [&] {                                                      \
    auto real = PHOS_NEXT_AS(name, library, type);           \
    return real ? real args : CUBLAS_STATUS_NOT_INITIALIZED; \
  }
#define PHOS_FORWARD(name, library, args) PHOS_FORWARD_AS(name, library, decltype(&::name), args)

// cublas_api.h overloads the Ex functions in C++ (an older computeType):
// their real type spelled out.
template <class I>
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, I, I, I, const void*,
                                    const void*, cudaDataType, I, const void*, cudaDataType, I, const void*, void*,
                                    cudaDataType, I, cublasComputeType_t, cublasGemmAlgo_t);
template <class I>
using GemmStridedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, I, I, I,
                                           const void*, const void*, cudaDataType, I, long long, const void*,
                                           cudaDataType, I, long long, const void*, void*, cudaDataType, I,
                                           long long, I, cublasComputeType_t, cublasGemmAlgo_t);
template <class I>
using GemmBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, I, I, I,
                                           const void*, const void* const[], cudaDataType, I, const void* const[],
                                           cudaDataType, I, const void*, void* const[], cudaDataType, I, I,
                                           cublasComputeType_t, cublasGemmAlgo_t);

// Single, double and half precision, each with 32- and 64-bit sizes (_64).
#define PHOS_TYPED_FAMILY(macro, s_name, d_name, h_name)                                       \
  macro(s_name, float, int) macro(s_name##_64, float, int64_t) macro(d_name, double, int)      \
  macro(d_name##_64, double, int64_t) macro(h_name, __half, int) macro(h_name##_64, __half, int64_t)

#define PHOS_GEMM(name, T, I)                                                                                     \
  extern "C" PHOS_EXPORT cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, I m,  \
                                             I n, I k, const T* alpha, const T* a, I lda, const T* b, I ldb,     \
                                             const T* beta, T* c, I ldc) {                                        \
    PHOS_CUBLAS_SCOPE(#name);                                                                                     \
    return library_call(                                                                                          \
        #name,                                                                                                    \
        [&] {                                                                                                     \
          auto s = shape(ta, tb, m, n, k, lda, ldb, ldc, bits_of<T>(), bits_of<T>(), bits_of<T>());               \
          return LibraryCall{stream_of(h),                                                                  \
                             with_library_writes(h, ranges::gemm(s, address_of(a), address_of(b), address_of(c)))}; \
        },                                                                                                        \
        PHOS_FORWARD(name, kCublas, (h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)));                  \
  }
PHOS_TYPED_FAMILY(PHOS_GEMM, cublasSgemm_v2, cublasDgemm_v2, cublasHgemm)

#define PHOS_GEMM_STRIDED(name, T, I)                                                                              \
  extern "C" PHOS_EXPORT cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, I m,   \
                                             I n, I k, const T* alpha, const T* a, I lda, long long sa,           \
                                             const T* b, I ldb, long long sb, const T* beta, T* c, I ldc,         \
                                             long long sc, I batch) {                                              \
    PHOS_CUBLAS_SCOPE(#name);                                                                                      \
    return library_call(                                                                                           \
        #name,                                                                                                     \
        [&] {                                                                                                      \
          auto s = shape(ta, tb, m, n, k, lda, ldb, ldc, bits_of<T>(), bits_of<T>(), bits_of<T>());                \
          return LibraryCall{stream_of(h), with_library_writes(h, ranges::gemm_strided_batched(                 \
                                               s, address_of(a), sa, address_of(b), sb, address_of(c), sc, batch))}; \
        },                                                                                                         \
        PHOS_FORWARD(name, kCublas, (h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch))); \
  }
PHOS_TYPED_FAMILY(PHOS_GEMM_STRIDED, cublasSgemmStridedBatched, cublasDgemmStridedBatched, cublasHgemmStridedBatched)

#define PHOS_GEMM_BATCHED(name, T, I)                                                                             \
  extern "C" PHOS_EXPORT cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, I m,  \
                                             I n, I k, const T* alpha, const T* const a[], I lda,                \
                                             const T* const b[], I ldb, const T* beta, T* const c[], I ldc,       \
                                             I batch) {                                                           \
    PHOS_CUBLAS_SCOPE(#name);                                                                                     \
    return library_call(                                                                                          \
        #name,                                                                                                    \
        [&] { return batched(h, a, b, c, batch); },                                                               \
        PHOS_FORWARD(name, kCublas, (h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch)));           \
  }
PHOS_TYPED_FAMILY(PHOS_GEMM_BATCHED, cublasSgemmBatched, cublasDgemmBatched, cublasHgemmBatched)

#define PHOS_GEMM_EX(name, I)                                                                                     \
  extern "C" PHOS_EXPORT cublasStatus_t name(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, I m,  \
                                             I n, I k, const void* alpha, const void* a, cudaDataType at, I lda, \
                                             const void* b, cudaDataType bt, I ldb, const void* beta, void* c,   \
                                             cudaDataType ct, I ldc, cublasComputeType_t compute,                \
                                             cublasGemmAlgo_t algo) {                                             \
    PHOS_CUBLAS_SCOPE(#name);                                                                                     \
    return library_call(                                                                                          \
        #name,                                                                                                    \
        [&] {                                                                                                     \
          auto s = typed_shape(ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct);                                       \
          return LibraryCall{stream_of(h),                                                                  \
                             with_library_writes(h, ranges::gemm(s, address_of(a), address_of(b), address_of(c)))}; \
        },                                                                                                        \
        PHOS_FORWARD_AS(name, kCublas, GemmExFn<I>,                                                               \
                        (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo)));   \
  }
PHOS_GEMM_EX(cublasGemmEx, int)
PHOS_GEMM_EX(cublasGemmEx_64, int64_t)

#define PHOS_GEMM_STRIDED_EX(name, I)                                                                             \
  extern "C" PHOS_EXPORT cublasStatus_t name(                                                                     \
      cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, I m, I n, I k, const void* alpha,             \
      const void* a, cudaDataType at, I lda, long long sa, const void* b, cudaDataType bt, I ldb, long long sb,   \
      const void* beta, void* c, cudaDataType ct, I ldc, long long sc, I batch, cublasComputeType_t compute,      \
      cublasGemmAlgo_t algo) {                                                                                    \
    PHOS_CUBLAS_SCOPE(#name);                                                                                     \
    return library_call(                                                                                          \
        #name,                                                                                                    \
        [&] {                                                                                                     \
          auto s = typed_shape(ta, tb, m, n, k, lda, ldb, ldc, at, bt, ct);                                       \
          return LibraryCall{stream_of(h), with_library_writes(h, ranges::gemm_strided_batched(                 \
                                               s, address_of(a), sa, address_of(b), sb, address_of(c), sc, batch))}; \
        },                                                                                                        \
        PHOS_FORWARD_AS(name, kCublas, GemmStridedExFn<I>,                                                        \
                        (h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta, c, ct, ldc, sc, batch,  \
                         compute, algo)));                                                                        \
  }
PHOS_GEMM_STRIDED_EX(cublasGemmStridedBatchedEx, int)
PHOS_GEMM_STRIDED_EX(cublasGemmStridedBatchedEx_64, int64_t)

#define PHOS_GEMM_BATCHED_EX(name, I)                                                                             \
  extern "C" PHOS_EXPORT cublasStatus_t name(                                                                     \
      cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, I m, I n, I k, const void* alpha,             \
      const void* const a[], cudaDataType at, I lda, const void* const b[], cudaDataType bt, I ldb,               \
      const void* beta, void* const c[], cudaDataType ct, I ldc, I batch, cublasComputeType_t compute,            \
      cublasGemmAlgo_t algo) {                                                                                    \
    PHOS_CUBLAS_SCOPE(#name);                                                                                     \
    return library_call(                                                                                          \
        #name,                                                                                                    \
        [&] { return batched(h, a, b, c, batch); },                                                               \
        PHOS_FORWARD_AS(name, kCublas, GemmBatchedExFn<I>,                                                        \
                        (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, batch, compute,     \
                         algo)));                                                                                 \
  }
PHOS_GEMM_BATCHED_EX(cublasGemmBatchedEx, int)
PHOS_GEMM_BATCHED_EX(cublasGemmBatchedEx_64, int64_t)

namespace {

// A layout's attributes, read back through cublasLt itself.
template <class T>
bool layout_attribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, T* value) {
  auto get = PHOS_NEXT(cublasLtMatrixLayoutGetAttribute, kCublasLt);
  size_t written = 0;
  return get && get(layout, attr, value, sizeof(T), &written) == CUBLAS_STATUS_SUCCESS && written == sizeof(T);
}

ranges::MatrixLayout read_layout(cublasLtMatrixLayout_t layout) {
  ranges::MatrixLayout l;
  if (!layout) return l;
  uint32_t type = 0;
  int32_t order = CUBLASLT_ORDER_COL;
  int64_t plane_offset = 0;
  l.known = layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &type) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &order) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &l.rows) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &l.cols) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &l.ld) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &l.batch) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &l.batch_stride) &&
            layout_attribute(layout, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, &plane_offset);
  l.bits = ranges::cuda_data_type_bits(int(type));
  l.column_major = order == CUBLASLT_ORDER_COL;
  // Tiled orders, and planar complex (the imaginary plane elsewhere): not computed.
  l.other_order = (order != CUBLASLT_ORDER_COL && order != CUBLASLT_ORDER_ROW) || plane_offset != 0;
  return l;
}

}  // namespace

extern "C" PHOS_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha,
                                                     const void* a, cublasLtMatrixLayout_t ad, const void* b,
                                                     cublasLtMatrixLayout_t bd, const void* beta, const void* c,
                                                     cublasLtMatrixLayout_t cd, void* d, cublasLtMatrixLayout_t dd,
                                                     const cublasLtMatmulAlgo_t* algo, void* workspace,
                                                     size_t workspace_bytes, cudaStream_t stream) {
  PHOS_CUBLAS_SCOPE("cublasLtMatmul");
  return library_call(
      "cublasLtMatmul",
      [&] {
        // Its workspace is an argument; no cublasSetWorkspace for a cublasLt handle.
        return LibraryCall{reinterpret_cast<CUstream>(stream),
                           with_library_writes(nullptr, ranges::lt_matmul(address_of(a), read_layout(ad), address_of(b),
                                                                          read_layout(bd), address_of(c),
                                                                          read_layout(cd), address_of(d),
                                                                          read_layout(dd), address_of(workspace),
                                                                          workspace_bytes))};
      },
      PHOS_FORWARD(cublasLtMatmul, kCublasLt,
                   (h, desc, alpha, a, ad, b, bd, beta, c, cd, d, dd, algo, workspace, workspace_bytes, stream)));
}

// The handles' lives and workspaces. None of them records anything; each is
// a library scope, for the memory cuBLAS allocates inside it.

extern "C" PHOS_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  PHOS_CUBLAS_SCOPE("cublasCreate_v2");
  cublasStatus_t s = forwarded_call(kInnermostScope, PHOS_FORWARD(cublasCreate_v2, kCublas, (handle)));
  // A destroyed handle's value may come back: the new one has no workspace.
  if (s == CUBLAS_STATUS_SUCCESS && handle) CublasDeps().library_memory().forget_handle(*handle);
  return s;
}

extern "C" PHOS_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  PHOS_CUBLAS_SCOPE("cublasDestroy_v2");
  cublasStatus_t s = forwarded_call(kInnermostScope, PHOS_FORWARD(cublasDestroy_v2, kCublas, (handle)));
  if (s == CUBLAS_STATUS_SUCCESS) CublasDeps().library_memory().forget_handle(handle);
  return s;
}

// PyTorch calls it each time it hands a handle out, so about once per GEMM:
// a lock and a map lookup.
extern "C" PHOS_EXPORT cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  PHOS_CUBLAS_SCOPE("cublasSetWorkspace_v2");
  cublasStatus_t s =
      forwarded_call(kInnermostScope, PHOS_FORWARD(cublasSetWorkspace_v2, kCublas, (handle, workspace, bytes)));
  if (s == CUBLAS_STATUS_SUCCESS) CublasDeps().library_memory().set_workspace(handle, address_of(workspace), bytes);
  return s;
}

// cuBLAS 12+ goes back to its default workspace pool here; the program's
// workspace is kept as written all the same (more saved, never less: a
// version that keeps it would write it unseen). Interposed for its scope: a
// pool cuBLAS makes for the stream is its own memory.
extern "C" PHOS_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  PHOS_CUBLAS_SCOPE("cublasSetStream_v2");
  return forwarded_call(kInnermostScope, PHOS_FORWARD(cublasSetStream_v2, kCublas, (handle, stream)));
}

extern "C" PHOS_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  PHOS_CUBLAS_SCOPE("cublasLtCreate");
  return forwarded_call(kInnermostScope, PHOS_FORWARD(cublasLtCreate, kCublasLt, (handle)));
}
