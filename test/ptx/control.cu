// Loops, predication-heavy code, warp shuffles, cooperative groups.
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
namespace cg = cooperative_groups;

__global__ void saxpy_loop(float a, const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = a * x[i] + y[i];
}

__global__ void predicated(const int* in, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = i < n ? in[i] : 0;
  if (v > 0) out[i] = v;
  if (v < 0) out[i] = -v;
  if ((v & 1) && i + 1 < n) out[i + 1] = v;
  int w = __shfl_xor_sync(0xffffffffu, v, 1);
  if (w == v && i < n) out[n + i] = w;
}

__global__ void block_reduce(const float* in, float* out, int n) {
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  int i = block.group_index().x * block.size() + block.thread_rank();
  float v = i < n ? in[i] : 0.0f;
  float s = cg::reduce(warp, v, cg::plus<float>());
  if (warp.thread_rank() == 0) atomicAdd(out, s);
}

__global__ void stencil(const float* in, float* out, int w, int h) {
  __shared__ float tile[18][18];
  int x = blockIdx.x * 16 + threadIdx.x, y = blockIdx.y * 16 + threadIdx.y;
  for (int dy = threadIdx.y; dy < 18; dy += 16)
    for (int dx = threadIdx.x; dx < 18; dx += 16) {
      int gx = min(max(blockIdx.x * 16 + dx - 1, 0), w - 1), gy = min(max(blockIdx.y * 16 + dy - 1, 0), h - 1);
      tile[dy][dx] = in[gy * w + gx];
    }
  __syncthreads();
  if (x < w && y < h) {
    out[y * w + x] = 0.25f * (tile[threadIdx.y][threadIdx.x + 1] + tile[threadIdx.y + 2][threadIdx.x + 1] +
                              tile[threadIdx.y + 1][threadIdx.x] + tile[threadIdx.y + 1][threadIdx.x + 2]);
  }
}
