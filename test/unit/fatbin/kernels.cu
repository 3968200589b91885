// Kernels whose parameter layouts test_fatbin.cc checks in what nvcc builds
// from this file (fatbins, cubins; test/unit/meson.build): each signature
// gives the offsets and sizes by the C++ ABI, and the test spells them out.

struct Span {  // 16 bytes, aligned 8: a pointer, an int, 4 bytes of padding
  float* data;
  int n;
};
struct Triple {  // 12 bytes, aligned 4
  int a, b, c;
};
struct InOut {  // 24 bytes, aligned 8
  const float* in;
  float* out;
  long long n;
};
struct Five {  // 40 bytes, aligned 8: 4 pointers, an int, padding
  float *a, *b, *c, *d;
  int e;
};
struct Big {  // 5000 bytes, aligned 1: large enough for EIATTR_KPARAM_INFO_V2
  char bytes[5000];
};

extern "C" __global__ void copy_ptrs(const float* in, float* out) { out[0] = in[0]; }

extern "C" __global__ void scalars(char c, short s, int i, long long l, float* out) { out[0] = float(c + s + i + l); }

extern "C" __global__ void mixed(char c, double* p, short s, int i) { p[0] = c + s + i; }

__global__ void structs(Span a, Triple b, InOut c, Five d) {
  a.data[0] = float(b.a + b.b + b.c);
  c.out[0] = c.in[0] + float(c.n);
  d.a[0] = *d.b + *d.c + *d.d + float(d.e);
}

// Not inlined, so that relocatable code keeps it: a function with a
// .nv.info section that is not a kernel.
__device__ __noinline__ float twice(float x) { return 2 * x; }

template <class T>
__global__ void fill(T* p, T v) {
  p[0] = T(twice(float(v)));
}
template __global__ void fill<float>(float*, float);
template __global__ void fill<double>(double*, double);

template <class F>
__global__ void apply(F f) {
  f();
}
void launch_apply(float* p) {
  auto f = [=] __device__() { p[0] = 1; };  // a closure of one pointer: 8 bytes
  apply<<<1, 1>>>(f);
}

extern "C" __global__ void many(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8, int a9, int* p0,
                                int* p1, int* p2, int* p3, char c0, double d0, int* p4) {
  p0[0] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;
  p1[0] = p2[0] + p3[0] + c0 + int(d0);
  p4[0] = 1;
}

extern "C" __global__ void big_param(Big b, int* out) { out[0] = b.bytes[4999]; }

extern "C" __global__ void no_params() {}
