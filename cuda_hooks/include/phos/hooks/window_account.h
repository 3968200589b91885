// What a copy window keeps of the program's calls for its close reply
// (copy_window.h), apart from the counters: the kernels launched on a
// trusted speculated set, and with cow_trust=checksum the buffers each
// pointed into without writing them, to name the kernels that could have
// written a chunk the engine found changed (a refused image); and the calls
// that waited longest for the engine, to say which call pays for
// copy-on-write.
//
// A launch's buffers are whole allocations of the program (the
// speculation's index), so "pointed into the chunk's buffer" is what can be
// known without validation. Bounded: a window of many distinct launches
// keeps the first kMaxRanges (kernel, buffer) pairs and counts the rest.
// A launch takes one lock and looks its kernel up once.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
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
  // speculated set, counted; the buffers it reads (none: not kept) and
  // those it writes.
  void launch(const void* kernel, const std::string& name, Ranges reads, Ranges writes);
  // A call that waited for the engine, or saved chunks into the pool.
  void cost(const agent::CallWait& w);

  // A list of kernels cut for the close reply: most launched first, at most
  // kMaxWindowKernels, and how many there were.
  using Kernels = std::pair<std::vector<agent::KernelLaunches>, uint64_t>;
  // The kernels launched.
  Kernels kernels() const;
  // The kernels whose launches pointed into the buffer of one of `missed`
  // without writing it.
  Kernels suspects(const std::vector<agent::AddressRange>& missed) const;
  // Longest first, at most agent::kMaxLongestWaits.
  std::vector<agent::CallWait> longest_waits() const;
  // Most chunks saved first, at most agent::kMaxLongestWaits.
  std::vector<agent::CallWait> most_saved() const;
  // (kernel, buffer) pairs past kMaxRanges, not kept: a suspect may be
  // missing from suspects().
  uint64_t ranges_dropped() const;

 private:
  struct Pointed {
    uint64_t start = 0, end = 0, launches = 0;
  };
  struct Kernel {
    std::string name;
    uint64_t launches = 0;
    std::vector<Pointed> pointed;  // by (start, end)
  };
  void pointed_locked(Kernel& k, uint64_t start, uint64_t end);

  mutable std::mutex mu_;
  std::unordered_map<const void*, Kernel> kernels_;
  size_t ranges_ = 0;  // pointed, over every kernel
  uint64_t dropped_ = 0;
  std::vector<agent::CallWait> longest_, most_saved_;
};

}  // namespace phos::hooks
