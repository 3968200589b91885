// A client of a c10d TCPStore (tcp_store_protocol.h): the store a torchrun
// or torch.distributed job already serves at MASTER_ADDR:MASTER_PORT, or
// phosctl's own. Written for phos from the protocol, not taken from torch:
// libtorch's client lives inside libtorch_cpu, and libphos is preloaded
// into programs without torch.
//
// One query at a time on one connection. Any error closes the connection
// (a reply half read cannot be told from the next): the client is then
// broken, every later call fails with EPIPE, and the caller connects again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "phos/support/result.h"
#include "phos/support/socket_io.h"
#include "phos/support/unique_fd.h"

namespace phos::net {

class TcpStoreClient {
 public:
  // How long one reply may take (not a WAIT's: it has its own deadline).
  static constexpr std::chrono::milliseconds kReplyTimeout{10000};

  // Connects, retrying with backoff (50 ms doubling to 1 s) while the
  // server refuses or is unreachable, until `deadline` (its host may come
  // back after this one: a restore); then VALIDATE and a PING whose echo
  // proves the other end is a TCPStore. EPROTO where it is not.
  static Result<TcpStoreClient> connect(const std::string& host, uint16_t port, Deadline deadline);

  Result<void> set(const std::string& key, const std::vector<uint8_t>& value);
  // The value once the key exists (a WAIT first, as libtorch's get):
  // ETIMEDOUT where it does not by `deadline`.
  Result<std::vector<uint8_t>> get(const std::string& key, Deadline deadline);
  // The key's value after adding `delta` (a missing key counts as 0).
  Result<int64_t> add(const std::string& key, int64_t delta);
  // Whether every key exists now.
  Result<bool> check(const std::vector<std::string>& keys);
  // Returns once every key exists, or ETIMEDOUT at `deadline` (the server's
  // wait cancelled).
  Result<void> wait(const std::vector<std::string>& keys, Deadline deadline);
  // Sets `key` to `desired` where it holds `expected` (a missing key counts
  // as empty); the value it holds afterwards either way.
  Result<std::vector<uint8_t>> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired);
  // Whether the key was there to delete.
  Result<bool> remove(const std::string& key);
  Result<int64_t> num_keys();
  // A key as it goes on the wire: as libtorch's client sends it ("/" first).
  static std::string store_key(const std::string& key);
  static std::vector<std::string> store_keys(const std::vector<std::string>& keys);
  // The server's echo of `nonce`.
  Result<uint32_t> ping(uint32_t nonce);

  bool connected() const { return fd_.valid(); }
  const std::string& peer() const { return peer_; }

 private:
  TcpStoreClient(UniqueFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}
  // One connection, validated and pinged.
  static Result<TcpStoreClient> attempt(const std::string& host, uint16_t port, Deadline deadline);
  Result<void> send(const std::vector<uint8_t>& query);
  template <class T>
  Result<T> receive(Deadline deadline);
  Result<std::vector<uint8_t>> receive_vector(Deadline deadline);
  // Every error goes through here: the connection is closed, the error named.
  Error broken(const std::string& what, const Error& e);
  Result<void> usable() const;

  UniqueFd fd_;
  std::string peer_;  // HOST:PORT, for messages
};

}  // namespace phos::net
