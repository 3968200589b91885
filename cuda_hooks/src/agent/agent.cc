#include "phos/hooks/agent.h"
#include "phos/hooks/stderr_line.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <type_traits>
#include <variant>

#include "phos/images/agent_wire.h"
#include "phos/images/ipc_handle.h"
#include "phos/support/clock.h"

namespace phos::hooks {
namespace {

std::string make_socket_name() {
  uint64_t nonce = 0;
  if (::getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != sizeof(nonce))
    nonce = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  return agent::agent_socket_name(::getpid(), nonce);
}

// This process's agent's socket name, for the IPC handles it serves. A
// function's static: the agent starts from libphos.so's constructor, which
// may run before this file's globals are made.
std::mutex g_own_name_mu;  // constant-initialized
std::string& own_name() {
  static std::string name;
  return name;
}


// The connected process's pid (in our pid namespace), 0 where not known.
pid_t peer_pid(int conn) {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

}  // namespace

Agent::Agent(Gate& gate, AgentBackend& backend, AgentOptions options)
    : gate_(gate), backend_(backend), options_(options) {}

Agent::~Agent() { stop(); }

std::string own_agent_socket_name() {
  std::lock_guard<std::mutex> lock(g_own_name_mu);
  return own_name();
}

Result<void> Agent::start() {
  name_ = make_socket_name();
  {
    std::lock_guard<std::mutex> lock(g_own_name_mu);
    own_name() = name_;
  }
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return errno_error("agent: socket");
  struct sockaddr_un addr;
  socklen_t len = wire::abstract_socket_address(name_, addr);
  if (::bind(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), len) != 0)
    return errno_error("agent: bind @" + name_);
  if (::listen(sock.get(), 8) != 0) return errno_error("agent: listen");
  UniqueFd ev(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!ev.valid()) return errno_error("agent: eventfd");
  listen_fd_ = std::move(sock);
  stop_fd_ = std::move(ev);
  // Return only once the thread has its name and tid: the plugin finds the
  // agent thread by name, and may look right after the program starts.
  std::promise<void> named;
  std::future<void> ready = named.get_future();
  thread_ = std::thread([this, &named] { run(named); });
  ready.wait();
  return {};
}

void Agent::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  if (::write(stop_fd_.get(), &one, sizeof(one)) < 0) std::perror("phos: agent stop");
  int conn = conn_fd_.load();
  if (conn >= 0) ::shutdown(conn, SHUT_RDWR);
  thread_.join();
  listen_fd_.reset();
  stop_fd_.reset();
}

Result<void> Agent::restart_after_fork() {
  // The parent's thread does not exist here; its fds do, and must not leak
  // into a checkpoint of the child.
  if (thread_.joinable()) thread_.detach();
  int conn = conn_fd_.exchange(-1);
  if (conn >= 0) ::close(conn);
  listen_fd_.reset();
  stop_fd_.reset();
  tid_ = 0;
  lease_ = StopLease();  // the parent's stop and its holder are the parent's
  return start();
}

void Agent::run(std::promise<void>& named) {
  // Application signals go to application threads; this thread must also
  // not be interrupted while a checkpoint talks to it.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  prctl(PR_SET_NAME, agent::kThreadName);
  tid_ = ::gettid();
  named.set_value();

  for (;;) {
    struct pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    int r = ::poll(fds, 2, poll_timeout_ms());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents & POLLIN)) return;
    // Looked at after every wake: a process frozen past its lease (by a
    // checkpoint that failed before its quiesce) finds it run out here.
    lift_lapsed_stop();
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    if (!peer_allowed(conn.get())) continue;
    conn_fd_ = conn.get();
    serve(conn.get());
    conn_fd_ = -1;
  }
}

bool Agent::peer_allowed(int conn) {
  constexpr uid_t kUnknown = uid_t(-1);
  uid_t uid = kUnknown;
  if (wire::peer_trusted(conn, uid)) return true;
  if (uid == kUnknown) return false;  // no credentials: nothing to tell it
  std::string why = "permission denied: uid " + std::to_string(uid) +
                    " is neither root nor the owner of process " + std::to_string(::getpid());
  (void)agent::send_reply(conn, make_error(why, EPERM));
  return false;
}

