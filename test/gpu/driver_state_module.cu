// Modules for driver_state_probe (make-bundle.sh builds both):
//   driver_state_small.cubin   one small kernel (ds_small), loaded N times
//   driver_state_big.fatbin    -DBIG: 1024 instances of a kernel with an
//                              unrolled body besides it (a few MiB of SASS),
//                              one module as large as a library's
// Their code is what the driver keeps on the device per loaded module.
#include <cstdint>
#include <utility>

extern "C" __global__ void ds_small(uint32_t* p, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 2654435761u + i;
}

#ifdef BIG
template <int K>
__global__ void ds_big(float* p, uint32_t n) {
  uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = p[i];
#pragma unroll
  for (int j = 0; j < 192; j++) x = x * (1.0f + float(K) * 1e-6f) + float(j ^ K) * 1e-3f;
  p[i] = x;
}

// Taken by address in host code: each instance is compiled into the fatbin.
template <int... K>
void* const* instances(std::integer_sequence<int, K...>) {
  static void* const all[] = {reinterpret_cast<void*>(ds_big<K>)...};
  return all;
}
void* const* g_instances = instances(std::make_integer_sequence<int, 1024>());
#endif
