// The c10d TCPStore protocol as phos speaks it: the bytes of each query
// (golden frames written from the protocol's table, tcp_store_protocol.h),
// the table a server keeps, and phos's client against phos's server.
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "phos/support/socket_io.h"
#include "phos/support/tcp_store_client.h"
#include "phos/support/tcp_store_protocol.h"
#include "phos/support/tcp_store_server.h"
#include "phos/support/tcp_store_table.h"

using namespace phos::net;
using Bytes = std::vector<uint8_t>;
using namespace std::chrono_literals;

namespace {

Bytes u64le(uint64_t v) {
  Bytes b;
  for (int i = 0; i < 8; i++) b.push_back(uint8_t(v >> (8 * i)));
  return b;
}
Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
Bytes str(const std::string& s) { return cat({u64le(s.size()), Bytes(s.begin(), s.end())}); }

// A table with client 1 validated.
StoreTable validated_table() {
  StoreTable t;
  std::vector<StoreReply> out;
  REQUIRE(t.serve(1, validate_query(), out).ok());
  REQUIRE(out.empty());
  return t;
}
// Serves `q` whole for `client`; the replies.
std::vector<StoreReply> serve(StoreTable& t, int client, const Bytes& q) {
  std::vector<StoreReply> out;
  auto used = t.serve(client, q, out);
  REQUIRE(used.ok());
  CHECK(*used == q.size());
  return out;
}

std::unique_ptr<TcpStoreServer> local_server() {
  auto s = TcpStoreServer::start("127.0.0.1", 0);
  REQUIRE(s.ok());
  return std::move(*s);
}
TcpStoreClient client_of(const TcpStoreServer& s) {
  auto c = TcpStoreClient::connect("127.0.0.1", s.port(), deadline_in(5s));
  REQUIRE(c.ok());
  return std::move(*c);
}

}  // namespace

TEST_CASE("tcpstore frames: VALIDATE is type 0 and the magic 0x3C85F7CE, little-endian", "[tcpstore]") {
  CHECK(validate_query() == Bytes{0x00, 0xCE, 0xF7, 0x85, 0x3C});
}

TEST_CASE("tcpstore frames: PING is type 13 and a u32 nonce", "[tcpstore]") {
  CHECK(ping_query(0x01020304) == Bytes{13, 0x04, 0x03, 0x02, 0x01});
}

TEST_CASE("tcpstore frames: SET is type 1, the key and the value, each a u64 length then bytes", "[tcpstore]") {
  CHECK(set_query("ab", Bytes{7, 8, 9}) == cat({{1}, str("ab"), u64le(3), {7, 8, 9}}));
}

TEST_CASE("tcpstore frames: GET, DELETE_KEY and GETNUMKEYS", "[tcpstore]") {
  CHECK(get_query("key") == cat({{3}, str("key")}));
  CHECK(delete_key_query("key") == cat({{8}, str("key")}));
  CHECK(num_keys_query() == Bytes{7});
}

TEST_CASE("tcpstore frames: ADD is type 4, the key and an i64 delta", "[tcpstore]") {
  CHECK(add_query("n", -2) == cat({{4}, str("n"), u64le(uint64_t(-2))}));
}

TEST_CASE("tcpstore frames: CHECK and WAIT carry a u64 key count, then the keys", "[tcpstore]") {
  CHECK(check_query({"a", "bc"}) == cat({{5}, u64le(2), str("a"), str("bc")}));
  CHECK(wait_query({"a"}) == cat({{6}, u64le(1), str("a")}));
  CHECK(cancel_wait_query() == Bytes{12});
}

TEST_CASE("tcpstore frames: COMPARE_SET is type 2, key, expected, desired", "[tcpstore]") {
  CHECK(compare_set_query("k", Bytes{}, Bytes{'x'}) == cat({{2}, str("k"), u64le(0), str("x")}));
}

TEST_CASE("tcpstore reader: a value not whole yet is not taken", "[tcpstore]") {
  Bytes half = cat({u64le(4), {'a', 'b'}});
  StoreReader r(half);
  CHECK_FALSE(r.text(100).has_value());
  CHECK(r.used() == 0);
  CHECK_FALSE(r.bad());
}

TEST_CASE("tcpstore reader: a length past its bound is bad, not pending", "[tcpstore]") {
  Bytes b = u64le(1000);
  StoreReader r(b);
  CHECK_FALSE(r.data(10).has_value());
  CHECK(r.bad());
}

