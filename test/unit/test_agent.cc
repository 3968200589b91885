// The agent in this process, with a fake backend, driven by the plugin's
// client and by raw sockets for what a well-behaved client never sends.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <thread>
#include <variant>

#include "phos/hooks/agent.h"
#include "phos/images/bytes.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/proc.h"

using namespace phos;
using namespace phos::hooks;
using phos::plugin::AgentClient;
using namespace std::chrono_literals;

namespace {

// Allocations whose exported fds are memfds holding their id. It leaves the
// copy window to AgentBackend's defaults (CopyWindowBackend below has one).
class FakeBackend : public AgentBackend {
 public:
  explicit FakeBackend(size_t n) {
    for (size_t i = 0; i < n; i++) allocs_.push_back({i + 1, 0, 0x7f0000000000ull + (i << 21), 1u << 21, 0});
  }
  agent::StatusReply status() override {
    agent::StatusReply s;
    s.cuda_initialized = true;
    s.allocation_count = allocs_.size();
    s.allocated_bytes = allocs_.size() << 21;
    s.device_count = 1;
    s.unsupported_calls = unsupported;
    s.counters = {{"launches", 42}};
    s.modules = modules;
    s.speculation_active = speculating;
    s.indexed_buffers = indexed_buffers;
    s.kernels = kernels;
    return s;
  }
  std::vector<agent::Allocation> allocations() override { return allocs_; }
  Result<UniqueFd> export_allocation(uint64_t id) override {
    UniqueFd fd(::memfd_create("fake-alloc", MFD_CLOEXEC));
    if (::write(fd.get(), &id, sizeof(id)) != sizeof(id)) return errno_error("write memfd");
    return fd;
  }
  Result<void> drain(std::chrono::milliseconds) override { return {}; }
  Result<uint64_t> release_mappings(bool drop_handles) override {
    released = true;
    dropped_handles = drop_handles;
    return uint64_t(allocs_.size() << 21);
  }
  Result<uint64_t> remap(std::span<const uint64_t> ids, std::vector<UniqueFd> fds) override {
    remapped_ids.insert(remapped_ids.end(), ids.begin(), ids.end());
    remapped_fds += fds.size();
    remap_calls++;
    // Each fd must be the one exported for its id (a memfd holding the id).
    for (size_t i = 0; i < fds.size(); i++) {
      uint64_t id = 0;
      if (::pread(fds[i].get(), &id, sizeof(id), 0) != sizeof(id) || id != ids[i]) mismatched_fds++;
    }
    return uint64_t(ids.size() << 21);
  }
  Result<void> set_speculation(bool on) override {
    speculate_calls.push_back(on);
    if (!speculation_error.empty()) return make_error(speculation_error, ENOSYS);
    speculating = on;
    return {};
  }
  Result<bool> set_validation(bool on) override {
    validate_calls.push_back(on);
    if (on) speculating = true;
    validating = on;
    return sass_attached;
  }
  bool sass_attached = false;
  bool speculating = false, validating = false;
  std::vector<bool> speculate_calls, validate_calls;
  std::string speculation_error;  // set_speculation fails with it where not empty
  uint64_t indexed_buffers = 0;
  std::vector<agent::KernelSpeculation> kernels;
  std::vector<std::string> unsupported;
  std::vector<agent::Module> modules;
  bool released = false;
  bool dropped_handles = false;
  std::vector<uint64_t> remapped_ids;
  size_t remapped_fds = 0;
  size_t remap_calls = 0;
  size_t mismatched_fds = 0;

 private:
  std::vector<agent::Allocation> allocs_;
};

template <class Backend>
struct BasicRunningAgent {
  Gate gate;
  Backend backend;
  Agent agent;
  explicit BasicRunningAgent(size_t allocs = 3, AgentOptions options = {})
      : backend(allocs), agent(gate, backend, options) {
    REQUIRE(agent.start().ok());
  }
  AgentClient client() {
    auto c = AgentClient::connect(::getpid(), 2000);
    REQUIRE(c.ok());
    return std::move(c.value());
  }
  UniqueFd raw_connect() {
    UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    struct sockaddr_un addr;
    socklen_t len = wire::abstract_socket_address(agent.socket_name(), addr);
    REQUIRE(::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0);
    return s;
  }
};
using RunningAgent = BasicRunningAgent<FakeBackend>;

agent::Reply raw_call(int sock, const agent::Request& req) {
  REQUIRE(agent::send_request(sock, req).ok());
  auto reply = agent::recv_reply(sock, 2000);
  REQUIRE(reply.ok());
  return std::move(reply->reply);
}

// The Error a reply must be.
Error error_of(const agent::Reply& reply) {
  const auto* e = std::get_if<Error>(&reply);
  REQUIRE(e);
  return *e;
}

}  // namespace

TEST_CASE("agent: hello and status", "[agent]") {
  RunningAgent a(3);
  auto c = a.client();
  CHECK(c.hello().pid == ::getpid());
  CHECK(c.hello().agent_tid == a.agent.thread_id());
  CHECK(c.hello().agent_version == PHOS_VERSION);
  CHECK(c.hello().uid == ::getuid());
  auto s = c.status();
  REQUIRE(s.ok());
  CHECK(s->gate_open);
  CHECK(s->cuda_initialized);
  CHECK(s->allocation_count == 3);
  REQUIRE(s->counters.size() == 1);
  CHECK(s->counters[0] == std::pair<std::string, uint64_t>{"launches", 42});
  CHECK(c.goodbye().ok());
}

TEST_CASE("agent: status carries the loaded modules, function names capped", "[agent]") {
  RunningAgent a;
  std::vector<std::string> many;
  for (int i = 0; i < 1500; i++) many.push_back("k" + std::to_string(i));
  a.backend.modules = {{1, "fatbin", 4096, 0x1234abcd, "cuLibraryLoadData", {"vec_add", "scale"}, 2, {"table"}},
                       {2, "file", 100, 7, "/tmp/x.cubin", many, many.size(), {}}};
  auto c = a.client();
  auto s = c.status();
  REQUIRE(s.ok());
  REQUIRE(s->modules.size() == 2);
  const auto& m = s->modules[0];
  CHECK(m.id == 1);
  CHECK(m.kind == "fatbin");
  CHECK(m.size == 4096);
  CHECK(m.hash == 0x1234abcd);
  CHECK(m.source == "cuLibraryLoadData");
  CHECK(m.functions == std::vector<std::string>{"vec_add", "scale"});
  CHECK(m.globals == std::vector<std::string>{"table"});
  CHECK(s->modules[1].functions.size() == 1000);
  CHECK(s->modules[1].function_count == 1500);
  CHECK(c.goodbye().ok());
}

