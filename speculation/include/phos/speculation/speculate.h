// Read and write sets of one piece of GPU work, at buffer granularity, before
// it runs (what the concurrent protocols check launches against):
//   - exact, for calls whose semantics say which bytes they touch (memcpy,
//     memset, the cuBLAS GEMM family, NCCL collectives): every buffer the
//     ranges overlap;
//   - speculated, for opaque kernels: each parameter that can hold a pointer
//     (layout.h) and lands inside a buffer names that buffer; pointers to
//     const are read, other pointers read and written; by-value aggregates
//     whose fields are not known have every aligned 8-byte word tried;
//   - unknown, where neither is possible (no parameter layout and no packed
//     argument buffer, a batched call whose matrices sit behind device
//     pointer arrays, more buffers than a set holds): the protocols then treat
//     every buffer as touched.
// No allocation, no lock: the caller (the hooks) holds the buffer index
// steady and owns the AccessSet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "phos/speculation/buffer_index.h"
#include "phos/speculation/kernel_layout.h"

namespace phos::speculation {

enum Access : uint8_t { kRead = 1, kWrite = 2 };

enum class SetKind : uint8_t { kExact, kSpeculated, kUnknown };
const char* set_kind_name(SetKind k);

// No default member initializers: an AccessSet lives on the launch path's
// stack, and its items must not be zeroed on every launch.
struct BufferAccess {
  uint64_t id;     // the buffer's (BufferIndex)
  uint64_t start;  // its first byte
  uint64_t end;    // one past its last
  uint8_t access;  // Access bits
};

// A word of a parameter whose fields are not known, read as a pointer
// because its value fell inside a buffer: the widest such buffer of a launch
// (a word that only looks like an address, such as two 32-bit integers,
// makes the whole buffer part of the set).
struct GuessedWord {
  uint32_t param = 0;   // the parameter's index
  uint32_t offset = 0;  // the word's offset in it
  uint64_t value = 0;
  uint64_t buffer_start = 0, buffer_end = 0;  // 0, 0: none
};

struct AccessSet {
  static constexpr size_t kMax = 64;
  SetKind kind = SetKind::kUnknown;
  uint32_t count = 0;
  uint32_t lookups = 0;  // index lookups made (statistics)
  BufferAccess items[kMax];
  GuessedWord widest_guess;
  uint32_t integer_words = 0;  // guessed words taken for two integers, not pointers
  uint32_t calculator_words = 0;  // words of an offset calculator (its stale entries too), not scanned

  void reset(SetKind k) {
    kind = k;
    count = 0;
    lookups = 0;
    widest_guess = {};
    integer_words = 0;
    calculator_words = 0;
  }
  // Adds (or widens) `b`'s entry; past kMax the whole set becomes unknown.
  void add(const Buffer& b, uint8_t access);
  uint32_t reads() const;
  uint32_t writes() const;
  const BufferAccess* find(uint64_t id) const;
};

// A kernel's arguments as the launch gives them: one pointer per parameter
// (kernelParams) or one packed buffer (the `extra` form).
struct LaunchArgs {
  void* const* params = nullptr;
  const std::byte* packed = nullptr;
  size_t packed_size = 0;
};

void speculate_kernel(const KernelLayout& layout, const LaunchArgs& args, const BufferIndex& index, AccessSet* out);

// A range a known call touches (call_ranges in the hooks says which).
struct CallRange {
  uint64_t address = 0;
  uint64_t bytes = 0;            // 0 with extent_unknown: only the buffer at address is known
  uint8_t access = 0;            // Access bits
  bool extent_unknown = false;
  bool pointer_array = false;    // the range holds device pointers to the real operands
};

void exact_call(std::span<const CallRange> ranges, const BufferIndex& index, AccessSet* out);

}  // namespace phos::speculation
