// What the driver's checkpoint moves into a process (issue 30, part 2): a
// child process is set up one way (a variant), then this process, its parent,
// checkpoints it with the driver's API (cuCheckpointProcessLock, Checkpoint,
// Restore, Unlock) and reads the child's resident memory before, after the
// checkpoint and after the restore (/proc/PID/status VmRSS and smaps_rollup's
// Anonymous), the checkpoint's and the restore's times, and which of the
// child's mappings grew. After the restore the child runs its work again
// (verify). Variants under libphos.so are checkpointed the way the plugin
// does it: phos-agent-tool driver-roundtrip (gate closed, device memory
// released, the driver's checkpoint and restore, memory mapped back).
//
//   driver_state_probe list                       the variants, one a line
//   driver_state_probe measure VARIANT [--libphos SO] [--agent-tool TOOL]
//       one line: "result variant=V key=value ..." (bench_driver_state.sh
//       runs each variant in a process of its own and prints the table)
//   driver_state_probe child VARIANT              (the child; internal)
//
// Modules: driver_state_small.cubin and driver_state_big.fatbin beside the
// binary (make-bundle.sh, from driver_state_module.cu).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

// ------------------------------------------------------------- errors
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "driver_state_probe[%d]: %s\n", int(getpid()), what.c_str());
  std::exit(1);
}
void check_rt(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void check_cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  die(std::string(what) + ": " + (name ? name : std::to_string(int(r))));
}
void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) die(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

// ------------------------------------------------------------ kernels
__global__ void tiny(uint32_t* p) { p[threadIdx.x] += 1; }

// 4 KiB of local memory per thread: the driver sizes the context's local
// memory for every thread the device can hold at that much each.
constexpr int kLmemWords = 1024;
__global__ void lmem_heavy(uint32_t* out, uint32_t seed) {
  volatile uint32_t buf[kLmemWords];
  for (int i = 0; i < kLmemWords; i++) buf[(i * 7 + threadIdx.x) % kLmemWords] = seed + i;
  uint32_t s = 0;
  for (int i = 0; i < kLmemWords; i += 33) s += buf[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// -------------------------------------------------------------- the child
struct Child {
  std::string dir;  // of the binary: the module files
  uint32_t* buf = nullptr;  // 1 MiB: each run of `tiny` adds 1 to its first 256 words
  uint32_t tiny_runs = 0;
  uint32_t* scratch = nullptr;  // the streams' kernels' (they run at once)
  std::vector<CUmodule> modules;
  std::vector<CUfunction> functions;
  CUdeviceptr mod_buf = 0;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  float* gemm[3] = {};
  bool lmem = false;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> events;
  std::string note;
};

std::string self_dir() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) die("readlink /proc/self/exe");
  path[n] = 0;
  std::string s(path);
  return s.substr(0, s.rfind('/'));
}

void run_tiny(Child& c) {
  tiny<<<1, 256>>>(c.buf);
  check_rt(cudaGetLastError(), "launch tiny");
  check_rt(cudaDeviceSynchronize(), "tiny: synchronize");
  c.tiny_runs++;
}

void primary(Child& c) {
  check_rt(cudaSetDevice(0), "cudaSetDevice");
  check_rt(cudaFree(nullptr), "cudaFree(0): primary context");
  check_rt(cudaMalloc(&c.buf, 1 << 20), "cudaMalloc 1 MiB");
  check_rt(cudaMemset(c.buf, 0, 1 << 20), "cudaMemset");
}

void ctx_create(Child& c, unsigned flags) {
  check_cu(cuInit(0), "cuInit");
  CUdevice dev;
  check_cu(cuDeviceGet(&dev, 0), "cuDeviceGet");
  CUcontext ctx;
  check_cu(cuCtxCreate(&ctx, nullptr, flags, dev), "cuCtxCreate");
  // The runtime takes the current context as its own.
  check_rt(cudaMalloc(&c.buf, 1 << 20), "cudaMalloc 1 MiB");
  check_rt(cudaMemset(c.buf, 0, 1 << 20), "cudaMemset");
}

// Each limit set to `value` (0: the least the driver takes); what it took,
// or why not, into the note.
void set_limit(Child& c, CUlimit limit, const char* name, size_t value) {
  CUresult r = cuCtxSetLimit(limit, value);
  size_t now = 0;
  cuCtxGetLimit(&now, limit);
  const char* err = nullptr;
  if (r != CUDA_SUCCESS) cuGetErrorName(r, &err);
  c.note += std::string(c.note.empty() ? "" : ",") + name + (r == CUDA_SUCCESS ? "=" : ":refused(") +
            (r == CUDA_SUCCESS ? std::to_string(now) : std::string(err ? err : "?") + ")");
}
void stack_min(Child& c) { set_limit(c, CU_LIMIT_STACK_SIZE, "stack", 0); }
void fifo_heap_min(Child& c) {
  set_limit(c, CU_LIMIT_PRINTF_FIFO_SIZE, "printf_fifo", 0);
  set_limit(c, CU_LIMIT_MALLOC_HEAP_SIZE, "malloc_heap", 0);
}
// The device runtime's reservations (dynamic parallelism), at their least.
void device_runtime_min(Child& c) {
  set_limit(c, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, "pending_launches", 0);
  set_limit(c, CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, "sync_depth", 0);
}

void run_lmem(Child& c) {
  lmem_heavy<<<4, 128>>>(c.buf + 4096, 7);  // past the words `tiny` counts in
  check_rt(cudaGetLastError(), "launch lmem_heavy");
  check_rt(cudaDeviceSynchronize(), "lmem_heavy: synchronize");
  c.lmem = true;
}

void load_module(Child& c, const std::string& file) {
  CUmodule m;
  check_cu(cuModuleLoad(&m, (c.dir + "/" + file).c_str()), ("cuModuleLoad " + file).c_str());
  unsigned n = 0;
  check_cu(cuModuleGetFunctionCount(&n, m), "cuModuleGetFunctionCount");
  if (n == 0) die(file + ": no functions");
  CUfunction f;
  check_cu(cuModuleEnumerateFunctions(&f, 1, m), "cuModuleEnumerateFunctions");
  c.modules.push_back(m);
  c.functions.push_back(f);
}

// One launch of each module's first function (lazy loading loads it here).
void run_modules(Child& c) {
  if (c.functions.empty()) return;
  if (!c.mod_buf) check_cu(cuMemAlloc(&c.mod_buf, 1 << 16), "cuMemAlloc for the modules' kernels");
  uint32_t n = 1024;
  void* args[] = {&c.mod_buf, &n};
  for (CUfunction f : c.functions) check_cu(cuLaunchKernel(f, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "cuLaunchKernel");
  check_cu(cuCtxSynchronize(), "modules: synchronize");
}

void modules(Child& c, int n) {
  for (int i = 0; i < n; i++) load_module(c, "driver_state_small.cubin");
  run_modules(c);
}

constexpr int kGemm = 1024;
void run_gemm(Child& c) {
  const float one = 1, zero = 0;
  check_blas(cublasSgemm(c.blas, CUBLAS_OP_N, CUBLAS_OP_N, kGemm, kGemm, kGemm, &one, c.gemm[0], kGemm, c.gemm[1],
                         kGemm, &zero, c.gemm[2], kGemm),
             "cublasSgemm");
  check_rt(cudaDeviceSynchronize(), "gemm: synchronize");
}

// cuBLAS's handle and one SGEMM; the matrices stay (12 MiB) for verify.
void cublas(Child& c) {
  check_blas(cublasCreate(&c.blas), "cublasCreate");
  for (auto& m : c.gemm) {
    check_rt(cudaMalloc(&m, size_t(kGemm) * kGemm * sizeof(float)), "cudaMalloc gemm");
    check_rt(cudaMemset(m, 0, size_t(kGemm) * kGemm * sizeof(float)), "cudaMemset gemm");
  }
  run_gemm(c);
}

// cuBLASLt: its handle and one heuristic-chosen SGEMM with a 32 MiB
// workspace, freed after (what stays is the library's own state).
void cublaslt(Child& c) {
  check_blas(cublasLtCreate(&c.lt), "cublasLtCreate");
  cublasLtMatmulDesc_t op;
  check_blas(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  cublasLtMatrixLayout_t l;
  check_blas(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, kGemm, kGemm, kGemm), "cublasLtMatrixLayoutCreate");
  cublasLtMatmulPreference_t pref;
  check_blas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  size_t ws_size = 32 << 20;
  check_blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size,
                                                  sizeof(ws_size)),
             "preference: workspace");
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  check_blas(cublasLtMatmulAlgoGetHeuristic(c.lt, op, l, l, l, l, pref, 1, &h, &found), "cublasLtMatmulAlgoGetHeuristic");
  if (!found) die("cublasLt: no algorithm");
  float* m[3];
  void* ws;
  for (auto& p : m) check_rt(cudaMalloc(&p, size_t(kGemm) * kGemm * sizeof(float)), "cudaMalloc lt");
  check_rt(cudaMalloc(&ws, ws_size), "cudaMalloc lt workspace");
  const float one = 1, zero = 0;
  check_blas(cublasLtMatmul(c.lt, op, &one, m[0], l, m[1], l, &zero, m[2], l, m[2], l, &h.algo, ws, ws_size, nullptr),
             "cublasLtMatmul");
  check_rt(cudaDeviceSynchronize(), "cublasLt: synchronize");
  for (auto& p : m) check_rt(cudaFree(p), "cudaFree lt");
  check_rt(cudaFree(ws), "cudaFree lt workspace");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(op);
}