void Agent::serve(int conn) {
  bool greeted = false;
  for (;;) {
    auto req = agent::recv_request(conn, options_.idle_timeout_ms);
    if (!req) {
      // EPROTO: tell the peer what was wrong before hanging up.
      if (req.error().code == EPROTO) (void)agent::send_reply(conn, req.error());
      return;
    }
    if (!handle(conn, *req, greeted)) return;
  }
}

bool Agent::handle(int conn, agent::ReceivedRequest& received, bool& greeted) {
  const bool hello = std::holds_alternative<agent::Hello>(received.request);
  if (!greeted && !hello) {
    (void)agent::send_reply(conn, make_error("the first request must be hello", EPROTO));
    return false;
  }
  Answer a = std::visit(
      [&](const auto& q) {
        using Q = std::decay_t<decltype(q)>;
        if constexpr (std::is_same_v<Q, agent::RemapRequest> || std::is_same_v<Q, agent::OpenCopyWindowRequest>)
          return answer(q, std::move(received.fds));
        else if constexpr (std::is_same_v<Q, agent::IpcOpenRequest> || std::is_same_v<Q, agent::IpcCloseRequest>)
          return answer(q, peer_pid(conn));
        else
          return answer(q);
      },
      received.request);
  greeted = greeted || (hello && !a.hang_up);
  std::vector<int> fds;
  for (const auto& fd : a.fds) fds.push_back(fd.get());
  auto sent = agent::send_reply(conn, a.reply, fds);
  return sent.ok() && !a.hang_up;
}

Agent::Answer Agent::failure(int code, const std::string& message) { return Answer(make_error(message, code)); }

Agent::Answer Agent::answer(const agent::Hello& q) {
  if (q.protocol_version != agent::kProtocolVersion)
    return {make_error("agent protocol " + std::to_string(q.protocol_version) + " not supported; this agent speaks " +
                           std::to_string(agent::kProtocolVersion),
                       EPROTONOSUPPORT),
            true};
  return {agent::HelloReply{.protocol_version = agent::kProtocolVersion,
                            .agent_version = PHOS_VERSION,
                            .pid = ::getpid(),
                            .agent_tid = tid_.load(),
                            .uid = ::getuid()}};
}

Agent::Answer Agent::answer(const agent::StatusRequest&) {
  agent::StatusReply s = backend_.status();
  s.gate_open = gate_.is_open();
  s.cow_missed = cow_missed_;
  if (options_.steps && options_.steps->used()) s.counters.push_back({"steps", options_.steps->steps()});
  return {std::move(s)};
}

Agent::Answer Agent::answer(const agent::ListAllocationsRequest& q) {
  auto all = backend_.allocations();
  uint64_t first = std::min<uint64_t>(q.first_index, all.size());
  uint64_t count = std::min({uint64_t(q.max_count), uint64_t(all.size() - first), uint64_t(wire::kMaxFdsPerFrame)});
  agent::ListAllocationsReply r;
  r.allocations.assign(all.begin() + first, all.begin() + first + count);
  r.total_count = all.size();
  std::vector<UniqueFd> fds;
  for (size_t i = 0; q.with_fds && i < r.allocations.size(); i++) {
    auto fd = backend_.export_allocation(r.allocations[i].id);
    if (!fd) return failure(fd.error().code, fd.error().message);
    fds.push_back(std::move(*fd));
  }
  Answer out(std::move(r));
  out.fds = std::move(fds);
  return out;
}

