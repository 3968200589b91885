#include "agent_client.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cstring>

#include "proc.h"

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

Result<AgentClient> AgentClient::connect(pid_t pid, int timeout_ms) {
  auto name = find_listening_socket(pid, kAgentSocketPrefix);
  if (!name) return name.error();
  if (!name->has_value()) return make_error("process " + std::to_string(pid) + " has no phos agent", ENOENT);
  auto sock = connect_in_netns(pid, **name);
  if (!sock) return sock.error();
  AgentClient client(std::move(*sock), timeout_ms);

  Phos__Agent__Hello hello = PHOS__AGENT__HELLO__INIT;
  hello.protocol_version = wire::kAgentProtocolVersion;
  hello.client_version = const_cast<char*>(PHOS_VERSION);
  auto reply = client.call(PHOS__AGENT__REQUEST__KIND_HELLO, &Phos__Agent__Request::hello, hello,
                           PHOS__AGENT__REPLY__KIND_HELLO);
  if (!reply) return reply.error();
  const auto* h = reply->reply->hello;
  client.hello_ = AgentHello{h->protocol_version, h->agent_version, h->pid, h->agent_tid, h->uid};
  return client;
}

template <class Msg>
Result<wire::ReceivedReply> AgentClient::call(Phos__Agent__Request__KindCase kind, Msg* Phos__Agent__Request::*field,
                                              Msg& msg, Phos__Agent__Reply__KindCase expected,
                                              std::span<const int> fds) {
  Phos__Agent__Request req = PHOS__AGENT__REQUEST__INIT;
  req.kind_case = kind;
  req.*field = &msg;
  PHOS_TRY(wire::send_message(sock_.get(), req.base, fds));
  auto reply = wire::recv_reply(sock_.get(), timeout_ms_);
  if (!reply) return reply.error();
  const auto* r = reply->reply.get();
  if (r->kind_case == PHOS__AGENT__REPLY__KIND_ERROR)
    return make_error(std::string("agent: ") + (r->error->message ? r->error->message : "error"), r->error->code);
  if (r->kind_case != expected)
    return make_error("agent answered with reply kind " + std::to_string(int(r->kind_case)) + ", expected " +
                          std::to_string(int(expected)),
                      EPROTO);
  return reply;
}

Result<AgentStatus> AgentClient::status() {
  Phos__Agent__StatusRequest q = PHOS__AGENT__STATUS_REQUEST__INIT;
  auto reply = call(PHOS__AGENT__REQUEST__KIND_STATUS, &Phos__Agent__Request::status, q,
                    PHOS__AGENT__REPLY__KIND_STATUS);
  if (!reply) return reply.error();
  const auto* r = reply->reply->status;
  AgentStatus out;
  out.gate_open = r->gate_open != 0;
  out.cuda_initialized = r->cuda_initialized != 0;
  out.allocation_count = r->allocation_count;
  out.allocated_bytes = r->allocated_bytes;
  out.device_count = r->device_count;
  for (size_t i = 0; i < r->n_devices; i++) {
    const auto* d = r->devices[i];
    if (d->uuid.len != 16) return make_error("agent status: a device UUID of " + std::to_string(d->uuid.len) + " bytes");
    wire::AgentDevice dev;
    dev.ordinal = d->ordinal;
    std::memcpy(dev.uuid.data(), d->uuid.data, 16);
    out.devices.push_back(dev);
  }
  for (size_t i = 0; i < r->n_unsupported_calls; i++) out.unsupported_calls.emplace_back(r->unsupported_calls[i]);
  for (size_t i = 0; i < r->n_counters; i++) out.counters.emplace_back(r->counters[i]->name, r->counters[i]->value);
  for (size_t i = 0; i < r->n_modules; i++) {
    const auto* m = r->modules[i];
    wire::ModuleEntry e{m->id, m->kind, m->size, m->hash, m->source, {}, m->function_count, {}};
    e.functions.assign(m->functions, m->functions + m->n_functions);
    e.globals.assign(m->globals, m->globals + m->n_globals);
    out.modules.push_back(std::move(e));
  }
  // Absent from an older agent's reply: speculation off, no kernels.
  out.speculation_active = r->has_speculation_active && r->speculation_active;
  out.indexed_buffers = r->has_indexed_buffers ? r->indexed_buffers : 0;
  for (size_t i = 0; i < r->n_kernels; i++) {
    const auto* k = r->kernels[i];
    wire::KernelSpeculationEntry e;
    e.name = k->name;
    e.module = k->module;
    e.launches = k->launches;
    e.exact = k->exact;
    e.speculated = k->speculated;
    e.unknown = k->unknown;
    e.buffers = k->buffers;
    e.reads = k->reads;
    e.writes = k->writes;
    e.types = k->types;
    if (k->note) e.note = k->note;
    out.kernels.push_back(std::move(e));
  }
  out.kernel_count = std::max<uint64_t>(r->has_kernel_count ? r->kernel_count : 0, out.kernels.size());
  return out;
}

Result<wire::ReceivedReply> AgentClient::speculate_request(bool on, std::optional<bool> validate) {
  Phos__Agent__SpeculateRequest q = PHOS__AGENT__SPECULATE_REQUEST__INIT;
  q.on = on;
  if (validate) {
    q.has_validate = true;
    q.validate = *validate;
  }
  auto reply = call(PHOS__AGENT__REQUEST__KIND_SPECULATE, &Phos__Agent__Request::speculate, q,
                    PHOS__AGENT__REPLY__KIND_SPECULATE);
  if (!reply && reply.error().code == EPROTO)  // an agent older than the request answers "unknown request kind"
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
  const auto* r = reply->reply->speculate;
  // An agent from before validation reads the request as "speculation on".
  if (!r->has_validating) return make_error("the agent predates validation (it turned speculation on only)", EPROTO);
  return r->has_sass_attached && r->sass_attached;
}

