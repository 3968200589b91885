#include "phos/plugin/agent_client.h"
#include "phos/plugin/job_env.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <variant>

#include "phos/plugin/proc.h"

namespace phos::plugin {
namespace {

// A socket created in the network namespace of `pid` (abstract unix names are
// per network namespace), connected to `name`.
Result<UniqueFd> connect_in_netns(pid_t pid, const std::string& name) {
  std::string target_ns = "/proc/" + std::to_string(pid) + "/ns/net";
  struct stat self_st {}, target_st {};
  if (::stat("/proc/self/ns/net", &self_st) != 0) return errno_error("stat /proc/self/ns/net");
  if (::stat(target_ns.c_str(), &target_st) != 0) return errno_error("stat " + target_ns);
  bool switch_ns = self_st.st_ino != target_st.st_ino || self_st.st_dev != target_st.st_dev;

  UniqueFd self_fd, target_fd;
  if (switch_ns) {
    self_fd.reset(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    target_fd.reset(::open(target_ns.c_str(), O_RDONLY | O_CLOEXEC));
    if (!self_fd.valid() || !target_fd.valid()) return errno_error("open network namespace of " + std::to_string(pid));
    if (::setns(target_fd.get(), CLONE_NEWNET) != 0)
      return errno_error("enter network namespace of " + std::to_string(pid));
  }
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int socket_errno = errno;
  if (switch_ns && ::setns(self_fd.get(), CLONE_NEWNET) != 0)
    return errno_error("return to criu's network namespace");
  if (!sock.valid()) return errno_error("socket", socket_errno);

  struct sockaddr_un addr;
  socklen_t len = wire::abstract_socket_address(name, addr);
  if (len == 0) return make_error("agent socket name '" + name + "' is not a valid abstract name");
  if (::connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), len) != 0)
    return errno_error("connect to agent @" + name + " of process " + std::to_string(pid));
  return sock;
}

}  // namespace

Result<AgentClient> AgentClient::connect(pid_t pid, int timeout_ms, Watch watch) {
  auto name = find_listening_socket(pid, agent::kSocketPrefix);
  if (!name) return name.error();
  if (!name->has_value()) return make_error("process " + std::to_string(pid) + " has no phos agent", ENOENT);
  auto sock = connect_in_netns(pid, **name);
  if (!sock) return sock.error();
  AgentClient client(std::move(*sock), timeout_ms, std::move(watch));
  auto hello = client.call<agent::HelloReply>(
      agent::Hello{.protocol_version = agent::kProtocolVersion, .client_version = PHOS_VERSION});
  if (!hello) return hello.error();
  client.hello_ = std::move(*hello);
  return client;
}

Result<void> AgentClient::wait_readable(const agent::Request& request, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += kWatchStepMs) {
    struct pollfd p {sock_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, kWatchStepMs);
    if (r < 0 && errno != EINTR) return errno_error("poll the agent's socket");
    if (r > 0) return {};
    if (auto why = watch_(kWatchStepMs))
      return make_error("agent: no answer to " + std::string(agent::kind_name(request)) + " can come: " + *why,
                        EDEADLK);
  }
  return {};  // recv_reply says it timed out
}

template <class R>
Result<R> AgentClient::call(const agent::Request& request, std::span<const int> fds,
                            std::vector<UniqueFd>* reply_fds, int longer_ms) {
  PHOS_TRY(agent::send_request(sock_.get(), request, fds));
  if (watch_) PHOS_TRY(wait_readable(request, timeout_ms_ + longer_ms));
  auto received = agent::recv_reply(sock_.get(), timeout_ms_ + longer_ms);
  if (!received)
    return make_error("agent: " + std::string(agent::kind_name(request)) + ": " + received.error().message,
                      received.error().code);
  if (const auto* e = std::get_if<Error>(&received->reply)) return make_error("agent: " + e->message, e->code);
  R* reply = std::get_if<R>(&received->reply);
  if (!reply)
    return make_error("agent answered " + std::string(agent::kind_name(request)) + " with a " +
                          std::string(agent::kind_name(received->reply)) + " reply",
                      EPROTO);
  if (reply_fds) *reply_fds = std::move(received->fds);
  return std::move(*reply);
}

