// Framing of the agent protocol over a unix stream socket: an 8-byte header
// (magic, payload length) and a protobuf payload; file descriptors ride along
// with the header's sendmsg as SCM_RIGHTS.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::wire {

inline constexpr uint32_t kFrameMagic = 0x31414850;  // "PHA1", little-endian
inline constexpr size_t kFrameHeaderSize = 8;
inline constexpr size_t kMaxFrameBytes = 16u << 20;
inline constexpr size_t kMaxFdsPerFrame = 253;  // the kernel's SCM_MAX_FD

struct Frame {
  std::vector<std::byte> payload;
  std::vector<UniqueFd> fds;
};

// Errors carry: ECONNRESET when the peer closed mid-frame, ENODATA when it
// closed cleanly before a frame began, ETIMEDOUT, EPROTO for a malformed or
// oversized frame (or fds the kernel truncated).
Result<void> send_frame(int sock, std::span<const std::byte> payload, std::span<const int> fds = {});
// timeout_ms < 0 waits forever; the timeout applies to each wait for bytes.
Result<Frame> recv_frame(int sock, int timeout_ms, size_t max_bytes = kMaxFrameBytes);

// The address of the abstract unix socket `name` (no leading NUL); returns
// the address length to pass to bind/connect, 0 when the name is too long.
socklen_t abstract_socket_address(const std::string& name, struct sockaddr_un& addr);

// Whether the process at the other end of `conn` (SO_PEERCRED) is root or
// runs as this process's user, the only ones either end of phos's sockets
// talks to; `uid`: its user, for the refusal's message (left as it was
// where the kernel does not say: false then too).
bool peer_trusted(int conn, uid_t& uid);

}  // namespace phos::wire