Agent::Answer Agent::answer(const agent::QuiesceRequest& q) {
  uint64_t t0 = monotonic_ns();
  auto timeout = std::chrono::milliseconds(q.timeout_ms);
  // A program that marks its iteration boundaries is closed at the next one
  // (bounded); it waits there until the gate opens again.
  StepBoundary* steps = options_.steps;
  const bool at_step = steps && steps->used() && steps->wait_next(std::chrono::milliseconds(options_.step_wait_ms));
  // NCCL's communicators go while the gate is still open: the calls on
  // them that run now need it to end.
  // One timeout for both: the gate gets what the release left of it.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nccl = backend_.nccl_release(timeout);
  if (!nccl) {
    if (at_step) steps->release();
    return failure(nccl.error().code, "NCCL: " + nccl.error().message + "; gate left open");
  }
  const auto left = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                               deadline - std::chrono::steady_clock::now()));
  const bool closed = gate_.close(left);
  // Taken while the program still waits in the step it handed them with:
  // they describe its memory at this closing, and at no later one.
  std::vector<dead::Range> dead = closed && at_step ? steps->dead_at_arrival() : std::vector<dead::Range>{};
  // Another thread's call since the program took them: it may have taken a
  // free block and written it (a caching allocator needs no CUDA call).
  const uint64_t other_calls = dead.empty() ? 0 : gate_.watched_calls();
  if (other_calls) dead.clear();
  if (at_step) steps->release();
  if (!closed)
    return failure(ETIMEDOUT, std::to_string(gate_.inside()) + " CUDA calls still running after " +
                                  std::to_string(q.timeout_ms) + " ms; gate reopened" + rebuilt_after_failure());
  if (auto d = backend_.drain(timeout); !d) {
    gate_.open();
    return failure(d.error().code, "drain: " + d.error().message + "; gate reopened" + rebuilt_after_failure());
  }
  // The checkpoint holds the stop from here on: the process may stay
  // frozen well past the lease, and is given back (or ended) by it.
  if (auto job = lease_.take_over())
    stderr_line("phos: the lease on the stop of NCCL communicator %016llx is taken over by a quiesce "
                "(a checkpoint holds it now)\n",
                static_cast<unsigned long long>(*job));
  agent::QuiesceReply reply{.drained_ns = monotonic_ns() - t0,
                            .at_step = at_step,
                            .touch_order = backend_.touch_order(),
                            .nccl_released = nccl->communicators,
                            .nccl_release_ns = nccl->ns,
                            .dead = std::move(dead),
                            .dead_dropped_calls = other_calls};
  return {std::move(reply)};
}

Agent::Answer Agent::answer(const agent::ReleaseMappingsRequest& q) {
  if (gate_.is_open()) return failure(EBUSY, "release mappings needs a quiesced process (gate is open)");
  auto released = backend_.release_mappings(q.release_handles);
  if (!released) return failure(released.error().code, released.error().message);
  return {agent::ReleaseMappingsReply{*released}};
}

Agent::Answer Agent::answer(const agent::RemapRequest& q, std::vector<UniqueFd> fds) {
  if (!fds.empty() && fds.size() != q.allocation_ids.size())
    return failure(EINVAL, "remap: " + std::to_string(fds.size()) + " fds for " +
                               std::to_string(q.allocation_ids.size()) + " allocations");
  auto mapped = backend_.remap(q.allocation_ids, std::move(fds));
  if (!mapped) return failure(mapped.error().code, mapped.error().message);
  return {agent::RemapReply{*mapped}};
}

// NCCL's communicators are made again once the gate is open (NCCL's
// threads call CUDA); the program's NCCL calls wait until then.
Agent::Answer Agent::answer(const agent::ResumeRequest& q) {
  backend_.gate_opening();
  gate_.open();
  if (auto made = backend_.nccl_rebuild(q.nccl_nonce); !made)
    return failure(made.error().code, "gate open, but NCCL: " + made.error().message);
  return {agent::ResumeReply{}};
}

// A quiesce that failed after NCCL's communicators went: they are made
// again (the gate is open), and the answer says if that failed too.
std::string Agent::rebuilt_after_failure() {
  auto made = backend_.nccl_rebuild(std::nullopt);
  return made ? std::string() : "; NCCL: " + made.error().message;
}

Agent::Answer Agent::answer(const agent::SpeculateRequest& q) {
  if (q.validate) {
    auto set = backend_.set_validation(*q.validate);
    if (!set)
      return failure(set.error().code,
                     "validation " + std::string(*q.validate ? "on" : "off") + ": " + set.error().message);
    return {agent::SpeculateReply{.validating = *q.validate, .sass_attached = *set}};
  }
  if (auto set = backend_.set_speculation(q.on); !set)
    return failure(set.error().code, "speculation " + std::string(q.on ? "on" : "off") + ": " + set.error().message);
  return {agent::SpeculateReply{}};
}