namespace {
agent::KernelSpeculation kernel_entry(std::string name, uint64_t launches) {
  agent::KernelSpeculation k;
  k.name = std::move(name);
  k.launches = launches;
  return k;
}
}  // namespace

TEST_CASE("agent: status carries the speculation and its kernels", "[agent][speculation]") {
  RunningAgent a;
  {
    auto s = a.client().status();
    REQUIRE(s.ok());
    CHECK_FALSE(s->speculation_active);
    CHECK(s->indexed_buffers == 0);
    CHECK(s->kernels.empty());
    CHECK(s->kernel_count == 0);
  }
  a.backend.speculating = true;
  a.backend.indexed_buffers = 17;
  agent::KernelSpeculation k = kernel_entry("_Z7vec_addPKfS0_Pfi", 10);
  k.module = 3;
  k.exact = 2;
  k.speculated = 7;
  k.unknown = 1;
  k.buffers = 29;
  k.reads = 19;
  k.writes = 10;
  k.types = "name";
  k.note = "cubin says 5 parameters, the name 4";
  a.backend.kernels = {k, kernel_entry("plain_c_kernel", 0)};
  auto s = a.client().status();
  REQUIRE(s.ok());
  CHECK(s->speculation_active);
  CHECK(s->indexed_buffers == 17);
  CHECK(s->kernel_count == 2);
  REQUIRE(s->kernels.size() == 2);
  const auto& got = s->kernels[0];
  CHECK(got.name == k.name);
  CHECK(got.module == 3);
  CHECK(got.launches == 10);
  CHECK(got.exact == 2);
  CHECK(got.speculated == 7);
  CHECK(got.unknown == 1);
  CHECK(got.buffers == 29);
  CHECK(got.reads == 19);
  CHECK(got.writes == 10);
  CHECK(got.types == "name");
  CHECK(got.note == k.note);
  CHECK(s->kernels[1].name == "plain_c_kernel");
  CHECK(s->kernels[1].note.empty());
}

TEST_CASE("agent: status carries the 1000 kernels with the most launches", "[agent][speculation]") {
  RunningAgent a;
  for (uint64_t i = 0; i < 1500; i++) a.backend.kernels.push_back(kernel_entry("k" + std::to_string(i), i));
  auto s = a.client().status();
  REQUIRE(s.ok());
  CHECK(s->kernel_count == 1500);
  REQUIRE(s->kernels.size() == 1000);
  uint64_t fewest = UINT64_MAX;
  for (const auto& k : s->kernels) fewest = std::min(fewest, k.launches);
  CHECK(fewest == 500);
  CHECK(s->kernels.front().name == "k1499");
}

TEST_CASE("agent: speculate reaches the backend", "[agent][speculation]") {
  RunningAgent a;
  auto c = a.client();
  REQUIRE(c.set_speculation(true).ok());
  CHECK(a.backend.speculating);
  auto s = c.status();
  REQUIRE(s.ok());
  CHECK(s->speculation_active);
  REQUIRE(c.set_speculation(false).ok());
  CHECK_FALSE(a.backend.speculating);
  CHECK(a.backend.speculate_calls == std::vector<bool>{true, false});
  CHECK(c.goodbye().ok());
}

TEST_CASE("agent: validate turns speculation on with it, and off alone", "[agent][speculation]") {
  RunningAgent a;
  a.backend.sass_attached = true;
  auto c = a.client();
  auto on = c.set_validation(true);
  REQUIRE(on.ok());
  CHECK(*on);  // the reply says the SASS validator is attached
  CHECK(a.backend.speculating);
  CHECK(a.backend.validating);
  REQUIRE(c.set_validation(false).ok());
  CHECK(a.backend.speculating);  // off leaves speculation on
  CHECK_FALSE(a.backend.validating);
  CHECK(a.backend.validate_calls == std::vector<bool>{true, false});
  CHECK(a.backend.speculate_calls.empty());  // validate requests do not go through set_speculation
  // A plain speculate request says nothing of validation.
  REQUIRE(c.set_speculation(false).ok());
  CHECK(a.backend.validate_calls.size() == 2);
  CHECK(c.goodbye().ok());
}

TEST_CASE("agent: a backend that cannot speculate yields an error reply", "[agent][speculation]") {
  RunningAgent a;
  a.backend.speculation_error = "speculation is not built yet";
  auto c = a.client();
  auto on = c.set_speculation(true);
  REQUIRE_FALSE(on.ok());
  CHECK(on.error().code == ENOSYS);
  CHECK_THAT(on.error().message, Catch::Contains("speculation is not built yet") && Catch::Contains("speculation on"));
  CHECK_FALSE(a.backend.speculating);
  CHECK(c.status().ok());  // the session goes on
  CHECK(c.goodbye().ok());
}

TEST_CASE("agent: its socket is found through /proc and its thread is named", "[agent]") {
  RunningAgent a;
  auto found = plugin::find_listening_socket(::getpid(), agent::kSocketPrefix);
  REQUIRE(found.ok());
  REQUIRE(found->has_value());
  CHECK(**found == a.agent.socket_name());
  CHECK(a.agent.socket_name().rfind("phos-agent." + std::to_string(::getpid()) + ".", 0) == 0);
  auto tid = plugin::find_thread(::getpid(), agent::kThreadName);
  REQUIRE(tid.ok());
  CHECK(*tid == a.agent.thread_id());
}

TEST_CASE("agent: quiesce closes the gate and resume opens it", "[agent][gate]") {
  RunningAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  CHECK_FALSE(a.gate.is_open());
  auto s = c.status();
  REQUIRE(s.ok());
  CHECK_FALSE(s->gate_open);
  REQUIRE(c.resume().ok());
  CHECK(a.gate.is_open());
}

