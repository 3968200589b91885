// CUDA IPC between processes, served by phos (cuIpcGetMemHandle,
// cuIpcOpenMemHandle, cuIpcCloseMemHandle; the runtime's cudaIpc* reach
// these through cuGetProcAddress). A handle names a phos allocation of the
// exporting process and that process's agent (ipc_handle.h); opening it asks
// that agent for the allocation's fd (agent.proto IpcOpenRequest) and maps
// the same physical memory here, so the driver never sees an IPC mapping and
// its checkpoint of either process succeeds. A dump stores such memory once,
// in its owner's image (the plugin's checkpoint.cc). Event IPC: below.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "driver/driver.h"
#include "phos/hooks/stderr_line.h"
#include "phos/hooks/agent.h"
#include "phos/images/agent_protocol.h"
#include "phos/images/agent_wire.h"
#include "phos/images/ipc_handle.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
namespace agent = phos::agent;

namespace {

// What the IPC hooks use: the gate, the device memory, and the calls that
// make a checkpoint impossible (a handle phos did not make).
struct IpcDeps : RuntimeView {
  using RuntimeView::gate;
  using RuntimeView::memory;
  using RuntimeView::unsupported;
};

constexpr int kAgentTimeoutMs = 10000;

// One request to the agent `name` (abstract, in our network namespace), as
// a short session of its own: hello, the request, goodbye.
phos::Result<agent::ReceivedReply> ask_agent(const std::string& name, const agent::Request& q) {
  phos::UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return phos::errno_error("socket");
  struct sockaddr_un addr;
  socklen_t len = phos::wire::abstract_socket_address(name, addr);
  if (len == 0 || ::connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), len) != 0)
    return phos::errno_error("connect to agent @" + name);
  PHOS_TRY(agent::send_request(sock.get(), agent::Hello{.protocol_version = agent::kProtocolVersion,
                                                        .client_version = PHOS_VERSION}));
  auto hello = agent::recv_reply(sock.get(), kAgentTimeoutMs);
  if (!hello) return hello.error();
  if (const auto* e = std::get_if<phos::Error>(&hello->reply)) return *e;
  PHOS_TRY(agent::send_request(sock.get(), q));
  auto reply = agent::recv_reply(sock.get(), kAgentTimeoutMs);
  if (reply) (void)agent::send_request(sock.get(), agent::GoodbyeRequest{});
  return reply;
}

// The exporter's fd of `h`'s allocation, and the allocation's size.
phos::Result<std::pair<phos::UniqueFd, uint64_t>> fetch(const agent::IpcSource& src) {
  auto got = ask_agent(src.owner_agent, agent::IpcOpenRequest{.allocation = src.owner_allocation});
  if (!got) return got.error();
  if (const auto* e = std::get_if<phos::Error>(&got->reply)) return *e;
  const auto* r = std::get_if<agent::IpcOpenReply>(&got->reply);
  if (!r || got->fds.size() != 1) return phos::make_error("the agent's answer to ipc_open has no fd", EPROTO);
  return std::pair{std::move(got->fds[0]), r->size};
}

agent::IpcSource source_of(const agent::IpcHandle& h) {
  return agent::IpcSource{.owner_pid = h.pid,
                          .owner_allocation = h.allocation,
                          .owner_agent = agent::agent_socket_name(h.pid, h.nonce)};
}

void say(const std::string& what) { stderr_line("phos: %s\n", what.c_str()); }

}  // namespace

extern "C" PHOS_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  const IpcDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcGetMemHandle));
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  const std::string own = own_agent_socket_name();
  const auto nonce = agent::agent_socket_nonce(own);
  const auto block = rt.memory().ipc_block(ptr);
  if (!block || !nonce) {
    // Memory phos does not own (or no agent to serve it): the driver's
    // handle, which a dump cannot take.
    rt.unsupported().note("cuIpcGetMemHandle");
    return PHOS_REAL(cuIpcGetMemHandle)(handle, ptr);
  }
  const auto bytes = agent::encode_ipc_handle(agent::IpcHandle{
      .pid = ::getpid(), .nonce = *nonce, .allocation = block->unit, .offset = block->offset, .size = block->size});
  static_assert(sizeof(handle->reserved) == agent::kIpcHandleBytes);
  std::memcpy(handle->reserved, bytes.data(), bytes.size());
  return CUDA_SUCCESS;
}

