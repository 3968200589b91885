// PTX twins on the GPU (validated speculation): runs the twins
// phos-ptx-twin made of test/ptx/generic.cu, globals.cu and triton_like.ptx
// with range tables that leave a buffer out, and checks that each planted
// mis-speculation is caught (count, first address, check ordinal), that
// what is in range passes (generic stores to shared memory, masked vector
// stores), and that the stores themselves still happen.
//
// usage: ptx_twin_check DIR   (DIR holds generic.twin.ptx and its check
//                              sites generic.sites from phos-ptx-twin --sites,
//                              triton.twin.ptx, triton.loads.ptx,
//                              globals.twin.ptx); prints
//                              ok/FAIL lines and ALL OK or FAILED
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#define CK(x)                                                  \
  do {                                                         \
    CUresult r_ = (x);                                         \
    if (r_) {                                                  \
      const char* s_;                                          \
      cuGetErrorString(r_, &s_);                               \
      printf("FAIL %s: %s\n", #x, s_);                         \
      exit(1);                                                 \
    }                                                          \
  } while (0)
static int failures = 0;
// The Triton-shaped kernel stages through dynamic shared memory, as Triton's
// launcher sizes it.
static constexpr unsigned kTritonShared = 16384;
static void expect(bool ok, const char* what) {
  printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) failures++;
}
static std::string read(const char* p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
// The ordinal of the first check site in `function` ("site N FUNCTION:LINE ..."
// lines of phos-ptx-twin --sites); -1 if there is none.
static long long site_of(const std::string& sites, const std::string& function) {
  std::istringstream in(sites);
  std::string line;
  while (std::getline(in, line)) {
    long long n;
    char where[512];
    if (std::sscanf(line.c_str(), "site %lld %511s", &n, where) == 2 && std::string(where).rfind(function + ":", 0) == 0)
      return n;
  }
  return -1;
}

static CUdeviceptr table(std::vector<std::pair<CUdeviceptr, size_t>> ranges) {
  std::vector<unsigned long long> w = {ranges.size(), 0, 0, 0};
  for (auto& r : ranges) {
    w.push_back(r.first);
    w.push_back(r.first + r.second);
  }
  CUdeviceptr t;
  CK(cuMemAlloc(&t, w.size() * 8));
  CK(cuMemcpyHtoD(t, w.data(), w.size() * 8));
  return t;
}
static std::vector<unsigned long long> result(CUdeviceptr t) {
  std::vector<unsigned long long> w(4);
  CK(cuMemcpyDtoH(w.data(), t, 32));
  return w;
}
int main(int argc, char** argv) {
  if (argc != 2) {
    printf("usage: ptx_twin_check DIR\n");
    return 2;
  }
  std::string dir = argv[1];
  CK(cuInit(0));
  CUdevice d;
  CK(cuDeviceGet(&d, 0));
  CUcontext c;
  CK(cuCtxCreate(&c, nullptr, 0, d));
  std::string g = read((dir + "/generic.twin.ptx").c_str()), tr = read((dir + "/triton.twin.ptx").c_str()),
              tl = read((dir + "/triton.loads.ptx").c_str()), sites = read((dir + "/generic.sites").c_str());
  // The checks that must report: the store through the pointer kept in
  // device memory, and the store of the device function through_struct calls.
  long long pointer_site = site_of(sites, "_Z22through_device_pointerPPfif");
  long long struct_site = site_of(sites, "_Z10scale_intoPfPKff");
  printf("  sites: through_device_pointer %lld, scale_into %lld\n", pointer_site, struct_site);
  CUmodule mg, mt, ml;
  CK(cuModuleLoadData(&mg, g.c_str()));
  CK(cuModuleLoadData(&mt, tr.c_str()));
  CK(cuModuleLoadData(&ml, tl.c_str()));
  CUdeviceptr A, B, P;
  CK(cuMemAlloc(&A, 4096));
  CK(cuMemAlloc(&B, 4096));
  CK(cuMemAlloc(&P, 16));
  CUdeviceptr ptrs[2] = {A, B};
  CK(cuMemcpyHtoD(P, ptrs, 16));
  CK(cuMemsetD8(A, 0, 4096));
  CK(cuMemsetD8(B, 0, 4096));
  CUfunction f;
  // A store through a pointer kept in device memory (speculation sees only P).
  CK(cuModuleGetFunction(&f, mg, "_Z22through_device_pointerPPfif__phos_twin"));
  for (int which = 0; which < 2; which++) {
    CUdeviceptr t = table({{A, 4096}});
    int w = which;
    float v = 3.0f;
    void* args[] = {&P, &w, &v, &t};
    CK(cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, 0, args, nullptr));
    CK(cuCtxSynchronize());
    auto r = result(t);
    float got[64];
    CK(cuMemcpyDtoH(got, which ? B : A, sizeof got));
    printf("  which=%d violations=%llu first=%llx (A=%llx B=%llx) ordinal=%llu\n", which, r[1], r[2],
           (unsigned long long)A, (unsigned long long)B, r[3]);
    expect(r[1] == (which ? 64u : 0u), which ? "write through B: 64 violations" : "write through A: none");
    if (which)
      expect(r[2] >= B && r[2] < B + 256 && (long long)r[3] == pointer_site,
             "first violation is in B, at through_device_pointer's store");
    expect(got[63] == 3.0f, "the store still happened");
  }
  // Generic stores to shared and global (through_struct): shared ones pass.
  CK(cuModuleGetFunction(&f, mg, "_Z14through_struct4Args__phos_twin"));
  struct Args {
    CUdeviceptr out, in, counts[2];
    int n;
  } a = {A, B, {B + 2048, B + 3072}, 128};
  for (int leave_out = 0; leave_out < 2; leave_out++) {
    CUdeviceptr t = leave_out ? table({{B, 4096}}) : table({{A, 4096}, {B + 2048, 2048}});
    void* args[] = {&a, &t};
    CK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, 0, args, nullptr));
    CK(cuCtxSynchronize());
    auto r = result(t);
    printf("  leave_out=%d violations=%llu first=%llx ordinal=%llu\n", leave_out, r[1], r[2], r[3]);
    expect(r[1] == (leave_out ? 128u : 0u), leave_out ? "out left out: 128 violations" : "shared generic stores pass");
    if (leave_out)
      expect(r[2] >= A && r[2] < A + 4096 && (long long)r[3] == struct_site,
             "first violation is in out, at the store of the function through_struct calls");
  }
  // Masked vector stores (Triton-shaped): masked-off lanes are not checked.
  CK(cuModuleGetFunction(&f, mt, "add_kernel__phos_twin"));
  for (int tight = 0; tight < 2; tight++) {
    int n = 1000;
    CUdeviceptr t = table({{A, tight ? 3996 : 4000}, {P, 8}});
    void* args[] = {&A, &B, &A, &n, &P, &t};
    CK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, kTritonShared, 0, args, nullptr));
    CK(cuCtxSynchronize());
    auto r = result(t);
    printf("  tight=%d violations=%llu first=%llx (A+3984=%llx) ordinal=%llu\n", tight, r[1], r[2],
           (unsigned long long)(A + 3984), r[3]);
    expect(r[1] == (tight ? 1u : 0u), tight ? "one vector store over the end" : "masked stores in range pass");
  }
  // Loads twin: reading y (B) without B in the table.
  CK(cuModuleGetFunction(&f, ml, "add_kernel__phos_twin"));
  {
    int n = 1000;
    CUdeviceptr t = table({{A, 4096}, {P, 8}});
    void* args[] = {&A, &B, &A, &n, &P, &t};
    CK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, kTritonShared, 0, args, nullptr));
    CK(cuCtxSynchronize());
    auto r = result(t);
    printf("  loads: violations=%llu first=%llx ordinal=%llu\n", r[1], r[2], r[3]);
    expect(r[1] == 250 && r[2] >= B && r[2] < B + 4000 && (r[3] == 2 || r[3] == 3), "loads of y: 250 violations");
  }
  // A store through a pointer kept in a __device__ variable: the module's
  // own variables are allowed (the runtime adds those a twin uses), the
  // buffer the variable points to is not.
  {
    std::string gl = read((dir + "/globals.twin.ptx").c_str());
    CUmodule mgl;
    CK(cuModuleLoadData(&mgl, gl.c_str()));
    CUdeviceptr redirect, history, hits;
    size_t redirect_bytes, history_bytes, hits_bytes;
    CK(cuModuleGetGlobal(&redirect, &redirect_bytes, mgl, "redirect"));
    CK(cuModuleGetGlobal(&history, &history_bytes, mgl, "history"));
    CK(cuModuleGetGlobal(&hits, &hits_bytes, mgl, "hits"));
    CK(cuMemcpyHtoD(redirect, &B, sizeof(B)));
    CK(cuModuleGetFunction(&f, mgl, "_Z11use_globalsPKfPfi__phos_twin"));
    CUdeviceptr in = A, out = A + 2048;
    int n = 64;
    CUdeviceptr t = table({{A, 4096}, {history, history_bytes}, {hits, hits_bytes}});
    void* args[] = {&in, &out, &n, &t};
    CK(cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, 0, args, nullptr));
    CK(cuCtxSynchronize());
    auto r = result(t);
    printf("  global redirect: violations=%llu first=%llx (B=%llx) ordinal=%llu\n", r[1], r[2],
           (unsigned long long)B, r[3]);
    expect(r[1] == 64 && r[2] >= B && r[2] < B + 256, "writes through the global pointer: 64 violations, in B");
  }
  printf("%s\n", failures ? "FAILED" : "ALL OK");
  return failures != 0;
}
