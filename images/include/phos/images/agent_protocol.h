// The agent protocol's codec and transport: Request and Reply values
// (agent_messages.h) to and from their protobuf payloads
// (images/proto/agent.proto), sent and received with their fds in the frames
// of agent_wire.h. A reply is the plugin's input from an untrusted process
// (the plugin runs as root inside criu), a request the agent's from any
// local peer: the decoders refuse what does not parse or does not add up
// with EPROTO and a message that says what, and never trust a count.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/agent_wire.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::agent {

// A status reply stays far below a frame's limit even for a process with
// thousands of modules and kernels (a kernel's mangled name can run to
// kilobytes): it carries at most this many function names per module, and
// the kernels with the most launches.
inline constexpr size_t kMaxModuleFunctions = 1000;
inline constexpr size_t kMaxStatusKernels = 1000;

std::vector<std::byte> encode_request(const Request& request);
Result<Request> decode_request(std::span<const std::byte> payload);
// A status reply is cut to what it may carry (see above); function_count
// and kernel_count still count all.
std::vector<std::byte> encode_reply(const Reply& reply);
Result<Reply> decode_reply(std::span<const std::byte> payload);

// The kind as agent.proto names it ("hello", "status", ..., "error").
std::string_view kind_name(const Request& request);
std::string_view kind_name(const Reply& reply);

struct ReceivedRequest {
  Request request;
  std::vector<UniqueFd> fds;
};
struct ReceivedReply {
  Reply reply;
  std::vector<UniqueFd> fds;
};

// Errors are the framing's (agent_wire.h), and EPROTO for a payload that
// does not decode.
Result<void> send_request(int sock, const Request& request, std::span<const int> fds = {});
Result<ReceivedRequest> recv_request(int sock, int timeout_ms);
Result<void> send_reply(int sock, const Reply& reply, std::span<const int> fds = {});
Result<ReceivedReply> recv_reply(int sock, int timeout_ms);

}  // namespace phos::agent
