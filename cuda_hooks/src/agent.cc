#include "phos/hooks/agent.h"

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

namespace phos::hooks {
namespace {

std::string make_socket_name() {
  uint64_t nonce = 0;
  if (::getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != sizeof(nonce))
    nonce = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%d.%016llx", kAgentSocketPrefix, int(::getpid()),
                static_cast<unsigned long long>(nonce));
  return buf;
}

uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// Sends `msg` as the reply of kind `kind` (stored in `field` of the oneof).
template <class Msg>
Result<void> send_reply(int conn, Phos__Agent__Reply__KindCase kind, Msg* Phos__Agent__Reply::*field, Msg& msg,
                        std::span<const int> fds = {}) {
  Phos__Agent__Reply reply = PHOS__AGENT__REPLY__INIT;
  reply.kind_case = kind;
  reply.*field = &msg;
  return wire::send_message(conn, reply.base, fds);
}

// Module names in a status reply: a frame stays far below its limit even for
// a process with thousands of modules.
constexpr size_t kMaxModuleFunctions = 1000;

// The Module messages of a status reply; they point into `modules`, and into
// `names` (pointer arrays), which must outlive the reply.
std::vector<Phos__Agent__Module> module_messages(std::vector<wire::ModuleEntry>& modules,
                                                std::vector<std::vector<char*>>& names) {
  std::vector<Phos__Agent__Module> out(modules.size());
  names.resize(2 * modules.size());
  for (size_t i = 0; i < modules.size(); i++) {
    auto& m = modules[i];
    auto& functions = names[2 * i];
    auto& globals = names[2 * i + 1];
    for (size_t f = 0; f < std::min(m.functions.size(), kMaxModuleFunctions); f++) functions.push_back(m.functions[f].data());
    for (auto& g : m.globals) globals.push_back(g.data());
    phos__agent__module__init(&out[i]);
    out[i].id = m.id;
    out[i].kind = m.kind.data();
    out[i].size = m.size;
    out[i].hash = m.hash;
    out[i].source = m.source.data();
    out[i].n_functions = functions.size();
    out[i].functions = functions.data();
    out[i].function_count = std::max<uint64_t>(m.function_count, m.functions.size());
    out[i].n_globals = globals.size();
    out[i].globals = globals.data();
  }
  return out;
}

// Kernels in a status reply: those with the most launches, for the same
// reason (a kernel's mangled name can run to kilobytes).
constexpr size_t kMaxStatusKernels = 1000;

// The KernelSpeculation messages of a status reply, of the kernels with the
// most launches (`kernels` is reordered and cut to those); they point into
// `kernels`, which must outlive the reply.
std::vector<Phos__Agent__KernelSpeculation> kernel_messages(std::vector<wire::KernelSpeculationEntry>& kernels) {
  if (kernels.size() > kMaxStatusKernels) {
    std::stable_sort(kernels.begin(), kernels.end(),
                     [](const auto& a, const auto& b) { return a.launches > b.launches; });
    kernels.resize(kMaxStatusKernels);
  }
  std::vector<Phos__Agent__KernelSpeculation> out(kernels.size());
  for (size_t i = 0; i < kernels.size(); i++) {
    auto& k = kernels[i];
    phos__agent__kernel_speculation__init(&out[i]);
    out[i].name = k.name.data();
    out[i].module = k.module;
    out[i].launches = k.launches;
    out[i].exact = k.exact;
    out[i].speculated = k.speculated;
    out[i].unknown = k.unknown;
    out[i].buffers = k.buffers;
    out[i].reads = k.reads;
    out[i].writes = k.writes;
    out[i].types = k.types.data();
    if (!k.note.empty()) out[i].note = k.note.data();
  }
  return out;
}

}  // namespace

Agent::Agent(Gate& gate, AgentBackend& backend, AgentOptions options)
    : gate_(gate), backend_(backend), options_(options) {}

Agent::~Agent() { stop(); }

Result<void> Agent::start() {
  name_ = make_socket_name();
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
  return start();
}

void Agent::run(std::promise<void>& named) {
  // Application signals go to application threads; this thread must also
  // not be interrupted while a checkpoint talks to it.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  prctl(PR_SET_NAME, kAgentThreadName);
  tid_ = ::gettid();
  named.set_value();

  for (;;) {
    struct pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents & POLLIN)) return;
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
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (cred.uid == 0 || cred.uid == ::getuid()) return true;
  (void)wire::send_error_reply(conn, EPERM,
                               "permission denied: uid " + std::to_string(cred.uid) +
                                   " is neither root nor the owner of process " + std::to_string(::getpid()));
  return false;
}