Result<agent::OpenCopyWindowReply> AgentClient::open_copy_window(const agent::OpenCopyWindowRequest& q,
                                                                 std::span<const int> fds) {
  return call<agent::OpenCopyWindowReply>(q, fds);
}

Result<agent::CloseCopyWindowReply> AgentClient::close_copy_window(bool missed,
                                                                   std::vector<agent::AddressRange> missed_chunks) {
  return call<agent::CloseCopyWindowReply>(
      agent::CloseCopyWindowRequest{.missed = missed, .missed_chunks = std::move(missed_chunks)});
}

uint64_t nccl_nonce() {
  static const uint64_t nonce = [] {
    // One host's criu of a job across hosts: the job-wide run.
    if (const auto& job = job_run_of_process(); job && *job) return (*job)->run;
    uint64_t n = 0;
    while (::getrandom(&n, sizeof(n), 0) != ssize_t(sizeof(n)) || n == 0) {
    }
    return n;
  }();
  return nonce;
}

Result<bool> AgentClient::nccl_stop(uint64_t job_id, std::optional<uint64_t> at_call,
                                    std::optional<uint32_t> lease_ms) {
  auto reply = call<agent::NcclStopReply>(agent::NcclStopRequest{
      .job_id = job_id, .at_call = at_call, .pend_release = std::nullopt, .lease_ms = at_call ? lease_ms : std::nullopt});
  if (!reply) return reply.error();
  return reply->armed;
}

Result<void> AgentClient::nccl_pend_release(uint64_t job_id, bool pend) {
  auto reply = call<agent::NcclStopReply>(
      agent::NcclStopRequest{.job_id = job_id, .at_call = std::nullopt, .pend_release = pend,
                             .lease_ms = std::nullopt});
  if (!reply) return reply.error();
  if (!reply->armed) return make_error(pend ? "the NCCL calls still running did not end" : "not pending", EBUSY);
  return {};
}

Result<agent::StatusReply> AgentClient::status() { return call<agent::StatusReply>(agent::StatusRequest{}); }

Result<agent::SpeculateReply> AgentClient::speculate_request(bool on, std::optional<bool> validate) {
  auto reply = call<agent::SpeculateReply>(agent::SpeculateRequest{.on = on, .validate = validate});
  if (!reply && reply.error().code == EPROTO)  // an agent older than the request does not know its kind
    return make_error(reply.error().message + " (the agent predates speculation)", EPROTO);
  return reply;
}

Result<void> AgentClient::set_speculation(bool on) {
  auto reply = speculate_request(on, std::nullopt);
  if (!reply) return reply.error();
  return {};
}

Result<bool> AgentClient::set_validation(bool on) {
  auto reply = speculate_request(true, on);
  if (!reply) return reply.error();
  // An agent from before validation reads the request as "speculation on".
  if (!reply->validating) return make_error("the agent predates validation (it turned speculation on only)", EPROTO);
  return reply->sass_attached;
}

// The agent may spend the whole quiesce timeout (an NCCL release, then the
// gate) before it answers: the reply is waited for that much longer.
Result<agent::QuiesceReply> AgentClient::quiesce(uint32_t timeout_ms) {
  return call<agent::QuiesceReply>(agent::QuiesceRequest{timeout_ms}, {}, nullptr,
                                   int(std::min<uint32_t>(timeout_ms, INT32_MAX / 2)));
}

