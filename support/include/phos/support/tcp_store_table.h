// What a TCPStore server keeps and answers (tcp_store_protocol.h), apart
// from its sockets: keys and values, and the clients waiting for keys.
// Fed the bytes a client sent, it takes the whole queries among them and
// says what goes back to whom (a SET may end other clients' waits).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::net {

struct StoreReply {
  int client = 0;
  std::vector<uint8_t> bytes;
};

class StoreTable {
 public:
  // Serves the whole queries at the front of `in` from `client`, appending
  // the replies to `out`; how many bytes they took (a query not yet whole
  // waits for more). EPROTO where `in` is no query this table serves (the
  // first not VALIDATE with the magic, an unknown or unserved type, a
  // length past its bound): the connection is then closed.
  Result<size_t> serve(int client, std::span<const uint8_t> in, std::vector<StoreReply>& out);
  // A client gone: its waits end, its validation with it.
  void forget(int client);
  size_t size() const { return values_.size(); }
  size_t waiting_clients() const { return awaited_.size(); }

 private:
  // One query from the front of `in`: bytes taken, 0 where not whole yet.
  Result<size_t> serve_one(int client, std::span<const uint8_t> in, std::vector<StoreReply>& out);
  void stored(const std::string& key, std::vector<StoreReply>& out);  // ends the waits it completes
  void forget_waits(int client);
  bool all_present(const std::vector<std::string>& keys) const;

  std::map<std::string, std::vector<uint8_t>> values_;
  std::map<std::string, std::vector<int>> waiters_;  // key -> clients waiting for it
  std::map<int, size_t> awaited_;                    // client -> keys it still waits for
  std::set<int> validated_;
};

}  // namespace phos::net
