// Asynchronous copies: cp.async (sm_80+) through the pipeline primitives,
// with src-size (zero fill); bulk copies and bulk reductions between global
// and shared memory (sm_90), and a tensor-map copy (not checkable: the twin
// is incomplete).
#include <cuda_pipeline.h>
#include <cstdint>

__global__ void pipeline_copy(const float4* in, float4* out, int n) {
  __shared__ float4 buf[128];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  __pipeline_memcpy_async(&buf[threadIdx.x], &in[i < n ? i : 0], sizeof(float4), i < n ? 0 : sizeof(float4));
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  if (i < n) out[i] = buf[threadIdx.x];
}

__global__ void cp_async_inline(const int* in, int* out, int n) {
  __shared__ int buf[256];
  uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&buf[threadIdx.x]));
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int bytes = i < n ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(in + i), "r"(bytes));
  asm volatile("cp.async.commit_group;\n" ::);
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  if (i < n) out[i] = buf[threadIdx.x] + 1;
}

#if __CUDA_ARCH__ >= 900
__global__ void bulk_copy(const float* in, float* out, float* sum, int n) {
  __shared__ alignas(128) float buf[1024];
  __shared__ alignas(8) uint64_t bar;
  uint32_t sbuf = static_cast<uint32_t>(__cvta_generic_to_shared(buf));
  uint32_t sbar = static_cast<uint32_t>(__cvta_generic_to_shared(&bar));
  uint32_t bytes = static_cast<uint32_t>(n) * 4u;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sbar));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sbar), "r"(bytes));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sbuf),
        "l"(in), "r"(bytes), "r"(sbar)
        : "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile(
        "{\n.reg .pred p;\nwaitLoop:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n@!p bra waitLoop;\n}" ::"r"(
            sbar));
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(out), "r"(sbuf), "r"(bytes)
                 : "memory");
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 16;" ::"l"(sum), "r"(sbuf)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;");
    asm volatile("cp.async.bulk.wait_group 0;");
  }
}


__global__ void tensor_copy(const void* tensor_map, int x) {
  __shared__ alignas(128) float buf[256];
  uint32_t sbuf = static_cast<uint32_t>(__cvta_generic_to_shared(buf));
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%1}], [%2];" ::"l"(tensor_map),
                 "r"(x), "r"(sbuf)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;");
  }
}
#endif