void streams(Child& c, int n_streams, int n_events) {
  check_rt(cudaMalloc(&c.scratch, size_t(n_streams) * 32 * sizeof(uint32_t)), "cudaMalloc streams' scratch");
  for (int i = 0; i < n_streams; i++) {
    cudaStream_t s;
    check_rt(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    tiny<<<1, 32, 0, s>>>(c.scratch + 32 * i);
    c.streams.push_back(s);
  }
  for (int i = 0; i < n_events; i++) {
    cudaEvent_t e;
    check_rt(cudaEventCreate(&e), "cudaEventCreate");
    check_rt(cudaEventRecord(e, c.streams.empty() ? nullptr : c.streams[i % c.streams.size()]), "cudaEventRecord");
    c.events.push_back(e);
  }
  check_rt(cudaDeviceSynchronize(), "streams: synchronize");
}

void gib(Child&, bool keep) {
  void* p;
  check_rt(cudaMalloc(&p, size_t(1) << 30), "cudaMalloc 1 GiB");
  check_rt(cudaMemset(p, 0x5a, size_t(1) << 30), "cudaMemset 1 GiB");
  check_rt(cudaDeviceSynchronize(), "1 GiB: synchronize");
  if (!keep) check_rt(cudaFree(p), "cudaFree 1 GiB");
}

// A phos process as the plugin finds it: memory of its own (64 MiB) that
// phos releases before the driver's checkpoint.
void phos_memory(Child&) {
  void* p;
  check_rt(cudaMalloc(&p, 64 << 20), "cudaMalloc 64 MiB");
  check_rt(cudaMemset(p, 1, 64 << 20), "cudaMemset 64 MiB");
  check_rt(cudaDeviceSynchronize(), "64 MiB: synchronize");
}

// ----------------------------------------------------------- the variants
struct Variant {
  const char* name;
  const char* what;
  void (*setup)(Child&);
  std::vector<const char*> env;  // for the child only
  bool phos = false;             // under libphos.so, checkpointed through its agent
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> all = {
      {"bare_primary", "primary context (cudaFree(0)), 1 MiB, no kernel", [](Child& c) { primary(c); }, {}},
      {"bare_ctxcreate", "cuCtxCreate, 1 MiB, no kernel", [](Child& c) { ctx_create(c, 0); }, {}},
      {"primary_kernel", "primary context, one small kernel (the base of what follows)",
       [](Child& c) { primary(c); run_tiny(c); }, {}},
      {"stack_min", "primary_kernel, CU_LIMIT_STACK_SIZE set to 0 (the driver's least) before the checkpoint",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); }, {}},
      {"fifo_heap_min", "primary_kernel, printf FIFO and malloc heap set to their least",
       [](Child& c) { primary(c); run_tiny(c); fifo_heap_min(c); }, {}},
      {"limits_min", "primary_kernel, stack, printf FIFO and malloc heap at their least",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); fifo_heap_min(c); }, {}},
      // What of a bare context's ~193 MiB is its work queues: each
      // connection (CUDA_DEVICE_MAX_CONNECTIONS, default 8) has a channel
      // with its own queue, sized by CUDA_SCALE_LAUNCH_QUEUES.
      {"limits_min_conn1", "limits_min with CUDA_DEVICE_MAX_CONNECTIONS=1",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); fifo_heap_min(c); }, {"CUDA_DEVICE_MAX_CONNECTIONS=1"}},
      {"limits_min_conn32", "limits_min with CUDA_DEVICE_MAX_CONNECTIONS=32",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); fifo_heap_min(c); }, {"CUDA_DEVICE_MAX_CONNECTIONS=32"}},
      {"limits_min_queues_quarter", "limits_min with CUDA_SCALE_LAUNCH_QUEUES=0.25x",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); fifo_heap_min(c); }, {"CUDA_SCALE_LAUNCH_QUEUES=0.25x"}},
      {"limits_min_devrt", "limits_min, and the device runtime's pending launches and sync depth at their least",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); fifo_heap_min(c); device_runtime_min(c); }, {}},
      {"limits_min_queues_4x", "limits_min with CUDA_SCALE_LAUNCH_QUEUES=4x",
       [](Child& c) { primary(c); run_tiny(c); stack_min(c); fifo_heap_min(c); }, {"CUDA_SCALE_LAUNCH_QUEUES=4x"}},
      {"lmem_4k", "primary_kernel, then a kernel with 4 KiB of local memory per thread (the stack grows)",
       [](Child& c) { primary(c); run_tiny(c); run_lmem(c); }, {}},
      {"lmem_4k_resize_max", "lmem_4k in a cuCtxCreate context with CU_CTX_LMEM_RESIZE_TO_MAX",
       [](Child& c) { ctx_create(c, CU_CTX_LMEM_RESIZE_TO_MAX); run_tiny(c); run_lmem(c); }, {}},
      {"lmem_4k_then_min", "lmem_4k, then CU_LIMIT_STACK_SIZE set to 0 again",
       [](Child& c) { primary(c); run_tiny(c); run_lmem(c); stack_min(c); }, {}},
      {"modules_1", "primary_kernel + 1 small module loaded, its kernel run", [](Child& c) { primary(c); run_tiny(c); modules(c, 1); }, {}},
      {"modules_10", "primary_kernel + 10 small modules", [](Child& c) { primary(c); run_tiny(c); modules(c, 10); }, {}},
      {"modules_100", "primary_kernel + 100 small modules", [](Child& c) { primary(c); run_tiny(c); modules(c, 100); }, {}},
      {"modules_100_eager", "modules_100, CUDA_MODULE_LOADING=EAGER",
       [](Child& c) { primary(c); run_tiny(c); modules(c, 100); }, {"CUDA_MODULE_LOADING=EAGER"}},
      {"big_fatbin", "primary_kernel + one 5 MiB fatbin (1024 kernels), one kernel run (lazy loading)",
       [](Child& c) { primary(c); run_tiny(c); load_module(c, "driver_state_big.fatbin"); run_modules(c); }, {"CUDA_MODULE_LOADING=LAZY"}},
      {"big_fatbin_eager", "big_fatbin, CUDA_MODULE_LOADING=EAGER",
       [](Child& c) { primary(c); run_tiny(c); load_module(c, "driver_state_big.fatbin"); run_modules(c); }, {"CUDA_MODULE_LOADING=EAGER"}},
      {"cublas", "primary_kernel + cublasCreate + one 1024^3 SGEMM (12 MiB of matrices kept)",
       [](Child& c) { primary(c); run_tiny(c); cublas(c); }, {}},
      {"cublas_ws32m", "cublas with CUBLAS_WORKSPACE_CONFIG=:4096:8 (as the coldstart server)",
       [](Child& c) { primary(c); run_tiny(c); cublas(c); }, {"CUBLAS_WORKSPACE_CONFIG=:4096:8"}},
      {"cublas_limits_min", "cublas, then stack, printf FIFO and malloc heap at their least",
       [](Child& c) { primary(c); run_tiny(c); cublas(c); stack_min(c); fifo_heap_min(c); }, {}},
      {"cublaslt", "primary_kernel + cublasLtCreate + one SGEMM with a 32 MiB workspace (freed)",
       [](Child& c) { primary(c); run_tiny(c); cublaslt(c); }, {}},
      {"streams_100", "primary_kernel + 100 streams (a kernel on each) and 1000 events",
       [](Child& c) { primary(c); run_tiny(c); streams(c, 100, 1000); }, {}},
      {"freed_1g", "primary_kernel + 1 GiB cudaMalloc'd, written, freed before the checkpoint",
       [](Child& c) { primary(c); run_tiny(c); gib(c, false); }, {}},
      {"held_1g", "primary_kernel + 1 GiB held (control: the driver copies it)",
       [](Child& c) { primary(c); run_tiny(c); gib(c, true); }, {}},
      {"phos_primary", "libphos.so (PHOS_SHRINK_DRIVER_STATE=0): primary_kernel + 64 MiB (released by phos before the checkpoint)",
       [](Child& c) { primary(c); run_tiny(c); phos_memory(c); }, {"PHOS_SHRINK_DRIVER_STATE=0"}, true},
      {"phos_primary_shrink", "phos_primary with PHOS_SHRINK_DRIVER_STATE=1",
       [](Child& c) { primary(c); run_tiny(c); phos_memory(c); }, {"PHOS_SHRINK_DRIVER_STATE=1"}, true},
      {"phos_lmem_4k", "libphos.so: lmem_4k + 64 MiB",
       [](Child& c) { primary(c); run_tiny(c); run_lmem(c); phos_memory(c); }, {"PHOS_SHRINK_DRIVER_STATE=0"}, true},
      {"phos_lmem_4k_shrink", "phos_lmem_4k with PHOS_SHRINK_DRIVER_STATE=1",
       [](Child& c) { primary(c); run_tiny(c); run_lmem(c); phos_memory(c); }, {"PHOS_SHRINK_DRIVER_STATE=1"}, true},
      {"phos_cublas", "libphos.so: cublas + 64 MiB",
       [](Child& c) { primary(c); run_tiny(c); cublas(c); phos_memory(c); },
       {"CUBLAS_WORKSPACE_CONFIG=:4096:8", "PHOS_SHRINK_DRIVER_STATE=0"}, true},
      {"phos_cublas_shrink", "phos_cublas with PHOS_SHRINK_DRIVER_STATE=1",
       [](Child& c) { primary(c); run_tiny(c); cublas(c); phos_memory(c); },
       {"CUBLAS_WORKSPACE_CONFIG=:4096:8", "PHOS_SHRINK_DRIVER_STATE=1"}, true},
  };
  return all;
}

