#include "phos/images/agent_protocol.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <variant>

#include "agent.pb-c.h"
#include "agent_pb.h"

namespace phos::agent {
namespace {

Error malformed(std::string_view what, const std::string& why) {
  return make_error("malformed " + std::string(what) + ": " + why, EPROTO);
}

// A string field as protobuf-c leaves it: NULL where absent.
std::string text(const char* s) { return s ? s : ""; }
char* c_text(const std::string& s) { return const_cast<char*>(s.c_str()); }

template <class Msg>
std::vector<std::byte> pack(const Msg& msg) {
  std::vector<std::byte> out(protobuf_c_message_get_packed_size(&msg.base));
  protobuf_c_message_pack(&msg.base, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// --- requests ---

// The Request with `msg` in `field` of its oneof, packed.
template <class Msg>
std::vector<std::byte> pack_request(Phos__Agent__Request__KindCase kind, Msg* Phos__Agent__Request::*field,
                                    Msg& msg) {
  Phos__Agent__Request req = PHOS__AGENT__REQUEST__INIT;
  req.kind_case = kind;
  req.*field = &msg;
  return pack(req);
}

std::vector<std::byte> encode(const Hello& h) {
  Phos__Agent__Hello m = PHOS__AGENT__HELLO__INIT;
  m.protocol_version = h.protocol_version;
  m.client_version = c_text(h.client_version);
  return pack_request(PHOS__AGENT__REQUEST__KIND_HELLO, &Phos__Agent__Request::hello, m);
}

std::vector<std::byte> encode(const StatusRequest&) {
  Phos__Agent__StatusRequest m = PHOS__AGENT__STATUS_REQUEST__INIT;
  return pack_request(PHOS__AGENT__REQUEST__KIND_STATUS, &Phos__Agent__Request::status, m);
}

std::vector<std::byte> encode(const ListAllocationsRequest& q) {
  Phos__Agent__ListAllocationsRequest m = PHOS__AGENT__LIST_ALLOCATIONS_REQUEST__INIT;
  m.first_index = q.first_index;
  m.max_count = q.max_count;
  m.with_fds = q.with_fds;
  return pack_request(PHOS__AGENT__REQUEST__KIND_LIST_ALLOCATIONS, &Phos__Agent__Request::list_allocations, m);
}

std::vector<std::byte> encode(const QuiesceRequest& q) {
  Phos__Agent__QuiesceRequest m = PHOS__AGENT__QUIESCE_REQUEST__INIT;
  m.timeout_ms = q.timeout_ms;
  return pack_request(PHOS__AGENT__REQUEST__KIND_QUIESCE, &Phos__Agent__Request::quiesce, m);
}

std::vector<std::byte> encode(const ReleaseMappingsRequest& q) {
  Phos__Agent__ReleaseMappingsRequest m = PHOS__AGENT__RELEASE_MAPPINGS_REQUEST__INIT;
  m.has_release_handles = 1;
  m.release_handles = q.release_handles;
  return pack_request(PHOS__AGENT__REQUEST__KIND_RELEASE_MAPPINGS, &Phos__Agent__Request::release_mappings, m);
}

std::vector<std::byte> encode(const RemapRequest& q) {
  Phos__Agent__RemapRequest m = PHOS__AGENT__REMAP_REQUEST__INIT;
  m.n_allocation_ids = q.allocation_ids.size();
  m.allocation_ids = const_cast<uint64_t*>(q.allocation_ids.data());
  return pack_request(PHOS__AGENT__REQUEST__KIND_REMAP, &Phos__Agent__Request::remap, m);
}

std::vector<std::byte> encode(const ResumeRequest& q) {
  Phos__Agent__ResumeRequest m = PHOS__AGENT__RESUME_REQUEST__INIT;
  m.has_nccl_nonce = q.nccl_nonce.has_value();
  m.nccl_nonce = q.nccl_nonce.value_or(0);
  return pack_request(PHOS__AGENT__REQUEST__KIND_RESUME, &Phos__Agent__Request::resume, m);
}

std::vector<std::byte> encode(const GoodbyeRequest&) {
  Phos__Agent__GoodbyeRequest m = PHOS__AGENT__GOODBYE_REQUEST__INIT;
  return pack_request(PHOS__AGENT__REQUEST__KIND_GOODBYE, &Phos__Agent__Request::goodbye, m);
}

std::vector<std::byte> encode(const SpeculateRequest& q) {
  Phos__Agent__SpeculateRequest m = PHOS__AGENT__SPECULATE_REQUEST__INIT;
  m.on = q.on;
  if (q.validate) {
    m.has_validate = 1;
    m.validate = *q.validate;
  }
  return pack_request(PHOS__AGENT__REQUEST__KIND_SPECULATE, &Phos__Agent__Request::speculate, m);
}

std::vector<std::byte> encode(const OpenCopyWindowRequest& q) {
  Phos__Agent__OpenCopyWindowRequest m = PHOS__AGENT__OPEN_COPY_WINDOW_REQUEST__INIT;
  m.trust = uint32_t(q.trust);
  m.timeout_ms = q.timeout_ms;
  m.pool_device = q.pool_device;
  m.pool_bytes = q.pool_bytes;
  return pack_request(PHOS__AGENT__REQUEST__KIND_OPEN_COPY_WINDOW, &Phos__Agent__Request::open_copy_window, m);
}

std::vector<std::byte> encode(const CloseCopyWindowRequest&) {
  Phos__Agent__CloseCopyWindowRequest m = PHOS__AGENT__CLOSE_COPY_WINDOW_REQUEST__INIT;
  return pack_request(PHOS__AGENT__REQUEST__KIND_CLOSE_COPY_WINDOW, &Phos__Agent__Request::close_copy_window, m);
}

std::vector<std::byte> encode(const NcclStopRequest& q) {
  Phos__Agent__NcclStopRequest m = PHOS__AGENT__NCCL_STOP_REQUEST__INIT;
  m.job_id = q.job_id;
  m.has_at_call = q.at_call.has_value();
  m.at_call = q.at_call.value_or(0);
  m.has_pend_release = q.pend_release.has_value();
  m.pend_release = q.pend_release.value_or(false);
  return pack_request(PHOS__AGENT__REQUEST__KIND_NCCL_STOP, &Phos__Agent__Request::nccl_stop, m);
}

Result<Request> decode(const Phos__Agent__OpenCopyWindowRequest& q) {
  if (q.trust < uint32_t(CopyTrust::kExact) || q.trust > uint32_t(CopyTrust::kValidated))
    return malformed("request", "open copy window: trust " + std::to_string(q.trust) + " is none of 1, 2, 3");
  return Request(OpenCopyWindowRequest{CopyTrust(q.trust), q.timeout_ms, q.pool_device, q.pool_bytes});
}

Result<Request> decode(const Phos__Agent__Request& r) {
  switch (r.kind_case) {
    case PHOS__AGENT__REQUEST__KIND_HELLO:
      return Request(Hello{r.hello->protocol_version, text(r.hello->client_version)});
    case PHOS__AGENT__REQUEST__KIND_STATUS:
      return Request(StatusRequest{});
    case PHOS__AGENT__REQUEST__KIND_LIST_ALLOCATIONS: {
      const auto& q = *r.list_allocations;
      return Request(ListAllocationsRequest{q.first_index, q.max_count, q.with_fds != 0});
    }
    case PHOS__AGENT__REQUEST__KIND_QUIESCE:
      return Request(QuiesceRequest{r.quiesce->timeout_ms});
    case PHOS__AGENT__REQUEST__KIND_RELEASE_MAPPINGS: {
      const auto& q = *r.release_mappings;
      return Request(ReleaseMappingsRequest{q.has_release_handles && q.release_handles});
    }
    case PHOS__AGENT__REQUEST__KIND_REMAP: {
      const auto& q = *r.remap;
      return Request(RemapRequest{std::vector<uint64_t>(q.allocation_ids, q.allocation_ids + q.n_allocation_ids)});
    }
    case PHOS__AGENT__REQUEST__KIND_RESUME: {
      ResumeRequest out;
      if (r.resume && r.resume->has_nccl_nonce) out.nccl_nonce = r.resume->nccl_nonce;
      return Request(out);
    }
    case PHOS__AGENT__REQUEST__KIND_GOODBYE:
      return Request(GoodbyeRequest{});
    case PHOS__AGENT__REQUEST__KIND_SPECULATE: {
      const auto& q = *r.speculate;
      SpeculateRequest out{q.on != 0, std::nullopt};
      if (q.has_validate) out.validate = q.validate != 0;
      return Request(out);
    }
    case PHOS__AGENT__REQUEST__KIND_OPEN_COPY_WINDOW:
      return decode(*r.open_copy_window);
    case PHOS__AGENT__REQUEST__KIND_CLOSE_COPY_WINDOW:
      return Request(CloseCopyWindowRequest{});
    case PHOS__AGENT__REQUEST__KIND_NCCL_STOP: {
      NcclStopRequest out{r.nccl_stop->job_id, std::nullopt, std::nullopt};
      if (r.nccl_stop->has_at_call) out.at_call = r.nccl_stop->at_call;
      if (r.nccl_stop->has_pend_release) out.pend_release = r.nccl_stop->pend_release != 0;
      return Request(out);
    }
    default:
      break;
  }
  return malformed("request", pb::no_kind(r.base));
}

// --- replies ---

template <class Msg>
std::vector<std::byte> pack_reply(Phos__Agent__Reply__KindCase kind, Msg* Phos__Agent__Reply::*field, Msg& msg) {
  Phos__Agent__Reply reply = PHOS__AGENT__REPLY__INIT;
  reply.kind_case = kind;
  reply.*field = &msg;
  return pack(reply);
}

std::vector<std::byte> encode(const HelloReply& h) {
  Phos__Agent__HelloReply m = PHOS__AGENT__HELLO_REPLY__INIT;
  m.protocol_version = h.protocol_version;
  m.agent_version = c_text(h.agent_version);
  m.pid = h.pid;
  m.agent_tid = h.agent_tid;
  m.uid = h.uid;
  return pack_reply(PHOS__AGENT__REPLY__KIND_HELLO, &Phos__Agent__Reply::hello, m);
}

// The kernels a status reply carries: all of them, or the kMaxStatusKernels
// with the most launches (in their order where launches tie).
std::vector<const KernelSpeculation*> kernels_to_send(const std::vector<KernelSpeculation>& kernels) {
  std::vector<const KernelSpeculation*> out;
  for (const auto& k : kernels) out.push_back(&k);
  if (out.size() > kMaxStatusKernels) {
    std::stable_sort(out.begin(), out.end(), [](const auto* a, const auto* b) { return a->launches > b->launches; });
    out.resize(kMaxStatusKernels);
  }
  return out;
}

// Owns the protobuf-c structs of one status reply while it is packed: they
// point into the StatusReply and into each other.
struct PbStatus {
  Phos__Agent__StatusReply m = PHOS__AGENT__STATUS_REPLY__INIT;
  std::vector<char*> unsupported;
  std::vector<Phos__Agent__Counter> counters;
  std::vector<Phos__Agent__Counter*> counter_ptrs;
  std::vector<Phos__Agent__Module> modules;
  std::vector<Phos__Agent__Module*> module_ptrs;
  std::vector<std::vector<char*>> functions, globals;
  std::vector<Phos__Agent__KernelSpeculation> kernels;
  std::vector<Phos__Agent__KernelSpeculation*> kernel_ptrs;
  std::vector<Phos__Agent__Device> devices;
  std::vector<Phos__Agent__Device*> device_ptrs;
  std::vector<Phos__Agent__NcclCommunicator> comms;
  std::vector<Phos__Agent__NcclCommunicator*> comm_ptrs;

  explicit PbStatus(const StatusReply& s) {
    m.gate_open = s.gate_open;
    m.cuda_initialized = s.cuda_initialized;
    m.allocation_count = s.allocation_count;
    m.allocated_bytes = s.allocated_bytes;
    m.device_count = s.device_count;
    for (const auto& c : s.unsupported_calls) unsupported.push_back(c_text(c));
    m.n_unsupported_calls = unsupported.size();
    m.unsupported_calls = unsupported.data();
    add_counters(s);
    add_modules(s);
    m.has_speculation_active = m.has_indexed_buffers = m.has_kernel_count = 1;
    m.speculation_active = s.speculation_active;
    m.has_validation_active = 1;
    m.validation_active = s.validation_active;
    m.indexed_buffers = s.indexed_buffers;
    m.kernel_count = std::max<uint64_t>(s.kernel_count, s.kernels.size());
    add_kernels(s);
    add_devices(s);
    add_nccl(s);
  }

  void add_nccl(const StatusReply& s) {
    comms.resize(s.nccl_communicators.size());
    for (size_t i = 0; i < comms.size(); i++) {
      const NcclCommunicatorStatus& c = s.nccl_communicators[i];
      phos__agent__nccl_communicator__init(&comms[i]);
      comms[i].rank = c.rank;
      comms[i].nranks = c.nranks;
      comms[i].device = c.device;
      comms[i].job_id = c.job_id;
      comms[i].calls = c.calls;
      comms[i].has_single_process = 1;
      comms[i].single_process = c.single_process;
      comms[i].has_stop_at = c.stop_at.has_value();
      comms[i].stop_at = c.stop_at.value_or(0);
      comms[i].has_held = 1;
      comms[i].held = c.held;
      comms[i].has_released = 1;
      comms[i].released = c.released;
      comms[i].has_rebuilds = 1;
      comms[i].rebuilds = c.rebuilds;
      comm_ptrs.push_back(&comms[i]);
    }
    m.n_nccl_communicators = comm_ptrs.size();
    m.nccl_communicators = comm_ptrs.data();
  }

  void add_counters(const StatusReply& s) {
    counters.resize(s.counters.size());
    for (size_t i = 0; i < s.counters.size(); i++) {
      phos__agent__counter__init(&counters[i]);
      counters[i].name = c_text(s.counters[i].first);
      counters[i].value = s.counters[i].second;
      counter_ptrs.push_back(&counters[i]);
    }
    m.n_counters = counter_ptrs.size();
    m.counters = counter_ptrs.data();
  }

  void add_modules(const StatusReply& s) {
    modules.resize(s.modules.size());
    functions.resize(s.modules.size());
    globals.resize(s.modules.size());
    for (size_t i = 0; i < s.modules.size(); i++) {
      const Module& in = s.modules[i];
      Phos__Agent__Module& o = modules[i];
      phos__agent__module__init(&o);
      o.id = in.id;
      o.kind = c_text(in.kind);
      o.size = in.size;
      o.hash = in.hash;
      o.source = c_text(in.source);
      for (size_t f = 0; f < std::min(in.functions.size(), kMaxModuleFunctions); f++)
        functions[i].push_back(c_text(in.functions[f]));
      o.n_functions = functions[i].size();
      o.functions = functions[i].data();
      o.function_count = std::max<uint64_t>(in.function_count, in.functions.size());
      for (const auto& g : in.globals) globals[i].push_back(c_text(g));
      o.n_globals = globals[i].size();
      o.globals = globals[i].data();
      module_ptrs.push_back(&o);
    }
    m.n_modules = module_ptrs.size();
    m.modules = module_ptrs.data();
  }

  void add_kernels(const StatusReply& s) {
    auto chosen = kernels_to_send(s.kernels);
    kernels.resize(chosen.size());
    for (size_t i = 0; i < chosen.size(); i++) {
      const KernelSpeculation& k = *chosen[i];
      Phos__Agent__KernelSpeculation& o = kernels[i];
      phos__agent__kernel_speculation__init(&o);
      o.name = c_text(k.name);
      o.module = k.module;
      o.launches = k.launches;
      o.exact = k.exact;
      o.speculated = k.speculated;
      o.unknown = k.unknown;
      o.buffers = k.buffers;
      o.reads = k.reads;
      o.writes = k.writes;
      o.types = c_text(k.types);
      if (!k.note.empty()) o.note = c_text(k.note);
      kernel_ptrs.push_back(&o);
    }
    m.n_kernels = kernel_ptrs.size();
    m.kernels = kernel_ptrs.data();
  }

  void add_devices(const StatusReply& s) {
    devices.resize(s.devices.size());
    for (size_t i = 0; i < s.devices.size(); i++) {
      phos__agent__device__init(&devices[i]);
      devices[i].ordinal = s.devices[i].ordinal;
      devices[i].uuid = {s.devices[i].uuid.size(), const_cast<uint8_t*>(s.devices[i].uuid.data())};
      device_ptrs.push_back(&devices[i]);
    }
    m.n_devices = device_ptrs.size();
    m.devices = device_ptrs.data();
  }
};

std::vector<std::byte> encode(const StatusReply& s) {
  PbStatus pb(s);
  return pack_reply(PHOS__AGENT__REPLY__KIND_STATUS, &Phos__Agent__Reply::status, pb.m);
}

std::vector<std::byte> encode(const ListAllocationsReply& r) {
  std::vector<Phos__Agent__Allocation> allocs(r.allocations.size());
  std::vector<Phos__Agent__Allocation*> ptrs;
  for (size_t i = 0; i < allocs.size(); i++) {
    pb::to_pb(r.allocations[i], allocs[i]);
    ptrs.push_back(&allocs[i]);
  }
  Phos__Agent__ListAllocationsReply m = PHOS__AGENT__LIST_ALLOCATIONS_REPLY__INIT;
  m.n_allocations = ptrs.size();
  m.allocations = ptrs.data();
  m.total_count = r.total_count;
  return pack_reply(PHOS__AGENT__REPLY__KIND_LIST_ALLOCATIONS, &Phos__Agent__Reply::list_allocations, m);
}

std::vector<std::byte> encode(const QuiesceReply& r) {
  Phos__Agent__QuiesceReply m = PHOS__AGENT__QUIESCE_REPLY__INIT;
  m.drained_ns = r.drained_ns;
  m.has_at_step = r.at_step;
  m.at_step = r.at_step;
  m.n_touch_order = r.touch_order.size();
  m.touch_order = const_cast<uint64_t*>(r.touch_order.data());
  m.has_nccl_released = r.nccl_released > 0;
  m.nccl_released = r.nccl_released;
  m.has_nccl_release_ns = r.nccl_released > 0;
  m.nccl_release_ns = r.nccl_release_ns;
  return pack_reply(PHOS__AGENT__REPLY__KIND_QUIESCE, &Phos__Agent__Reply::quiesce, m);
}

std::vector<std::byte> encode(const ReleaseMappingsReply& r) {
  Phos__Agent__ReleaseMappingsReply m = PHOS__AGENT__RELEASE_MAPPINGS_REPLY__INIT;
  m.released_bytes = r.released_bytes;
  return pack_reply(PHOS__AGENT__REPLY__KIND_RELEASE_MAPPINGS, &Phos__Agent__Reply::release_mappings, m);
}

std::vector<std::byte> encode(const RemapReply& r) {
  Phos__Agent__RemapReply m = PHOS__AGENT__REMAP_REPLY__INIT;
  m.mapped_bytes = r.mapped_bytes;
  return pack_reply(PHOS__AGENT__REPLY__KIND_REMAP, &Phos__Agent__Reply::remap, m);
}

std::vector<std::byte> encode(const ResumeReply&) {
  Phos__Agent__ResumeReply m = PHOS__AGENT__RESUME_REPLY__INIT;
  return pack_reply(PHOS__AGENT__REPLY__KIND_RESUME, &Phos__Agent__Reply::resume, m);
}

std::vector<std::byte> encode(const GoodbyeReply&) {
  Phos__Agent__GoodbyeReply m = PHOS__AGENT__GOODBYE_REPLY__INIT;
  return pack_reply(PHOS__AGENT__REPLY__KIND_GOODBYE, &Phos__Agent__Reply::goodbye, m);
}

std::vector<std::byte> encode(const SpeculateReply& r) {
  Phos__Agent__SpeculateReply m = PHOS__AGENT__SPECULATE_REPLY__INIT;
  if (r.validating) {
    m.has_validating = m.has_sass_attached = 1;
    m.validating = *r.validating;
    m.sass_attached = r.sass_attached;
  }
  return pack_reply(PHOS__AGENT__REPLY__KIND_SPECULATE, &Phos__Agent__Reply::speculate, m);
}

std::vector<std::byte> encode(const OpenCopyWindowReply& r) {
  Phos__Agent__OpenCopyWindowReply m = PHOS__AGENT__OPEN_COPY_WINDOW_REPLY__INIT;
  m.validating = r.validating;
  return pack_reply(PHOS__AGENT__REPLY__KIND_OPEN_COPY_WINDOW, &Phos__Agent__Reply::open_copy_window, m);
}

std::vector<std::byte> encode(const NcclStopReply& r) {
  Phos__Agent__NcclStopReply m = PHOS__AGENT__NCCL_STOP_REPLY__INIT;
  m.armed = r.armed;
  return pack_reply(PHOS__AGENT__REPLY__KIND_NCCL_STOP, &Phos__Agent__Reply::nccl_stop, m);
}

std::vector<std::byte> encode(const CloseCopyWindowReply& r) {
  Phos__Agent__CloseCopyWindowReply m = PHOS__AGENT__CLOSE_COPY_WINDOW_REPLY__INIT;
  m.calls_checked = r.calls_checked;
  m.chunks_saved = r.chunks_saved;
  m.calls_waited = r.calls_waited;
  m.unknown_waits = r.unknown_waits;
  m.wait_ns = r.wait_ns;
  m.violations = r.violations;
  if (!r.violation.empty()) m.violation = c_text(r.violation);
  m.aborted = r.aborted;
  if (!r.abort_reason.empty()) m.abort_reason = c_text(r.abort_reason);
  return pack_reply(PHOS__AGENT__REPLY__KIND_CLOSE_COPY_WINDOW, &Phos__Agent__Reply::close_copy_window, m);
}

std::vector<std::byte> encode(const Error& e) {
  Phos__Agent__Error m = PHOS__AGENT__ERROR__INIT;
  m.code = e.code;
  m.message = c_text(e.message);
  return pack_reply(PHOS__AGENT__REPLY__KIND_ERROR, &Phos__Agent__Reply::error, m);
}

Result<Module> decode(const Phos__Agent__Module& m) {
  if (m.function_count < m.n_functions)
    return malformed("reply", "status: module " + std::to_string(m.id) + " counts " + std::to_string(m.function_count) +
                                  " functions but names " + std::to_string(m.n_functions));
  Module out{m.id, text(m.kind), m.size, m.hash, text(m.source), {}, m.function_count, {}};
  for (size_t f = 0; f < m.n_functions; f++) out.functions.push_back(text(m.functions[f]));
  for (size_t g = 0; g < m.n_globals; g++) out.globals.push_back(text(m.globals[g]));
  return out;
}

KernelSpeculation decode(const Phos__Agent__KernelSpeculation& k) {
  return KernelSpeculation{text(k.name), k.module,  k.launches, k.exact,       k.speculated, k.unknown,
                           k.buffers,    k.reads,   k.writes,   text(k.types), text(k.note)};
}

Result<Device> decode(const Phos__Agent__Device& d) {
  if (d.uuid.len != sizeof(Device::uuid))
    return malformed("reply", "status: device " + std::to_string(d.ordinal) + " has a UUID of " +
                                  std::to_string(d.uuid.len) + " bytes, not " + std::to_string(sizeof(Device::uuid)));
  Device out{d.ordinal, {}};
  std::memcpy(out.uuid.data(), d.uuid.data, out.uuid.size());
  return out;
}

Result<StatusReply> decode(const Phos__Agent__StatusReply& r) {
  StatusReply out;
  out.gate_open = r.gate_open != 0;
  out.cuda_initialized = r.cuda_initialized != 0;
  out.allocation_count = r.allocation_count;
  out.allocated_bytes = r.allocated_bytes;
  out.device_count = r.device_count;
  for (size_t i = 0; i < r.n_unsupported_calls; i++) out.unsupported_calls.push_back(text(r.unsupported_calls[i]));
  for (size_t i = 0; i < r.n_counters; i++) out.counters.emplace_back(text(r.counters[i]->name), r.counters[i]->value);
  for (size_t i = 0; i < r.n_modules; i++) {
    auto m = decode(*r.modules[i]);
    if (!m) return m.error();
    out.modules.push_back(std::move(*m));
  }
  // Absent from an older agent's reply: speculation off, nothing indexed,
  // no kernels.
  out.speculation_active = r.has_speculation_active && r.speculation_active;
  out.indexed_buffers = r.has_indexed_buffers ? r.indexed_buffers : 0;
  out.validation_active = r.has_validation_active && r.validation_active;
  for (size_t i = 0; i < r.n_nccl_communicators; i++) {
    const Phos__Agent__NcclCommunicator& c = *r.nccl_communicators[i];
    NcclCommunicatorStatus s{c.rank, c.nranks, c.device, c.job_id, c.calls, c.has_single_process && c.single_process,
                             std::nullopt, c.has_held && c.held};
    if (c.has_stop_at) s.stop_at = c.stop_at;
    s.released = c.has_released && c.released;
    s.rebuilds = c.has_rebuilds ? c.rebuilds : 0;
    out.nccl_communicators.push_back(s);
  }
  for (size_t i = 0; i < r.n_kernels; i++) out.kernels.push_back(decode(*r.kernels[i]));
  if (r.has_kernel_count && r.kernel_count < r.n_kernels)
    return malformed("reply", "status: kernel count " + std::to_string(r.kernel_count) + " is below the " +
                                  std::to_string(r.n_kernels) + " kernels it carries");
  out.kernel_count = r.has_kernel_count ? r.kernel_count : r.n_kernels;
  for (size_t i = 0; i < r.n_devices; i++) {
    auto d = decode(*r.devices[i]);
    if (!d) return d.error();
    out.devices.push_back(*d);
  }
  return out;
}

Result<ListAllocationsReply> decode(const Phos__Agent__ListAllocationsReply& r) {
  if (r.total_count < r.n_allocations)
    return malformed("reply", "list allocations: " + std::to_string(r.n_allocations) + " allocations of a total of " +
                                  std::to_string(r.total_count));
  ListAllocationsReply out;
  out.total_count = r.total_count;
  for (size_t i = 0; i < r.n_allocations; i++) out.allocations.push_back(pb::from_pb(*r.allocations[i]));
  return out;
}

Result<Reply> decode(const Phos__Agent__Reply& r) {
  switch (r.kind_case) {
    case PHOS__AGENT__REPLY__KIND_HELLO: {
      const auto& h = *r.hello;
      return Reply(HelloReply{h.protocol_version, text(h.agent_version), h.pid, h.agent_tid, h.uid});
    }
    case PHOS__AGENT__REPLY__KIND_STATUS: {
      auto s = decode(*r.status);
      if (!s) return s.error();
      return Reply(std::move(*s));
    }
    case PHOS__AGENT__REPLY__KIND_LIST_ALLOCATIONS: {
      auto l = decode(*r.list_allocations);
      if (!l) return l.error();
      return Reply(std::move(*l));
    }
    case PHOS__AGENT__REPLY__KIND_QUIESCE:
      return Reply(QuiesceReply{r.quiesce->drained_ns, bool(r.quiesce->at_step),
                                std::vector<uint64_t>(r.quiesce->touch_order,
                                                      r.quiesce->touch_order + r.quiesce->n_touch_order),
                                r.quiesce->has_nccl_released ? r.quiesce->nccl_released : 0,
                                r.quiesce->has_nccl_release_ns ? r.quiesce->nccl_release_ns : 0});
    case PHOS__AGENT__REPLY__KIND_RELEASE_MAPPINGS:
      return Reply(ReleaseMappingsReply{r.release_mappings->released_bytes});
    case PHOS__AGENT__REPLY__KIND_REMAP:
      return Reply(RemapReply{r.remap->mapped_bytes});
    case PHOS__AGENT__REPLY__KIND_RESUME:
      return Reply(ResumeReply{});
    case PHOS__AGENT__REPLY__KIND_GOODBYE:
      return Reply(GoodbyeReply{});
    case PHOS__AGENT__REPLY__KIND_SPECULATE: {
      // Absent from an agent older than validation: it did not validate.
      const auto& s = *r.speculate;
      SpeculateReply out;
      if (s.has_validating) out.validating = s.validating != 0;
      out.sass_attached = s.has_sass_attached && s.sass_attached;
      return Reply(out);
    }
    case PHOS__AGENT__REPLY__KIND_OPEN_COPY_WINDOW:
      return Reply(OpenCopyWindowReply{r.open_copy_window->validating != 0});
    case PHOS__AGENT__REPLY__KIND_CLOSE_COPY_WINDOW: {
      const auto& c = *r.close_copy_window;
      return Reply(CloseCopyWindowReply{c.calls_checked, c.chunks_saved, c.calls_waited, c.unknown_waits, c.wait_ns,
                                        c.violations, text(c.violation), c.aborted != 0, text(c.abort_reason)});
    }
    case PHOS__AGENT__REPLY__KIND_NCCL_STOP:
      return Reply(NcclStopReply{r.nccl_stop->armed != 0});
    case PHOS__AGENT__REPLY__KIND_ERROR:
      // A code that is no errno would read as success where it is returned.
      if (r.error->code <= 0)
        return malformed("reply", "error reply with code " + std::to_string(r.error->code) + " (\"" +
                                      text(r.error->message) + "\")");
      return Reply(make_error(text(r.error->message), r.error->code));
    default:
      break;
  }
  return malformed("reply", pb::no_kind(r.base));
}

// Unpacks `payload` with `unpack` and decodes what it holds; `what` names
// the message in errors.
template <class Msg, class Value>
Result<Value> unpack_and_decode(std::span<const std::byte> payload,
                                Msg* (*unpack)(ProtobufCAllocator*, size_t, const uint8_t*), std::string_view what) {
  Msg* msg = unpack(nullptr, payload.size(), reinterpret_cast<const uint8_t*>(payload.data()));
  if (!msg)
    return malformed(what, "payload does not parse (not a " + std::string(what) + ", or a required field is missing)");
  Result<Value> out = decode(*msg);
  protobuf_c_message_free_unpacked(&msg->base, nullptr);
  return out;
}

}  // namespace

std::vector<std::byte> encode_request(const Request& request) {
  return std::visit([](const auto& q) { return encode(q); }, request);
}

Result<Request> decode_request(std::span<const std::byte> payload) {
  return unpack_and_decode<Phos__Agent__Request, Request>(payload, phos__agent__request__unpack, "request");
}

std::vector<std::byte> encode_reply(const Reply& reply) {
  return std::visit([](const auto& r) { return encode(r); }, reply);
}

Result<Reply> decode_reply(std::span<const std::byte> payload) {
  return unpack_and_decode<Phos__Agent__Reply, Reply>(payload, phos__agent__reply__unpack, "reply");
}

std::string_view kind_name(const Request& request) {
  static constexpr std::string_view names[] = {"hello",  "status", "list_allocations", "quiesce",  "release_mappings",
                                               "remap",  "resume", "goodbye",          "speculate",
                                               "open_copy_window", "close_copy_window", "nccl_stop"};
  static_assert(std::size(names) == std::variant_size_v<Request>);
  return names[request.index()];
}

std::string_view kind_name(const Reply& reply) {
  static constexpr std::string_view names[] = {"hello",  "status", "list_allocations", "quiesce",   "release_mappings",
                                               "remap",  "resume", "goodbye",          "speculate",
                                               "open_copy_window", "close_copy_window", "nccl_stop", "error"};
  static_assert(std::size(names) == std::variant_size_v<Reply>);
  return names[reply.index()];
}

Result<void> send_request(int sock, const Request& request, std::span<const int> fds) {
  return wire::send_frame(sock, encode_request(request), fds);
}

Result<ReceivedRequest> recv_request(int sock, int timeout_ms) {
  auto frame = wire::recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  auto request = decode_request(frame->payload);
  if (!request) return request.error();
  return ReceivedRequest{std::move(*request), std::move(frame->fds)};
}

Result<void> send_reply(int sock, const Reply& reply, std::span<const int> fds) {
  return wire::send_frame(sock, encode_reply(reply), fds);
}

Result<ReceivedReply> recv_reply(int sock, int timeout_ms) {
  auto frame = wire::recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  auto reply = decode_reply(frame->payload);
  if (!reply) return reply.error();
  return ReceivedReply{std::move(*reply), std::move(frame->fds)};
}

}  // namespace phos::agent
