// Blocking TCP with deadlines, for phos's TCPStore client and server. Waits
// go through ppoll(): libphos stands in for poll() in the processes it is
// preloaded into (the NCCL proxy wake), and this code runs there too.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "phos/support/result.h"
#include "phos/support/unique_fd.h"

namespace phos::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_in(std::chrono::milliseconds d) { return Clock::now() + d; }

// "HOST:PORT" or "[V6]:PORT" split; an error names what is wrong with it.
struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string text() const;
};
// `any_port`: port 0 (the system picks one, for a server) is taken too.
Result<HostPort> parse_host_port(const std::string& text, bool any_port = false);

// One connection attempt to each address of `host` (getaddrinfo, IPv6 or
// IPv4), each bounded by `deadline`; the first that connects. The error is
// the last attempt's (ECONNREFUSED, ETIMEDOUT, EHOSTUNREACH...).
Result<UniqueFd> connect_tcp(const std::string& host, uint16_t port, Deadline deadline);

// A listening socket on `host` (empty: every address) and `port` (0: any).
Result<UniqueFd> listen_tcp(const std::string& host, uint16_t port);
// The port a socket is bound to.
Result<uint16_t> bound_port(int fd);

// Every byte sent, or an error (ETIMEDOUT past the deadline, EPIPE...).
Result<void> send_all(int fd, std::span<const uint8_t> bytes, Deadline deadline);
// Exactly out.size() bytes, or an error (ECONNRESET where the peer closed first).
Result<void> recv_exact(int fd, std::span<uint8_t> out, Deadline deadline);
// Whether input (or an end) comes before the deadline.
Result<bool> wait_readable(int fd, Deadline deadline);

}  // namespace phos::net