Result<uint64_t> AgentClient::quiesce(uint32_t timeout_ms) {
  Phos__Agent__QuiesceRequest q = PHOS__AGENT__QUIESCE_REQUEST__INIT;
  q.timeout_ms = timeout_ms;
  auto reply = call(PHOS__AGENT__REQUEST__KIND_QUIESCE, &Phos__Agent__Request::quiesce, q,
                    PHOS__AGENT__REPLY__KIND_QUIESCE);
  if (!reply) return reply.error();
  return uint64_t(reply->reply->quiesce->drained_ns);
}

Result<std::vector<AgentAllocation>> AgentClient::list_allocations(bool with_fds, std::vector<UniqueFd>* fds) {
  std::vector<AgentAllocation> out;
  for (;;) {
    Phos__Agent__ListAllocationsRequest q = PHOS__AGENT__LIST_ALLOCATIONS_REQUEST__INIT;
    q.first_index = out.size();
    q.max_count = wire::kMaxFdsPerFrame;
    q.with_fds = with_fds;
    auto reply = call(PHOS__AGENT__REQUEST__KIND_LIST_ALLOCATIONS, &Phos__Agent__Request::list_allocations, q,
                      PHOS__AGENT__REPLY__KIND_LIST_ALLOCATIONS);
    if (!reply) return reply.error();
    const auto* r = reply->reply->list_allocations;
    if (with_fds && reply->fds.size() != r->n_allocations)
      return make_error("agent sent " + std::to_string(reply->fds.size()) + " fds for " +
                            std::to_string(r->n_allocations) + " allocations",
                        EPROTO);
    for (size_t i = 0; i < r->n_allocations; i++) {
      const auto* a = r->allocations[i];
      out.push_back(wire::from_message(*a));
      if (with_fds && fds) fds->push_back(std::move(reply->fds[i]));
    }
    if (out.size() >= r->total_count || r->n_allocations == 0) break;
  }
  return out;
}

Result<uint64_t> AgentClient::release_mappings(bool release_handles) {
  Phos__Agent__ReleaseMappingsRequest q = PHOS__AGENT__RELEASE_MAPPINGS_REQUEST__INIT;
  q.has_release_handles = 1;
  q.release_handles = release_handles;
  auto reply = call(PHOS__AGENT__REQUEST__KIND_RELEASE_MAPPINGS, &Phos__Agent__Request::release_mappings, q,
                    PHOS__AGENT__REPLY__KIND_RELEASE_MAPPINGS);
  if (!reply) return reply.error();
  return uint64_t(reply->reply->release_mappings->released_bytes);
}

Result<uint64_t> AgentClient::remap(const std::vector<uint64_t>& ids, const std::vector<int>& fds) {
  Phos__Agent__RemapRequest q = PHOS__AGENT__REMAP_REQUEST__INIT;
  q.n_allocation_ids = ids.size();
  q.allocation_ids = const_cast<uint64_t*>(ids.data());
  auto reply = call(PHOS__AGENT__REQUEST__KIND_REMAP, &Phos__Agent__Request::remap, q,
                    PHOS__AGENT__REPLY__KIND_REMAP, fds);
  if (!reply) return reply.error();
  return uint64_t(reply->reply->remap->mapped_bytes);
}

Result<uint64_t> AgentClient::remap_all(const std::vector<AgentAllocation>& allocs, const std::vector<UniqueFd>& fds) {
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

Result<void> AgentClient::resume() {
  Phos__Agent__ResumeRequest q = PHOS__AGENT__RESUME_REQUEST__INIT;
  auto reply = call(PHOS__AGENT__REQUEST__KIND_RESUME, &Phos__Agent__Request::resume, q,
                    PHOS__AGENT__REPLY__KIND_RESUME);
  if (!reply) return reply.error();
  return {};
}

Result<void> AgentClient::goodbye() {
  Phos__Agent__GoodbyeRequest q = PHOS__AGENT__GOODBYE_REQUEST__INIT;
  auto reply = call(PHOS__AGENT__REQUEST__KIND_GOODBYE, &Phos__Agent__Request::goodbye, q,
                    PHOS__AGENT__REPLY__KIND_GOODBYE);
  if (!reply) return reply.error();
  auto eof = wire::recv_frame(sock_.get(), timeout_ms_);
  if (eof.ok()) return make_error("agent sent a frame after goodbye", EPROTO);
  if (eof.error().code != ENODATA) return eof.error();
  sock_.reset();
  return {};
}

}  // namespace phos::plugin

#include <unistd.h>

#include <optional>

#include "stopped_thread.h"

namespace phos::plugin {

Result<void> with_agent(pid_t pid, int timeout_ms, const std::function<Result<void>(AgentClient&)>& fn) {
  auto tid = find_thread(pid, kAgentThreadName);
  if (!tid) return tid.error();
  auto tracer = tracer_of(pid, *tid);
  if (!tracer) return tracer.error();
  std::optional<StoppedThreadRun> run;
  if (*tracer == ::getpid()) {
    auto started = StoppedThreadRun::start(*tid);
    if (!started) return started.error();
    run.emplace(std::move(*started));
  }
  auto client = AgentClient::connect(pid, timeout_ms);
  if (!client) return client.error();
  PHOS_TRY(fn(*client));
  PHOS_TRY(client->goodbye());
  return run ? run->stop() : Result<void>();
}

}  // namespace phos::plugin