const Variant& find_variant(const std::string& name) {
  for (const auto& v : variants())
    if (name == v.name) return v;
  die("no variant " + name + " (driver_state_probe list)");
}

size_t limit_of(CUlimit l) {
  size_t v = 0;
  return cuCtxGetLimit(&v, l) == CUDA_SUCCESS ? v : 0;
}

// The work again after the restore: the context, its modules and
// libraries must still run.
std::string verify(Child& c) {
  run_tiny(c);
  uint32_t h[256];
  check_rt(cudaMemcpy(h, c.buf, sizeof(h), cudaMemcpyDeviceToHost), "verify: copy back");
  if (c.lmem) run_lmem(c);
  run_modules(c);
  if (c.blas) run_gemm(c);
  for (auto s : c.streams) check_rt(cudaStreamSynchronize(s), "verify: stream");
  for (auto e : c.events) check_rt(cudaEventSynchronize(e), "verify: event");
  for (uint32_t v : h)
    if (v != c.tiny_runs) return "FAIL(buffer " + std::to_string(v) + ",expected_" + std::to_string(c.tiny_runs) + ")";
  return "ok";
}

int child_main(const std::string& name) {
  const Variant& v = find_variant(name);
  Child c;
  c.dir = self_dir();
  v.setup(c);
  size_t free_b = 0, total_b = 0;
  check_rt(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  std::printf("ready gpu_used_mib=%.0f stack=%zu printf_fifo=%zu malloc_heap=%zu set=%s\n",
              double(total_b - free_b) / (1 << 20), limit_of(CU_LIMIT_STACK_SIZE), limit_of(CU_LIMIT_PRINTF_FIFO_SIZE),
              limit_of(CU_LIMIT_MALLOC_HEAP_SIZE), c.note.empty() ? "-" : c.note.c_str());
  std::fflush(stdout);
  char line[64];
  while (std::fgets(line, sizeof(line), stdin)) {
    if (std::strncmp(line, "verify", 6) == 0) {
      std::string r = verify(c);
      std::printf("verified %s stack=%zu\n", r.c_str(), limit_of(CU_LIMIT_STACK_SIZE));
      std::fflush(stdout);
    }
  }
  return 0;
}

// ----------------------------------------------------------- the parent
struct Memory {
  double rss_mib = -1, anon_mib = -1;
};
double kib_field(const std::string& path, const char* key) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return -1;
  char line[256];
  double v = -1;
  size_t k = std::strlen(key);
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, key, k) == 0 && line[k] == ':') {
      v = std::atof(line + k + 1) / 1024;
      break;
    }
  std::fclose(f);
  return v;
}
Memory memory_of(pid_t pid) {
  std::string p = "/proc/" + std::to_string(pid);
  return {kib_field(p + "/status", "VmRSS"), kib_field(p + "/smaps_rollup", "Anonymous")};
}

