// Typed agent-protocol messages (images/proto/agent.proto) on top of the
// framing: pack/send and receive/unpack, with the protobuf-c structs owned.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "agent.pb-c.h"
#include "phos/images/agent_wire.h"
#include "phos/images/result.h"

namespace phos::wire {

inline constexpr uint32_t kAgentProtocolVersion = 1;
inline constexpr const char* kAgentSocketPrefix = "phos-agent.";
inline constexpr const char* kAgentThreadName = "phos-agent";

// The address of the abstract unix socket `name` (no leading NUL); returns
// the address length to pass to bind/connect, 0 when the name is too long.
socklen_t abstract_socket_address(const std::string& name, struct sockaddr_un& addr);

// What StatusReply, Module and Allocation carry, as values both sides use.
struct ModuleEntry {
  uint64_t id = 0;
  std::string kind;
  uint64_t size = 0;
  uint64_t hash = 0;
  std::string source;
  std::vector<std::string> functions;
  uint64_t function_count = 0;
  std::vector<std::string> globals;
};

// One kernel's read/write-set speculation so far (the speculation issue):
// what each launch's set was, how many buffers it named, and where the
// kernel's parameter types came from.
struct KernelSpeculationEntry {
  std::string name;    // as the driver names it (mangled, or plain for extern "C")
  uint64_t module = 0; // the module's id (ModuleEntry)
  uint64_t launches = 0;
  uint64_t exact = 0;       // launches covered by an exact set (issued inside a known library call)
  uint64_t speculated = 0;  // launches with a speculated set
  uint64_t unknown = 0;     // launches whose set is unknown (every buffer counts as touched)
  uint64_t buffers = 0;     // buffers named, summed over launches
  uint64_t reads = 0;       // of those, read
  uint64_t writes = 0;      // of those, written
  std::string types;        // where parameter types came from: sigdb, name, cubin, none
  std::string note;         // what the layout sources disagreed on; empty if nothing
};

// A GPU as the process numbers it, and its UUID.
struct AgentDevice {
  uint32_t ordinal = 0;
  std::array<uint8_t, 16> uuid{};
};

struct AgentStatus {
  bool gate_open = false;
  bool cuda_initialized = false;
  uint64_t allocation_count = 0;
  uint64_t allocated_bytes = 0;
  uint32_t device_count = 0;
  std::vector<std::string> unsupported_calls;
  std::vector<std::pair<std::string, uint64_t>> counters;
  std::vector<ModuleEntry> modules;
  bool speculation_active = false;
  uint64_t indexed_buffers = 0;  // buffers in the speculation's index
  std::vector<KernelSpeculationEntry> kernels;  // empty until speculation has run
  // All kernels with statistics: more than kernels.size() where a status
  // reply carried only those with the most launches (0: kernels.size()).
  uint64_t kernel_count = 0;
  std::vector<AgentDevice> devices;  // empty from an older agent
};

struct AllocationEntry {
  uint64_t id = 0;
  uint32_t device = 0;
  uint64_t address = 0;
  uint64_t size = 0;
  uint32_t flags = 0;
};

// An Allocation message from an entry (initialized, then filled), and back.
void to_message(const AllocationEntry& a, Phos__Agent__Allocation& m);
AllocationEntry from_message(const Phos__Agent__Allocation& m);

struct UnpackedDeleter {
  void operator()(ProtobufCMessage* m) const { protobuf_c_message_free_unpacked(m, nullptr); }
  void operator()(Phos__Agent__Request* m) const { operator()(&m->base); }
  void operator()(Phos__Agent__Reply* m) const { operator()(&m->base); }
};
using RequestPtr = std::unique_ptr<Phos__Agent__Request, UnpackedDeleter>;
using ReplyPtr = std::unique_ptr<Phos__Agent__Reply, UnpackedDeleter>;

Result<void> send_message(int sock, const ProtobufCMessage& message, std::span<const int> fds = {});

struct ReceivedRequest {
  RequestPtr request;
  std::vector<UniqueFd> fds;
};
struct ReceivedReply {
  ReplyPtr reply;
  std::vector<UniqueFd> fds;
};
Result<ReceivedRequest> recv_request(int sock, int timeout_ms);
Result<ReceivedReply> recv_reply(int sock, int timeout_ms);

// An Error reply.
Result<void> send_error_reply(int sock, int code, const std::string& message);

}  // namespace phos::wire