TEST_CASE("agent: quiesce times out while a CUDA call stays inside", "[agent][gate]") {
  RunningAgent a;
  a.gate.enter();
  auto c = a.client();
  auto q = c.quiesce(50);
  REQUIRE_FALSE(q.ok());
  CHECK(q.error().code == ETIMEDOUT);
  CHECK_THAT(q.error().message, Catch::Contains("1 CUDA calls still running") && Catch::Contains("gate reopened"));
  CHECK(a.gate.is_open());
  a.gate.leave();
}

TEST_CASE("agent: release mappings needs a quiesced process", "[agent]") {
  RunningAgent a(2);
  auto c = a.client();
  auto early = c.release_mappings();
  REQUIRE_FALSE(early.ok());
  CHECK(early.error().code == EBUSY);
  REQUIRE(c.quiesce(1000).ok());
  auto released = c.release_mappings();
  REQUIRE(released.ok());
  CHECK(*released == 2u << 21);
  CHECK(a.backend.released);
  CHECK_FALSE(a.backend.dropped_handles);
  REQUIRE(c.release_mappings(true).ok());
  CHECK(a.backend.dropped_handles);
  REQUIRE(c.resume().ok());
}

TEST_CASE("agent: allocations and their fds come in pages", "[agent][fds]") {
  RunningAgent a(300);
  auto c = a.client();
  std::vector<UniqueFd> fds;
  auto list = c.list_allocations(true, &fds);
  REQUIRE(list.ok());
  REQUIRE(list->size() == 300);
  REQUIRE(fds.size() == 300);
  for (size_t i = 0; i < 300; i += 37) {
    uint64_t id = 0;
    REQUIRE(::pread(fds[i].get(), &id, sizeof(id), 0) == sizeof(id));
    CHECK(id == (*list)[i].id);
  }
  auto no_fds = c.list_allocations(false, nullptr);
  REQUIRE(no_fds.ok());
  CHECK(no_fds->size() == 300);
}

TEST_CASE("agent: remap with fds", "[agent][fds]") {
  RunningAgent a;
  auto c = a.client();
  int p[2];
  REQUIRE(::pipe(p) == 0);
  auto mapped = c.remap({5, 6}, {p[0], p[1]});
  ::close(p[0]);
  ::close(p[1]);
  REQUIRE(mapped.ok());
  CHECK(a.backend.remapped_ids == std::vector<uint64_t>{5, 6});
  CHECK(a.backend.remapped_fds == 2);
}

TEST_CASE("agent: remap_all sends every allocation's fd, a frame at a time", "[agent][fds]") {
  RunningAgent a(300);
  auto c = a.client();
  std::vector<UniqueFd> fds;
  auto list = c.list_allocations(true, &fds);
  REQUIRE(list.ok());
  auto mapped = c.remap_all(*list, fds);
  REQUIRE(mapped.ok());
  CHECK(*mapped == 300u << 21);
  CHECK(a.backend.remap_calls == 2);  // 253 + 47
  CHECK(a.backend.remapped_fds == 300);
  CHECK(a.backend.mismatched_fds == 0);
  REQUIRE(a.backend.remapped_ids.size() == 300);
  CHECK(a.backend.remapped_ids.front() == 1);
  CHECK(a.backend.remapped_ids.back() == 300);
}

TEST_CASE("agent: remap_all without allocations maps the same memory", "[agent]") {
  RunningAgent a;
  auto c = a.client();
  REQUIRE(c.remap_all({}, {}).ok());
  CHECK(a.backend.remap_calls == 1);
  CHECK(a.backend.remapped_fds == 0);
}

TEST_CASE("agent: remap with a wrong number of fds is refused", "[agent][fds]") {
  RunningAgent a;
  auto c = a.client();
  int p[2];
  REQUIRE(::pipe(p) == 0);
  auto mapped = c.remap({5, 6}, {p[0]});
  ::close(p[0]);
  ::close(p[1]);
  REQUIRE_FALSE(mapped.ok());
  CHECK(mapped.error().code == EINVAL);
  CHECK_THAT(mapped.error().message, Catch::Contains("1 fds for 2 allocations"));
}

TEST_CASE("agent: unsupported calls are reported", "[agent]") {
  RunningAgent a;
  a.backend.unsupported = {"cuIpcOpenMemHandle", "cudaMallocManaged"};
  auto s = a.client().status();
  REQUIRE(s.ok());
  CHECK(s->unsupported_calls == a.backend.unsupported);
}

TEST_CASE("agent: the first request must be hello", "[agent][protocol]") {
  RunningAgent a;
  UniqueFd s = a.raw_connect();
  auto r = raw_call(s.get(), agent::StatusRequest{});
  CHECK(error_of(r).code == EPROTO);
  CHECK(wire::recv_frame(s.get(), 1000).error().code == ENODATA);  // closed
}

TEST_CASE("agent: an unknown protocol version is refused", "[agent][protocol]") {
  RunningAgent a;
  UniqueFd s = a.raw_connect();
  auto r = raw_call(s.get(), agent::Hello{99, "future"});
  CHECK(error_of(r).code == EPROTONOSUPPORT);
  CHECK_THAT(error_of(r).message, Catch::Contains("agent protocol 99 not supported"));
}

TEST_CASE("agent: a malformed frame is answered and the agent serves on", "[agent][malformed]") {
  RunningAgent a;
  {
    UniqueFd s = a.raw_connect();
    std::byte junk[8];
    bytes::put_u32(junk, 0x01020304);
    bytes::put_u32(junk + 4, 0);
    REQUIRE(::send(s.get(), junk, 8, MSG_NOSIGNAL) == 8);
    auto r = agent::recv_reply(s.get(), 2000);
    REQUIRE(r.ok());
    CHECK(error_of(r->reply).code == EPROTO);
  }
  CHECK(a.client().status().ok());
}

TEST_CASE("agent: a payload that is not a request is answered", "[agent][malformed]") {
  RunningAgent a;
  UniqueFd s = a.raw_connect();
  std::vector<std::byte> junk(16, std::byte{0xff});
  REQUIRE(wire::send_frame(s.get(), junk).ok());
  auto r = agent::recv_reply(s.get(), 2000);
  REQUIRE(r.ok());
  CHECK_THAT(error_of(r->reply).message, Catch::Contains("malformed request"));
}

