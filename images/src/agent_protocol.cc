#include "phos/images/agent_protocol.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <variant>

#include "agent.pb-c.h"
#include "agent_pb.h"
#include "pb_codec.h"

namespace phos::agent {
namespace {

using pb::c_text;
using pb::text;

// --- requests ---

// The Request with `body` as `kind` of its oneof, packed.
template <class Body>
std::vector<std::byte> request(Phos__Agent__Request__KindCase kind, Body* Phos__Agent__Request::*field, Body& body) {
  Phos__Agent__Request envelope = PHOS__AGENT__REQUEST__INIT;
  return pb::pack_oneof(envelope, kind, field, body);
}

std::vector<std::byte> encode(const Hello& h) {
  Phos__Agent__Hello m = PHOS__AGENT__HELLO__INIT;
  m.protocol_version = h.protocol_version;
  m.client_version = c_text(h.client_version);
  return request(PHOS__AGENT__REQUEST__KIND_HELLO, &Phos__Agent__Request::hello, m);
}

std::vector<std::byte> encode(const StatusRequest&) {
  Phos__Agent__StatusRequest m = PHOS__AGENT__STATUS_REQUEST__INIT;
  return request(PHOS__AGENT__REQUEST__KIND_STATUS, &Phos__Agent__Request::status, m);
}

std::vector<std::byte> encode(const ListAllocationsRequest& q) {
  Phos__Agent__ListAllocationsRequest m = PHOS__AGENT__LIST_ALLOCATIONS_REQUEST__INIT;
  m.first_index = q.first_index;
  m.max_count = q.max_count;
  m.with_fds = q.with_fds;
  return request(PHOS__AGENT__REQUEST__KIND_LIST_ALLOCATIONS, &Phos__Agent__Request::list_allocations, m);
}

std::vector<std::byte> encode(const QuiesceRequest& q) {
  Phos__Agent__QuiesceRequest m = PHOS__AGENT__QUIESCE_REQUEST__INIT;
  m.timeout_ms = q.timeout_ms;
  return request(PHOS__AGENT__REQUEST__KIND_QUIESCE, &Phos__Agent__Request::quiesce, m);
}

std::vector<std::byte> encode(const ReleaseMappingsRequest& q) {
  Phos__Agent__ReleaseMappingsRequest m = PHOS__AGENT__RELEASE_MAPPINGS_REQUEST__INIT;
  pb::set_present(m.has_release_handles, m.release_handles, q.release_handles);
  return request(PHOS__AGENT__REQUEST__KIND_RELEASE_MAPPINGS, &Phos__Agent__Request::release_mappings, m);
}

std::vector<std::byte> encode(const RemapRequest& q) {
  Phos__Agent__RemapRequest m = PHOS__AGENT__REMAP_REQUEST__INIT;
  pb::set_repeated(m.n_allocation_ids, m.allocation_ids, q.allocation_ids);
  return request(PHOS__AGENT__REQUEST__KIND_REMAP, &Phos__Agent__Request::remap, m);
}

std::vector<std::byte> encode(const ResumeRequest& q) {
  Phos__Agent__ResumeRequest m = PHOS__AGENT__RESUME_REQUEST__INIT;
  pb::set_optional(m.has_nccl_nonce, m.nccl_nonce, q.nccl_nonce);
  return request(PHOS__AGENT__REQUEST__KIND_RESUME, &Phos__Agent__Request::resume, m);
}

std::vector<std::byte> encode(const GoodbyeRequest&) {
  Phos__Agent__GoodbyeRequest m = PHOS__AGENT__GOODBYE_REQUEST__INIT;
  return request(PHOS__AGENT__REQUEST__KIND_GOODBYE, &Phos__Agent__Request::goodbye, m);
}

std::vector<std::byte> encode(const SpeculateRequest& q) {
  Phos__Agent__SpeculateRequest m = PHOS__AGENT__SPECULATE_REQUEST__INIT;
  m.on = q.on;
  pb::set_optional(m.has_validate, m.validate, q.validate);
  return request(PHOS__AGENT__REQUEST__KIND_SPECULATE, &Phos__Agent__Request::speculate, m);
}

std::vector<std::byte> encode(const OpenCopyWindowRequest& q) {
  Phos__Agent__OpenCopyWindowRequest m = PHOS__AGENT__OPEN_COPY_WINDOW_REQUEST__INIT;
  m.trust = uint32_t(q.trust);
  m.timeout_ms = q.timeout_ms;
  pb::Repeated<Phos__Agent__CopyPool> pools(phos__agent__copy_pool__init, q.pools,
                                            [](const CopyPool& in, Phos__Agent__CopyPool& o) {
                                              o.device = in.device;
                                              o.bytes = in.bytes;
                                              o.slots = in.slots;
                                            });
  pools.set(m.n_pools, m.pools);
  return request(PHOS__AGENT__REQUEST__KIND_OPEN_COPY_WINDOW, &Phos__Agent__Request::open_copy_window, m);
}

std::vector<std::byte> encode(const CloseCopyWindowRequest& q) {
  Phos__Agent__CloseCopyWindowRequest m = PHOS__AGENT__CLOSE_COPY_WINDOW_REQUEST__INIT;
  pb::set_present(m.has_missed, m.missed, q.missed);
  auto chunks = pb::Repeated<Phos__Agent__AddressRange>(phos__agent__address_range__init, q.missed_chunks,
                                                        [](const AddressRange& a, Phos__Agent__AddressRange& o) {
                                                          o.address = a.address;
                                                          o.bytes = a.bytes;
                                                        });
  chunks.set(m.n_missed_chunks, m.missed_chunks);
  return request(PHOS__AGENT__REQUEST__KIND_CLOSE_COPY_WINDOW, &Phos__Agent__Request::close_copy_window, m);
}

std::vector<std::byte> encode(const NcclStopRequest& q) {
  Phos__Agent__NcclStopRequest m = PHOS__AGENT__NCCL_STOP_REQUEST__INIT;
  m.job_id = q.job_id;
  pb::set_optional(m.has_at_call, m.at_call, q.at_call);
  pb::set_optional(m.has_pend_release, m.pend_release, q.pend_release);
  pb::set_optional(m.has_lease_ms, m.lease_ms, q.lease_ms);
  return request(PHOS__AGENT__REQUEST__KIND_NCCL_STOP, &Phos__Agent__Request::nccl_stop, m);
}

std::vector<std::byte> encode(const IpcOpenRequest& q) {
  Phos__Agent__IpcOpenRequest m = PHOS__AGENT__IPC_OPEN_REQUEST__INIT;
  m.allocation = q.allocation;
  return request(PHOS__AGENT__REQUEST__KIND_IPC_OPEN, &Phos__Agent__Request::ipc_open, m);
}

std::vector<std::byte> encode(const IpcCloseRequest& q) {
  Phos__Agent__IpcCloseRequest m = PHOS__AGENT__IPC_CLOSE_REQUEST__INIT;
  m.allocation = q.allocation;
  return request(PHOS__AGENT__REQUEST__KIND_IPC_CLOSE, &Phos__Agent__Request::ipc_close, m);
}

Result<Request> decode(const Phos__Agent__OpenCopyWindowRequest& q) {
  if (q.trust < uint32_t(CopyTrust::kExact) || q.trust > uint32_t(CopyTrust::kChecksum))
    return pb::malformed("request", "open copy window: trust " + std::to_string(q.trust) + " is none of 1, 2, 3, 4");
  if (q.n_pools > kMaxCopyPools)
    return pb::malformed("request", "open copy window: " + std::to_string(q.n_pools) + " pools, more than " +
                                        std::to_string(kMaxCopyPools));
  std::vector<CopyPool> pools;
  for (size_t i = 0; i < q.n_pools; i++) {
    const Phos__Agent__CopyPool& p = *q.pools[i];
    for (const CopyPool& seen : pools)
      if (seen.device == p.device)
        return pb::malformed("request", "open copy window: two pools on device " + std::to_string(p.device));
    pools.push_back(CopyPool{.device = p.device, .bytes = p.bytes, .slots = p.slots});
  }
  return Request(OpenCopyWindowRequest{.trust = CopyTrust(q.trust), .timeout_ms = q.timeout_ms, .pools = std::move(pools)});
}

Result<Request> decode(const Phos__Agent__Request& r) {
  switch (r.kind_case) {
    case PHOS__AGENT__REQUEST__KIND_HELLO:
      return Request(
          Hello{.protocol_version = r.hello->protocol_version, .client_version = text(r.hello->client_version)});
    case PHOS__AGENT__REQUEST__KIND_STATUS:
      return Request(StatusRequest{});
    case PHOS__AGENT__REQUEST__KIND_LIST_ALLOCATIONS: {
      const auto& q = *r.list_allocations;
      return Request(
          ListAllocationsRequest{.first_index = q.first_index, .max_count = q.max_count, .with_fds = q.with_fds != 0});
    }
    case PHOS__AGENT__REQUEST__KIND_QUIESCE:
      return Request(QuiesceRequest{.timeout_ms = r.quiesce->timeout_ms});
    case PHOS__AGENT__REQUEST__KIND_RELEASE_MAPPINGS: {
      const auto& q = *r.release_mappings;
      return Request(ReleaseMappingsRequest{.release_handles = pb::flag(q.has_release_handles, q.release_handles)});
    }
    case PHOS__AGENT__REQUEST__KIND_REMAP:
      return Request(RemapRequest{.allocation_ids = pb::repeated(r.remap->allocation_ids, r.remap->n_allocation_ids)});
    case PHOS__AGENT__REQUEST__KIND_RESUME:
      return Request(ResumeRequest{.nccl_nonce = pb::optional(r.resume->has_nccl_nonce, r.resume->nccl_nonce)});
    case PHOS__AGENT__REQUEST__KIND_GOODBYE:
      return Request(GoodbyeRequest{});
    case PHOS__AGENT__REQUEST__KIND_SPECULATE: {
      const auto& q = *r.speculate;
      return Request(SpeculateRequest{.on = q.on != 0, .validate = pb::optional<bool>(q.has_validate, q.validate)});
    }
    case PHOS__AGENT__REQUEST__KIND_OPEN_COPY_WINDOW:
      return decode(*r.open_copy_window);
    case PHOS__AGENT__REQUEST__KIND_CLOSE_COPY_WINDOW: {
      const auto& q = *r.close_copy_window;
      return Request(CloseCopyWindowRequest{
          .missed = pb::flag(q.has_missed, q.missed),
          .missed_chunks = pb::decode_each(q.missed_chunks, q.n_missed_chunks, [](const Phos__Agent__AddressRange& a) {
            return AddressRange{.address = a.address, .bytes = a.bytes};
          })});
    }
    case PHOS__AGENT__REQUEST__KIND_NCCL_STOP: {
      const auto& q = *r.nccl_stop;
      return Request(NcclStopRequest{.job_id = q.job_id,
                                     .at_call = pb::optional(q.has_at_call, q.at_call),
                                     .pend_release = pb::optional<bool>(q.has_pend_release, q.pend_release),
                                     .lease_ms = pb::optional(q.has_lease_ms, q.lease_ms)});
    }
    case PHOS__AGENT__REQUEST__KIND_IPC_OPEN:
      return Request(IpcOpenRequest{.allocation = r.ipc_open->allocation});
    case PHOS__AGENT__REQUEST__KIND_IPC_CLOSE:
      return Request(IpcCloseRequest{.allocation = r.ipc_close->allocation});
    default:
      break;
  }
  return pb::no_kind_error("request", r.base);
}

// --- replies ---

// The Reply with `body` as `kind` of its oneof, packed.
template <class Body>
std::vector<std::byte> reply(Phos__Agent__Reply__KindCase kind, Body* Phos__Agent__Reply::*field, Body& body) {
  Phos__Agent__Reply envelope = PHOS__AGENT__REPLY__INIT;
  return pb::pack_oneof(envelope, kind, field, body);
}

std::vector<std::byte> encode(const HelloReply& h) {
  Phos__Agent__HelloReply m = PHOS__AGENT__HELLO_REPLY__INIT;
  m.protocol_version = h.protocol_version;
  m.agent_version = c_text(h.agent_version);
  m.pid = h.pid;
  m.agent_tid = h.agent_tid;
  m.uid = h.uid;
  return reply(PHOS__AGENT__REPLY__KIND_HELLO, &Phos__Agent__Reply::hello, m);
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
  pb::Repeated<Phos__Agent__Counter> counters;
  std::vector<std::vector<char*>> functions, globals;  // per module
  pb::Repeated<Phos__Agent__Module> modules;
  pb::Repeated<Phos__Agent__KernelSpeculation> kernels;
  pb::Repeated<Phos__Gpu__Device> devices;
  pb::Repeated<Phos__Agent__NcclCommunicator> comms;
  Phos__Agent__CallCycles call_cycles = PHOS__AGENT__CALL_CYCLES__INIT;
  pb::Repeated<Phos__Agent__CallCost> call_costs;
  pb::Repeated<Phos__Agent__IpcExport> ipc_exports;

  explicit PbStatus(const StatusReply& s) {
    m.gate_open = s.gate_open;
    m.cuda_initialized = s.cuda_initialized;
    m.allocation_count = s.allocation_count;
    m.allocated_bytes = s.allocated_bytes;
    m.device_count = s.device_count;
    pb::set_strings(m.n_unsupported_calls, m.unsupported_calls, s.unsupported_calls, unsupported);
    counters = pb::Repeated<Phos__Agent__Counter>(phos__agent__counter__init, s.counters,
                                                  [](const auto& c, Phos__Agent__Counter& o) {
                                                    o.name = c_text(c.first);
                                                    o.value = c.second;
                                                  });
    counters.set(m.n_counters, m.counters);
    add_modules(s);
    pb::set_present(m.has_speculation_active, m.speculation_active, s.speculation_active);
    pb::set_present(m.has_indexed_buffers, m.indexed_buffers, s.indexed_buffers);
    pb::set_present(m.has_kernel_count, m.kernel_count, std::max<uint64_t>(s.kernel_count, s.kernels.size()));
    pb::set_present(m.has_validation_active, m.validation_active, s.validation_active);
    pb::set_present(m.has_cow_missed, m.cow_missed, s.cow_missed);
    kernels = pb::Repeated<Phos__Agent__KernelSpeculation>(phos__agent__kernel_speculation__init,
                                                           kernels_to_send(s.kernels), encode_kernel);
    kernels.set(m.n_kernels, m.kernels);
    devices = pb::Repeated<Phos__Gpu__Device>(phos__gpu__device__init, s.devices,
                                              [](const GpuDevice& d, Phos__Gpu__Device& o) { pb::to_pb(d, o); });
    devices.set(m.n_devices, m.devices);
    comms = pb::Repeated<Phos__Agent__NcclCommunicator>(phos__agent__nccl_communicator__init, s.nccl_communicators,
                                                        encode_communicator);
    comms.set(m.n_nccl_communicators, m.nccl_communicators);
    ipc_exports = pb::Repeated<Phos__Agent__IpcExport>(phos__agent__ipc_export__init, s.ipc_exports,
                                                       [](const IpcExport& e, Phos__Agent__IpcExport& o) {
                                                         o.allocation = e.allocation;
                                                         o.importer_pid = e.importer_pid;
                                                       });
    ipc_exports.set(m.n_ipc_exports, m.ipc_exports);
    if (s.call_cycles) {
      call_cycles.cycles_per_second = s.call_cycles->cycles_per_second;
      pb::set_present(call_cycles.has_floor_cycles_per_call, call_cycles.floor_cycles_per_call,
                      s.call_cycles->floor_cycles_per_call);
      call_costs = pb::Repeated<Phos__Agent__CallCost>(phos__agent__call_cost__init, s.call_cycles->calls,
                                                       [](const CallCost& c, Phos__Agent__CallCost& o) {
                                                         o.call = c_text(c.call);
                                                         o.calls = c.calls;
                                                         o.cycles = c.cycles;
                                                         o.ns = c.ns;
                                                       });
      call_costs.set(call_cycles.n_calls, call_cycles.calls);
      m.call_cycles = &call_cycles;
    }
  }

  static void encode_communicator(const NcclCommunicatorStatus& c, Phos__Agent__NcclCommunicator& o) {
    o.rank = c.rank;
    o.nranks = c.nranks;
    o.device = c.device;
    o.job_id = c.job_id;
    o.calls = c.calls;
    pb::set_present(o.has_single_process, o.single_process, c.single_process);
    pb::set_optional(o.has_stop_at, o.stop_at, c.stop_at);
    pb::set_present(o.has_held, o.held, c.held);
    pb::set_present(o.has_released, o.released, c.released);
    pb::set_present(o.has_rebuilds, o.rebuilds, c.rebuilds);
  }

  void add_modules(const StatusReply& s) {
    functions.resize(s.modules.size());
    globals.resize(s.modules.size());
    size_t i = 0;
    modules = pb::Repeated<Phos__Agent__Module>(phos__agent__module__init, s.modules,
                                                [&](const Module& in, Phos__Agent__Module& o) {
                                                  encode_module(in, o, functions[i], globals[i]);
                                                  i++;
                                                });
    modules.set(m.n_modules, m.modules);
  }

  // `names` and `global_names` keep the module's strings while it is packed.
  static void encode_module(const Module& in, Phos__Agent__Module& o, std::vector<char*>& names,
                            std::vector<char*>& global_names) {
    o.id = in.id;
    o.kind = c_text(in.kind);
    o.size = in.size;
    o.hash = in.hash;
    o.source = c_text(in.source);
    for (size_t f = 0; f < std::min(in.functions.size(), kMaxModuleFunctions); f++)
      names.push_back(c_text(in.functions[f]));
    o.n_functions = names.size();
    o.functions = names.data();
    o.function_count = std::max<uint64_t>(in.function_count, in.functions.size());
    pb::set_strings(o.n_globals, o.globals, in.globals, global_names);
  }

  static void encode_kernel(const KernelSpeculation* k, Phos__Agent__KernelSpeculation& o) {
    o.name = c_text(k->name);
    o.module = k->module;
    o.launches = k->launches;
    o.exact = k->exact;
    o.speculated = k->speculated;
    o.unknown = k->unknown;
    o.buffers = k->buffers;
    o.reads = k->reads;
    o.writes = k->writes;
    o.types = c_text(k->types);
    o.note = pb::c_text_or_null(k->note);
  }
};

std::vector<std::byte> encode(const StatusReply& s) {
  PbStatus pb(s);
  return reply(PHOS__AGENT__REPLY__KIND_STATUS, &Phos__Agent__Reply::status, pb.m);
}

std::vector<std::byte> encode(const ListAllocationsReply& r) {
  Phos__Agent__ListAllocationsReply m = PHOS__AGENT__LIST_ALLOCATIONS_REPLY__INIT;
  auto allocations = pb::allocations_to_pb(r.allocations);
  allocations.set(m.n_allocations, m.allocations);
  m.total_count = r.total_count;
  return reply(PHOS__AGENT__REPLY__KIND_LIST_ALLOCATIONS, &Phos__Agent__Reply::list_allocations, m);
}

std::vector<std::byte> encode(const QuiesceReply& r) {
  Phos__Agent__QuiesceReply m = PHOS__AGENT__QUIESCE_REPLY__INIT;
  m.drained_ns = r.drained_ns;
  m.has_at_step = r.at_step;  // only where true, as agents have always sent it
  m.at_step = r.at_step;
  pb::set_repeated(m.n_touch_order, m.touch_order, r.touch_order);
  const std::vector<uint64_t> dead = dead::to_pairs(r.dead);
  pb::set_repeated(m.n_dead_ranges, m.dead_ranges, dead);
  m.has_dead_dropped_calls = r.dead_dropped_calls > 0;
  m.dead_dropped_calls = r.dead_dropped_calls;
  // Both only where something was released.
  m.has_nccl_released = m.has_nccl_release_ns = r.nccl_released > 0;
  m.nccl_released = r.nccl_released;
  m.nccl_release_ns = r.nccl_release_ns;
  return reply(PHOS__AGENT__REPLY__KIND_QUIESCE, &Phos__Agent__Reply::quiesce, m);
}

std::vector<std::byte> encode(const ReleaseMappingsReply& r) {
  Phos__Agent__ReleaseMappingsReply m = PHOS__AGENT__RELEASE_MAPPINGS_REPLY__INIT;
  m.released_bytes = r.released_bytes;
  return reply(PHOS__AGENT__REPLY__KIND_RELEASE_MAPPINGS, &Phos__Agent__Reply::release_mappings, m);
}

std::vector<std::byte> encode(const RemapReply& r) {
  Phos__Agent__RemapReply m = PHOS__AGENT__REMAP_REPLY__INIT;
  m.mapped_bytes = r.mapped_bytes;
  return reply(PHOS__AGENT__REPLY__KIND_REMAP, &Phos__Agent__Reply::remap, m);
}

std::vector<std::byte> encode(const ResumeReply&) {
  Phos__Agent__ResumeReply m = PHOS__AGENT__RESUME_REPLY__INIT;
  return reply(PHOS__AGENT__REPLY__KIND_RESUME, &Phos__Agent__Reply::resume, m);
}

std::vector<std::byte> encode(const GoodbyeReply&) {
  Phos__Agent__GoodbyeReply m = PHOS__AGENT__GOODBYE_REPLY__INIT;
  return reply(PHOS__AGENT__REPLY__KIND_GOODBYE, &Phos__Agent__Reply::goodbye, m);
}

std::vector<std::byte> encode(const SpeculateReply& r) {
  Phos__Agent__SpeculateReply m = PHOS__AGENT__SPECULATE_REPLY__INIT;
  // Both, or neither (a reply to a request without `validate`).
  if (r.validating) {
    pb::set_present(m.has_validating, m.validating, *r.validating);
    pb::set_present(m.has_sass_attached, m.sass_attached, r.sass_attached);
  }
  return reply(PHOS__AGENT__REPLY__KIND_SPECULATE, &Phos__Agent__Reply::speculate, m);
}

std::vector<std::byte> encode(const OpenCopyWindowReply& r) {
  Phos__Agent__OpenCopyWindowReply m = PHOS__AGENT__OPEN_COPY_WINDOW_REPLY__INIT;
  m.validating = r.validating;
  return reply(PHOS__AGENT__REPLY__KIND_OPEN_COPY_WINDOW, &Phos__Agent__Reply::open_copy_window, m);
}

std::vector<std::byte> encode(const NcclStopReply& r) {
  Phos__Agent__NcclStopReply m = PHOS__AGENT__NCCL_STOP_REPLY__INIT;
  m.armed = r.armed;
  return reply(PHOS__AGENT__REPLY__KIND_NCCL_STOP, &Phos__Agent__Reply::nccl_stop, m);
}

std::vector<std::byte> encode(const IpcOpenReply& r) {
  Phos__Agent__IpcOpenReply m = PHOS__AGENT__IPC_OPEN_REPLY__INIT;
  m.size = r.size;
  m.device = r.device;
  return reply(PHOS__AGENT__REPLY__KIND_IPC_OPEN, &Phos__Agent__Reply::ipc_open, m);
}

std::vector<std::byte> encode(const IpcCloseReply&) {
  Phos__Agent__IpcCloseReply m = PHOS__AGENT__IPC_CLOSE_REPLY__INIT;
  return reply(PHOS__AGENT__REPLY__KIND_IPC_CLOSE, &Phos__Agent__Reply::ipc_close, m);
}

void fill_call_wait(const CallWait& w, Phos__Agent__CallWait& o) {
  o.call = c_text(w.call);
  o.kernel = pb::c_text_or_null(w.kernel);
  o.wait_ns = w.wait_ns;
  o.chunks_waited = w.chunks_waited;
  o.chunks_saved = w.chunks_saved;
  pb::set_present(o.has_save_ns, o.save_ns, w.save_ns);
  pb::set_present(o.has_engine_wait_ns, o.engine_wait_ns, w.engine_wait_ns);
}

CallWait call_wait(const Phos__Agent__CallWait& w) {
  return CallWait{.call = text(w.call),
                  .kernel = text(w.kernel),
                  .wait_ns = w.wait_ns,
                  .chunks_waited = w.chunks_waited,
                  .chunks_saved = w.chunks_saved,
                  .save_ns = w.has_save_ns ? w.save_ns : 0,
                  .engine_wait_ns = w.has_engine_wait_ns ? w.engine_wait_ns : 0};
}

std::vector<std::byte> encode(const CloseCopyWindowReply& r) {
  Phos__Agent__CloseCopyWindowReply m = PHOS__AGENT__CLOSE_COPY_WINDOW_REPLY__INIT;
  auto kernels = pb::Repeated<Phos__Agent__KernelLaunches>(phos__agent__kernel_launches__init, r.speculated_kernels,
                                                           [](const KernelLaunches& k, Phos__Agent__KernelLaunches& o) {
                                                             o.name = c_text(k.name);
                                                             o.launches = k.launches;
                                                           });
  kernels.set(m.n_speculated_kernels, m.speculated_kernels);
  auto suspects = pb::Repeated<Phos__Agent__KernelLaunches>(phos__agent__kernel_launches__init, r.suspects,
                                                            [](const KernelLaunches& k, Phos__Agent__KernelLaunches& o) {
                                                              o.name = c_text(k.name);
                                                              o.launches = k.launches;
                                                            });
  suspects.set(m.n_suspects, m.suspects);
  auto waits = pb::Repeated<Phos__Agent__CallWait>(phos__agent__call_wait__init, r.longest_waits, fill_call_wait);
  waits.set(m.n_longest_waits, m.longest_waits);
  auto saved = pb::Repeated<Phos__Agent__CallWait>(phos__agent__call_wait__init, r.most_saved, fill_call_wait);
  saved.set(m.n_most_saved, m.most_saved);
  pb::set_present(m.has_speculated_kernel_count, m.speculated_kernel_count,
                  std::max<uint64_t>(r.speculated_kernel_count, r.speculated_kernels.size()));
  pb::set_present(m.has_unmarked_calls, m.unmarked_calls, r.unmarked_calls);
  m.calls_checked = r.counters.calls_checked;
  m.chunks_saved = r.chunks_saved;
  m.calls_waited = r.counters.calls_waited;
  m.unknown_waits = r.counters.unknown_waits;
  m.wait_ns = r.counters.wait_ns;
  m.violations = r.violations;
  m.violation = pb::c_text_or_null(r.violation);
  m.aborted = r.aborted;
  m.abort_reason = pb::c_text_or_null(r.abort_reason);
  return reply(PHOS__AGENT__REPLY__KIND_CLOSE_COPY_WINDOW, &Phos__Agent__Reply::close_copy_window, m);
}

std::vector<std::byte> encode(const Error& e) {
  Phos__Agent__Error m = PHOS__AGENT__ERROR__INIT;
  m.code = e.code;
  m.message = c_text(e.message);
  return reply(PHOS__AGENT__REPLY__KIND_ERROR, &Phos__Agent__Reply::error, m);
}

Result<Module> decode(const Phos__Agent__Module& m) {
  if (m.function_count < m.n_functions)
    return pb::malformed("reply", "status: module " + std::to_string(m.id) + " counts " +
                                      std::to_string(m.function_count) + " functions but names " +
                                      std::to_string(m.n_functions));
  return Module{.id = m.id,
                .kind = text(m.kind),
                .size = m.size,
                .hash = m.hash,
                .source = text(m.source),
                .functions = pb::strings(m.functions, m.n_functions),
                .function_count = m.function_count,
                .globals = pb::strings(m.globals, m.n_globals)};
}

KernelSpeculation decode(const Phos__Agent__KernelSpeculation& k) {
  return KernelSpeculation{.name = text(k.name),
                           .module = k.module,
                           .launches = k.launches,
                           .exact = k.exact,
                           .speculated = k.speculated,
                           .unknown = k.unknown,
                           .buffers = k.buffers,
                           .reads = k.reads,
                           .writes = k.writes,
                           .types = text(k.types),
                           .note = text(k.note)};
}

NcclCommunicatorStatus decode(const Phos__Agent__NcclCommunicator& c) {
  // Absent from an older agent: none of it.
  return NcclCommunicatorStatus{.rank = c.rank,
                                .nranks = c.nranks,
                                .device = c.device,
                                .job_id = c.job_id,
                                .calls = c.calls,
                                .single_process = pb::flag(c.has_single_process, c.single_process),
                                .stop_at = pb::optional(c.has_stop_at, c.stop_at),
                                .held = pb::flag(c.has_held, c.held),
                                .released = pb::flag(c.has_released, c.released),
                                .rebuilds = pb::value_or_zero(c.has_rebuilds, c.rebuilds)};
}

// None where the counter is off (or the agent older).
std::optional<CallCycles> decode_call_cycles(const Phos__Agent__CallCycles* c) {
  if (!c) return std::nullopt;
  return CallCycles{.cycles_per_second = c->cycles_per_second,
                    .calls = pb::decode_each(c->calls, c->n_calls, [](const Phos__Agent__CallCost& k) {
                      return CallCost{.call = text(k.call), .calls = k.calls, .cycles = k.cycles, .ns = k.ns};
                    }),
                    .floor_cycles_per_call = pb::value_or_zero(c->has_floor_cycles_per_call, c->floor_cycles_per_call)};
}

Result<StatusReply> decode(const Phos__Agent__StatusReply& r) {
  auto modules = pb::try_decode_each(r.modules, r.n_modules, [](const Phos__Agent__Module& m) { return decode(m); });
  if (!modules) return modules.error();
  if (r.has_kernel_count && r.kernel_count < r.n_kernels)
    return pb::malformed("reply", "status: kernel count " + std::to_string(r.kernel_count) + " is below the " +
                                      std::to_string(r.n_kernels) + " kernels it carries");
  auto devices = pb::try_decode_each(r.devices, r.n_devices, [](const Phos__Gpu__Device& d) { return pb::from_pb(d); });
  if (!devices) return pb::malformed("reply", "status: " + devices.error().message);
  // Absent from an older agent's reply: speculation and validation off,
  // nothing indexed, no kernels, devices, communicators or call counts.
  return StatusReply{
      .gate_open = r.gate_open != 0,
      .cuda_initialized = r.cuda_initialized != 0,
      .allocation_count = r.allocation_count,
      .allocated_bytes = r.allocated_bytes,
      .device_count = r.device_count,
      .unsupported_calls = pb::strings(r.unsupported_calls, r.n_unsupported_calls),
      .counters = pb::decode_each(r.counters, r.n_counters,
                                  [](const Phos__Agent__Counter& c) { return std::pair(text(c.name), c.value); }),
      .modules = std::move(modules.value()),
      .speculation_active = pb::flag(r.has_speculation_active, r.speculation_active),
      .indexed_buffers = pb::value_or_zero(r.has_indexed_buffers, r.indexed_buffers),
      .kernels =
          pb::decode_each(r.kernels, r.n_kernels, [](const Phos__Agent__KernelSpeculation& k) { return decode(k); }),
      .kernel_count = r.has_kernel_count ? r.kernel_count : r.n_kernels,
      .devices = std::move(devices.value()),
      .validation_active = pb::flag(r.has_validation_active, r.validation_active),
      .nccl_communicators = pb::decode_each(r.nccl_communicators, r.n_nccl_communicators,
                                            [](const Phos__Agent__NcclCommunicator& c) { return decode(c); }),
      .cow_missed = pb::flag(r.has_cow_missed, r.cow_missed),
      .call_cycles = decode_call_cycles(r.call_cycles),
      .ipc_exports = pb::decode_each(r.ipc_exports, r.n_ipc_exports,
                                     [](const Phos__Agent__IpcExport& e) {
                                       return IpcExport{.allocation = e.allocation, .importer_pid = e.importer_pid};
                                     }),
  };
}

Result<ListAllocationsReply> decode(const Phos__Agent__ListAllocationsReply& r) {
  if (r.total_count < r.n_allocations)
    return pb::malformed("reply", "list allocations: " + std::to_string(r.n_allocations) +
                                      " allocations of a total of " + std::to_string(r.total_count));
  return ListAllocationsReply{.allocations = pb::allocations_from_pb(r.allocations, r.n_allocations),
                              .total_count = r.total_count};
}

// Lifts a decoder's Result<T> into a Result<Reply>.
template <class T>
Result<Reply> as_reply(Result<T> r) {
  if (!r) return r.error();
  return Reply(std::move(r.value()));
}

Result<Reply> decode(const Phos__Agent__Reply& r) {
  switch (r.kind_case) {
    case PHOS__AGENT__REPLY__KIND_HELLO: {
      const auto& h = *r.hello;
      return Reply(HelloReply{.protocol_version = h.protocol_version,
                              .agent_version = text(h.agent_version),
                              .pid = h.pid,
                              .agent_tid = h.agent_tid,
                              .uid = h.uid});
    }
    case PHOS__AGENT__REPLY__KIND_STATUS:
      return as_reply(decode(*r.status));
    case PHOS__AGENT__REPLY__KIND_LIST_ALLOCATIONS:
      return as_reply(decode(*r.list_allocations));
    case PHOS__AGENT__REPLY__KIND_QUIESCE: {
      const auto& q = *r.quiesce;
      std::vector<dead::Range> dead;
      if (std::string bad = dead::from_pairs(pb::repeated(q.dead_ranges, q.n_dead_ranges), dead); !bad.empty())
        return pb::malformed("reply", "quiesce: " + bad);
      return Reply(QuiesceReply{.drained_ns = q.drained_ns,
                                .at_step = q.at_step != 0,
                                .touch_order = pb::repeated(q.touch_order, q.n_touch_order),
                                .nccl_released = pb::value_or_zero(q.has_nccl_released, q.nccl_released),
                                .nccl_release_ns = pb::value_or_zero(q.has_nccl_release_ns, q.nccl_release_ns),
                                .dead = std::move(dead),
                                .dead_dropped_calls = pb::value_or_zero(q.has_dead_dropped_calls, q.dead_dropped_calls)});
    }
    case PHOS__AGENT__REPLY__KIND_RELEASE_MAPPINGS:
      return Reply(ReleaseMappingsReply{.released_bytes = r.release_mappings->released_bytes});
    case PHOS__AGENT__REPLY__KIND_REMAP:
      return Reply(RemapReply{.mapped_bytes = r.remap->mapped_bytes});
    case PHOS__AGENT__REPLY__KIND_RESUME:
      return Reply(ResumeReply{});
    case PHOS__AGENT__REPLY__KIND_GOODBYE:
      return Reply(GoodbyeReply{});
    case PHOS__AGENT__REPLY__KIND_SPECULATE: {
      // Absent from an agent older than validation: it did not validate.
      const auto& s = *r.speculate;
      return Reply(SpeculateReply{.validating = pb::optional<bool>(s.has_validating, s.validating),
                                  .sass_attached = pb::flag(s.has_sass_attached, s.sass_attached)});
    }
    case PHOS__AGENT__REPLY__KIND_OPEN_COPY_WINDOW:
      return Reply(OpenCopyWindowReply{.validating = r.open_copy_window->validating != 0});
    case PHOS__AGENT__REPLY__KIND_CLOSE_COPY_WINDOW: {
      const auto& c = *r.close_copy_window;
      return Reply(CloseCopyWindowReply{.counters = {.calls_checked = c.calls_checked,
                                                     .calls_waited = c.calls_waited,
                                                     .unknown_waits = c.unknown_waits,
                                                     .wait_ns = c.wait_ns},
                                        .chunks_saved = c.chunks_saved,
                                        .violations = c.violations,
                                        .violation = text(c.violation),
                                        .aborted = c.aborted != 0,
                                        .abort_reason = text(c.abort_reason),
                                        .speculated_kernels = pb::decode_each(
                                            c.speculated_kernels, c.n_speculated_kernels,
                                            [](const Phos__Agent__KernelLaunches& k) {
                                              return KernelLaunches{.name = text(k.name), .launches = k.launches};
                                            }),
                                        .speculated_kernel_count = c.has_speculated_kernel_count
                                                                       ? c.speculated_kernel_count
                                                                       : c.n_speculated_kernels,
                                        .unmarked_calls = pb::value_or_zero(c.has_unmarked_calls, c.unmarked_calls),
        .suspects = pb::decode_each(c.suspects, c.n_suspects,
                                    [](const Phos__Agent__KernelLaunches& k) {
                                      return KernelLaunches{.name = text(k.name), .launches = k.launches};
                                    }),
        .longest_waits = pb::decode_each(c.longest_waits, c.n_longest_waits, call_wait),
        .most_saved = pb::decode_each(c.most_saved, c.n_most_saved, call_wait)});
    }
    case PHOS__AGENT__REPLY__KIND_NCCL_STOP:
      return Reply(NcclStopReply{.armed = r.nccl_stop->armed != 0});
    case PHOS__AGENT__REPLY__KIND_IPC_OPEN:
      return Reply(IpcOpenReply{.size = r.ipc_open->size, .device = r.ipc_open->device});
    case PHOS__AGENT__REPLY__KIND_IPC_CLOSE:
      return Reply(IpcCloseReply{});
    case PHOS__AGENT__REPLY__KIND_ERROR:
      // A code that is no errno would read as success where it is returned.
      if (r.error->code <= 0)
        return pb::malformed("reply", "error reply with code " + std::to_string(r.error->code) + " (\"" +
                                          text(r.error->message) + "\")");
      return Reply(make_error(text(r.error->message), r.error->code));
    default:
      break;
  }
  return pb::no_kind_error("reply", r.base);
}

}  // namespace

std::vector<std::byte> encode_request(const Request& request) {
  return std::visit([](const auto& q) { return encode(q); }, request);
}

Result<Request> decode_request(std::span<const std::byte> payload) {
  return pb::unpack_and_decode<Phos__Agent__Request>(phos__agent__request__descriptor, payload, "request",
                                                     [](const Phos__Agent__Request& r) { return decode(r); });
}

std::vector<std::byte> encode_reply(const Reply& reply) {
  return std::visit([](const auto& r) { return encode(r); }, reply);
}

Result<Reply> decode_reply(std::span<const std::byte> payload) {
  return pb::unpack_and_decode<Phos__Agent__Reply>(phos__agent__reply__descriptor, payload, "reply",
                                                   [](const Phos__Agent__Reply& r) { return decode(r); });
}

std::string_view kind_name(const Request& request) {
  static constexpr std::string_view names[] = {"hello",  "status", "list_allocations", "quiesce",  "release_mappings",
                                               "remap",  "resume", "goodbye",          "speculate",
                                               "open_copy_window", "close_copy_window", "nccl_stop", "ipc_open",
                                               "ipc_close"};
  static_assert(std::size(names) == std::variant_size_v<Request>);
  return names[request.index()];
}

std::string_view kind_name(const Reply& reply) {
  static constexpr std::string_view names[] = {"hello",  "status", "list_allocations", "quiesce",   "release_mappings",
                                               "remap",  "resume", "goodbye",          "speculate",
                                               "open_copy_window", "close_copy_window", "nccl_stop", "ipc_open",
                                               "ipc_close", "error"};
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
