// An interprocess event recorded again and again for another process to
// wait on each time, for the GPU suite's gpu_ipc_event case: the owner A
// allocates S, creates E with cudaEventInterprocess, and starts B (itself
// again, exec'd) with both IPC handles and two pipes. Each round k:
//   A: a kernel spins SPIN_MS on the GPU's clock, then writes S[0] = k;
//      A records E after it, and only once cudaEventRecord returned tells B;
//      B waits on its opened E (cudaStreamWaitEvent on a non-blocking stream
//      of its own), copies S[0] out on that stream: it must read k;
//   B: the same the other way (S[1] = 1000 + k, B records its E, A waits).
// Under the driver the records return at once and the waits hold the
// readers back; under libphos each record of an interprocess event returns
// once the kernel before it is done (phos serves event IPC, the driver
// holds no interprocess event). Either way every read must be right.
// Prints per round "round K a_record_ms T b_read V ok|bad" and
// "round K b_record_ms T a_read V ok|bad"; exit 0 when all are ok.
//
// usage: gpu_ipc_event ROUNDS SPIN_MS | gpu_ipc_event --b MEMHEX EVENTHEX RFD WFD ROUNDS SPIN_MS
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu_check.h"

namespace {

__device__ uint64_t gpu_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_then_write(unsigned* where, unsigned value, uint64_t ns) {
  const uint64_t t0 = gpu_ns();
  while (gpu_ns() - t0 < ns) __nanosleep(10000);
  *reinterpret_cast<volatile unsigned*>(where) = value;
}

__global__ void copy_word(const unsigned* from, unsigned* to) { *to = *reinterpret_cast<const volatile unsigned*>(from); }

void send(int fd, unsigned v) {
  if (write(fd, &v, sizeof(v)) != sizeof(v)) std::exit(3);
}
unsigned receive(int fd) {
  unsigned v = 0;
  if (read(fd, &v, sizeof(v)) != sizeof(v)) std::exit(3);
  return v;
}

template <class H>
std::string to_hex(const H& h) {
  char hex[2 * sizeof(h.reserved) + 1];
  for (size_t i = 0; i < sizeof(h.reserved); i++) std::snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
  return hex;
}
template <class H>
H from_hex(const char* hex) {
  H h;
  if (std::strlen(hex) != 2 * sizeof(h.reserved)) std::exit(2);
  for (size_t i = 0; i < sizeof(h.reserved); i++) {
    unsigned v;
    if (std::sscanf(hex + 2 * i, "%2x", &v) != 1) std::exit(2);
    h.reserved[i] = char(v);
  }
  return h;
}

// One side: its event, its stream, S, and a word of its own to read into.
struct Side {
  cudaEvent_t event;
  cudaStream_t stream;
  unsigned* s;
  unsigned* word;
  unsigned* host;
  uint64_t spin_ns;
};

Side make_side(cudaEvent_t event, unsigned* s, unsigned spin_ms) {
  Side side{};
  side.event = event;
  side.s = s;
  side.spin_ns = uint64_t(spin_ms) * 1000000;
  CHECK_CUDA(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMalloc(&side.word, sizeof(unsigned)));
  CHECK_CUDA(cudaMallocHost(&side.host, sizeof(unsigned)));
  return side;
}

// The kernel that writes S[at] = value, then the record: how long the
// record call took, in ms.
double write_and_record(const Side& side, int at, unsigned value) {
  spin_then_write<<<1, 1, 0, side.stream>>>(side.s + at, value, side.spin_ns);
  CHECK_CUDA(cudaGetLastError());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_CUDA(cudaEventRecord(side.event, side.stream));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// What this side reads at S[at] once its stream waited on its event.
unsigned wait_and_read(const Side& side, int at) {
  CHECK_CUDA(cudaStreamWaitEvent(side.stream, side.event, 0));
  copy_word<<<1, 1, 0, side.stream>>>(side.s + at, side.word);
  CHECK_CUDA(cudaMemcpyAsync(side.host, side.word, sizeof(unsigned), cudaMemcpyDeviceToHost, side.stream));
  CHECK_CUDA(cudaStreamSynchronize(side.stream));
  return *side.host;
}

bool report(unsigned k, const char* who, double record_ms, const char* reader, unsigned read, unsigned want) {
  std::printf("round %u %s_record_ms %.1f %s_read %u %s\n", k, who, record_ms, reader, read, read == want ? "ok" : "bad");
  std::fflush(stdout);
  return read == want;
}

int b(const char* mem_hex, const char* event_hex, int rfd, int wfd, unsigned rounds, unsigned spin_ms) {
  void* p = nullptr;
  cudaEvent_t event;
  CHECK_CUDA(cudaIpcOpenEventHandle(&event, from_hex<cudaIpcEventHandle_t>(event_hex)));
  CHECK_CUDA(cudaIpcOpenMemHandle(&p, from_hex<cudaIpcMemHandle_t>(mem_hex), cudaIpcMemLazyEnablePeerAccess));
  const Side side = make_side(event, static_cast<unsigned*>(p), spin_ms);
  bool ok = true;
  for (unsigned k = 1; k <= rounds; k++) {
    if (receive(rfd) != k) return 3;
    send(wfd, wait_and_read(side, 0));
    const double ms = write_and_record(side, 1, 1000 + k);
    send(wfd, k);
    ok &= report(k, "b", ms, "a", receive(rfd), 1000 + k);
  }
  CHECK_CUDA(cudaIpcCloseMemHandle(p));
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && !std::strcmp(argv[1], "--b"))
    return b(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]), std::atoi(argv[7]));
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ROUNDS SPIN_MS\n", argv[0]);
    return 2;
  }
  const unsigned rounds = std::atoi(argv[1]), spin_ms = std::atoi(argv[2]);
  unsigned* s = nullptr;
  cudaEvent_t event;
  CHECK_CUDA(cudaMalloc(&s, 2 << 20));
  CHECK_CUDA(cudaMemset(s, 0, 2 << 20));
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventInterprocess | cudaEventDisableTiming));
  cudaIpcMemHandle_t mh;
  cudaIpcEventHandle_t eh;
  CHECK_CUDA(cudaIpcGetMemHandle(&mh, s));
  CHECK_CUDA(cudaIpcGetEventHandle(&eh, event));
  int down[2], up[2];  // A -> B, B -> A
  if (pipe(down) != 0 || pipe(up) != 0) return 2;
  pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    const std::string rfd = std::to_string(down[0]), wfd = std::to_string(up[1]);
    execl("/proc/self/exe", argv[0], "--b", to_hex(mh).c_str(), to_hex(eh).c_str(), rfd.c_str(), wfd.c_str(), argv[1],
          argv[2], static_cast<char*>(nullptr));
    _exit(127);
  }
  const Side side = make_side(event, s, spin_ms);
  bool ok = true;
  for (unsigned k = 1; k <= rounds; k++) {
    const double ms = write_and_record(side, 0, k);
    send(down[1], k);
    ok &= report(k, "a", ms, "b", receive(up[0]), k);
    if (receive(up[0]) != k) return 3;
    send(down[1], wait_and_read(side, 1));
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("b failed: status %d\n", status);
    ok = false;
  }
  return ok ? 0 : 1;
}