Result<void> check_allocations(const std::vector<agent::Allocation>& allocs) {
  auto bad = [](const agent::Allocation& a, const std::string& what) {
    char where[96];
    std::snprintf(where, sizeof(where), "allocation %llu (0x%llx, %llu bytes)", (unsigned long long)a.id,
                  (unsigned long long)a.address, (unsigned long long)a.size);
    return make_error("agent listed " + std::string(where) + ": " + what, EPROTO);
  };
  std::vector<const agent::Allocation*> by_address;
  std::set<uint64_t> ids;
  for (const auto& a : allocs) {
    if (a.size == 0) return bad(a, "empty");
    if (a.size > kMaxAllocationBytes) return bad(a, "larger than any GPU");
    if (a.address == 0 || a.address % kPageBytes || a.size % kPageBytes) return bad(a, "not page-aligned");
    if (a.address > kUserAddressEnd || a.size > kUserAddressEnd - a.address)
      return bad(a, "outside the process's address space");
    if (a.device >= kMaxDevices) return bad(a, "on device " + std::to_string(a.device));
    if (!ids.insert(a.id).second) return bad(a, "its id listed twice");
    by_address.push_back(&a);
  }
  std::sort(by_address.begin(), by_address.end(), [](auto* x, auto* y) { return x->address < y->address; });
  for (size_t i = 1; i < by_address.size(); i++)
    if (by_address[i - 1]->address + by_address[i - 1]->size > by_address[i]->address)
      return bad(*by_address[i], "overlaps allocation " + std::to_string(by_address[i - 1]->id));
  return {};
}

Result<void> check_memory_fd(int fd, const agent::Allocation& a) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_error("fstat the fd of allocation " + std::to_string(a.id));
  // Exported device memory is a driver file (a character device or an
  // anonymous inode): never a file, directory, socket or pipe to read. A
  // memfd (it takes seals; no other file does) is anonymous memory: the
  // tests' fake drivers export those, and the real driver refuses to import
  // one, so it is let through to that refusal.
  const bool memfd = S_ISREG(st.st_mode) && ::fcntl(fd, F_GET_SEALS) >= 0;
  const char* kind = S_ISREG(st.st_mode) && !memfd ? "a regular file"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISFIFO(st.st_mode) ? "a pipe"
                     : S_ISLNK(st.st_mode)  ? "a link"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                                            : nullptr;
  if (kind)
    return make_error("agent sent " + std::string(kind) + " as the memory of allocation " + std::to_string(a.id) +
                          ", not exported device memory",
                      EPROTO);
  return {};
}

Result<std::vector<agent::Allocation>> AgentClient::list_allocations(bool with_fds, std::vector<UniqueFd>* fds) {
  std::vector<agent::Allocation> out;
  std::vector<UniqueFd> got;
  const uint32_t page_max = uint32_t(wire::kMaxFdsPerFrame);
  for (;;) {
    std::vector<UniqueFd> page_fds;
    auto reply = call<agent::ListAllocationsReply>(
        agent::ListAllocationsRequest{.first_index = out.size(), .max_count = page_max, .with_fds = with_fds}, {},
        &page_fds);
    if (!reply) return reply.error();
    const auto& page = reply->allocations;
    // An agent is not trusted (it runs in the process being dumped): its
    // counts are bounded before anything is kept.
    if (reply->total_count > kMaxAllocations)
      return make_error("agent says it has " + std::to_string(reply->total_count) + " allocations, more than the " +
                            std::to_string(kMaxAllocations) + " a dump takes",
                        EPROTO);
    if (page.size() > page_max || out.size() + page.size() > reply->total_count)
      return make_error("agent sent " + std::to_string(page.size()) + " allocations in a page of at most " +
                            std::to_string(page_max) + ", " + std::to_string(out.size()) + " of " +
                            std::to_string(reply->total_count) + " listed before",
                        EPROTO);
    if (with_fds && page_fds.size() != page.size())
      return make_error("agent sent " + std::to_string(page_fds.size()) + " fds for " + std::to_string(page.size()) +
                            " allocations",
                        EPROTO);
    for (size_t i = 0; with_fds && i < page.size(); i++) PHOS_TRY(check_memory_fd(page_fds[i].get(), page[i]));
    out.insert(out.end(), page.begin(), page.end());
    for (auto& fd : page_fds) got.push_back(std::move(fd));
    if (out.size() >= reply->total_count || page.empty()) break;
  }
  PHOS_TRY(check_allocations(out));
  if (with_fds && fds)
    for (auto& fd : got) fds->push_back(std::move(fd));
  return out;
}