void Agent::serve(int conn) {
  bool greeted = false;
  for (;;) {
    auto req = wire::recv_request(conn, options_.idle_timeout_ms);
    if (!req) {
      // EPROTO: tell the peer what was wrong before hanging up.
      if (req.error().code == EPROTO) (void)wire::send_error_reply(conn, EPROTO, req.error().message);
      return;
    }
    if (!handle(conn, *req, greeted)) return;
  }
}

bool Agent::handle(int conn, wire::ReceivedRequest& received, bool& greeted) {
  const Phos__Agent__Request& req = *received.request;
  auto fail = [&](int code, const std::string& msg) {
    (void)wire::send_error_reply(conn, code, msg);
    return true;
  };
  if (!greeted && req.kind_case != PHOS__AGENT__REQUEST__KIND_HELLO) {
    (void)wire::send_error_reply(conn, EPROTO, "the first request must be hello");
    return false;
  }
  switch (req.kind_case) {
    case PHOS__AGENT__REQUEST__KIND_HELLO: {
      if (req.hello->protocol_version != wire::kAgentProtocolVersion) {
        (void)wire::send_error_reply(conn, EPROTONOSUPPORT,
                                     "agent protocol " + std::to_string(req.hello->protocol_version) +
                                         " not supported; this agent speaks " +
                                         std::to_string(wire::kAgentProtocolVersion));
        return false;
      }
      greeted = true;
      Phos__Agent__HelloReply r = PHOS__AGENT__HELLO_REPLY__INIT;
      r.protocol_version = wire::kAgentProtocolVersion;
      r.agent_version = const_cast<char*>(PHOS_VERSION);
      r.pid = ::getpid();
      r.agent_tid = tid_.load();
      r.uid = ::getuid();
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_HELLO, &Phos__Agent__Reply::hello, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_STATUS: {
      BackendStatus s = backend_.status();
      std::vector<char*> calls;
      for (auto& c : s.unsupported_calls) calls.push_back(c.data());
      Phos__Agent__StatusReply r = PHOS__AGENT__STATUS_REPLY__INIT;
      r.gate_open = gate_.is_open();
      r.cuda_initialized = s.cuda_initialized;
      r.allocation_count = s.allocation_count;
      r.allocated_bytes = s.allocated_bytes;
      r.device_count = s.device_count;
      std::vector<Phos__Agent__Device> devices(s.devices.size());
      std::vector<Phos__Agent__Device*> device_ptrs;
      for (size_t i = 0; i < s.devices.size(); i++) {
        phos__agent__device__init(&devices[i]);
        devices[i].ordinal = s.devices[i].ordinal;
        devices[i].uuid = {s.devices[i].uuid.size(), s.devices[i].uuid.data()};
        device_ptrs.push_back(&devices[i]);
      }
      r.n_devices = device_ptrs.size();
      r.devices = device_ptrs.data();
      r.n_unsupported_calls = calls.size();
      r.unsupported_calls = calls.data();
      std::vector<Phos__Agent__Counter> counters(s.counters.size());
      std::vector<Phos__Agent__Counter*> counter_ptrs;
      for (size_t i = 0; i < s.counters.size(); i++) {
        phos__agent__counter__init(&counters[i]);
        counters[i].name = s.counters[i].first.data();
        counters[i].value = s.counters[i].second;
        counter_ptrs.push_back(&counters[i]);
      }
      r.n_counters = counter_ptrs.size();
      r.counters = counter_ptrs.data();
      std::vector<std::vector<char*>> module_names;
      auto modules = module_messages(s.modules, module_names);
      std::vector<Phos__Agent__Module*> module_ptrs;
      for (auto& m : modules) module_ptrs.push_back(&m);
      r.n_modules = module_ptrs.size();
      r.modules = module_ptrs.data();
      r.has_speculation_active = 1;
      r.speculation_active = s.speculation_active;
      r.has_indexed_buffers = 1;
      r.indexed_buffers = s.indexed_buffers;
      r.has_kernel_count = 1;
      r.kernel_count = std::max<uint64_t>(s.kernel_count, s.kernels.size());
      auto kernels = kernel_messages(s.kernels);
      std::vector<Phos__Agent__KernelSpeculation*> kernel_ptrs;
      for (auto& k : kernels) kernel_ptrs.push_back(&k);
      r.n_kernels = kernel_ptrs.size();
      r.kernels = kernel_ptrs.data();
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_STATUS, &Phos__Agent__Reply::status, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_LIST_ALLOCATIONS: {
      const auto* q = req.list_allocations;
      auto all = backend_.allocations();
      uint64_t first = std::min<uint64_t>(q->first_index, all.size());
      uint64_t count = std::min({uint64_t(q->max_count), uint64_t(all.size() - first), uint64_t(wire::kMaxFdsPerFrame)});
      std::vector<Phos__Agent__Allocation> msgs(count);
      std::vector<Phos__Agent__Allocation*> ptrs;
      std::vector<UniqueFd> owned;
      std::vector<int> fds;
      for (uint64_t i = 0; i < count; i++) {
        const AllocationInfo& a = all[first + i];
        wire::to_message(wire::AllocationEntry{a.id, a.device, a.address, a.size, a.flags}, msgs[i]);
        ptrs.push_back(&msgs[i]);
        if (q->with_fds) {
          auto fd = backend_.export_allocation(a.id);
          if (!fd) return fail(fd.error().code, fd.error().message);
          fds.push_back(fd->get());
          owned.push_back(std::move(*fd));
        }
      }
      Phos__Agent__ListAllocationsReply r = PHOS__AGENT__LIST_ALLOCATIONS_REPLY__INIT;
      r.n_allocations = ptrs.size();
      r.allocations = ptrs.data();
      r.total_count = all.size();
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_LIST_ALLOCATIONS, &Phos__Agent__Reply::list_allocations, r, fds).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_QUIESCE: {
      uint64_t t0 = now_ns();
      auto timeout = std::chrono::milliseconds(req.quiesce->timeout_ms);
      if (!gate_.close(timeout))
        return fail(ETIMEDOUT, std::to_string(gate_.inside()) + " CUDA calls still running after " +
                                   std::to_string(req.quiesce->timeout_ms) + " ms; gate reopened");
      if (auto d = backend_.drain(timeout); !d) {
        gate_.open();
        return fail(d.error().code, "drain: " + d.error().message + "; gate reopened");
      }
      Phos__Agent__QuiesceReply r = PHOS__AGENT__QUIESCE_REPLY__INIT;
      r.drained_ns = now_ns() - t0;
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_QUIESCE, &Phos__Agent__Reply::quiesce, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_RELEASE_MAPPINGS: {
      if (gate_.is_open()) return fail(EBUSY, "release mappings needs a quiesced process (gate is open)");
      auto released = backend_.release_mappings(req.release_mappings->release_handles);
      if (!released) return fail(released.error().code, released.error().message);
      Phos__Agent__ReleaseMappingsReply r = PHOS__AGENT__RELEASE_MAPPINGS_REPLY__INIT;
      r.released_bytes = *released;
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_RELEASE_MAPPINGS, &Phos__Agent__Reply::release_mappings, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_REMAP: {
      const auto* q = req.remap;
      if (!received.fds.empty() && received.fds.size() != q->n_allocation_ids)
        return fail(EINVAL, "remap: " + std::to_string(received.fds.size()) + " fds for " +
                                std::to_string(q->n_allocation_ids) + " allocations");
      auto mapped = backend_.remap(std::span<const uint64_t>(q->allocation_ids, q->n_allocation_ids),
                                   std::move(received.fds));
      if (!mapped) return fail(mapped.error().code, mapped.error().message);
      Phos__Agent__RemapReply r = PHOS__AGENT__REMAP_REPLY__INIT;
      r.mapped_bytes = *mapped;
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_REMAP, &Phos__Agent__Reply::remap, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_RESUME: {
      gate_.open();
      Phos__Agent__ResumeReply r = PHOS__AGENT__RESUME_REPLY__INIT;
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_RESUME, &Phos__Agent__Reply::resume, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_SPECULATE: {
      Phos__Agent__SpeculateReply r = PHOS__AGENT__SPECULATE_REPLY__INIT;
      if (req.speculate->has_validate) {
        auto set = backend_.set_validation(req.speculate->validate);
        if (!set)
          return fail(set.error().code, "validation " + std::string(req.speculate->validate ? "on" : "off") + ": " +
                                            set.error().message);
        r.has_validating = r.has_sass_attached = true;
        r.validating = req.speculate->validate;
        r.sass_attached = *set;
      } else if (auto set = backend_.set_speculation(req.speculate->on); !set) {
        return fail(set.error().code, "speculation " + std::string(req.speculate->on ? "on" : "off") + ": " +
                                          set.error().message);
      }
      return send_reply(conn, PHOS__AGENT__REPLY__KIND_SPECULATE, &Phos__Agent__Reply::speculate, r).ok();
    }
    case PHOS__AGENT__REQUEST__KIND_GOODBYE: {
      Phos__Agent__GoodbyeReply r = PHOS__AGENT__GOODBYE_REPLY__INIT;
      (void)send_reply(conn, PHOS__AGENT__REPLY__KIND_GOODBYE, &Phos__Agent__Reply::goodbye, r);
      return false;  // run() closes our end now, before the peer closes its own
    }
    default:
      return fail(EPROTO, "unknown request kind " + std::to_string(int(req.kind_case)));
  }
}

}  // namespace phos::hooks