extern "C" PHOS_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle, unsigned int flags) {
  const IpcDeps rt;
  const auto h = agent::decode_ipc_handle(reinterpret_cast<const uint8_t*>(handle.reserved));
  if (!h) {
    GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcOpenMemHandle_v2));
    rt.unsupported().note("cuIpcOpenMemHandle");
    return PHOS_REAL(cuIpcOpenMemHandle_v2)(dptr, handle, flags);
  }
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  const agent::IpcSource src = source_of(*h);
  // The driver refuses a process's own handle too (the agent names the
  // process: pids repeat across pid namespaces).
  if (src.owner_agent == own_agent_socket_name()) return CUDA_ERROR_INVALID_CONTEXT;
  {
    GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcOpenMemHandle_v2));
    if (rt.memory().ipc_reopen(src, h->offset, dptr)) return CUDA_SUCCESS;
  }
  // The exporter's agent is asked outside the gate: a dump that holds that
  // agent must not find this process inside a CUDA call meanwhile.
  auto fetched = fetch(src);
  if (!fetched) {
    say("cuIpcOpenMemHandle: allocation " + std::to_string(h->allocation) + " of process " + std::to_string(h->pid) +
        ": " + fetched.error().message);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcOpenMemHandle_v2));
  if (rt.memory().ipc_reopen(src, h->offset, dptr)) return CUDA_SUCCESS;  // another thread was first
  return rt.memory().ipc_import(src, fetched->first.get(), fetched->second, h->offset, dptr);
}

extern "C" PHOS_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  const IpcDeps rt;
  bool last = false;
  agent::IpcSource src;
  {
    GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcCloseMemHandle));
    if (!rt.memory().ipc_close(dptr, &last, &src)) return PHOS_REAL(cuIpcCloseMemHandle)(dptr);
  }
  // The exporter stops counting this process among its importers (a dump
  // of it alone is possible again); best effort: it may have ended.
  if (last) {
    auto told = ask_agent(src.owner_agent, agent::IpcCloseRequest{.allocation = src.owner_allocation});
    if (!told)
      say("cuIpcCloseMemHandle: tell process " + std::to_string(src.owner_pid) + ": " + told.error().message);
  }
  return CUDA_SUCCESS;
}