// Each mapping's resident KiB, by its address range and name.
std::map<std::string, long> mappings_of(pid_t pid) {
  std::map<std::string, long> out;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/smaps").c_str(), "r");
  if (!f) return out;
  char line[1024];
  std::string current;
  while (std::fgets(line, sizeof(line), f)) {
    unsigned long a, b;
    char name[512] = "";
    if (std::sscanf(line, "%lx-%lx %*s %*s %*s %*s %511s", &a, &b, name) >= 2) {
      char key[700];
      std::snprintf(key, sizeof(key), "%lx+%luM:%s", a, (b - a) >> 20, name[0] ? name : "[anon]");
      current = key;
      out[current] = 0;
    } else if (std::strncmp(line, "Rss:", 4) == 0 && !current.empty()) {
      out[current] = std::atol(line + 4);
    }
  }
  std::fclose(f);
  return out;
}

// The mappings that grew by 1 MiB or more, largest first (3 at most).
std::string grown(const std::map<std::string, long>& before, const std::map<std::string, long>& after) {
  std::vector<std::pair<long, std::string>> g;
  for (const auto& [k, kib] : after) {
    auto it = before.find(k);
    long d = kib - (it == before.end() ? 0 : it->second);
    if (d >= 1024) g.push_back({d, k + (it == before.end() ? "(new)" : "")});
  }
  std::sort(g.rbegin(), g.rend());
  std::string s;
  for (size_t i = 0; i < g.size() && i < 3; i++) s += (s.empty() ? "" : ";") + g[i].second + "=" + std::to_string(g[i].first >> 10) + "MiB";
  return s.empty() ? "-" : s;
}

