#include "phos/support/tcp_store_client.h"
#include "phos/support/text.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "phos/support/tcp_store_protocol.h"

namespace phos::net {
namespace {

// Errors worth another try while connecting: nobody listens yet, or the
// network between is not up (yet, or locked by a criu on either side).
bool transient(int code) {
  return code == ECONNREFUSED || code == ETIMEDOUT || code == EHOSTUNREACH || code == ENETUNREACH ||
         code == ECONNRESET || code == ECONNABORTED || code == EAGAIN;
}

Deadline reply_deadline() { return deadline_in(TcpStoreClient::kReplyTimeout); }

}  // namespace

Result<TcpStoreClient> TcpStoreClient::attempt(const std::string& host, uint16_t port, Deadline deadline) {
  // One attempt gets at most 2 s, so that a dropped SYN is tried again.
  auto fd = connect_tcp(host, port, std::min(deadline, deadline_in(std::chrono::seconds(2))));
  if (!fd) return make_error("TCPStore at " + HostPort{host, port}.text() + ": " + fd.error().message, fd.error().code);
  TcpStoreClient c(std::move(*fd), HostPort{host, port}.text());
  PHOS_TRY(c.send(validate_query()));
  // The echo proves a TCPStore answers (nothing answers VALIDATE).
  const uint32_t nonce = uint32_t(::getpid()) ^ 0x70686f73u;
  auto echo = c.ping(nonce);
  if (!echo) return echo.error();
  if (*echo != nonce)
    return make_error("TCPStore at " + c.peer_ + ": PING answered " + std::to_string(*echo) + ", not " +
                          std::to_string(nonce) + ": not a TCPStore of the protocol phos speaks",
                      EPROTO);
  return c;
}

Result<TcpStoreClient> TcpStoreClient::connect(const std::string& host, uint16_t port, Deadline deadline) {
  auto backoff = std::chrono::milliseconds(50);
  for (;;) {
    auto c = attempt(host, port, deadline);
    if (c || !transient(c.error().code) || Clock::now() >= deadline) return c;
    // The last try comes at the deadline itself.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

Error TcpStoreClient::broken(const std::string& what, const Error& e) {
  fd_.reset();
  return make_error("TCPStore at " + peer_ + ": " + what + ": " + e.message, e.code);
}

Result<void> TcpStoreClient::usable() const {
  if (!fd_.valid()) return make_error("TCPStore at " + peer_ + ": the connection was closed after an error", EPIPE);
  return {};
}

Result<void> TcpStoreClient::send(const std::vector<uint8_t>& query) {
  PHOS_TRY(usable());
  if (auto r = send_all(fd_.get(), query, reply_deadline()); !r) return broken("send a query", r.error());
  return {};
}

template <class T>
Result<T> TcpStoreClient::receive(Deadline deadline) {
  PHOS_TRY(usable());
  uint8_t b[sizeof(T)];
  if (auto r = recv_exact(fd_.get(), b, deadline); !r) return broken("read a reply", r.error());
  T v;
  std::memcpy(&v, b, sizeof(T));
  return v;
}

Result<std::vector<uint8_t>> TcpStoreClient::receive_vector(Deadline deadline) {
  auto n = receive<uint64_t>(deadline);
  if (!n) return n.error();
  if (*n > kMaxStoreValueBytes)
    return broken("read a reply", make_error("a value of " + std::to_string(*n) + " bytes", EPROTO));
  std::vector<uint8_t> v(*n);
  if (auto r = recv_exact(fd_.get(), v, deadline); !r) return broken("read a reply", r.error());
  return v;
}

// libtorch's TCPStore client puts "/" before every key it is given (its
// keyPrefix_): the same here, so that a key phos sets is the key a torch
// client reads under the same name, and the other way round.
std::string TcpStoreClient::store_key(const std::string& key) { return "/" + key; }

std::vector<std::string> TcpStoreClient::store_keys(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(store_key(k));
  return out;
}

Result<void> TcpStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  return send(set_query(store_key(key), value));
}

Result<std::vector<uint8_t>> TcpStoreClient::get(const std::string& key, Deadline deadline) {
  PHOS_TRY(wait({key}, deadline));
  PHOS_TRY(send(get_query(store_key(key))));
  return receive_vector(reply_deadline());
}

Result<int64_t> TcpStoreClient::add(const std::string& key, int64_t delta) {
  PHOS_TRY(send(add_query(store_key(key), delta)));
  return receive<int64_t>(reply_deadline());
}

Result<bool> TcpStoreClient::check(const std::vector<std::string>& keys) {
  PHOS_TRY(send(check_query(store_keys(keys))));
  auto r = receive<uint8_t>(reply_deadline());
  if (!r) return r.error();
  if (*r == uint8_t(StoreCheckReply::kReady)) return true;
  if (*r == uint8_t(StoreCheckReply::kNotReady)) return false;
  return broken("CHECK", make_error("reply byte " + std::to_string(*r) + " is neither READY nor NOT_READY", EPROTO));
}

Result<void> TcpStoreClient::wait(const std::vector<std::string>& keys, Deadline deadline) {
  PHOS_TRY(send(wait_query(store_keys(keys))));
  auto came = wait_readable(fd_.get(), deadline);
  if (!came) return broken("WAIT", came.error());
  if (*came) {
    auto r = receive<uint8_t>(reply_deadline());
    if (!r) return r.error();
    if (*r != uint8_t(StoreWaitReply::kStopWaiting))
      return broken("WAIT", make_error("reply byte " + std::to_string(*r) + " is not STOP_WAITING", EPROTO));
    return {};
  }
  // Past the deadline: the server forgets the wait; a STOP_WAITING sent
  // before it read the cancel may come first.
  PHOS_TRY(send(cancel_wait_query()));
  auto r = receive<uint8_t>(reply_deadline());
  if (!r) return r.error();
  if (*r == uint8_t(StoreWaitReply::kStopWaiting)) {
    r = receive<uint8_t>(reply_deadline());
    if (!r) return r.error();
  }
  if (*r != uint8_t(StoreWaitReply::kWaitCanceled))
    return broken("CANCEL_WAIT", make_error("reply byte " + std::to_string(*r) + " is not WAIT_CANCELED", EPROTO));
  std::string names;
  for (const auto& k : keys) append_item(names, ", ", k);
  return make_error("TCPStore at " + peer_ + ": key(s) " + names + " not set before the deadline", ETIMEDOUT);
}

Result<std::vector<uint8_t>> TcpStoreClient::compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                                         const std::vector<uint8_t>& desired) {
  PHOS_TRY(send(compare_set_query(store_key(key), expected, desired)));
  return receive_vector(reply_deadline());
}

Result<bool> TcpStoreClient::remove(const std::string& key) {
  PHOS_TRY(send(delete_key_query(store_key(key))));
  auto n = receive<int64_t>(reply_deadline());
  if (!n) return n.error();
  return *n == 1;
}

Result<int64_t> TcpStoreClient::num_keys() {
  PHOS_TRY(send(num_keys_query()));
  return receive<int64_t>(reply_deadline());
}

Result<uint32_t> TcpStoreClient::ping(uint32_t nonce) {
  PHOS_TRY(send(ping_query(nonce)));
  return receive<uint32_t>(reply_deadline());
}

}  // namespace phos::net
