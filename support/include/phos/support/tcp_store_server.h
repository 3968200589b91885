// A small TCPStore server (tcp_store_table.h behind sockets), serving in a
// thread of its own: the store `phosctl job` coordinates the hosts of a
// job through, and the stand-in for torch's store in CI (phos-tcpstore).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "phos/support/result.h"
#include "phos/support/unique_fd.h"

namespace phos::net {

class TcpStoreServer {
 public:
  // Listens on `host` (empty: every address) and `port` (0: one the system
  // picks) and serves until destroyed.
  static Result<std::unique_ptr<TcpStoreServer>> start(const std::string& host, uint16_t port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }
  // Connections accepted so far (tests look).
  uint64_t accepted() const { return accepted_.load(); }

 private:
  TcpStoreServer(UniqueFd listener, UniqueFd wake, uint16_t port)
      : listener_(std::move(listener)), wake_(std::move(wake)), port_(port) {}
  void run();

  UniqueFd listener_;
  UniqueFd wake_;  // an eventfd: written to stop the thread
  uint16_t port_;
  std::atomic<uint64_t> accepted_{0};
  std::thread thread_;
};

}  // namespace phos::net
