// A process whose agent is not to be trusted, for e2e/hostile_agent.sh: the
// e2e workload contract (a random token and a counter written to STATE
// every 10 ms, no file kept open) with an agent that answers a dump with
// what MODE says. The plugin in criu must refuse each dump saying what was
// wrong, and the process must carry on.
//
// The real agent (phos/hooks/agent.h), with a backend that lists
//   overlap       two allocations that overlap
//   unaligned     an allocation at an odd address
//   proc-mem      /proc/self/mem as an allocation's memory
//   regular-file  a regular file (this program) as an allocation's memory
//   directory     a directory as an allocation's memory
//   socket        a socket as an allocation's memory
// and, on a raw listener of its own (the same socket name prefix), after a
// proper hello and status:
//   huge          an allocation count of 2^40
//   silent        no reply at all
//   endless       a reply whose frame never ends
//   stuck-resume  a resume that waits for a lock the main thread holds for
//                 good, as an agent's would for a program thread criu keeps
//                 stopped (no allocations listed)
// The status says no allocations, so that the plugin needs no CUDA (CI has
// none) before it asks for the list.
//
// usage: phos-hostile-agent STATE MODE
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <variant>

#include "phos/hooks/agent.h"
#include "phos/hooks/agent_backend.h"
#include "phos/hooks/gate.h"
#include "phos/images/agent_protocol.h"
#include "phos/images/agent_wire.h"
#include "phos/images/bytes.h"

namespace {

using namespace phos;

std::string g_mode;
std::mutex g_held;  // stuck-resume: the main thread's, for good

agent::Allocation alloc(uint64_t id, uint64_t address, uint64_t size) { return {id, 0, address, size, 0}; }

class HostileBackend : public hooks::AgentBackend {
 public:
  agent::StatusReply status() override {
    agent::StatusReply s;
    s.cuda_initialized = false;
    return s;
  }
  std::vector<agent::Allocation> allocations() override {
    if (g_mode == "overlap") return {alloc(1, 0x7f0000000000, 4 << 20), alloc(2, 0x7f0000200000, 2 << 20)};
    if (g_mode == "unaligned") return {alloc(1, 0x7f0000000010, 2 << 20)};
    if (g_mode == "stuck-resume") return {};
    return {alloc(1, 0x7f0000000000, 2 << 20)};
  }
  Result<UniqueFd> export_allocation(uint64_t) override {
    int fd = -1;
    if (g_mode == "proc-mem") fd = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    else if (g_mode == "regular-file") fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    else if (g_mode == "directory") fd = ::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    else if (g_mode == "socket") fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    else fd = ::memfd_create("hostile", MFD_CLOEXEC);
    if (fd < 0) return errno_error("hostile fd");
    return UniqueFd(fd);
  }
  Result<void> drain(std::chrono::milliseconds) override { return {}; }
  Result<uint64_t> release_mappings(bool) override { return uint64_t(0); }
  Result<uint64_t> remap(std::span<const uint64_t>, std::vector<UniqueFd>) override { return uint64_t(0); }
  Result<void> set_speculation(bool) override { return {}; }
  Result<bool> set_validation(bool) override { return false; }
  void gate_opening() override {
    if (g_mode == "stuck-resume") std::lock_guard<std::mutex> wait(g_held);
  }
};

// The raw modes: answers hello, status and quiesce as an agent would, then
// misbehaves at the allocation list (or at once, for silent and endless);
// everything after that (the plugin giving the process back) is answered
// with plain replies.
void serve_raw(int conn) {
  for (;;) {
    auto req = agent::recv_request(conn, -1);
    if (!req) return;
    const auto& q = req->request;
    if (std::holds_alternative<agent::Hello>(q)) {
      (void)agent::send_reply(conn, agent::HelloReply{.protocol_version = agent::kProtocolVersion,
                                                      .agent_version = "hostile",
                                                      .pid = ::getpid(),
                                                      .agent_tid = 0,
                                                      .uid = ::getuid()});
    } else if (g_mode == "silent") {
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return;
    } else if (g_mode == "endless") {
      std::byte header[8];
      bytes::put_u32(header, wire::kFrameMagic);
      bytes::put_u32(header + 4, 1u << 20);
      (void)::send(conn, header, sizeof(header), MSG_NOSIGNAL);
      (void)::send(conn, "0123456789", 10, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return;
    } else if (std::holds_alternative<agent::StatusRequest>(q)) {
      (void)agent::send_reply(conn, agent::StatusReply{});
    } else if (std::holds_alternative<agent::QuiesceRequest>(q)) {
      (void)agent::send_reply(conn, agent::QuiesceReply{.drained_ns = 1000, .at_step = false, .touch_order = {}});
    } else if (std::holds_alternative<agent::ListAllocationsRequest>(q)) {
      agent::ListAllocationsReply r;
      r.allocations = {alloc(1, 0x7f0000000000, 2 << 20)};
      r.total_count = 1ull << 40;
      UniqueFd fd(::memfd_create("hostile", MFD_CLOEXEC));
      int fds[] = {fd.get()};
      (void)agent::send_reply(conn, r, fds);
    } else if (std::holds_alternative<agent::ResumeRequest>(q)) {
      (void)agent::send_reply(conn, agent::ResumeReply{});
    } else if (std::holds_alternative<agent::GoodbyeRequest>(q)) {
      (void)agent::send_reply(conn, agent::GoodbyeReply{});
      return;
    } else {
      (void)agent::send_reply(conn, make_error("not answered by this agent", ENOTSUP));
    }
  }
}

void raw_listener() {
  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr;
  socklen_t len = wire::abstract_socket_address(std::string(agent::kSocketPrefix) + std::to_string(::getpid()), addr);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(listener.get(), 4) != 0) {
    std::perror("hostile agent: listen");
    std::exit(2);
  }
  for (;;) {
    UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    std::thread([c = std::move(conn)]() mutable { serve_raw(c.get()); }).detach();
  }
}

void write_state(const char* path, uint64_t token, uint64_t counter) {
  std::string tmp = std::string(path) + ".tmp";
  char line[64];
  int n = std::snprintf(line, sizeof(line), "%016llx %llu\n", (unsigned long long)token, (unsigned long long)counter);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, line, size_t(n)) != n) std::exit(2);
  ::close(fd);
  if (::rename(tmp.c_str(), path) != 0) std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s STATE MODE\n", argv[0]);
    return 2;
  }
  g_mode = argv[2];
  const bool raw = g_mode == "huge" || g_mode == "silent" || g_mode == "endless";
  hooks::Gate gate;
  HostileBackend backend;
  hooks::Agent agent(gate, backend);
  if (raw) {
    std::thread(raw_listener).detach();
  } else if (auto started = agent.start(); !started) {
    std::fprintf(stderr, "hostile agent: %s\n", started.error().message.c_str());
    return 2;
  }
  if (g_mode == "stuck-resume") g_held.lock();
  uint64_t token = 0;
  if (::getrandom(&token, sizeof(token), 0) != sizeof(token)) return 2;
  for (uint64_t counter = 0;; counter++) {
    write_state(argv[1], token, counter);
    ::usleep(10000);
  }
}
