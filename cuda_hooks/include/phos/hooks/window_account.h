// What a copy window keeps of the program's calls for its close reply
// (copy_window.h), apart from the counters: the buffers each launch on a
// trusted speculated set pointed into without writing them, to name the
// kernels that could have written a chunk the engine found changed (a
// refused image, cow_trust=checksum); and the calls that waited longest for
// the engine, to say which call pays for copy-on-write.
//
// A launch's buffers are whole allocations of the program (the
// speculation's index), so "pointed into the chunk's buffer" is what can be
// known without validation. Bounded: a window of many distinct launches
// keeps the first kMaxRanges (kernel, buffer) pairs and counts the rest.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "phos/images/agent_messages.h"

namespace phos::hooks {

class WindowAccount {
 public:
  static constexpr size_t kMaxRanges = 4096;
  using Ranges = std::span<const std::pair<uint64_t, uint64_t>>;  // [start, end)

  void clear();
  // A launch of `kernel` (its identity; `name` as registered) on a trusted
  // speculated set: the buffers it reads and those it writes.
  void launch(const void* kernel, const std::string& name, Ranges reads, Ranges writes);
  // A call that waited for the engine, or saved chunks into the pool.
  void cost(const agent::CallWait& w);

  // The kernels whose launches pointed into the buffer of one of `missed`
  // without writing it, most launched first (at most kMaxWindowKernels),
  // and how many kernels in all.
  std::pair<std::vector<agent::KernelLaunches>, uint64_t> suspects(
      const std::vector<agent::AddressRange>& missed) const;
  // Longest first, at most agent::kMaxLongestWaits.
  std::vector<agent::CallWait> longest_waits() const;
  // Most chunks saved first, at most agent::kMaxLongestWaits.
  std::vector<agent::CallWait> most_saved() const;
  uint64_t ranges_dropped() const;

 private:
  struct Pointed {
    std::string name;
    uint64_t launches = 0;
  };
  mutable std::mutex mu_;
  std::map<std::tuple<const void*, uint64_t, uint64_t>, Pointed> pointed_;  // (kernel, start, end)
  uint64_t dropped_ = 0;
  std::vector<agent::CallWait> longest_, most_saved_;
};

}  // namespace phos::hooks
