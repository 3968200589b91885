// How large the copy-on-write pool on one GPU is (soft copy-on-write,
// copy_state.h). The pool is GPU memory the hooks save chunks into, device
// to device, before a write; the engine drains it to the host at PCIe
// speed. The larger it is, the fewer writes wait for the engine; with
// cow_pool_mib=auto it takes what the GPU has free at the stall, less a
// reserve for the program, and gives it back when the program's own
// allocation finds the GPU full (copy_state.h, "giving the pool back").
#pragma once

#include <cstdint>
#include <string>

namespace phos::plugin {

struct PoolRequest {
  bool automatic = true;     // cow_pool_mib=auto
  uint64_t wanted = 0;       // cow_pool_mib's bytes where not automatic
  uint64_t free_bytes = 0;   // what the GPU has free now
  uint64_t total_bytes = 0;  // the GPU's memory
  uint64_t extra_keep = 0;   // the engine's own memory still to come there (checksum bounce buffers)
  uint64_t process_bytes = 0;  // the process's memory on that GPU: auto needs no slot beyond it
  uint64_t chunk = 0;          // a slot's size
};

struct PoolSize {
  uint64_t slots = 0;
  uint64_t reserve = 0;  // kept free for the program (extra_keep included)
  uint64_t room = 0;     // free less the reserve
  const char* limit = "";  // what bounded it: "the setting", "free memory", "the process's memory"
};

// The largest explicit pool (cow_pool_mib's upper bound), and auto's too.
constexpr uint64_t kMaxPoolBytes = uint64_t(1) << 40;

// Explicit: the setting, at most what is free less 5% of the GPU (at least
// 1 GiB). Auto: what is free less 5% of the GPU or 2 GiB, the larger, at
// most the process's memory there and kMaxPoolBytes.
PoolSize size_pool(const PoolRequest& q);

// One line for the log: the figures that made the size.
std::string describe_pool_size(const PoolRequest& q, const PoolSize& s);

}  // namespace phos::plugin