TEST_CASE("tcpstore table: a connection's first query must be VALIDATE", "[tcpstore]") {
  StoreTable t;
  std::vector<StoreReply> out;
  auto r = t.serve(1, set_query("k", Bytes{1}), out);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EPROTO);
  CHECK(r.error().message.find("first query is not VALIDATE") != std::string::npos);
}

TEST_CASE("tcpstore table: VALIDATE with another magic is refused", "[tcpstore]") {
  StoreTable t;
  std::vector<StoreReply> out;
  auto r = t.serve(1, StoreFrame(StoreQuery::kValidate).u32(0x12345678).bytes(), out);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("wrong magic") != std::string::npos);
}

TEST_CASE("tcpstore table: SET then GET; a missing key reads empty", "[tcpstore]") {
  StoreTable t = validated_table();
  CHECK(serve(t, 1, set_query("k", Bytes{5, 6})).empty());
  auto got = serve(t, 1, get_query("k"));
  REQUIRE(got.size() == 1);
  CHECK(got[0].bytes == cat({u64le(2), {5, 6}}));
  CHECK(serve(t, 1, get_query("none"))[0].bytes == u64le(0));
}

TEST_CASE("tcpstore table: ADD counts from 0 and keeps decimal text", "[tcpstore]") {
  StoreTable t = validated_table();
  CHECK(serve(t, 1, add_query("n", 3))[0].bytes == u64le(3));
  CHECK(serve(t, 1, add_query("n", 4))[0].bytes == u64le(7));
  CHECK(serve(t, 1, get_query("n"))[0].bytes == str("7"));
}

TEST_CASE("tcpstore table: a WAIT ends when another client sets its last key", "[tcpstore]") {
  StoreTable t = validated_table();
  std::vector<StoreReply> out;
  REQUIRE(t.serve(2, validate_query(), out).ok());
  CHECK(serve(t, 1, wait_query({"a", "b"})).empty());
  CHECK(t.waiting_clients() == 1);
  CHECK(serve(t, 2, set_query("a", Bytes{1})).empty());
  auto woke = serve(t, 2, add_query("b", 1));
  REQUIRE(woke.size() == 2);  // ADD's reply to 2, STOP_WAITING to 1
  CHECK(woke[1].client == 1);
  CHECK(woke[1].bytes == Bytes{uint8_t(StoreWaitReply::kStopWaiting)});
  CHECK(t.waiting_clients() == 0);
}

TEST_CASE("tcpstore table: a WAIT for keys already there ends at once", "[tcpstore]") {
  StoreTable t = validated_table();
  serve(t, 1, set_query("a", Bytes{1}));
  CHECK(serve(t, 1, wait_query({"a"}))[0].bytes == Bytes{uint8_t(StoreWaitReply::kStopWaiting)});
}

TEST_CASE("tcpstore table: CANCEL_WAIT forgets the wait and says WAIT_CANCELED", "[tcpstore]") {
  StoreTable t = validated_table();
  serve(t, 1, wait_query({"a"}));
  CHECK(serve(t, 1, cancel_wait_query())[0].bytes == Bytes{uint8_t(StoreWaitReply::kWaitCanceled)});
  CHECK(t.waiting_clients() == 0);
  CHECK(serve(t, 1, set_query("a", Bytes{1})).empty());  // nobody to wake
}

TEST_CASE("tcpstore table: CHECK says READY only when every key is there", "[tcpstore]") {
  StoreTable t = validated_table();
  serve(t, 1, set_query("a", Bytes{}));
  CHECK(serve(t, 1, check_query({"a"}))[0].bytes == Bytes{uint8_t(StoreCheckReply::kReady)});
  CHECK(serve(t, 1, check_query({"a", "b"}))[0].bytes == Bytes{uint8_t(StoreCheckReply::kNotReady)});
}