TEST_CASE("agent: an oversized frame is refused", "[agent][malformed]") {
  RunningAgent a;
  UniqueFd s = a.raw_connect();
  std::byte header[8];
  bytes::put_u32(header, wire::kFrameMagic);
  bytes::put_u32(header + 4, 512u << 20);
  REQUIRE(::send(s.get(), header, 8, MSG_NOSIGNAL) == 8);
  auto r = agent::recv_reply(s.get(), 2000);
  REQUIRE(r.ok());
  CHECK_THAT(error_of(r->reply).message, Catch::Contains("oversized frame"));
}

TEST_CASE("agent: a client that disconnects mid-message does not stop it", "[agent][disconnect]") {
  RunningAgent a;
  {
    UniqueFd s = a.raw_connect();
    std::byte header[8];
    bytes::put_u32(header, wire::kFrameMagic);
    bytes::put_u32(header + 4, 1000);
    REQUIRE(::send(s.get(), header, 8, MSG_NOSIGNAL) == 8);
    REQUIRE(::send(s.get(), "abc", 3, MSG_NOSIGNAL) == 3);
  }
  CHECK(a.client().status().ok());
}

TEST_CASE("agent: a silent client is dropped after the idle timeout", "[agent][timeout]") {
  RunningAgent a(1, AgentOptions{100});
  UniqueFd silent = a.raw_connect();
  auto start = std::chrono::steady_clock::now();
  CHECK(a.client().status().ok());
  CHECK(std::chrono::steady_clock::now() - start >= 90ms);
}

TEST_CASE("agent: goodbye closes the agent's end first", "[agent]") {
  RunningAgent a;
  auto c = a.client();
  CHECK(c.goodbye().ok());
  CHECK(a.client().status().ok());  // listening again
}

TEST_CASE("agent: refuses a peer that is neither root nor its owner", "[agent][security]") {
  if (::getuid() != 0) {
    WARN("needs root to connect as another uid; not checked");
    return;
  }
  RunningAgent a;
  const std::string name = a.agent.socket_name();
  pid_t child = ::fork();
  if (child == 0) {
    // The unprivileged peer: connects as nobody and expects EPERM.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(10);
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr;
    socklen_t len = wire::abstract_socket_address(name, addr);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) _exit(11);
    auto r = agent::recv_reply(s, 2000);
    if (!r.ok()) _exit(12);
    const auto* e = std::get_if<Error>(&r->reply);
    if (!e || e->code != EPERM) _exit(13);
    _exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(a.client().status().ok());  // root still gets in
}

TEST_CASE("agent: restarts under a new name after fork", "[agent][fork]") {
  RunningAgent a;
  int p[2];
  REQUIRE(::pipe(p) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(p[0]);
    bool ok = a.agent.restart_after_fork().ok();
    std::string name = a.agent.socket_name();
    bool own = name.rfind("phos-agent." + std::to_string(::getpid()) + ".", 0) == 0;
    auto found = plugin::find_listening_socket(::getpid(), agent::kSocketPrefix);
    bool only_own = found.ok() && found->has_value() && **found == name;
    char result = ok && own && only_own ? 'y' : 'n';
    (void)!::write(p[1], &result, 1);
    _exit(0);
  }
  ::close(p[1]);
  char result = 0;
  REQUIRE(::read(p[0], &result, 1) == 1);
  ::close(p[0]);
  ::waitpid(child, nullptr, 0);
  CHECK(result == 'y');
}

// --- the copy window of a concurrent dump ---

namespace {

// A backend with a copy window: records what open_copy_window was given.
class CopyWindowBackend final : public FakeBackend {
 public:
  using FakeBackend::FakeBackend;
  Result<agent::OpenCopyWindowReply> open_copy_window(const agent::OpenCopyWindowRequest& q,
                                                      std::vector<UniqueFd> fds) override {
    open_calls++;
    opened_with = q;
    fd_count = fds.size();
    markers.clear();
    for (const auto& fd : fds) {
      char buf[16] = {};
      ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
      markers.push_back(n > 0 ? std::string(buf, size_t(n)) : std::string());
    }
    if (!open_error.empty()) return make_error(open_error, EINVAL);
    return agent::OpenCopyWindowReply{validating_window};
  }
  Result<agent::CloseCopyWindowReply> close_copy_window(const std::vector<agent::AddressRange>& missed) override {
    close_calls++;
    closed_with = missed;
    return close_reply;
  }
  size_t open_calls = 0, close_calls = 0;
  std::vector<agent::AddressRange> closed_with;
  agent::OpenCopyWindowRequest opened_with;
  size_t fd_count = 0;
  std::vector<std::string> markers;  // what each fd held
  bool validating_window = false;
  std::string open_error;  // open_copy_window fails with EINVAL and it where not empty
  agent::CloseCopyWindowReply close_reply;
};

using CopyWindowAgent = BasicRunningAgent<CopyWindowBackend>;

// A memfd holding `text`.
UniqueFd memfd_with(const std::string& text) {
  UniqueFd fd(::memfd_create("copy-window-test", MFD_CLOEXEC));
  REQUIRE(fd.valid());
  REQUIRE(::write(fd.get(), text.data(), text.size()) == ssize_t(text.size()));
  return fd;
}

const agent::OpenCopyWindowRequest kOpen{agent::CopyTrust::kSpeculated, 1500, {{.device = 1, .bytes = 64u << 20, .slots = 32}}};

// True when every write end of the pipe whose read end is `r` is closed.
bool write_ends_closed(int r) {
  struct pollfd p {r, POLLIN, 0};
  if (::poll(&p, 1, 1000) != 1) return false;
  char c;
  return ::read(r, &c, 1) == 0;
}

}  // namespace

TEST_CASE("agent: open copy window while the gate is open is refused with EBUSY", "[agent][copy_window]") {
  RunningAgent a;
  auto c = a.client();
  auto opened = c.open_copy_window(kOpen, {});
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().code == EBUSY);
  CHECK_THAT(opened.error().message, Catch::Contains("open copy window needs a quiesced process"));
  CHECK(a.gate.is_open());
  CHECK(c.status().ok());  // the session goes on
}

