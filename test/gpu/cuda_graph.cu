// CUDA graphs in the GPU suite: a graph captured from a stream (kernels, a
// memcpy, a memset) and one built node by node with a child graph, replayed
// many times, with a kernel node's parameters updated in the executable
// graph between replays. Prints a checksum and the kernel counts: its own
// (kernels per replay x replays), and CUPTI's.
//
// usage: cuda_graph [REPLAYS] [--pace-ms N] [--ready FILE]
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "gpu_check.h"

__global__ void scale(uint32_t* p, size_t n, uint32_t a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = p[i] * a + uint32_t(i);
}
__global__ void sum(const uint32_t* p, size_t n, unsigned long long* out) {
  unsigned long long s = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) s += p[i];
  atomicAdd(out, s);
}

int main(int argc, char** argv) {
  int replays = 200, pace_ms = 0;
  std::string ready;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--pace-ms") && i + 1 < argc) pace_ms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ready") && i + 1 < argc) ready = argv[++i];
    else replays = std::atoi(argv[i]);
  }
  CHECK_CUDA(cudaFree(nullptr));
  gpu_check::start_kernel_count();
  constexpr size_t kWords = 4u << 20;
  uint32_t *a, *b;
  unsigned long long* acc;
  CHECK_CUDA(cudaMalloc(&a, kWords * 4));
  CHECK_CUDA(cudaMalloc(&b, kWords * 4));
  CHECK_CUDA(cudaMalloc(&acc, sizeof(*acc)));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMemsetAsync(a, 1, kWords * 4, s));
  CHECK_CUDA(cudaMemsetAsync(acc, 0, sizeof(*acc), s));

  // Graph 1: captured. 3 kernels.
  cudaGraph_t captured;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  scale<<<128, 256, 0, s>>>(a, kWords, 3);
  CHECK_CUDA(cudaMemcpyAsync(b, a, kWords * 4, cudaMemcpyDeviceToDevice, s));
  scale<<<128, 256, 0, s>>>(b, kWords, 5);
  sum<<<128, 256, 0, s>>>(b, kWords, acc);
  CHECK_CUDA(cudaStreamEndCapture(s, &captured));
  cudaGraphExec_t exec1;
  CHECK_CUDA(cudaGraphInstantiate(&exec1, captured, 0));

  // Graph 2: built by hand, a kernel node and a child graph with one more.
  cudaGraph_t built, child;
  CHECK_CUDA(cudaGraphCreate(&built, 0));
  CHECK_CUDA(cudaGraphCreate(&child, 0));
  uint32_t factor = 7;
  size_t n = kWords;
  void* scale_args[] = {&a, &n, &factor};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(scale);
  kp.gridDim = dim3(64);
  kp.blockDim = dim3(256);
  kp.kernelParams = scale_args;
  cudaGraphNode_t scale_node, child_kernel, child_node;
  CHECK_CUDA(cudaGraphAddKernelNode(&scale_node, built, nullptr, 0, &kp));
  void* sum_args[] = {&a, &n, &acc};
  cudaKernelNodeParams kp2 = kp;
  kp2.func = reinterpret_cast<void*>(sum);
  kp2.kernelParams = sum_args;
  CHECK_CUDA(cudaGraphAddKernelNode(&child_kernel, child, nullptr, 0, &kp2));
  CHECK_CUDA(cudaGraphAddChildGraphNode(&child_node, built, &scale_node, 1, child));
  cudaGraphExec_t exec2;
  CHECK_CUDA(cudaGraphInstantiate(&exec2, built, 0));

  long own_kernels = 0;
  for (int r = 0; r < replays; r++) {
    CHECK_CUDA(cudaGraphLaunch(exec1, s));
    own_kernels += 3;
    if (r % 10 == 0) {  // change the scale factor of the executable graph
      factor = 7 + r;
      CHECK_CUDA(cudaGraphExecKernelNodeSetParams(exec2, scale_node, &kp));
    }
    CHECK_CUDA(cudaGraphLaunch(exec2, s));
    own_kernels += 2;
    if (r == 10 && !ready.empty()) {
      CHECK_CUDA(cudaStreamSynchronize(s));
      if (FILE* f = std::fopen(ready.c_str(), "w")) std::fclose(f);
    }
    if (pace_ms) {
      CHECK_CUDA(cudaStreamSynchronize(s));
      std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms));
    }
  }
  unsigned long long result = 0;
  CHECK_CUDA(cudaMemcpyAsync(&result, acc, sizeof(result), cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  unsigned long long kernels = gpu_check::kernel_count();
  std::printf("checksum %016llx\n", result);
  std::printf("counts own_kernels=%ld cupti_kernels=%llu\n", own_kernels, kernels);
  CHECK_CUDA(cudaGraphExecDestroy(exec1));
  CHECK_CUDA(cudaGraphExecDestroy(exec2));
  return 0;
}