Result<uint64_t> AgentClient::release_mappings(bool release_handles) {
  auto reply = call<agent::ReleaseMappingsReply>(agent::ReleaseMappingsRequest{release_handles});
  if (!reply) return reply.error();
  return reply->released_bytes;
}

Result<uint64_t> AgentClient::remap(const std::vector<uint64_t>& ids, const std::vector<int>& fds) {
  auto reply = call<agent::RemapReply>(agent::RemapRequest{ids}, fds);
  if (!reply) return reply.error();
  return reply->mapped_bytes;
}

Result<uint64_t> AgentClient::remap_all(const std::vector<agent::Allocation>& allocs,
                                        const std::vector<UniqueFd>& fds) {
  if (allocs.empty()) return remap({}, {});
  if (fds.size() != allocs.size())
    return make_error(std::to_string(fds.size()) + " fds for " + std::to_string(allocs.size()) + " allocations");
  uint64_t mapped = 0;
  for (size_t at = 0; at < allocs.size(); at += wire::kMaxFdsPerFrame) {
    std::vector<uint64_t> ids;
    std::vector<int> raw;
    for (size_t i = at; i < std::min(allocs.size(), at + wire::kMaxFdsPerFrame); i++) {
      ids.push_back(allocs[i].id);
      raw.push_back(fds[i].get());
    }
    auto m = remap(ids, raw);
    if (!m) return m.error();
    mapped += *m;
  }
  return mapped;
}

Result<void> AgentClient::resume() { return resume(nccl_nonce()); }

Result<void> AgentClient::resume(uint64_t run) {
  auto reply = call<agent::ResumeReply>(agent::ResumeRequest{run});
  if (!reply) return reply.error();
  return {};
}

Result<void> AgentClient::goodbye() {
  auto reply = call<agent::GoodbyeReply>(agent::GoodbyeRequest{});
  if (!reply) return reply.error();
  auto eof = wire::recv_frame(sock_.get(), timeout_ms_);
  if (eof.ok()) return make_error("agent sent a frame after goodbye", EPROTO);
  if (eof.error().code != ENODATA) return eof.error();
  sock_.reset();
  return {};
}

}  // namespace phos::plugin

#include <unistd.h>

#include <memory>
#include <optional>

#include "common/stopped_thread.h"
#include "common/stuck_thread.h"

namespace phos::plugin {

namespace {
// How long the agent's thread may wait in a futex while the others are
// stopped: its own work on those paths takes no lock for longer than this.
constexpr int kStuckMs = 1000;
}  // namespace

Result<void> with_agent(pid_t pid, int timeout_ms, const std::function<Result<void>(AgentClient&)>& fn) {
  auto tid = find_thread(pid, agent::kThreadName);
  if (!tid) return tid.error();
  auto tracer = tracer_of(pid, *tid);
  if (!tracer) return tracer.error();
  std::optional<StoppedThreadRun> run;
  AgentClient::Watch watch;
  if (*tracer == ::getpid()) {
    auto started = StoppedThreadRun::start(*tid);
    if (!started) return started.error();
    run.emplace(std::move(*started));
    // The agent's thread alone runs: a wait of its in a futex is for a
    // stopped thread, and ends the exchange at once rather than at the
    // timeout, saying where each thread is.
    watch = [stuck = std::make_shared<StuckWatch>(pid, *tid, kStuckMs)](int step_ms) { return stuck->check(step_ms); };
  }
  auto client = AgentClient::connect(pid, timeout_ms, std::move(watch));
  if (!client) return client.error();
  PHOS_TRY(fn(*client));
  PHOS_TRY(client->goodbye());
  return run ? run->stop() : Result<void>();
}

}  // namespace phos::plugin