TEST_CASE("agent: open copy window while the gate is open does not reach the backend", "[agent][copy_window]") {
  CopyWindowAgent a;
  auto c = a.client();
  UniqueFd table = memfd_with("table");
  std::vector<int> fds{table.get()};
  auto opened = c.open_copy_window(kOpen, fds);
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().code == EBUSY);
  CHECK(a.backend.open_calls == 0);
}

TEST_CASE("agent: the fds of a refused open copy window are closed", "[agent][copy_window][fds]") {
  RunningAgent a;
  auto c = a.client();
  int p[2];
  REQUIRE(::pipe(p) == 0);
  auto opened = c.open_copy_window(kOpen, std::vector<int>{p[1]});
  ::close(p[1]);
  REQUIRE_FALSE(opened.ok());
  CHECK(write_ends_closed(p[0]));  // the agent kept no copy
  ::close(p[0]);
}

TEST_CASE("agent: open copy window on a backend without one answers ENOTSUP", "[agent][copy_window]") {
  RunningAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  auto opened = c.open_copy_window(kOpen, {});
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().code == ENOTSUP);
  CHECK_THAT(opened.error().message,
             Catch::Contains("open copy window") && Catch::Contains("this process has no copy window"));
  CHECK(c.status().ok());
  CHECK(c.resume().ok());
}

TEST_CASE("agent: a backend without a copy window closes the fds sent to open one", "[agent][copy_window][fds]") {
  RunningAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  int p[2];
  REQUIRE(::pipe(p) == 0);
  auto opened = c.open_copy_window(kOpen, std::vector<int>{p[1]});
  ::close(p[1]);
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().code == ENOTSUP);
  CHECK(write_ends_closed(p[0]));
  ::close(p[0]);
  CHECK(c.resume().ok());
}

TEST_CASE("agent: close copy window on a backend without one answers ENOTSUP", "[agent][copy_window]") {
  RunningAgent a;
  auto c = a.client();
  auto closed = c.close_copy_window();
  REQUIRE_FALSE(closed.ok());
  CHECK(closed.error().code == ENOTSUP);
  CHECK_THAT(closed.error().message, Catch::Contains("this process has no copy window"));
  CHECK(c.status().ok());
}

TEST_CASE("agent: open copy window hands the backend every fd sent with it", "[agent][copy_window][fds]") {
  CopyWindowAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  UniqueFd table = memfd_with("table"), pool = memfd_with("pool");
  std::vector<int> fds{table.get(), pool.get()};
  auto opened = c.open_copy_window(kOpen, fds);
  REQUIRE(opened.ok());
  CHECK(a.backend.open_calls == 1);
  CHECK(a.backend.fd_count == 2);
  // The same files, in the order sent.
  CHECK(a.backend.markers == std::vector<std::string>{"table", "pool"});
  CHECK(c.resume().ok());
}

TEST_CASE("agent: open copy window with no fds reaches the backend with none", "[agent][copy_window][fds]") {
  CopyWindowAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  REQUIRE(c.open_copy_window(kOpen, {}).ok());
  CHECK(a.backend.open_calls == 1);
  CHECK(a.backend.fd_count == 0);
}

TEST_CASE("agent: open copy window hands the backend the request as sent", "[agent][copy_window]") {
  CopyWindowAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  REQUIRE(c.open_copy_window(kOpen, {}).ok());
  CHECK(a.backend.opened_with == kOpen);
  CHECK(a.backend.opened_with.trust == agent::CopyTrust::kSpeculated);
  CHECK(a.backend.opened_with.pools == kOpen.pools);
}

TEST_CASE("agent: open copy window returns the backend's reply", "[agent][copy_window]") {
  CopyWindowAgent a;
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  a.backend.validating_window = true;
  auto on = c.open_copy_window(kOpen, {});
  REQUIRE(on.ok());
  CHECK(on->validating);
  a.backend.validating_window = false;
  auto off = c.open_copy_window(kOpen, {});
  REQUIRE(off.ok());
  CHECK_FALSE(off->validating);
}

TEST_CASE("agent: a backend that fails to open the window yields its errno and message", "[agent][copy_window]") {
  CopyWindowAgent a;
  a.backend.open_error = "the table is not a copy-state table";
  auto c = a.client();
  REQUIRE(c.quiesce(1000).ok());
  auto opened = c.open_copy_window(kOpen, {});
  REQUIRE_FALSE(opened.ok());
  CHECK(opened.error().code == EINVAL);
  CHECK_THAT(opened.error().message,
             Catch::Contains("open copy window: ") && Catch::Contains("the table is not a copy-state table"));
  CHECK(c.status().ok());
}

TEST_CASE("agent: close copy window returns the backend's figures, gate open or not", "[agent][copy_window]") {
  CopyWindowAgent a;
  a.backend.close_reply = {.counters = {.calls_checked = 12, .calls_waited = 4, .unknown_waits = 1, .wait_ns = 5000000},
                           .chunks_saved = 3,
                           .violations = 2,
                           .violation = "kernel k wrote 0x7f0000001000",
                           .aborted = true,
                           .abort_reason = "chunk 7 timed out",
                           .speculated_kernels = {{"k", 9}},
                           .speculated_kernel_count = 1,
                           .unmarked_calls = 0,
                           .suspects = {{"k", 2}},
                           .longest_waits = {{"kernel launch", "k", 7000000, 3, 1}},
                           .most_saved = {{"kernel launch", "k", 7000000, 3, 1}}};
  auto c = a.client();
  // The engine closes the window while the process runs again.
  REQUIRE(a.gate.is_open());
  auto closed = c.close_copy_window();
  REQUIRE(closed.ok());
  CHECK(*closed == a.backend.close_reply);
  CHECK(a.backend.close_calls == 1);
  REQUIRE(c.quiesce(1000).ok());
  REQUIRE(c.close_copy_window().ok());
  CHECK(a.backend.close_calls == 2);
  CHECK(c.resume().ok());
}

