// Kernels for the phos-sigdb test: one of each parameter form the database
// knows. expected.sigdb is the tool's output for this file (and lambdas.cu);
// every kernel name in it must also be in nvcc's cubin for this file.
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>

#include "common.cuh"

// Pointers: mutable, const pointee, pointer arrays.
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
__global__ void pointer_arrays(const float* const* a, float* const* b, const float** c, float** d,
                               const float (*rows)[4]) {
  *d[0] = *a[0] + *b[0] + *c[0] + rows[0][1];
}
__global__ void no_params() {}

// Scalars of every size, enums, half types.
enum Color : uint8_t { kRed, kGreen };
enum class Wide : int64_t { kA = 1 };
__global__ void scalars(char c, short s, int i, long long l, unsigned u, float f, double d,
                        bool b, Color color, Wide w, __half h, __nv_bfloat16 bf, float4 v,
                        double2 dv, __int128 q, int* out) {
  *out = c + s + i + int(l) + int(u) + int(f) + int(d) + b + color + int(w) + int(__half2float(h)) +
         int(__bfloat162float(bf)) + int(v.x) + int(dv.y) + int(q);
}

// By-value structs.
struct Plain { int n; float scale; double bias; };
struct Buffers { const float* in; float* out; int n; };
struct Nested { int tag; Buffers buf; float* extra[3]; struct { const int* idx; } inner[2]; };
struct alignas(16) Aligned { float* p; int n; };
struct Derived : Buffers { unsigned flags : 3; const double* weights; };
__global__ void plain(Plain p, float* out) { *out = p.n * p.scale + p.bias; }
__global__ void buffers(Buffers b) { b.out[0] = b.in[0] + b.n; }
__global__ void nested(char c, Nested n) { *n.extra[2] = *n.buf.in + *n.inner[1].idx + c; }
__global__ void aligned(int i, Aligned a) { a.p[i] = a.n; }
__global__ void derived(Derived d) { d.out[0] = d.in[0] * d.weights[d.flags]; }
__global__ void grid_constant(const __grid_constant__ Buffers b) { b.out[0] = b.in[0]; }

// Unions: with a pointer (opaque) and without (no pointer fields).
union Bits { float f; uint32_t u; };
union MaybePtr { float* p; uint64_t bits; };
struct HasUnion { int n; MaybePtr m; };
__global__ void unions(Bits b, MaybePtr m, HasUnion h, float* out) { *out = b.f + (h.n ? *m.p : 0); }

// extern "C": the plain name. Internal linkage: nvcc's name has no 'L'; in an
// anonymous namespace nvcc's name has a hash of the file: left out.
extern "C" __global__ void c_kernel(const int* in, int* out, unsigned n) { out[n] = in[n]; }
static __global__ void file_local(int* p) { *p = 1; }
namespace ns {
static __global__ void file_local(float* p) { *p = 1; }
}  // namespace ns
namespace {
__global__ void anonymous(int* p) { *p = 2; }
}  // namespace

// Templates: explicit instantiations, an explicit specialization, and one
// instantiated implicitly by a launch.
template <typename T, int N>
__global__ void fill(T* out, T value) { for (int i = 0; i < N; ++i) out[i] = value; }
template __global__ void fill<float, 4>(float*, float);
template __global__ void fill<const char*, 2>(const char**, const char*);

template <typename T>
__global__ void scale(const T* in, T* out, T s) { out[0] = in[0] * s; }
template <>
__global__ void scale<double>(const double* in, double* out, double s) { out[0] = in[0] * s + 1; }

namespace ops {
template <typename T>
struct Pair { T* first; const T* second; };
template <typename T>
__global__ void swap(Pair<T> p) { *p.first = *p.second; }
}  // namespace ops

void launch_templates(int* out, ops::Pair<int> p) {
  scale<<<1, 1>>>((const int*)out, out, 2);
  ops::swap<<<1, 1>>>(p);
  zero<<<1, 1>>>(out, 4);
  file_local<<<1, 1>>>(out);
  ns::file_local<<<1, 1>>>((float*)out);
  anonymous<<<1, 1>>>(out);
}

// Cooperative groups in the body do not change the signature.
__global__ void coop(unsigned* counter) {
  namespace cg = cooperative_groups;
  cg::thread_block block = cg::this_thread_block();
  if (block.thread_rank() == 0) atomicAdd(counter, 1u);
}
