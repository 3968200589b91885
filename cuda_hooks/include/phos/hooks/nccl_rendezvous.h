// Where the ranks of an NCCL job on one host meet after a checkpoint: the
// communicator's rank 0 draws a new unique id and leaves it in a file named
// by the communicator's job id and the resuming criu run's nonce; the other
// ranks wait for it there. A directory of the user's own (0700, checked),
// on /dev/shm by default; no NCCL here (the id is bytes).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::hooks {

class NcclRendezvous {
 public:
  // `dir` made (0700) where missing; refused where it is not a directory of
  // this user's, closed to others.
  static Result<NcclRendezvous> open(const std::string& dir);
  // The user's directory on /dev/shm (PHOS_NCCL_RENDEZVOUS_DIR overrides).
  static std::string default_dir();

  // Rank 0: the id, whole or not at all for a reader. It stays: rank 0
  // cannot know when the last rank has read it (NCCL's own join is no
  // proof where a rank gave up); ids left more than an hour ago go.
  Result<void> leave(uint64_t job_id, uint64_t nonce, const std::vector<uint8_t>& id) const;
  // The other ranks: the id once it is there (`bytes` of it), or an error
  // after `timeout`.
  Result<std::vector<uint8_t>> wait(uint64_t job_id, uint64_t nonce, size_t bytes,
                                    std::chrono::milliseconds timeout) const;
  // Every rank says it is here (before NCCL's creation, which has no
  // deadline); wait_all returns once `nranks` have, or fails after
  // `timeout`.
  Result<void> arrive(uint64_t job_id, uint64_t nonce, int rank) const;
  Result<void> wait_all(uint64_t job_id, uint64_t nonce, int nranks, std::chrono::milliseconds timeout) const;
  // Removes the files left before `age` ago; how many went.
  size_t prune(std::chrono::seconds age) const;

  const std::string& dir() const { return dir_; }

 private:
  explicit NcclRendezvous(std::string dir) : dir_(std::move(dir)) {}
  std::string path(uint64_t job_id, uint64_t nonce) const;
  std::string dir_;
};

}  // namespace phos::hooks