TEST_CASE("agent: a close that says a copy missed a write is remembered in the status for good",
          "[agent][copy_window][checksum]") {
  CopyWindowAgent a;
  auto c = a.client();
  auto before = c.status();
  REQUIRE(before.ok());
  CHECK_FALSE(before->cow_missed);
  REQUIRE(c.close_copy_window().ok());
  CHECK_FALSE(c.status()->cow_missed);  // a close that found nothing changes nothing
  REQUIRE(c.close_copy_window(/*missed=*/true, {{0x7f0000400000, 4u << 20}}).ok());
  CHECK(c.status()->cow_missed);
  // The backend gets the missed chunks, to name the launches that could
  // have written them.
  REQUIRE(a.backend.closed_with.size() == 1);
  CHECK(a.backend.closed_with[0].address == 0x7f0000400000);
  CHECK(a.backend.closed_with[0].bytes == 4u << 20);
  REQUIRE(c.close_copy_window().ok());
  CHECK(c.status()->cow_missed);  // sticky: a later clean close does not clear it
}

// --- an untrusted agent: what it lists is checked before a dump uses it ---

namespace {

using phos::plugin::check_allocations;
using phos::plugin::check_memory_fd;

agent::Allocation alloc(uint64_t id, uint64_t address, uint64_t size) { return {id, 0, address, size, 0}; }

// A backend whose allocations and exported fds are whatever the case sets.
class HostileBackend : public FakeBackend {
 public:
  explicit HostileBackend(size_t n) : FakeBackend(n) {}
  std::vector<agent::Allocation> allocations() override { return listed.empty() ? FakeBackend::allocations() : listed; }
  Result<UniqueFd> export_allocation(uint64_t id) override {
    if (!export_fd) return FakeBackend::export_allocation(id);
    return export_fd();
  }
  std::vector<agent::Allocation> listed;
  std::function<Result<UniqueFd>()> export_fd;
};

std::string list_error(BasicRunningAgent<HostileBackend>& a) {
  auto c = a.client();
  std::vector<UniqueFd> fds;
  auto r = c.list_allocations(true, &fds);
  if (r.ok()) return "";
  CHECK(fds.empty());  // nothing handed on from a refused list
  return r.error().message;
}

}  // namespace

TEST_CASE("agent list: well-formed allocations pass the checks", "[agent][hostile]") {
  CHECK(check_allocations({alloc(1, 0x7f0000000000, 2 << 20), alloc(2, 0x7f0000200000, 4 << 20)}).ok());
  CHECK(check_allocations({}).ok());
}

TEST_CASE("agent list: each malformed allocation is refused, naming it", "[agent][hostile]") {
  struct Case {
    const char* what;
    std::vector<agent::Allocation> list;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"empty", {alloc(1, 0x7f0000000000, 0)}, "empty"},
      {"beyond any GPU", {alloc(1, 0x7f0000000000, 1ull << 41)}, "larger than any GPU"},
      {"unaligned address", {alloc(1, 0x7f0000000010, 2 << 20)}, "not page-aligned"},
      {"unaligned size", {alloc(1, 0x7f0000000000, (2 << 20) + 1)}, "not page-aligned"},
      {"null", {alloc(1, 0, 2 << 20)}, "not page-aligned"},
      {"kernel addresses", {alloc(1, 0xffff800000000000ull, 2 << 20)}, "outside the process's address space"},
      {"wrapping", {alloc(1, (1ull << 57) - 4096, 8192)}, "outside the process's address space"},
      {"overlapping", {alloc(1, 0x7f0000000000, 4 << 20), alloc(2, 0x7f0000200000, 2 << 20)}, "overlaps allocation 1"},
      {"an id twice", {alloc(1, 0x7f0000000000, 2 << 20), alloc(1, 0x7f0000400000, 2 << 20)}, "listed twice"},
      {"device beyond any", {{1, 5000, 0x7f0000000000, 2 << 20, 0}}, "on device 5000"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    auto r = check_allocations(c.list);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find(c.says) != std::string::npos);
    CHECK(r.error().message.find("allocation ") != std::string::npos);
  }
}

TEST_CASE("agent list: an fd that is not device memory is refused, naming what it is", "[agent][hostile]") {
  const agent::Allocation a = alloc(7, 0x7f0000000000, 2 << 20);
  UniqueFd mem(::open("/proc/self/mem", O_RDONLY | O_CLOEXEC));
  REQUIRE(mem.valid());
  CHECK(check_memory_fd(mem.get(), a).error().message.find("a regular file as the memory of allocation 7") !=
        std::string::npos);
  UniqueFd dir(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  CHECK(check_memory_fd(dir.get(), a).error().message.find("a directory") != std::string::npos);
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  UniqueFd s0(sv[0]), s1(sv[1]);
  CHECK(check_memory_fd(s0.get(), a).error().message.find("a socket") != std::string::npos);
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  UniqueFd p0(p[0]), p1(p[1]);
  CHECK(check_memory_fd(p0.get(), a).error().message.find("a pipe") != std::string::npos);
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // a character device, as the driver's files are
  CHECK(check_memory_fd(null.get(), a).ok());
  UniqueFd memfd(::memfd_create("stand-in", MFD_CLOEXEC));  // what the fake drivers export
  CHECK(check_memory_fd(memfd.get(), a).ok());
}

TEST_CASE("agent list: a dump's listing refuses overlapping allocations from the agent", "[agent][hostile]") {
  BasicRunningAgent<HostileBackend> a(0);
  a.backend.listed = {alloc(1, 0x7f0000000000, 4 << 20), alloc(2, 0x7f0000200000, 2 << 20)};
  CHECK(list_error(a).find("overlaps allocation 1") != std::string::npos);
}

TEST_CASE("agent list: a dump's listing refuses /proc/self/mem, a directory or a socket as memory",
          "[agent][hostile]") {
  struct Case {
    const char* what;
    std::function<Result<UniqueFd>()> fd;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"/proc/self/mem", [] { return Result<UniqueFd>(UniqueFd(::open("/proc/self/mem", O_RDONLY | O_CLOEXEC))); },
       "a regular file"},
      {"a directory", [] { return Result<UniqueFd>(UniqueFd(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC))); },
       "a directory"},
      {"a socket", [] { return Result<UniqueFd>(UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0))); },
       "a socket"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    BasicRunningAgent<HostileBackend> a(2);
    a.backend.export_fd = c.fd;
    CHECK(list_error(a).find(c.says) != std::string::npos);
  }
}