// With the gate closed: nothing writes device memory before every hook
// consults the table.
Agent::Answer Agent::answer(const agent::OpenCopyWindowRequest& q, std::vector<UniqueFd> fds) {
  if (gate_.is_open()) return failure(EBUSY, "open copy window needs a quiesced process (gate is open)");
  auto opened = backend_.open_copy_window(q, std::move(fds));
  if (!opened) return failure(opened.error().code, "open copy window: " + opened.error().message);
  return {*opened};
}

Agent::Answer Agent::answer(const agent::CloseCopyWindowRequest& q) {
  if (q.missed) cow_missed_ = true;
  auto closed = backend_.close_copy_window(q.missed_chunks);
  if (!closed) return failure(closed.error().code, "close copy window: " + closed.error().message);
  return {*closed};
}

// run() closes our end after the reply, before the peer closes its own.
Agent::Answer Agent::answer(const agent::NcclStopRequest& q) {
  if (q.pend_release) {
    auto pending = backend_.nccl_pend_release(*q.pend_release);
    if (!pending) return failure(pending.error().code, "nccl release: " + pending.error().message);
    return {agent::NcclStopReply{*pending}};
  }
  auto stopped = backend_.nccl_stop(q.job_id, q.at_call);
  if (!stopped) return failure(stopped.error().code, "nccl stop: " + stopped.error().message);
  // Armed (or renewed) with a lease, the lease runs from now; armed without
  // one, or lifted, none runs.
  if (q.at_call && q.lease_ms && *q.lease_ms > 0)
    lease_.grant(q.job_id, std::chrono::milliseconds(*q.lease_ms), StopLease::Clock::now());
  else
    lease_.clear(q.job_id);
  return {agent::NcclStopReply{*stopped}};
}

int Agent::poll_timeout_ms() const {
  auto left = lease_.left(StopLease::Clock::now());
  if (!left) return -1;
  return int(std::min<int64_t>(left->count(), 60000));
}

// Its holder is gone (killed before its checkpoint ran, or cut off): no one
// else would ever lift the stop, and the program would wait for good.
void Agent::lift_lapsed_stop() {
  const auto length = lease_.length();
  auto job = lease_.expired(StopLease::Clock::now());
  if (!job) return;
  const auto id = static_cast<unsigned long long>(*job);
  stderr_line("phos: the stop of NCCL communicator %016llx was not renewed in %lld ms (its holder is gone): "
              "lifted, the program's NCCL calls go on\n",
              id, static_cast<long long>(length.count()));
  // A release pending that released nothing is lifted; one that released
  // communicators stays (they are made again by a resume).
  if (auto pending = backend_.nccl_pend_release(false); !pending)
    stderr_line("phos: lifting the pending release of NCCL communicator %016llx: %s\n", id,
                pending.error().message.c_str());
  else if (!*pending)
    stderr_line("phos: NCCL communicator %016llx was released already: its calls wait for a resume\n", id);
  if (auto lifted = backend_.nccl_stop(*job, std::nullopt); !lifted)
    stderr_line("phos: lifting the stop of NCCL communicator %016llx: %s\n", id, lifted.error().message.c_str());
}

// CUDA IPC: another libphos process opens (or closes) one of this
// process's allocations; the gate need not be closed (the memory stays
// where it is).
Agent::Answer Agent::answer(const agent::IpcOpenRequest& q, pid_t peer) {
  UniqueFd fd;
  auto opened = backend_.ipc_open(q.allocation, peer, &fd);
  if (!opened) return failure(opened.error().code, "ipc open: " + opened.error().message);
  Answer out(*opened);
  out.fds.push_back(std::move(fd));
  return out;
}

Agent::Answer Agent::answer(const agent::IpcCloseRequest& q, pid_t peer) {
  if (auto closed = backend_.ipc_close(q.allocation, peer); !closed)
    return failure(closed.error().code, "ipc close: " + closed.error().message);
  return {agent::IpcCloseReply{}};
}

Agent::Answer Agent::answer(const agent::GoodbyeRequest&) { return {agent::GoodbyeReply{}, true}; }

}  // namespace phos::hooks
