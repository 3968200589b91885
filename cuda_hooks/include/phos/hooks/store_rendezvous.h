// The rendezvous of ranks on any number of hosts (nccl_rendezvous.h),
// through the c10d TCPStore the job already serves (torchrun's agent, or
// rank 0's torch.distributed store): nothing new to deploy. Under
//
//   phos/nccl/<job id>/<run>/<held call>/
//
// rank 0 SETs `id`; the others GET it (waiting for it); each ADDs 1 to
// `arrived`, and the rank whose ADD makes it the rank count SETs `all`;
// every rank WAITs for `all`, then ADDs 1 to `left`, and the last to leave
// deletes the four keys, so the store does not grow checkpoint after
// checkpoint. torch's own keys never start with "phos/".
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "phos/hooks/nccl_rendezvous.h"
#include "phos/support/tcp_store_client.h"

namespace phos::hooks {

class StoreRendezvous : public NcclRendezvous {
 public:
  static Result<std::unique_ptr<StoreRendezvous>> connect(const net::HostPort& at, net::Deadline deadline);

  Result<void> leave(const NcclMeeting& m, const std::vector<uint8_t>& id) override;
  Result<std::vector<uint8_t>> wait(const NcclMeeting& m, size_t bytes, std::chrono::milliseconds timeout) override;
  Result<void> arrive(const NcclMeeting& m, int rank, int nranks) override;
  Result<void> wait_all(const NcclMeeting& m, int nranks, std::chrono::milliseconds timeout) override;
  std::string where() const override { return "TCPStore " + client_.peer(); }

  // The key of `what` in meeting `m`.
  static std::string key(const NcclMeeting& m, const char* what);

 private:
  explicit StoreRendezvous(net::TcpStoreClient client) : client_(std::move(client)) {}
  net::TcpStoreClient client_;
};

}  // namespace phos::hooks