// --- an agent that is not phos's: raw replies from a listener of our own ---

namespace {

// Listens as an agent would (the same abstract name prefix), greets the
// client properly, then answers its next request with `misbehave`.
struct RawAgent {
  UniqueFd listener;
  std::thread server;
  explicit RawAgent(std::function<void(int conn)> misbehave) {
    listener.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    struct sockaddr_un addr;
    socklen_t len = wire::abstract_socket_address(std::string(agent::kSocketPrefix) + "raw." +
                                                      std::to_string(::getpid()), addr);
    REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0);
    REQUIRE(::listen(listener.get(), 1) == 0);
    server = std::thread([this, misbehave] {
      UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn.valid()) return;
      auto hello = agent::recv_request(conn.get(), 2000);
      if (!hello) return;
      (void)agent::send_reply(conn.get(), agent::HelloReply{agent::kProtocolVersion, "raw", ::getpid(), 0, ::getuid()});
      if (!agent::recv_request(conn.get(), 2000)) return;
      misbehave(conn.get());
      // Keep the connection until the client gives up.
      char b;
      (void)::recv(conn.get(), &b, 1, 0);
    });
  }
  ~RawAgent() {
    ::shutdown(listener.get(), SHUT_RDWR);
    if (server.joinable()) server.join();
  }
};

Result<std::vector<agent::Allocation>> list_from(RawAgent&, int timeout_ms = 300) {
  auto c = AgentClient::connect(::getpid(), timeout_ms);
  if (!c) return c.error();
  std::vector<UniqueFd> fds;
  return c->list_allocations(true, &fds);
}

}  // namespace

TEST_CASE("agent list: a count beyond any dump is refused before a page is kept", "[agent][hostile]") {
  RawAgent raw([](int conn) {
    agent::ListAllocationsReply r;
    r.allocations = {alloc(1, 0x7f0000000000, 2 << 20)};
    r.total_count = 1ull << 40;
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    int fds[] = {fd.get()};
    (void)agent::send_reply(conn, r, fds);
  });
  auto r = list_from(raw);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("more than the") != std::string::npos);
}

TEST_CASE("agent list: more allocations in a page than asked for are refused", "[agent][hostile]") {
  RawAgent raw([](int conn) {
    agent::ListAllocationsReply r;
    for (uint64_t i = 0; i < 300; i++) r.allocations.push_back(alloc(i + 1, 0x7f0000000000 + (i << 21), 2 << 20));
    r.total_count = 300;
    (void)agent::send_reply(conn, r);
  });
  auto r = list_from(raw);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("in a page of at most 253") != std::string::npos);
}

