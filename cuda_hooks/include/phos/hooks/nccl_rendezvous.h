// Where the ranks of an NCCL job meet after a checkpoint to make their
// communicator again: its rank 0 draws a new unique id and leaves it there,
// the other ranks take it; then every rank says it has come and waits for
// the others (NCCL's creation has no deadline, this wait has). Two places:
// a directory on /dev/shm (ShmRendezvous: the ranks of one host), and the
// c10d TCPStore the job already serves (StoreRendezvous: ranks on any
// number of hosts).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "phos/support/result.h"
#include "phos/support/socket_io.h"

namespace phos::hooks {

// One meeting: a communicator's ranks after one resume.
struct NcclMeeting {
  uint64_t job_id = 0;   // the communicator's (the same on every rank)
  uint64_t run = 0;      // the resuming run: a criu run's nonce, or a job-wide run (phosctl job)
  uint64_t at_call = 0;  // the call every rank was held before: ranks held elsewhere never meet
};

class NcclRendezvous {
 public:
  virtual ~NcclRendezvous() = default;
  // Rank 0: the id, whole or not at all for a reader.
  virtual Result<void> leave(const NcclMeeting& m, const std::vector<uint8_t>& id) = 0;
  // The other ranks: the id once it is there (`bytes` of it), or an error
  // after `timeout`.
  virtual Result<std::vector<uint8_t>> wait(const NcclMeeting& m, size_t bytes, std::chrono::milliseconds timeout) = 0;
  // Every rank says it is here; wait_all returns once `nranks` have, or
  // fails after `timeout`.
  virtual Result<void> arrive(const NcclMeeting& m, int rank, int nranks) = 0;
  virtual Result<void> wait_all(const NcclMeeting& m, int nranks, std::chrono::milliseconds timeout) = 0;
  // Where, for messages ("/dev/shm/phos-nccl-0", "TCPStore 10.77.0.1:29500").
  virtual std::string where() const = 0;
};

// Which rendezvous a rank uses: PHOS_NCCL_STORE (HOST:PORT, or `off` for
// the directory); else MASTER_ADDR and MASTER_PORT (the store torch's ranks
// are clients of); else the directory (PHOS_NCCL_RENDEZVOUS_DIR, or the
// user's on /dev/shm).
struct RendezvousChoice {
  bool store = false;
  net::HostPort at;  // the store's
  std::string dir;   // the directory's
  std::string why;   // what chose it, for messages
};
using GetEnv = std::function<const char*(const char*)>;
Result<RendezvousChoice> choose_rendezvous(const GetEnv& getenv);

// The rendezvous chosen, opened: the directory made or checked, or the
// store connected (retried until `deadline`: its host may be restored
// after this one).
Result<std::unique_ptr<NcclRendezvous>> open_rendezvous(const RendezvousChoice& choice, net::Deadline deadline);

}  // namespace phos::hooks