// Events. CUDA lets either process record an interprocess event and the
// other wait on it (cuStreamWaitEvent, cuEventSynchronize, cuEventQuery), a
// wait standing for the event's latest record at the time of the wait. The
// driver never holds an interprocess event here (its checkpoint could not
// take one): cuEventCreate drops CU_EVENT_INTERPROCESS, and phos serves
// event IPC by making every record of an interprocess event (the exporter's,
// or the opener's stand-in) complete before it returns: the real record,
// then cuEventSynchronize. That is exact: another process can only know
// that a record happened through something the recorder does after its
// record call returned (a message, a write), and by then the work before
// the record is done; so a wait on its own event in the other process (the
// exporter's, or the stand-in, complete from the start) waits for all that
// CUDA would make it wait for. The same holds for an event shared once
// (torch.multiprocessing sends one with each CUDA tensor) and for one
// recorded again and again for the other process to wait on each time.
// Cost: a host wait per record of an interprocess event, none for other
// events (one load of a count while the process has none). Not served: a
// record whose earlier work waits for the other process to act after it
// hears of that record (it would wait forever); and records no call could
// complete, made later by a graph's launch (a stream capture's, an event
// record node's): refused at the call, saying why, rather than left to
// give the other process a wait that waits for nothing.
namespace {

// What the event hooks use.
struct EventDeps : RuntimeView {
  using RuntimeView::captures;
  using RuntimeView::gate;
  using RuntimeView::interprocess_events;
  using RuntimeView::unsupported;
};

CUresult refuse_graph_record(const char* call, CUresult r) {
  say(std::string(call) + ": an interprocess event recorded by a CUDA graph is not supported (phos serves event "
      "IPC by completing each record at its call; a graph records when it runs)");
  return r;
}

// cuEventSynchronize is unsafe while a stream is captured: where another
// thread captures in global mode (torch's default) it would fail and
// invalidate that capture. This thread's mode is relaxed for the wait (the
// record's stream is not capturing: the wait is for work already queued).
CUresult synchronize_beside_captures(const EventDeps& rt, CUevent event) {
  auto exchange = PHOS_REAL(cuThreadExchangeStreamCaptureMode);
  if (!rt.captures().any() || !exchange) return PHOS_REAL(cuEventSynchronize)(event);
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult r = exchange(&mode);
  if (r != CUDA_SUCCESS) {
    say(std::string("cuThreadExchangeStreamCaptureMode (to relaxed, for the wait of an interprocess event's record): ") +
        cu_name(r));
    return r;
  }
  r = PHOS_REAL(cuEventSynchronize)(event);
  if (CUresult back = exchange(&mode); back != CUDA_SUCCESS)
    say(std::string("cuThreadExchangeStreamCaptureMode (back to the thread's own mode): ") + cu_name(back));
  return r;
}

// A record of interprocess `event` on `stream` (`record()`, the real one),
// complete when it returns.
template <class Record>
CUresult record_interprocess(const EventDeps& rt, CUevent event, CUstream stream, bool per_thread, const char* call,
                             Record&& record) {
  if (rt.captures().capturing(stream, per_thread))
    return refuse_graph_record(call, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUresult r = record();
  if (r != CUDA_SUCCESS) return r;
  r = synchronize_beside_captures(rt, event);
  if (r != CUDA_SUCCESS) say(std::string(call) + ": waiting for the record of an interprocess event: " + cu_name(r));
  return r;
}

// The event a generic graph node's parameters record, if any.
CUevent recorded_by(const CUgraphNodeParams* p) {
  return p && p->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? p->eventRecord.event : nullptr;
}

}  // namespace

extern "C" PHOS_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  const EventDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuEventCreate));
  const bool interprocess = flags & CU_EVENT_INTERPROCESS;
  // As the driver: an interprocess event keeps no timing.
  if (interprocess && !(flags & CU_EVENT_DISABLE_TIMING)) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_REAL(cuEventCreate)(event, flags & ~unsigned(CU_EVENT_INTERPROCESS));
  if (r == CUDA_SUCCESS && interprocess) rt.interprocess_events().add(*event);
  return r;
}

#define PHOS_EVENT_RECORD_HOOK(name, per_thread, params, args)                                        \
  extern "C" PHOS_EXPORT CUresult name params {                                                        \
    const EventDeps rt;                                                                                \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));                                                    \
    auto real = PHOS_REAL(name);                                                                       \
    if (!real) return CUDA_ERROR_NOT_FOUND;                                                            \
    if (!rt.interprocess_events().contains(event)) return real args;                                   \
    return record_interprocess(rt, event, stream, per_thread, #name, [&] { return real args; });       \
  }
PHOS_EVENT_RECORD_HOOK(cuEventRecord, false, (CUevent event, CUstream stream), (event, stream))
PHOS_EVENT_RECORD_HOOK(cuEventRecord_ptsz, true, (CUevent event, CUstream stream), (event, stream))
PHOS_EVENT_RECORD_HOOK(cuEventRecordWithFlags, false, (CUevent event, CUstream stream, unsigned int flags),
                       (event, stream, flags))
PHOS_EVENT_RECORD_HOOK(cuEventRecordWithFlags_ptsz, true, (CUevent event, CUstream stream, unsigned int flags),
                       (event, stream, flags))

// A graph's event record nodes: refused for an interprocess event.
#define PHOS_GRAPH_RECORD_HOOK(name, params, args, event)                                        \
  extern "C" PHOS_EXPORT CUresult name params {                                                  \
    const EventDeps rt;                                                                          \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));                                              \
    if (rt.interprocess_events().contains(event))                                                \
      return refuse_graph_record(#name, CUDA_ERROR_NOT_SUPPORTED);                               \
    auto real = PHOS_REAL(name);                                                                 \
    return real ? real args : CUDA_ERROR_NOT_FOUND;                                              \
  }
PHOS_GRAPH_RECORD_HOOK(cuGraphAddEventRecordNode,
                       (CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t n, CUevent event),
                       (node, graph, deps, n, event), event)
PHOS_GRAPH_RECORD_HOOK(cuGraphEventRecordNodeSetEvent, (CUgraphNode node, CUevent event), (node, event), event)
PHOS_GRAPH_RECORD_HOOK(cuGraphExecEventRecordNodeSetEvent, (CUgraphExec exec, CUgraphNode node, CUevent event),
                       (exec, node, event), event)
