#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "fixtures.h"
#include "phos/images/agent_wire.h"
#include "phos/images/bytes.h"

using namespace phos::wire;
using phos::UniqueFd;

namespace {

using phos::test::SocketPair;

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

void raw_send(int fd, const void* p, size_t n) { REQUIRE(::send(fd, p, n, MSG_NOSIGNAL) == ssize_t(n)); }

}  // namespace

TEST_CASE("wire: a frame round trips", "[wire]") {
  SocketPair s;
  auto payload = bytes_of("hello agent");
  REQUIRE(send_frame(s.a.get(), payload).ok());
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE(f.ok());
  CHECK(f->payload == payload);
  CHECK(f->fds.empty());
}

TEST_CASE("wire: an empty frame round trips", "[wire]") {
  SocketPair s;
  REQUIRE(send_frame(s.a.get(), {}).ok());
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE(f.ok());
  CHECK(f->payload.empty());
}

TEST_CASE("wire: a large frame round trips across partial reads", "[wire]") {
  SocketPair s;
  std::vector<std::byte> payload(3 << 20);
  for (size_t i = 0; i < payload.size(); i++) payload[i] = std::byte(i * 7);
  std::thread sender([&] { REQUIRE(send_frame(s.a.get(), payload).ok()); });
  auto f = recv_frame(s.b.get(), 5000);
  sender.join();
  REQUIRE(f.ok());
  CHECK(f->payload == payload);
}

TEST_CASE("wire: file descriptors travel with the frame", "[wire][fds]") {
  SocketPair s;
  int pipes[2][2];
  REQUIRE(::pipe(pipes[0]) == 0);
  REQUIRE(::pipe(pipes[1]) == 0);
  int to_send[2] = {pipes[0][1], pipes[1][1]};
  REQUIRE(send_frame(s.a.get(), bytes_of("fds"), to_send).ok());
  ::close(pipes[0][1]);
  ::close(pipes[1][1]);
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE(f.ok());
  REQUIRE(f->fds.size() == 2);
  for (int i = 0; i < 2; i++) {
    char c = char('x' + i);
    REQUIRE(::write(f->fds[i].get(), &c, 1) == 1);
    char got = 0;
    REQUIRE(::read(pipes[i][0], &got, 1) == 1);
    CHECK(got == c);
    ::close(pipes[i][0]);
  }
}

TEST_CASE("wire: too many fds are refused before sending", "[wire][fds]") {
  SocketPair s;
  std::vector<int> fds(kMaxFdsPerFrame + 1, 0);
  auto r = send_frame(s.a.get(), {}, fds);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EMSGSIZE);
}

TEST_CASE("wire: bad magic is a malformed frame", "[wire][malformed]") {
  SocketPair s;
  std::byte header[8];
  phos::bytes::put_u32(header, 0xdeadbeef);
  phos::bytes::put_u32(header + 4, 0);
  raw_send(s.a.get(), header, 8);
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == EPROTO);
  CHECK_THAT(f.error().message, Catch::Contains("bad magic"));
}

TEST_CASE("wire: oversized frame is refused without reading it", "[wire][malformed]") {
  SocketPair s;
  std::byte header[8];
  phos::bytes::put_u32(header, kFrameMagic);
  phos::bytes::put_u32(header + 4, 1u << 30);
  raw_send(s.a.get(), header, 8);
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == EPROTO);
  CHECK_THAT(f.error().message, Catch::Contains("oversized frame"));
}

TEST_CASE("wire: peer that disconnects mid-header", "[wire][disconnect]") {
  SocketPair s;
  std::byte header[8];
  phos::bytes::put_u32(header, kFrameMagic);
  raw_send(s.a.get(), header, 3);
  s.a.reset();
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == ECONNRESET);
  CHECK_THAT(f.error().message, Catch::Contains("3 of 8 header bytes"));
}

TEST_CASE("wire: peer that disconnects mid-payload", "[wire][disconnect]") {
  SocketPair s;
  std::byte header[8];
  phos::bytes::put_u32(header, kFrameMagic);
  phos::bytes::put_u32(header + 4, 100);
  raw_send(s.a.get(), header, 8);
  raw_send(s.a.get(), "0123456789", 10);
  s.a.reset();
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == ECONNRESET);
  CHECK_THAT(f.error().message, Catch::Contains("10 of 100 payload bytes"));
}

TEST_CASE("wire: clean close before a frame", "[wire][disconnect]") {
  SocketPair s;
  s.a.reset();
  auto f = recv_frame(s.b.get(), 1000);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == ENODATA);
}

TEST_CASE("wire: silent peer times out", "[wire][timeout]") {
  SocketPair s;
  auto f = recv_frame(s.b.get(), 50);
  REQUIRE_FALSE(f.ok());
  CHECK(f.error().code == ETIMEDOUT);
}

TEST_CASE("wire: send to a closed peer fails without SIGPIPE", "[wire][disconnect]") {
  SocketPair s;
  s.b.reset();
  auto r = send_frame(s.a.get(), bytes_of("x"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EPIPE);
}
