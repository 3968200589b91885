// The agent protocol's messages (images/proto/agent.proto) as C++ values:
// what the CRIU plugin and phosctl say to the agent inside an application
// that runs with libphos.so, and what it answers. agent_protocol.h encodes,
// sends and receives them; protobuf-c stays inside images/src. Each struct
// is the one name of its concept on both sides: the hooks fill them, the
// plugin reads them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "phos/images/dead_ranges.h"
#include "phos/images/gpu_device.h"
#include "phos/support/result.h"

namespace phos::agent {

inline constexpr uint32_t kProtocolVersion = 1;
// The agent listens on the abstract socket "<prefix><pid>.<nonce>", from a
// thread of this name: the plugin finds it through /proc.
inline constexpr const char* kSocketPrefix = "phos-agent.";
inline constexpr const char* kThreadName = "phos-agent";

// A session starts with Hello; the agent refuses anything else first.
struct Hello {
  uint32_t protocol_version = kProtocolVersion;
  std::string client_version;
  bool operator==(const Hello&) const = default;
};
struct HelloReply {
  uint32_t protocol_version = 0;
  std::string agent_version;
  int32_t pid = 0;        // in the agent's own pid namespace
  int32_t agent_tid = 0;  // likewise
  uint32_t uid = 0;
  bool operator==(const HelloReply&) const = default;
};

struct StatusRequest {
  bool operator==(const StatusRequest&) const = default;
};

// Code the process loaded (a module or library, or a fatbin registered with
// the shared cudart), and what the program took from it.
struct Module {
  uint64_t id = 0;  // the id launch records name
  std::string kind;  // fatbin, cubin, ptx, file, unknown
  uint64_t size = 0;  // bytes of the image; 0 where not known
  uint64_t hash = 0;  // 64-bit hash of those bytes
  std::string source;  // the file, or the call that loaded it
  std::vector<std::string> functions;  // in the order taken; a reply carries at most kMaxModuleFunctions
  uint64_t function_count = 0;  // all of them (at least functions.size())
  std::vector<std::string> globals;
  bool operator==(const Module&) const = default;
};

// One kernel's read/write-set speculation so far: how each launch's set came
// about, how many buffers the sets named, and where the kernel's parameter
// types came from.
struct KernelSpeculation {
  std::string name;  // as the driver names it (mangled, or plain for extern "C")
  uint64_t module = 0;  // Module::id; 0: not known
  uint64_t launches = 0;
  uint64_t exact = 0;  // launches covered by an exact set (issued inside a known library call)
  uint64_t speculated = 0;  // launches with a speculated set
  uint64_t unknown = 0;  // launches whose set is unknown (every buffer counts as touched)
  uint64_t buffers = 0;  // buffers named, summed over launches
  uint64_t reads = 0;  // of those, read
  uint64_t writes = 0;  // of those, written
  std::string types;  // where parameter types came from: sigdb, name, cubin, none
  std::string note;  // what the layout sources disagreed on; empty if nothing
  bool operator==(const KernelSpeculation&) const = default;
};

// A live NCCL communicator of the process (agent.proto NcclCommunicator).
struct NcclCommunicatorStatus {
  int32_t rank = -1;
  int32_t nranks = 0;
  int32_t device = -1;
  uint64_t job_id = 0;  // the same on every rank of it
  uint64_t calls = 0;
  bool single_process = false;
  std::optional<uint64_t> stop_at;  // a stop armed at this call
  bool held = false;                // a thread waits at it
  bool released = false;            // destroyed for a checkpoint, not made again yet
  uint32_t rebuilds = 0;            // times made again behind the program's handle
  bool operator==(const NcclCommunicatorStatus&) const = default;
};

// One kind of call the opt-in call counter saw (agent.proto CallCost): how
// many, and the CPU time phos's own code took in them.
struct CallCost {
  std::string call;  // the driver function or library call
  uint64_t calls = 0;
  uint64_t cycles = 0;  // TSC cycles, the forwarded call left out
  uint64_t ns = 0;
  bool operator==(const CallCost&) const = default;
};
struct CallCycles {
  double cycles_per_second = 0;
  std::vector<CallCost> calls;
  // The counter's own part of each call's cycles (0 from an older agent).
  double floor_cycles_per_call = 0;
  bool operator==(const CallCycles&) const = default;
};

// CUDA IPC: whose memory an importing process's allocation is (gpu.proto
// Allocation fields 7-9).
struct IpcSource {
  int32_t owner_pid = 0;          // the exporter, in its own pid namespace
  uint64_t owner_allocation = 0;  // its allocation id
  std::string owner_agent;        // its agent's socket name
  bool operator==(const IpcSource&) const = default;
};

// An allocation of this process that another opened through a phos IPC
// handle (StatusReply::ipc_exports).
struct IpcExport {
  uint64_t allocation = 0;
  int32_t importer_pid = 0;  // in this process's pid namespace
  bool operator==(const IpcExport&) const = default;
};

struct StatusReply {
  bool gate_open = false;  // the agent fills it in: it owns the gate
  bool cuda_initialized = false;
  uint64_t allocation_count = 0;
  uint64_t allocated_bytes = 0;
  uint32_t device_count = 0;
  std::vector<std::string> unsupported_calls;  // make a checkpoint impossible
  std::vector<std::pair<std::string, uint64_t>> counters;  // what the hooks saw, by name
  std::vector<Module> modules;
  // Speculation; an older agent sends none of it (off, nothing indexed).
  bool speculation_active = false;
  uint64_t indexed_buffers = 0;  // buffers in the speculation's index
  // A reply carries the kMaxStatusKernels with the most launches.
  std::vector<KernelSpeculation> kernels;
  // All kernels with statistics: more than kernels.size() where a reply
  // carried only those with the most launches.
  uint64_t kernel_count = 0;
  // The GPUs the process has memory on, as it numbers them, with their
  // UUIDs (no name or memory size); empty from an older agent.
  std::vector<GpuDevice> devices;
  bool validation_active = false;  // false from an older agent
  std::vector<NcclCommunicatorStatus> nccl_communicators;  // empty from an older agent
  // A copy-on-write dump of this process found a write that speculation
  // missed (CloseCopyWindowRequest::missed): its next dumps copy while it is
  // stopped. false from an older agent.
  bool cow_missed = false;
  // PHOS_CALL_CYCLES=on: the call counter's totals; none while it is off.
  std::optional<CallCycles> call_cycles;
  // CUDA IPC: the allocations live importers opened (empty from an older agent).
  std::vector<IpcExport> ipc_exports;
  bool operator==(const StatusReply&) const = default;
};

// A device allocation of the process: what the agent lists, the keeper
// holds and an image records (image::Allocation adds where its bytes are).
struct Allocation {
  uint64_t id = 0;
  uint32_t device = 0;  // GpuDevice::ordinal, in the process's numbering
  uint64_t address = 0;
  uint64_t size = 0;
  uint32_t flags = 0;  // image::kAlloc*
  std::optional<IpcSource> ipc = std::nullopt;  // image::kAllocIpcImported: another process's memory
  bool operator==(const Allocation&) const = default;
};


// Allocations come in pages so that a page's fds fit one frame.
struct ListAllocationsRequest {
  uint64_t first_index = 0;
  uint32_t max_count = 0;
  bool with_fds = false;  // one fd per allocation comes with the reply, in order
  bool operator==(const ListAllocationsRequest&) const = default;
};
struct ListAllocationsReply {
  std::vector<Allocation> allocations;
  uint64_t total_count = 0;
  bool operator==(const ListAllocationsReply&) const = default;
};

// Close the gate (CUDA calls block, they do not fail) and drain all work.
struct QuiesceRequest {
  uint32_t timeout_ms = 0;
  bool operator==(const QuiesceRequest&) const = default;
};
struct QuiesceReply {
  uint64_t drained_ns = 0;
  bool at_step = false;  // closed at the program's iteration boundary (phos_step)
  std::vector<uint64_t> touch_order;  // allocation ids, as the recorded launches first touched them
  uint32_t nccl_released = 0;    // NCCL communicators destroyed for the checkpoint
  uint64_t nccl_release_ns = 0;
  // The program's free device memory at this closing (at_step only;
  // dead_ranges.h): the image need not hold it.
  std::vector<dead::Range> dead{};
  // Free blocks handed, but dropped: other threads made this many CUDA
  // calls between the program taking them and the gate closing.
  uint64_t dead_dropped_calls = 0;
  bool operator==(const QuiesceReply&) const = default;
};

// Unmap the application's device memory, keeping its address reservations;
// with release_handles the process lets go of the memory itself too.
struct ReleaseMappingsRequest {
  bool release_handles = false;
  bool operator==(const ReleaseMappingsRequest&) const = default;
};
struct ReleaseMappingsReply {
  uint64_t released_bytes = 0;
  bool operator==(const ReleaseMappingsReply&) const = default;
};

// Map memory back at the recorded addresses: the same memory (no fds), or
// the fds that come with the request, one per id.
struct RemapRequest {
  std::vector<uint64_t> allocation_ids;
  bool operator==(const RemapRequest&) const = default;
};
struct RemapReply {
  uint64_t mapped_bytes = 0;
  bool operator==(const RemapReply&) const = default;
};

// Open the gate.
struct ResumeRequest {
  std::optional<uint64_t> nccl_nonce;  // see agent.proto
  bool operator==(const ResumeRequest&) const = default;
};
struct ResumeReply {
  bool operator==(const ResumeReply&) const = default;
};

// The agent closes its end after replying.
struct GoodbyeRequest {
  bool operator==(const GoodbyeRequest&) const = default;
};
struct GoodbyeReply {
  bool operator==(const GoodbyeReply&) const = default;
};

// Speculation on or off; with `validate`, validation instead (see
// SpeculateRequest in agent.proto).
struct SpeculateRequest {
  bool on = false;
  std::optional<bool> validate;
  bool operator==(const SpeculateRequest&) const = default;
};
// Answered to a request with `validate`: whether validation is on now, and
// whether the SASS-level validator is attached. An agent older than
// validation sends neither.
struct SpeculateReply {
  std::optional<bool> validating;
  bool sass_attached = false;
  bool operator==(const SpeculateReply&) const = default;
};

// Which write sets a call may rely on while a copy window is open; a call
// whose set is not trusted waits until the window closes.
enum class CopyTrust : uint32_t {
  kExact = 1,       // only exact sets: copies, memsets, known library calls
  kSpeculated = 2,  // speculated kernel sets too
  kValidated = 3,   // speculated sets of launches that run validated
  // Speculated kernel sets too, and every chunk the engine copies is
  // checked against its fingerprint at the freeze (fingerprint.h): a write
  // speculation missed refuses the image instead of corrupting it. Recopy's
  // final pass copies again what changed, whatever the marks say.
  kChecksum = 4,
};

// A copy-on-write pool on one GPU: the table's pool slots are numbered
// across the pools in their order (this pool's first slot follows the
// previous pools' slots); a chunk is saved into a pool of its own GPU.
struct CopyPool {
  uint32_t device = 0;  // the process's ordinal
  uint64_t bytes = 0;   // mapped size (slots * chunk size, rounded up to the granularity)
  uint32_t slots = 0;
  bool operator==(const CopyPool&) const = default;
};
inline constexpr size_t kMaxCopyPools = 64;
// Open a concurrent dump's copy window (copy_state.h); the table's memfd,
// then one fd per pool in `pools` (copy-on-write only), come with it.
struct OpenCopyWindowRequest {
  CopyTrust trust = CopyTrust::kValidated;
  uint32_t timeout_ms = 0;
  std::vector<CopyPool> pools;
  bool operator==(const OpenCopyWindowRequest&) const = default;
};
struct OpenCopyWindowReply {
  bool validating = false;
  bool operator==(const OpenCopyWindowReply&) const = default;
};
struct AddressRange {
  uint64_t address = 0;
  uint64_t bytes = 0;
  bool operator==(const AddressRange&) const = default;
};
struct CloseCopyWindowRequest {
  // The engine found a chunk whose copy differs from its content at the
  // freeze: the agent remembers it (StatusReply::cow_missed).
  bool missed = false;
  // Those chunks (the first few): the reply names the launches that could
  // have written them (CloseCopyWindowReply::suspects).
  std::vector<AddressRange> missed_chunks;
  bool operator==(const CloseCopyWindowRequest&) const = default;
};
// A kernel and how often it was launched in a window with a speculated set
// that was trusted (what a refused image names).
struct KernelLaunches {
  std::string name;  // demangled
  uint64_t launches = 0;
  bool operator==(const KernelLaunches&) const = default;
};
inline constexpr size_t kMaxWindowKernels = 16;
// A call of the program that waited for the engine while a window was open.
struct CallWait {
  std::string call;    // the CUDA or library call ("cuMemcpyDtoDAsync", "kernel launch")
  std::string kernel;  // a launch: its kernel, demangled; else empty
  uint64_t wait_ns = 0;
  uint64_t chunks_waited = 0;
  uint64_t chunks_saved = 0;
  uint64_t save_ns = 0;         // of wait_ns: its saves launched and waited for
  uint64_t engine_wait_ns = 0;  // of wait_ns: chunks the engine copies waited for
  bool operator==(const CallWait&) const = default;
};
inline constexpr size_t kMaxLongestWaits = 3;
// What a copy window cost the program, as the hooks count it: the close
// reply carries it and a dump's manifest records it as it is
// (image::Statistics::copy_window), so a counter is added here alone.
struct CopyWindowCounters {
  uint64_t calls_checked = 0;  // calls that consulted the table
  uint64_t calls_waited = 0;   // calls that waited for the engine
  uint64_t unknown_waits = 0;  // of those, calls with an unknown write set
  uint64_t wait_ns = 0;        // what those calls waited, summed
  bool operator==(const CopyWindowCounters&) const = default;
};
// What the window cost the program, and whether its image can be trusted.
struct CloseCopyWindowReply {
  CopyWindowCounters counters{};
  uint64_t chunks_saved = 0;  // copy-on-write: saved into the pool before a write (an image records bytes)
  uint64_t violations = 0;
  std::string violation;  // the first: kernel and address
  bool aborted = false;
  std::string abort_reason;
  // cow_trust=checksum: the kernels launched in the window on a trusted
  // speculated set, the kMaxWindowKernels most launched, and how many kernels
  // there were in all; recopy: calls whose set was not trusted, counted
  // instead of marking every chunk dirty. None from an older agent.
  std::vector<KernelLaunches> speculated_kernels;
  uint64_t speculated_kernel_count = 0;
  uint64_t unmarked_calls = 0;
  // A refused image (CloseCopyWindowRequest::missed_chunks): launches on a
  // trusted speculated set that pointed into a missed chunk's buffer without
  // that chunk in their write set, most launched first (kMaxWindowKernels).
  std::vector<KernelLaunches> suspects;
  // The calls that waited longest for the engine, longest first.
  std::vector<CallWait> longest_waits;
  // The calls that saved the most chunks into the pool, most first.
  std::vector<CallWait> most_saved;
  bool operator==(const CloseCopyWindowReply&) const = default;
};

// A job-wide quiesce's stop (agent.proto NcclStopRequest): armed at
// `at_call` on the communicators of `job_id`, or disarmed without.
struct NcclStopRequest {
  uint64_t job_id = 0;
  std::optional<uint64_t> at_call;
  std::optional<bool> pend_release;  // see agent.proto
  std::optional<uint32_t> lease_ms;  // with at_call: lifted unless renewed in this long (agent.proto)
  bool operator==(const NcclStopRequest&) const = default;
};
struct NcclStopReply {
  bool armed = false;
  bool operator==(const NcclStopReply&) const = default;
};

// CUDA IPC between processes (agent.proto IpcOpenRequest): one libphos
// asks another's agent for an allocation's memory; an fd comes with the
// reply.
struct IpcOpenRequest {
  uint64_t allocation = 0;
  bool operator==(const IpcOpenRequest&) const = default;
};
struct IpcOpenReply {
  uint64_t size = 0;
  uint32_t device = 0;
  bool operator==(const IpcOpenReply&) const = default;
};
struct IpcCloseRequest {
  uint64_t allocation = 0;
  bool operator==(const IpcCloseRequest&) const = default;
};
struct IpcCloseReply {
  bool operator==(const IpcCloseReply&) const = default;
};

using Request = std::variant<Hello, StatusRequest, ListAllocationsRequest, QuiesceRequest, ReleaseMappingsRequest,
                             RemapRequest, ResumeRequest, GoodbyeRequest, SpeculateRequest, OpenCopyWindowRequest,
                             CloseCopyWindowRequest, NcclStopRequest, IpcOpenRequest, IpcCloseRequest>;
// Every request gets one reply: the matching kind, or an Error (its code an
// errno value).
using Reply = std::variant<HelloReply, StatusReply, ListAllocationsReply, QuiesceReply, ReleaseMappingsReply,
                           RemapReply, ResumeReply, GoodbyeReply, SpeculateReply, OpenCopyWindowReply,
                           CloseCopyWindowReply, NcclStopReply, IpcOpenReply, IpcCloseReply, Error>;

}  // namespace phos::agent
