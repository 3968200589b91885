// The copy-on-write pool's saves (launch/copy_window.cc), device to device
// on the SMs. cuMemcpyDtoDAsync goes through the GPU's copy engines, where
// each save queued behind the dump engine's transfers to the host: 31 GB/s
// on an H200 while the engine copied (57 GB of saves took 1.8 s of one
// kernel launch's wait), where the SMs copy at the memory's speed.
// `words` 16-byte words from `src` to `dst`, both 16-byte aligned.
extern "C" __global__ void phos_chunk_save(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                           unsigned long long words) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
    dst[i] = src[i];
}
