#include "phos/images/agent_wire.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "phos/images/bytes.h"

namespace phos::wire {
namespace {

Result<void> wait_readable(int sock, int timeout_ms) {
  struct pollfd p {sock, POLLIN, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_error("poll agent socket");
    if (r == 0) return make_error("timed out after " + std::to_string(timeout_ms) + " ms waiting for the peer", ETIMEDOUT);
    return {};
  }
}

// Collects the fds of every SCM_RIGHTS message in `msg`.
void take_fds(struct msghdr& msg, std::vector<UniqueFd>& out) {
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.emplace_back(fd);
    }
  }
}

}  // namespace

socklen_t abstract_socket_address(const std::string& name, struct sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path)) return 0;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: leading NUL
  return socklen_t(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

bool peer_trusted(int conn, uid_t& uid) {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  uid = cred.uid;
  return cred.uid == 0 || cred.uid == ::getuid();
}

Result<void> send_frame(int sock, std::span<const std::byte> payload, std::span<const int> fds) {
  if (payload.size() > kMaxFrameBytes)
    return make_error("frame of " + std::to_string(payload.size()) + " bytes exceeds " + std::to_string(kMaxFrameBytes),
                      EMSGSIZE);
  if (fds.size() > kMaxFdsPerFrame)
    return make_error(std::to_string(fds.size()) + " fds exceed " + std::to_string(kMaxFdsPerFrame) + " per frame",
                      EMSGSIZE);
  std::byte header[kFrameHeaderSize];
  bytes::put_u32(header, kFrameMagic);
  bytes::put_u32(header + 4, uint32_t(payload.size()));

  struct iovec iov[2] = {{header, sizeof(header)},
                         {const_cast<std::byte*>(payload.data()), payload.size()}};
  std::vector<char> control(fds.empty() ? 0 : CMSG_SPACE(fds.size() * sizeof(int)));
  struct msghdr msg {};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ssize_t sent;
  do sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  if (sent < 0) return errno_error("send to agent peer");

  // The fds went with the first bytes; send what the kernel did not take.
  size_t total = sizeof(header) + payload.size();
  size_t done = size_t(sent);
  while (done < total) {
    const std::byte* p = done < sizeof(header) ? header + done : payload.data() + (done - sizeof(header));
    size_t len = done < sizeof(header) ? sizeof(header) - done : total - done;
    ssize_t w = ::send(sock, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno_error("send to agent peer");
    done += size_t(w);
  }
  return {};
}

Result<Frame> recv_frame(int sock, int timeout_ms, size_t max_bytes) {
  Frame frame;
  std::byte header[kFrameHeaderSize];
  size_t got = 0;
  std::vector<char> control(CMSG_SPACE(kMaxFdsPerFrame * sizeof(int)));
  while (got < sizeof(header)) {
    PHOS_TRY(wait_readable(sock, timeout_ms));
    struct iovec iov {header + got, sizeof(header) - got};
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    ssize_t r = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_error("receive from agent peer");
    take_fds(msg, frame.fds);
    if (msg.msg_flags & MSG_CTRUNC) return make_error("peer sent more fds than a frame may carry", EPROTO);
    if (r == 0) {
      if (got == 0) return make_error("peer closed the connection", ENODATA);
      return make_error("peer closed after " + std::to_string(got) + " of " + std::to_string(sizeof(header)) +
                        " header bytes", ECONNRESET);
    }
    got += size_t(r);
  }
  if (bytes::get_u32(header) != kFrameMagic) return make_error("malformed frame: bad magic", EPROTO);
  size_t len = bytes::get_u32(header + 4);
  if (len > max_bytes)
    return make_error("oversized frame: " + std::to_string(len) + " bytes, at most " + std::to_string(max_bytes),
                      EPROTO);
  frame.payload.resize(len);
  size_t done = 0;
  while (done < len) {
    PHOS_TRY(wait_readable(sock, timeout_ms));
    ssize_t r = ::recv(sock, frame.payload.data() + done, len - done, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_error("receive from agent peer");
    if (r == 0)
      return make_error("peer closed after " + std::to_string(done) + " of " + std::to_string(len) + " payload bytes",
                        ECONNRESET);
    done += size_t(r);
  }
  return frame;
}

}  // namespace phos::wire
