// How large the copy-on-write pool on one GPU is (soft copy-on-write,
// copy_state.h). The pool is GPU memory the hooks save chunks into, device
// to device, before a write; the engine drains it to the host at PCIe
// speed. The larger it is, the fewer writes wait for the engine; with
// cow_pool_mib=auto it takes what the GPU has free at the stall, less a
// reserve for the program, and gives it back when the program's own
// allocation finds the GPU full (copy_state.h, "giving the pool back").
//
// Several processes of one dump on a GPU: a pool can be given back only to
// its own process, so the first process's pool must not take the free
// memory a second one's program then needs. Auto splits one measurement of
// the free memory, less one reserve, among the dump's processes there in
// proportion to their memory on that GPU. Processes outside the dump that
// use the GPU are not covered: they find what the reserve leaves, as
// before (nothing tells criu of them, and their allocations cannot ask a
// pool back).
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
  // Auto, several processes of the dump on this GPU: free_bytes is the one
  // measurement split among them (taken before the first of their pools);
  // dump_bytes their memory there, this process's included, that may take
  // a pool; `processes` how many they are (each keeps its own extra_keep).
  // 0 / 1: this process alone.
  uint64_t dump_bytes = 0;
  uint32_t processes = 1;
  // What the GPU has free now, where pools of the dump were made since
  // free_bytes was measured (0: free_bytes is now): the share is at most
  // this less this process's own reserve.
  uint64_t free_now = 0;
};

// The dump's processes on one GPU that may take an auto pool there.
struct PoolPeers {
  uint64_t bytes = 0;      // their memory there (PoolRequest::dump_bytes)
  uint32_t processes = 0;
};

struct PoolSize {
  uint64_t slots = 0;
  uint64_t reserve = 0;  // kept free for the program (extra_keep included)
  uint64_t room = 0;     // free less the reserve
  // What bounded it: "the setting", "free memory", "the process's memory",
  // "its share of free memory", "free memory now".
  const char* limit = "";
};

// The largest explicit pool (cow_pool_mib's upper bound), and auto's too.
constexpr uint64_t kMaxPoolBytes = uint64_t(1) << 40;

// Explicit: the setting, at most what is free less 5% of the GPU (at least
// 1 GiB). Auto: what is free less 5% of the GPU or 2 GiB, the larger (and
// every process's extra_keep), times this process's part of dump_bytes; at
// most the process's memory there, kMaxPoolBytes and free_now less its
// reserve.
PoolSize size_pool(const PoolRequest& q);

// One line for the log: the figures that made the size.
std::string describe_pool_size(const PoolRequest& q, const PoolSize& s);

}  // namespace phos::plugin