TEST_CASE("tcpstore table: COMPARE_SET sets a missing key only where nothing was expected", "[tcpstore]") {
  StoreTable t = validated_table();
  CHECK(serve(t, 1, compare_set_query("k", Bytes{'x'}, Bytes{'y'}))[0].bytes == str("x"));
  CHECK(serve(t, 1, get_query("k"))[0].bytes == u64le(0));  // still missing
  CHECK(serve(t, 1, compare_set_query("k", Bytes{}, Bytes{'a'}))[0].bytes == str("a"));
  // The first value wins: a second proposal gets it back.
  CHECK(serve(t, 1, compare_set_query("k", Bytes{}, Bytes{'b'}))[0].bytes == str("a"));
  CHECK(serve(t, 1, compare_set_query("k", Bytes{'a'}, Bytes{'c'}))[0].bytes == str("c"));
}

TEST_CASE("tcpstore table: DELETE_KEY says how many went; GETNUMKEYS counts", "[tcpstore]") {
  StoreTable t = validated_table();
  serve(t, 1, set_query("a", Bytes{}));
  serve(t, 1, set_query("b", Bytes{}));
  CHECK(serve(t, 1, num_keys_query())[0].bytes == u64le(2));
  CHECK(serve(t, 1, delete_key_query("a"))[0].bytes == u64le(1));
  CHECK(serve(t, 1, delete_key_query("a"))[0].bytes == u64le(0));
  CHECK(t.size() == 1);
}

TEST_CASE("tcpstore table: a query in pieces is served once whole", "[tcpstore]") {
  StoreTable t = validated_table();
  Bytes q = set_query("key", Bytes{1, 2, 3});
  std::vector<StoreReply> out;
  auto used = t.serve(1, std::span<const uint8_t>(q).first(q.size() - 1), out);
  REQUIRE(used.ok());
  CHECK(*used == 0);
  CHECK(t.size() == 0);
  used = t.serve(1, q, out);
  CHECK(*used == q.size());
  CHECK(t.size() == 1);
}

TEST_CASE("tcpstore table: two queries in one read are both served", "[tcpstore]") {
  StoreTable t = validated_table();
  Bytes q = cat({add_query("n", 1), add_query("n", 1)});
  auto out = serve(t, 1, q);
  REQUIRE(out.size() == 2);
  CHECK(out[1].bytes == u64le(2));
}

TEST_CASE("tcpstore table: an unknown query type and too many keys are refused", "[tcpstore]") {
  StoreTable t = validated_table();
  std::vector<StoreReply> out;
  auto r = t.serve(1, Bytes{200}, out);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("query type 200 is not served") != std::string::npos);
  r = t.serve(1, cat({{6}, u64le(1u << 30)}), out);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("more than") != std::string::npos);
}

TEST_CASE("tcpstore client: set, get and add through phos's server", "[tcpstore]") {
  auto server = local_server();
  TcpStoreClient a = client_of(*server), b = client_of(*server);
  REQUIRE(a.set("phos/k", Bytes{1, 2}).ok());
  auto got = b.get("phos/k", deadline_in(2s));
  REQUIRE(got.ok());
  CHECK(*got == Bytes{1, 2});
  CHECK(*a.add("n", 2) == 2);
  CHECK(*b.add("n", 3) == 5);
  CHECK(*a.num_keys() == 2);
  CHECK(*a.remove("n"));
  CHECK_FALSE(*a.remove("n"));
}

TEST_CASE("tcpstore client: get waits for a key another client sets later", "[tcpstore]") {
  auto server = local_server();
  TcpStoreClient waiter = client_of(*server), setter = client_of(*server);
  bool set = false;  // Catch2's assertions stay on this thread
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    set = setter.set("late", Bytes{9}).ok();
  });
  auto got = waiter.get("late", deadline_in(5s));
  later.join();
  CHECK(set);
  REQUIRE(got.ok());
  CHECK(*got == Bytes{9});
}

TEST_CASE("tcpstore client: a wait past its deadline is cancelled and the connection goes on", "[tcpstore]") {
  auto server = local_server();
  TcpStoreClient c = client_of(*server);
  const auto t0 = Clock::now();
  auto r = c.wait({"never"}, deadline_in(150ms));
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == ETIMEDOUT);
  CHECK(r.error().message.find("never") != std::string::npos);
  CHECK(Clock::now() - t0 >= 150ms);
  REQUIRE(c.connected());
  CHECK(*c.add("after", 1) == 1);
}

