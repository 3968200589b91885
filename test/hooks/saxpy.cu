// The kernel speculation_client.c launches, as nvcc compiles it: its cubin's
// parameter records must agree with the layout the (fake) driver reports.
__global__ void saxpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