PHOS_GRAPH_RECORD_HOOK(cuGraphAddNode_v2,
                       (CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* data,
                        size_t n, CUgraphNodeParams* p),
                       (node, graph, deps, data, n, p), recorded_by(p))
PHOS_GRAPH_RECORD_HOOK(cuGraphNodeSetParams, (CUgraphNode node, CUgraphNodeParams* p), (node, p), recorded_by(p))
PHOS_GRAPH_RECORD_HOOK(cuGraphExecNodeSetParams, (CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* p),
                       (exec, node, p), recorded_by(p))

namespace {
// `event` destroyed by `real`, the driver's cuEventDestroy_v2 or its
// unversioned one: both counted as cuEventDestroy_v2, the driver's time
// outside phos's (forwarded_call), as PHOS_REAL's calls are.
using EventDestroyFn = CUresult (*)(CUevent);
CUresult destroy_event(EventDestroyFn real, CUevent event) {
  const EventDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuEventDestroy_v2));
  if (!real) return CUDA_ERROR_NOT_FOUND;
  // Forgotten first: once the driver destroyed it, another thread may get
  // the same handle for an event of its own.
  rt.interprocess_events().forget(event);
  return forwarded_call(PHOS_CALL_KIND(cuEventDestroy_v2), [&] { return real(event); });
}
}  // namespace

extern "C" PHOS_EXPORT CUresult cuEventDestroy_v2(CUevent event) {
  return destroy_event(driver::real_as<EventDestroyFn>(driver::Fn::cuEventDestroy_v2), event);
}

// The same, reached through cuGetProcAddress below CUDA 4.0 (or dlsym).
extern "C" PHOS_EXPORT CUresult phos_cuEventDestroy_v1(CUevent event) {
  return destroy_event(reinterpret_cast<EventDestroyFn>(driver::real_event_destroy_v1()), event);
}

// A context destroyed or reset destroys its events: which of the set were
// its is not known here, so the whole set is forgotten.
#define PHOS_CONTEXT_END_HOOK(name, params, args)             \
  extern "C" PHOS_EXPORT CUresult name params {                \
    const EventDeps rt;                                        \
    GatePass pass(rt.gate(), PHOS_CALL_KIND(name));            \
    auto real = PHOS_REAL(name);                               \
    if (!real) return CUDA_ERROR_NOT_FOUND;                    \
    CUresult r = real args;                                    \
    if (r == CUDA_SUCCESS) rt.interprocess_events().clear();   \
    return r;                                                  \
  }
PHOS_CONTEXT_END_HOOK(cuCtxDestroy_v2, (CUcontext ctx), (ctx))
PHOS_CONTEXT_END_HOOK(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))

// The handle names no driver event (the opener makes a stand-in of its own).
// An event phos did not see created interprocess is one from now on; its
// last record may still be under way, so it is waited for here.
extern "C" PHOS_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  const EventDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcGetEventHandle));
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  rt.interprocess_events().add(event);
  CUresult r = PHOS_REAL(cuEventSynchronize)(event);
  if (r != CUDA_SUCCESS) return r;
  const auto bytes = agent::encode_ipc_event_handle(::getpid());
  static_assert(sizeof(handle->reserved) == agent::kIpcHandleBytes);
  std::memcpy(handle->reserved, bytes.data(), bytes.size());
  return CUDA_SUCCESS;
}

// The opener's stand-in: an event never recorded, which stands for no work
// (complete for any wait), until the opener records it itself.
extern "C" PHOS_EXPORT CUresult cuIpcOpenEventHandle(CUevent* event, CUipcEventHandle handle) {
  const EventDeps rt;
  GatePass pass(rt.gate(), PHOS_CALL_KIND(cuIpcOpenEventHandle));
  if (!agent::decode_ipc_event_handle(reinterpret_cast<const uint8_t*>(handle.reserved))) {
    rt.unsupported().note("cuIpcOpenEventHandle (an event handle phos did not make)");
    return PHOS_REAL(cuIpcOpenEventHandle)(event, handle);
  }
  if (!event) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = PHOS_REAL(cuEventCreate)(event, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) rt.interprocess_events().add(*event);
  return r;
}
