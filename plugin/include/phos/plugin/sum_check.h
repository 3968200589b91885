// Validation by checksum, the engine's pure part (docs/design/
// checksum-validation.md): the fingerprints (fingerprint.h) of a copy
// window's chunks, the check of each copy against the memory's content at
// the freeze, the plan of recopy's final pass, and what a refused image
// says. The engine takes the fingerprints (GPU or CPU) and copies; this
// decides, and is tested without a GPU (test_sum_check.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/copy_state.h"

namespace phos::plugin::sum_check {

// A fingerprint per chunk of a copy table, where one was taken. Workers
// set distinct chunks at once: each chunk is its own memory.
class ChunkSums {
 public:
  ChunkSums() = default;
  explicit ChunkSums(size_t chunks) : value_(chunks, 0), known_(chunks, 0) {}
  size_t size() const { return value_.size(); }
  bool empty() const { return value_.empty(); }
  // `zero`: every byte of the chunk was 0 (zero_chunk.h), as the pass that
  // took the fingerprint saw it.
  void set(uint64_t chunk, uint64_t fingerprint, bool zero = false);
  std::optional<uint64_t> get(uint64_t chunk) const;
  // Whether the chunk's fingerprint was taken and it was all 0 bytes then.
  bool zero(uint64_t chunk) const { return chunk < known_.size() && known_[chunk] == kKnownZero; }

 private:
  static constexpr uint8_t kKnown = 1, kKnownZero = 2;
  std::vector<uint64_t> value_;
  std::vector<uint8_t> known_;  // 0, kKnown or kKnownZero
};

// What a copy was checked against: the freeze (copy-on-write's T0) or the
// final gate closing (recopy's T1).
enum class Against { kFreeze, kFinalPass };

// A copy's fingerprint against the reference: false where they differ.
// A chunk the reference has no fingerprint for cannot be checked: false.
bool matches(const ChunkSums& reference, uint64_t chunk, uint64_t copied);

// Where a chunk lies, for what a refused image says.
struct ChunkPlace {
  uint64_t chunk = 0;          // in the copy table
  uint64_t allocation_id = 0;
  uint64_t address = 0;        // the allocation's, in the process
  uint64_t offset = 0;         // of the chunk in it
  bool from_pool = false;      // copy-on-write: copied from its pool slot
};

// Copies that differed from the reference: the first few, all counted.
class Misses {
 public:
  static constexpr size_t kNamed = 16;
  void add(const ChunkPlace& where);
  uint64_t count() const { return count_; }
  const std::vector<ChunkPlace>& named() const { return named_; }

 private:
  uint64_t count_ = 0;
  std::vector<ChunkPlace> named_;
};

// "chunk 913 (allocation #17 at 0x7f2a40000000, offset 52 MiB, from the
// process's memory)".
std::string describe_place(const ChunkPlace& where);
// Why the engine fails the copy: the first chunk that differed, how many.
std::string describe_misses(const Misses& misses, Against against);
// The kernels a refused image names: those trusted on speculation in the
// window, most launched first.
std::string describe_kernels(const std::vector<agent::KernelLaunches>& kernels, uint64_t kernel_count);
// The launches that could have written the missed chunks: their arguments
// pointed into a missed chunk's buffer, their speculated write set did not
// hold it (the agent's CloseCopyWindowReply::suspects).
std::string describe_suspects(const std::vector<agent::KernelLaunches>& suspects);
// The whole refusal, as criu's log and the user see it.
std::string refusal(const std::string& engine_error, const std::vector<agent::KernelLaunches>& kernels,
                    uint64_t kernel_count, const std::vector<agent::KernelLaunches>& suspects = {});
// The address ranges of the misses named, for the agent (chunk_size bytes each).
std::vector<agent::AddressRange> missed_ranges(const Misses& misses, uint64_t chunk_size);

// Recopy's final pass, gate closed and streams drained: every chunk not
// copied yet, and every copied chunk whose content now (T1) differs from
// the fingerprint of its copy in the image, whatever its dirty mark says.
struct FinalPass {
  std::vector<uint64_t> copy;  // table chunks to copy (again), in order
  uint64_t not_copied = 0;     // of those, never copied (not reached, or skipped dirty)
  uint64_t changed = 0;        // of those, copied and changed since (or without a fingerprint to tell)
  uint64_t missed = 0;         // of the changed, without a dirty mark: writes speculation missed
  uint64_t unchanged_dirty = 0;  // dirty but unchanged: their copy stands
};
// `dead`: chunks dead at the final closing (dead_ranges.h), neither copied
// nor counted, whatever changed.
FinalPass plan_final_pass(const copystate::CopyState& table, const ChunkSums& image, const ChunkSums& now,
                          const std::function<bool(uint64_t)>& dead = nullptr);

}  // namespace phos::plugin::sum_check