TEST_CASE("tcpstore client: check and compare_set", "[tcpstore]") {
  auto server = local_server();
  TcpStoreClient c = client_of(*server);
  CHECK_FALSE(*c.check({"x"}));
  CHECK(*c.compare_set("x", {}, Bytes{'1'}) == Bytes{'1'});
  CHECK(*c.compare_set("x", {}, Bytes{'2'}) == Bytes{'1'});
  CHECK(*c.check({"x"}));
}

TEST_CASE("tcpstore client: nobody listening is ECONNREFUSED once the deadline passes", "[tcpstore]") {
  uint16_t port = 0;
  {
    auto s = local_server();
    port = s->port();
  }
  const auto t0 = Clock::now();
  auto c = TcpStoreClient::connect("127.0.0.1", port, deadline_in(300ms));
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code == ECONNREFUSED);
  CHECK(Clock::now() - t0 >= 300ms);  // tried again until then
  CHECK(c.error().message.find("127.0.0.1:" + std::to_string(port)) != std::string::npos);
}

TEST_CASE("tcpstore client: a server that starts after the client is found", "[tcpstore]") {
  auto probe = TcpStoreServer::start("127.0.0.1", 0);
  REQUIRE(probe.ok());
  const uint16_t port = (*probe)->port();
  probe->reset();
  std::unique_ptr<TcpStoreServer> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(200ms);
    if (auto s = TcpStoreServer::start("127.0.0.1", port)) late = std::move(*s);
  });
  auto c = TcpStoreClient::connect("127.0.0.1", port, deadline_in(5s));
  starter.join();
  REQUIRE(late);
  REQUIRE(c.ok());
  CHECK(*c->add("k", 1) == 1);
}

TEST_CASE("tcpstore client: a peer that is no TCPStore is refused, not waited on", "[tcpstore]") {
  // A listener that answers anything with 4 bytes that are not the nonce.
  auto l = listen_tcp("127.0.0.1", 0);
  REQUIRE(l.ok());
  const uint16_t port = *bound_port(l->get());
  std::thread liar([&] {
    int fd = ::accept(l->get(), nullptr, nullptr);
    uint8_t buf[64];
    (void)::recv(fd, buf, sizeof(buf), 0);
    const uint8_t junk[4] = {1, 2, 3, 4};
    (void)::send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
    std::this_thread::sleep_for(100ms);
    ::close(fd);
  });
  auto c = TcpStoreClient::connect("127.0.0.1", port, deadline_in(5s));
  liar.join();
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().code == EPROTO);
  CHECK(c.error().message.find("not a TCPStore") != std::string::npos);
}

TEST_CASE("tcpstore client: after an error every call says the connection is closed", "[tcpstore]") {
  auto server = local_server();
  TcpStoreClient c = client_of(*server);
  server.reset();  // the server goes: the next reply never comes
  auto r = c.add("k", 1);
  REQUIRE_FALSE(r.ok());
  CHECK_FALSE(c.connected());
  auto again = c.add("k", 1);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == EPIPE);
}

TEST_CASE("tcpstore host:port: parsed, and bad text said why", "[tcpstore]") {
  auto hp = parse_host_port("10.77.0.1:29500");
  REQUIRE(hp.ok());
  CHECK(hp->host == "10.77.0.1");
  CHECK(hp->port == 29500);
  auto v6 = parse_host_port("[::1]:5");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  CHECK(v6->text() == "[::1]:5");
  CHECK_FALSE(parse_host_port("nohost").ok());
  CHECK_FALSE(parse_host_port("h:0").ok());
  CHECK_FALSE(parse_host_port("h:70000").ok());
  // A server may ask for any port; a client may not.
  auto any = parse_host_port("127.0.0.1:0", /*any_port=*/true);
  REQUIRE(any.ok());
  CHECK(any->port == 0);
  CHECK_FALSE(parse_host_port("h:70000", /*any_port=*/true).ok());
  CHECK(parse_host_port("h:x").error().message.find("1..65535") != std::string::npos);
}

// libtorch's client sends every key with "/" first; phos's must too, or a
// key one sets is not the key the other reads (tcpstore_interop on a GPU
// host found it so).
TEST_CASE("tcpstore client: keys go on the wire as libtorch's client sends them", "[tcpstore]") {
  CHECK(TcpStoreClient::store_key("phos/nccl/1/2/3/id") == "/phos/nccl/1/2/3/id");
  CHECK(TcpStoreClient::store_keys({"a", "b"}) == std::vector<std::string>{"/a", "/b"});
}
