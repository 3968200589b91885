// Dead memory: device memory that the program's allocator holds free at an
// iteration boundary (phos.step() takes PyTorch's caching allocator's free
// blocks from its memory snapshot). A checkpoint taken while the program
// waits in that very step call stores none of it, and its restore leaves it
// unfilled: nothing the program runs reads a free block before it writes
// it. The agent hands the ranges to the plugin with the quiesce's reply
// (agent.proto QuiesceReply.dead_ranges); the engine marks the chunks that
// lie wholly inside them dead (Compression::kDead). A chunk only partly
// free is stored whole: a chunk is the image's unit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace phos::dead {

// [address, address + size) of the program's virtual addresses.
struct Range {
  uint64_t address = 0;
  uint64_t size = 0;
  bool operator==(const Range&) const = default;
};

// The ranges sorted by address, empty ones dropped, overlapping and
// adjacent ones merged (an allocator's neighbouring free blocks are one
// free run).
std::vector<Range> normalized(std::vector<Range> ranges);

// Which chunks of the allocation [address, address + size), in chunks of
// `chunk_size` from its start (the last one may be shorter), lie wholly in
// `ranges` (normalized()); true for a dead chunk.
std::vector<bool> dead_chunks(uint64_t address, uint64_t size, uint64_t chunk_size, const std::vector<Range>& ranges);

// The ranges as the wire carries them (address, size, address, size, ...),
// and back; "" or what is wrong with a wire list (odd length, a range that
// wraps around the address space).
std::vector<uint64_t> to_pairs(const std::vector<Range>& ranges);
std::string from_pairs(const std::vector<uint64_t>& pairs, std::vector<Range>& out);

}  // namespace phos::dead
