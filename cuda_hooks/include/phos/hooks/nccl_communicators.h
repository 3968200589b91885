// The NCCL communicators the program has created and not yet destroyed,
// with the layout each was made with (rank, rank count, device, the
// communicator it was split from). A multi-process job's checkpoint (issue
// 17) must destroy them before the driver's checkpoint and create them
// again after a restore; this is what it will know them by. No CUDA or
// NCCL here: handles are opaque addresses, so it is unit-tested alone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace phos::hooks {

struct NcclCommunicator {
  uint64_t handle = 0;  // the program's ncclComm_t
  int rank = -1;
  int nranks = 0;
  int device = -1;      // current at its creation; -1: none
  uint64_t parent = 0;  // ncclCommSplit's source; 0: made from a unique id
  int color = 0, key = 0;  // ncclCommSplit's arguments
  bool single_process = false;  // every rank in this process (ncclCommInitAll, and its splits)
  // The same on every rank of the communicator: a hash of the unique id it
  // was made with, or of its parent's and its split color and key's order.
  uint64_t job_id = 0;
  uint64_t calls = 0;  // collective and point-to-point calls issued on it
  // A job-wide quiesce's stop: the call with this number (0 the first)
  // waits before it is issued, until disarmed; held while one does.
  std::optional<uint64_t> stop_at;
  bool held = false;
  bool operator==(const NcclCommunicator&) const = default;
};

// The job-wide name of a communicator made from a unique id (its bytes),
// and of one split from `parent_job` with `color` (every rank of the new
// communicator passed the same color).
uint64_t nccl_job_id(const void* unique_id, size_t bytes);
uint64_t nccl_split_job_id(uint64_t parent_job, int color);

class NcclCommunicators {
 public:
  // A creation that succeeded. A handle listed already is replaced (NCCL
  // handed out the address of one destroyed without phos seeing it).
  void created(const NcclCommunicator& c);
  // ncclCommDestroy or ncclCommAbort succeeded. ncclCommFinalize does not
  // free the communicator: it stays until one of those.
  void destroyed(uint64_t handle);
  std::optional<NcclCommunicator> find(uint64_t handle) const;
  // A collective or point-to-point call is about to be issued on `handle`
  // (one not created through the hooks is not counted): counted, after
  // waiting while it is the call a stop is armed at. The caller holds no
  // gate pass: a checkpoint's quiesce goes on while it waits.
  void count_call(uint64_t handle);
  // Every rank's calls on a communicator are issued in the same order: a
  // stop armed at the same call number on every rank (`job_id`) holds them
  // all at one boundary, none having issued it, each having issued all
  // before it. False where this process has no communicator of the job, or
  // has issued that call already.
  bool arm_stop(uint64_t job_id, uint64_t at_call);
  // Lets the held calls (and those still to come to the stop) go on.
  void disarm(uint64_t job_id);
  // In creation order.
  std::vector<NcclCommunicator> list() const;
  // Communicators with ranks in other processes: what a dump of this
  // process alone cannot take (until issue 17's coordinated checkpoint).
  size_t spanning_processes() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;  // a stop disarmed, or a communicator gone
  std::vector<NcclCommunicator> live_;
};

}  // namespace phos::hooks
