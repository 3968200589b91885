// The rendezvous of the ranks of one host (nccl_rendezvous.h): files named
// by the communicator's job id and the resuming run, in a directory of the
// user's own (0700, checked), on /dev/shm by default. No NCCL here (the id
// is bytes).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "phos/hooks/nccl_rendezvous.h"
#include "phos/support/result.h"

namespace phos::hooks {

class ShmRendezvous : public NcclRendezvous {
 public:
  // `dir` made (0700) where missing; refused where it is not a directory of
  // this user's, closed to others.
  static Result<ShmRendezvous> open(const std::string& dir);
  // The user's directory on /dev/shm (PHOS_NCCL_RENDEZVOUS_DIR overrides).
  static std::string default_dir();

  // The id stays: rank 0 cannot know when the last rank has read it
  // (NCCL's own join is no proof where a rank gave up); ids left more than
  // an hour ago go.
  Result<void> leave(const NcclMeeting& m, const std::vector<uint8_t>& id) override;
  Result<std::vector<uint8_t>> wait(const NcclMeeting& m, size_t bytes, std::chrono::milliseconds timeout) override;
  Result<void> arrive(const NcclMeeting& m, int rank, int nranks) override;
  Result<void> wait_all(const NcclMeeting& m, int nranks, std::chrono::milliseconds timeout) override;
  std::string where() const override { return dir_; }
  // Removes the files left before `age` ago; how many went.
  size_t prune(std::chrono::seconds age) const;

  const std::string& dir() const { return dir_; }

 private:
  explicit ShmRendezvous(std::string dir) : dir_(std::move(dir)) {}
  // Named by job id and run only, as before multi-host jobs (a held call
  // is one per host's criu run there).
  std::string path(const NcclMeeting& m) const;
  std::string dir_;
};

}  // namespace phos::hooks
