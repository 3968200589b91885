#include "phos/support/tcp_store_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "phos/support/socket_io.h"
#include "phos/support/tcp_store_table.h"

namespace phos::net {
namespace {

struct Connection {
  UniqueFd fd;
  std::vector<uint8_t> in;   // bytes not yet a whole query
  std::vector<uint8_t> out;  // replies the socket has not taken yet
};

// Reads what is there; false where the connection is to close.
bool read_some(Connection& c) {
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
      if (size_t(n) < sizeof(buf)) return true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

// Sends what the socket takes; false where the connection is to close.
bool write_some(Connection& c) {
  while (!c.out.empty()) {
    ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(c.out.begin(), c.out.begin() + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, uint16_t port) {
  auto listener = listen_tcp(host, port);
  if (!listener) return make_error("TCPStore server: " + listener.error().message, listener.error().code);
  auto bound = bound_port(listener->get());
  if (!bound) return bound.error();
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return errno_error("TCPStore server: eventfd");
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer(std::move(*listener), std::move(wake), *bound));
  s->thread_ = std::thread([raw = s.get()] { raw->run(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  const uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) != sizeof(one))
    std::fprintf(stderr, "phos: TCPStore server: cannot wake its thread to stop: %s\n", std::strerror(errno));
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::run() {
  StoreTable table;
  std::map<int, Connection> conns;  // by fd: the table knows clients by it
  auto drop = [&](int fd) {
    table.forget(fd);
    conns.erase(fd);
  };
  for (;;) {
    std::vector<struct pollfd> fds = {{wake_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
    for (auto& [fd, c] : conns) fds.push_back({fd, short(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    if (::ppoll(fds.data(), fds.size(), nullptr, nullptr) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "phos: TCPStore server: ppoll: %s; it stops serving\n", std::strerror(errno));
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) {
        conns[fd].fd.reset(fd);
        accepted_++;
      }
    }
    std::vector<StoreReply> replies;
    for (size_t i = 2; i < fds.size(); i++) {
      const int fd = fds[i].fd;
      auto it = conns.find(fd);
      if (it == conns.end() || !fds[i].revents) continue;
      Connection& c = it->second;
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) && !read_some(c)) {
        drop(fd);
        continue;
      }
      auto used = table.serve(fd, c.in, replies);
      if (!used) {
        std::fprintf(stderr, "phos: TCPStore server: a client's %s; its connection closed\n",
                     used.error().message.c_str());
        drop(fd);
        continue;
      }
      c.in.erase(c.in.begin(), c.in.begin() + long(*used));
    }
    for (auto& r : replies)
      if (auto it = conns.find(r.client); it != conns.end())
        it->second.out.insert(it->second.out.end(), r.bytes.begin(), r.bytes.end());
    for (auto it = conns.begin(); it != conns.end();) {
      const int fd = it->first;
      ++it;
      if (!write_some(conns[fd])) drop(fd);
    }
  }
}

}  // namespace phos::net