TEST_CASE("agent list: a reply that never comes ends in the client's timeout", "[agent][hostile]") {
  RawAgent raw([](int) {});
  auto t0 = std::chrono::steady_clock::now();
  auto r = list_from(raw, 300);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("agent list: a reply that never ends ends in the client's timeout", "[agent][hostile]") {
  RawAgent raw([](int conn) {
    // A well-formed header announcing 1 MiB, of which 10 bytes come.
    std::byte header[8];
    bytes::put_u32(header, wire::kFrameMagic);
    bytes::put_u32(header + 4, 1u << 20);
    (void)::send(conn, header, sizeof(header), MSG_NOSIGNAL);
    (void)::send(conn, "0123456789", 10, MSG_NOSIGNAL);
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = list_from(raw, 300);
  REQUIRE_FALSE(r.ok());
  INFO(r.error().message);
  CHECK(r.error().code == ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

// --- iteration boundaries (step_boundary.h): a checkpoint lands on one ---

namespace {

// A program's loop: at a boundary (step), then an iteration that is not a
// CUDA call (the gate does not stop it) of `work`.
struct SteppingProgram {
  StepBoundary& steps;
  Gate& gate;
  std::atomic<bool> in_iteration{false}, stop{false};
  std::atomic<uint64_t> iterations{0};
  std::thread thread;
  SteppingProgram(StepBoundary& s, Gate& g, std::chrono::milliseconds work) : steps(s), gate(g) {
    thread = std::thread([this, work] {
      while (!stop) {
        steps.step(gate);
        in_iteration = true;
        std::this_thread::sleep_for(work);
        in_iteration = false;
        iterations++;
      }
    });
  }
  ~SteppingProgram() {
    stop = true;
    thread.join();
  }
};

AgentOptions with_steps(StepBoundary& s, int wait_ms) {
  AgentOptions o;
  o.steps = &s;
  o.step_wait_ms = wait_ms;
  return o;
}

}  // namespace

TEST_CASE("agent steps: a quiesce closes the gate at the program's next boundary, and holds it there",
          "[agent][steps]") {
  StepBoundary steps;
  RunningAgent a(0, with_steps(steps, 2000));
  SteppingProgram program(steps, a.gate, 30ms);
  while (program.iterations < 3) std::this_thread::sleep_for(1ms);
  auto c = a.client();
  auto q = c.quiesce(1000);
  REQUIRE(q.ok());
  CHECK(q->at_step);
  // Held at the boundary: no iteration runs while the gate is closed.
  const uint64_t at = program.iterations;
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(program.in_iteration);
  CHECK(program.iterations == at);
  REQUIRE(c.resume().ok());
  while (program.iterations < at + 2) std::this_thread::sleep_for(1ms);
  auto status = c.status();
  REQUIRE(status.ok());
  bool counted = false;
  for (const auto& [name, value] : status->counters) counted = counted || (name == "steps" && value >= at + 2);
  CHECK(counted);
}

TEST_CASE("agent steps: a program that stops stepping delays a quiesce by the bound only", "[agent][steps]") {
  StepBoundary steps;
  RunningAgent a(0, with_steps(steps, 150));
  steps.step(a.gate);  // it marked boundaries once, then none
  auto c = a.client();
  auto t0 = std::chrono::steady_clock::now();
  auto q = c.quiesce(1000);
  auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE(q.ok());
  CHECK_FALSE(q->at_step);
  CHECK(waited >= 140ms);
  CHECK(waited < 2s);
  REQUIRE(c.resume().ok());
}

TEST_CASE("agent steps: a program idle at a boundary, or one that never steps, is closed at once",
          "[agent][steps]") {
  SECTION("idle") {
    StepBoundary steps;
    RunningAgent a(0, with_steps(steps, 5000));
    steps.step(a.gate);
    steps.set_idle(true);
    auto c = a.client();
    auto t0 = std::chrono::steady_clock::now();
    auto q = c.quiesce(1000);
    REQUIRE(q.ok());
    CHECK(q->at_step);
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    REQUIRE(c.resume().ok());
  }
  SECTION("never steps") {
    StepBoundary steps;
    RunningAgent a(0, with_steps(steps, 5000));
    auto c = a.client();
    auto t0 = std::chrono::steady_clock::now();
    auto q = c.quiesce(1000);
    REQUIRE(q.ok());
    CHECK_FALSE(q->at_step);
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    REQUIRE(c.resume().ok());
  }
}

// --- dead memory (dead_ranges.h): free blocks handed at the boundary a
// checkpoint closes at, and at no other ---

namespace {

const std::vector<dead::Range> kFree{{0x7f0000400000ull, 4u << 20}, {0x7f0000000000ull, 1u << 20}};

// A program that, as the SDK's step() does, takes its free blocks only
// where a checkpoint waits (pending), and hands them with that step;
// `fresh` false: it hands none (they would be stale).
struct FreeingProgram {
  StepBoundary& steps;
  Gate& gate;
  std::atomic<bool> fresh{true}, stop{false};
  std::atomic<uint64_t> iterations{0};
  std::thread thread;
  FreeingProgram(StepBoundary& s, Gate& g) : steps(s), gate(g) {
    thread = std::thread([this] {
      while (!stop) {
        if (steps.pending(gate) && fresh)
          steps.step(gate, kFree);
        else
          steps.step(gate);
        std::this_thread::sleep_for(5ms);
        iterations++;
      }
    });
  }
  ~FreeingProgram() {
    stop = true;
    thread.join();
  }
};

// A program's thread that runs `iteration`, then 5 ms of work, until it ends.
struct Looping {
  std::atomic<bool> stop{false};
  std::thread thread;
  explicit Looping(std::function<void()> iteration) {
    thread = std::thread([this, iteration] {
      while (!stop) {
        iteration();
        std::this_thread::sleep_for(5ms);
      }
    });
  }
  ~Looping() {
    stop = true;
    thread.join();
  }
};

// A quiesce that closes at a step, and the free blocks it came with.
std::vector<dead::Range> quiesced_free_blocks(RunningAgent& a, const StepBoundary& steps) {
  // A program that has not stepped yet has no boundary to close at (on a
  // loaded machine its thread may not have run by now).
  while (!steps.used()) std::this_thread::sleep_for(1ms);
  auto c = a.client();
  auto q = c.quiesce(1000);
  REQUIRE(q.ok());
  CHECK(q->at_step);
  REQUIRE(c.resume().ok());
  return q->dead;
}

}  // namespace

TEST_CASE("agent steps: the free blocks handed at the boundary the gate closes at come with the quiesce",
          "[agent][steps][dead]") {
  StepBoundary steps;
  RunningAgent a(0, with_steps(steps, 2000));
  FreeingProgram program(steps, a.gate);
  while (program.iterations < 3) std::this_thread::sleep_for(1ms);
  auto c = a.client();
  auto q = c.quiesce(1000);
  REQUIRE(q.ok());
  CHECK(q->at_step);
  CHECK(q->dead == dead::normalized(kFree));
  CHECK(q->dead_dropped_calls == 0);
  REQUIRE(c.resume().ok());
  // The next closing lands on a step that hands none: the earlier list is
  // stale and does not come again.
  program.fresh = false;
  const uint64_t at = program.iterations;
  while (program.iterations < at + 3) std::this_thread::sleep_for(1ms);
  q = c.quiesce(1000);
  REQUIRE(q.ok());
  CHECK(q->at_step);
  CHECK(q->dead.empty());
  REQUIRE(c.resume().ok());
}

TEST_CASE("agent steps: free blocks handed without a pending checkpoint are not kept for a later one",
          "[agent][steps][dead]") {
  StepBoundary steps;
  RunningAgent a(0, with_steps(steps, 2000));
  // Handed at a step no checkpoint waited for, then plain steps.
  steps.step(a.gate, kFree);
  Looping program([&] { steps.step(a.gate); });
  CHECK(quiesced_free_blocks(a, steps).empty());
}

TEST_CASE("agent steps: free blocks taken before the pending check are dropped", "[agent][steps][dead]") {
  // A program that takes its free blocks, then steps with them, without
  // asking pending() first: nothing says no one used them meanwhile.
  StepBoundary steps;
  RunningAgent a(0, with_steps(steps, 2000));
  Looping program([&] { steps.step(a.gate, kFree); });
  CHECK(quiesced_free_blocks(a, steps).empty());
}

TEST_CASE("agent steps: another thread's CUDA call before the gate closes drops the free blocks",
          "[agent][steps][dead]") {
  StepBoundary steps;
  RunningAgent a(0, with_steps(steps, 2000));
  // A second thread of the program that keeps making calls: it could take a
  // free block from the allocator and write it before the gate closes.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  std::thread other([&] {
    while (!stop) {
      { GatePass pass(a.gate); }
      calls++;
      std::this_thread::yield();
    }
  });
  // The program asks pending(), then hands its free blocks only once the
  // other thread has made a call in between (not left to the scheduler: on
  // a loaded machine that thread may not run in so short a gap).
  std::atomic<uint64_t> iterations{0};
  Looping program([&] {
    if (steps.pending(a.gate)) {
      const uint64_t seen = calls;
      while (calls == seen && !stop) std::this_thread::sleep_for(100us);
      steps.step(a.gate, kFree);
    } else {
      steps.step(a.gate);
    }
    iterations++;
  });
  while (iterations < 3) std::this_thread::sleep_for(1ms);
  auto c = a.client();
  auto q = c.quiesce(1000);
  REQUIRE(q.ok());
  CHECK(q->at_step);
  CHECK(q->dead.empty());
  CHECK(q->dead_dropped_calls > 0);
  REQUIRE(c.resume().ok());
  stop = true;
  other.join();
}
