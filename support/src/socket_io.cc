#include "phos/support/socket_io.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace phos::net {
namespace {

// What is left until `deadline` as a timespec for ppoll (0 once past).
struct timespec left_until(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count();
  if (left < 0) left = 0;
  return {time_t(left / 1000000000), long(left % 1000000000)};
}

// Waits for `events` on `fd` until the deadline: true when they came.
Result<bool> wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    struct pollfd p {fd, events, 0};
    struct timespec ts = left_until(deadline);
    int n = ::ppoll(&p, 1, &ts, nullptr);
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return errno_error("ppoll");
  }
}

Result<UniqueFd> connect_one(const struct addrinfo& a, Deadline deadline) {
  UniqueFd fd(::socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol));
  if (!fd.valid()) return errno_error("socket");
  if (::connect(fd.get(), a.ai_addr, a.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno_error("connect");
    auto ready = wait_for(fd.get(), POLLOUT, deadline);
    if (!ready) return ready.error();
    if (!*ready) return make_error("connect: no answer before the deadline", ETIMEDOUT);
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno_error("getsockopt(SO_ERROR)");
    if (err != 0) return errno_error("connect", err);
  }
  int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

std::string HostPort::text() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<HostPort> parse_host_port(const std::string& text, bool any_port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    return make_error("'" + text + "' is not HOST:PORT", EINVAL);
  std::string host = text.substr(0, colon);
  if (host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const unsigned long port = std::strtoul(text.c_str() + colon + 1, &end, 10);
  if (*end || (port == 0 && !any_port) || port > 65535)
    return make_error("'" + text + "': the port is not " + (any_port ? "0" : "1") + "..65535", EINVAL);
  if (host.empty()) return make_error("'" + text + "': no host", EINVAL);
  return HostPort{host, uint16_t(port)};
}

Result<UniqueFd> connect_tcp(const std::string& host, uint16_t port, Deadline deadline) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (int r = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list); r != 0)
    return make_error("resolve " + host + ": " + ::gai_strerror(r), r == EAI_SYSTEM ? errno : EHOSTUNREACH);
  Error last = make_error("resolve " + host + ": no address", EHOSTUNREACH);
  for (struct addrinfo* a = list; a; a = a->ai_next) {
    auto fd = connect_one(*a, deadline);
    if (fd) {
      ::freeaddrinfo(list);
      return std::move(*fd);
    }
    last = fd.error();
  }
  ::freeaddrinfo(list);
  return make_error(host + ":" + service + ": " + last.message, last.code);
}

Result<UniqueFd> listen_tcp(const std::string& host, uint16_t port) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (int r = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list); r != 0)
    return make_error("resolve " + host + ": " + ::gai_strerror(r), EADDRNOTAVAIL);
  Error last = make_error("no address to listen on for '" + host + "'", EADDRNOTAVAIL);
  for (struct addrinfo* a = list; a; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last = errno_error("socket");
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      last = errno_error("bind " + (host.empty() ? std::string("*") : host) + ":" + service);
      continue;
    }
    if (::listen(fd.get(), 128) != 0) {
      last = errno_error("listen");
      continue;
    }
    ::freeaddrinfo(list);
    return fd;
  }
  ::freeaddrinfo(list);
  return last;
}

Result<uint16_t> bound_port(int fd) {
  struct sockaddr_storage ss {};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) return errno_error("getsockname");
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_port);
  return make_error("not an IP socket", EAFNOSUPPORT);
}

Result<void> send_all(int fd, std::span<const uint8_t> bytes, Deadline deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return errno_error("send");
    auto ready = wait_for(fd, POLLOUT, deadline);
    if (!ready) return ready.error();
    if (!*ready) return make_error("send: the peer took no data before the deadline", ETIMEDOUT);
  }
  return {};
}

Result<void> recv_exact(int fd, std::span<uint8_t> out, Deadline deadline) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::recv(fd, out.data() + done, out.size() - done, MSG_DONTWAIT);
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if (n == 0) return make_error("recv: the peer closed the connection", ECONNRESET);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_error("recv");
    auto ready = wait_for(fd, POLLIN, deadline);
    if (!ready) return ready.error();
    if (!*ready) return make_error("recv: no reply before the deadline", ETIMEDOUT);
  }
  return {};
}

Result<bool> wait_readable(int fd, Deadline deadline) { return wait_for(fd, POLLIN, deadline); }

}  // namespace phos::net