struct Proc {
  pid_t pid = -1;
  int in = -1, out = -1;  // its stdin (ours to write), its stdout (ours to read)
  std::string buffered;
};

// `argv` with `env` added, its stdin and stdout piped to us (its stderr
// too with `merge_stderr`).
Proc spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, bool merge_stderr = false) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC)) die("pipe");
  Proc p;
  p.pid = fork();
  if (p.pid < 0) die("fork");
  if (p.pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    if (merge_stderr) dup2(from[1], 2);
    for (const auto& e : env) putenv(strdup(e.c_str()));
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    std::fprintf(stderr, "driver_state_probe: exec %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  p.in = to[1];
  p.out = from[0];
  return p;
}

// The next line of its output (without the newline), or "" at its end or
// after `timeout_ms`.
std::string read_line(Proc& p, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t nl = p.buffered.find('\n');
    if (nl != std::string::npos) {
      std::string line = p.buffered.substr(0, nl);
      p.buffered.erase(0, nl + 1);
      return line;
    }
    int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) return "";
    struct pollfd fd = {p.out, POLLIN, 0};
    if (poll(&fd, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(p.out, buf, sizeof(buf));
    if (n <= 0) return "";
    p.buffered.append(buf, size_t(n));
  }
}

// Everything it writes until it closes its output, or `timeout_ms` passed.
std::string read_all(Proc& p, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    if (left <= 0) break;
    struct pollfd fd = {p.out, POLLIN, 0};
    if (poll(&fd, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(p.out, buf, sizeof(buf));
    if (n <= 0) break;
    p.buffered.append(buf, size_t(n));
  }
  std::string all;
  all.swap(p.buffered);
  return all;
}

void end(Proc& p) {
  if (p.in >= 0) close(p.in);
  p.in = -1;
  for (int i = 0; i < 100; i++) {  // 5 s for it to exit on its own
    if (waitpid(p.pid, nullptr, WNOHANG) == p.pid) return;
    usleep(50000);
  }
  kill(p.pid, SIGKILL);
  waitpid(p.pid, nullptr, 0);
}

std::string word(const std::string& line, const std::string& key) {
  size_t at = line.find(key + "=");
  if (at == std::string::npos) return "-";
  at += key.size() + 1;
  return line.substr(at, line.find(' ', at) - at);
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

struct Driver {
  CUresult (*lock)(int, CUcheckpointLockArgs*);
  CUresult (*checkpoint)(int, CUcheckpointCheckpointArgs*);
  CUresult (*restore)(int, CUcheckpointRestoreArgs*);
  CUresult (*unlock)(int, CUcheckpointUnlockArgs*);
};

std::string err_name(CUresult r) {
  const char* n = nullptr;
  cuGetErrorName(r, &n);
  return n ? n : std::to_string(int(r));
}

int measure_main(const std::string& name, const std::string& libphos, const std::string& tool) {
  const Variant& v = find_variant(name);
  std::vector<std::string> env(v.env.begin(), v.env.end());
  if (v.phos) {
    if (libphos.empty() || tool.empty()) die(name + " needs --libphos and --agent-tool");
    env.push_back("LD_PRELOAD=" + libphos);
  }
  check_cu(cuInit(0), "cuInit (parent)");
  Proc child = spawn({"/proc/self/exe", "child", name}, env);
  std::string ready = read_line(child, 120000);
  if (ready.rfind("ready", 0) != 0) {
    end(child);
    std::printf("result variant=%s status=FAIL note=child_not_ready\n", name.c_str());
    return 1;
  }
  Memory before = memory_of(child.pid), ckpt, restored;
  std::map<std::string, double> ms;
  std::string status = "ok", why, grew = "-";
  if (v.phos) {
    // The plugin's sequence through the agent; the tool reads the memory.
    Proc t = spawn({tool, "driver-roundtrip", std::to_string(child.pid)}, {}, true);
    std::string out = read_all(t, 120000);
    end(t);
    size_t at = out.find("driver_rss ");
    if (at == std::string::npos) {
      status = "FAIL";
      why = "agent-tool: " + out.substr(0, 200);
    } else {
      std::string l = out.substr(at, out.find('\n', at) - at);
      before = {std::atof(word(l, "before_kib").c_str()) / 1024, std::atof(word(l, "anon_before_kib").c_str()) / 1024};
      ckpt = {std::atof(word(l, "checkpointed_kib").c_str()) / 1024, std::atof(word(l, "anon_checkpointed_kib").c_str()) / 1024};
      restored = {std::atof(word(l, "restored_kib").c_str()) / 1024, -1};
      for (const char* k : {"lock_ms", "checkpoint_ms", "restore_ms", "unlock_ms"}) ms[k] = std::atof(word(l, k).c_str());
    }
  } else {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW);
    Driver d{reinterpret_cast<decltype(d.lock)>(dlsym(lib, "cuCheckpointProcessLock")),
             reinterpret_cast<decltype(d.checkpoint)>(dlsym(lib, "cuCheckpointProcessCheckpoint")),
             reinterpret_cast<decltype(d.restore)>(dlsym(lib, "cuCheckpointProcessRestore")),
             reinterpret_cast<decltype(d.unlock)>(dlsym(lib, "cuCheckpointProcessUnlock"))};
    if (!d.lock || !d.checkpoint || !d.restore || !d.unlock) die("the driver lacks the checkpoint API");
    auto maps0 = mappings_of(child.pid);
    CUcheckpointLockArgs la{};
    la.timeoutMs = 30000;
    CUcheckpointCheckpointArgs ca{};
    CUcheckpointRestoreArgs ra{};
    CUcheckpointUnlockArgs ua{};
    auto t = std::chrono::steady_clock::now();
    CUresult r = d.lock(child.pid, &la);
    ms["lock_ms"] = ms_since(t);
    if (r == CUDA_SUCCESS) {
      t = std::chrono::steady_clock::now();
      r = d.checkpoint(child.pid, &ca);
      ms["checkpoint_ms"] = ms_since(t);
      if (r == CUDA_SUCCESS) {
        ckpt = memory_of(child.pid);
        grew = grown(maps0, mappings_of(child.pid));
        t = std::chrono::steady_clock::now();
        r = d.restore(child.pid, &ra);
        ms["restore_ms"] = ms_since(t);
        if (r != CUDA_SUCCESS) why = "restore: " + err_name(r);
      } else {
        why = "checkpoint: " + err_name(r);
      }
      t = std::chrono::steady_clock::now();
      CUresult u = d.unlock(child.pid, &ua);
      ms["unlock_ms"] = ms_since(t);
      if (u != CUDA_SUCCESS && why.empty()) why = "unlock: " + err_name(u);
    } else {
      why = "lock: " + err_name(r);
    }
    if (!why.empty()) status = "FAIL";
    restored = memory_of(child.pid);
  }
  std::string verified = "-";
  if (status == "ok") {
    if (write(child.in, "verify\n", 7) != 7) die("write to the child");
    verified = read_line(child, 60000);
    if (verified.rfind("verified ok", 0) != 0) status = "FAIL", why = "verify: " + (verified.empty() ? "no answer" : verified);
  }
  end(child);
  auto f = [](double x) { char b[32]; std::snprintf(b, sizeof(b), x < 0 ? "-" : "%.1f", x); return std::string(b); };
  auto delta = [](double a, double b) { char s[32]; std::snprintf(s, sizeof(s), a < 0 || b < 0 ? "-" : "%+.1f", b - a); return std::string(s); };
  auto msf = [&](const char* k) { return ms.count(k) ? f(ms[k]) : std::string("-"); };
  for (char& ch : why) if (ch == ' ') ch = '_';
  std::printf("result variant=%s status=%s rss_before_mib=%s rss_checkpointed_mib=%s rss_restored_mib=%s delta_mib=%s "
              "anon_delta_mib=%s lock_ms=%s checkpoint_ms=%s restore_ms=%s unlock_ms=%s gpu_used_mib=%s stack=%s "
              "printf_fifo=%s malloc_heap=%s set=%s stack_after=%s grown=%s note=%s\n",
              name.c_str(), status.c_str(), f(before.rss_mib).c_str(), f(ckpt.rss_mib).c_str(), f(restored.rss_mib).c_str(),
              delta(before.rss_mib, ckpt.rss_mib).c_str(), delta(before.anon_mib, ckpt.anon_mib).c_str(), msf("lock_ms").c_str(),
              msf("checkpoint_ms").c_str(), msf("restore_ms").c_str(), msf("unlock_ms").c_str(),
              word(ready, "gpu_used_mib").c_str(), word(ready, "stack").c_str(), word(ready, "printf_fifo").c_str(),
              word(ready, "malloc_heap").c_str(), word(ready, "set").c_str(), word(verified, "stack").c_str(), grew.c_str(),
              why.empty() ? "-" : why.c_str());
  return status == "ok" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "list") {
    for (const auto& v : variants()) std::printf("%s\t%s\n", v.name, v.what);
    return 0;
  }
  if (cmd == "child" && argc == 3) return child_main(argv[2]);
  if (cmd == "measure" && argc >= 3) {
    std::string libphos, tool;
    for (int i = 3; i + 1 < argc; i += 2) {
      if (!std::strcmp(argv[i], "--libphos")) libphos = argv[i + 1];
      else if (!std::strcmp(argv[i], "--agent-tool")) tool = argv[i + 1];
      else die(std::string("unknown argument ") + argv[i]);
    }
    return measure_main(argv[2], libphos, tool);
  }
  std::fprintf(stderr, "usage: driver_state_probe list | measure VARIANT [--libphos SO --agent-tool TOOL] | child VARIANT\n");
  return 2;
}
