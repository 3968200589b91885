#include "phos/speculation/speculate.h"

#include <cstring>
#include <utility>

namespace phos::speculation {
namespace {

// Up to 8 bytes of parameter `param` at `offset` within it, zero-extended.
uint64_t read_word(const LaunchArgs& args, const ParamLayout& param, size_t index, uint32_t offset) {
  uint64_t value = 0;
  if (offset >= param.size) return 0;
  // The common case, a whole word from kernelParams: a fixed-size copy the
  // compiler turns into one load.
  if (args.params && param.size - offset >= 8) {
    std::memcpy(&value, static_cast<const std::byte*>(args.params[index]) + offset, 8);
    return value;
  }
  uint32_t n = param.size - offset < 8 ? param.size - offset : 8;
  if (args.params) {
    std::memcpy(&value, static_cast<const std::byte*>(args.params[index]) + offset, n);
  } else if (args.packed) {
    size_t at = size_t(param.offset) + offset;
    if (at >= args.packed_size) return 0;
    if (args.packed_size - at < n) n = uint32_t(args.packed_size - at);
    std::memcpy(&value, args.packed + at, n);
  }
  return value;
}

// A word of a struct whose fields are not known that reads as two 32-bit
// integers, the low one small (under 64 Ki), deep inside a buffer (64 KiB or
// more past its start): where device memory sits low in the address space
// (0x6cc000000 on an H200 with driver 580), pairs such as (7, 1) or (8, 8),
// common in offset calculators and configurations, fall inside a large
// allocation. On the 8B server, 11 kernels took a 64 GiB KV-cache pool into
// their sets this way, and copy-on-write saved or waited for all of it. A
// real pointer this filter drops (within 64 KiB past a 4 GiB boundary, deep
// in a buffer: rare, though tensors aligned in a pool meet such boundaries
// more often than spread addresses would) leaves a write out of the set:
// checksum validation refuses the image; cow_trust=speculated, which checks
// nothing, would not. Only words of structs whose fields are not known are
// filtered: typed pointer parameters and a packed buffer without a layout
// are taken as they are.
// A low half of 0 (an address at a 4 GiB boundary) is kept. A small
// negative low half (-1 .. -64 Ki, e.g. (11, -1) = 0xbffffffff, a max
// reduction's word on the same server) is as unlikely in a real pointer
// (within 64 KiB below a 4 GiB boundary) and filtered the same way.
bool two_small_integers(uint64_t value, const Buffer& b) {
  const uint64_t low = value & 0xffffffffu;
  const bool small = (low != 0 && low < 0x10000) || low >= 0xffff0000u;
  return small && value - b.start >= 0x10000;
}

// A word whose halves are the (m1, shift) of a PyTorch IntDivider<uint32_t>
// ({divisor, m1, shift}, OffsetCalculator's per-dimension divisors), the
// 32 bits before it being the divisor: IntDivider's constructor makes shift
// the least s with 2^s >= divisor and m1 = 2^32 (2^s - divisor) / divisor + 1
// (truncated to 32 bits), so a word that satisfies both is one, but for a
// chance of about 2^-32 per word. On the 8B server, the divider of the
// vocabulary (128256: shift 17, m1 0x059eea08) read as 0x11059eea08, inside
// the 64 GiB KV pool, in the closure of an elementwise mul whose operands
// are not contiguous: that launch saved the whole pool (13464 chunks). A
// kernel's closure holds the calculator by value, so no layout rule sees it.
bool int_divider_tail(uint32_t divisor, uint64_t value) {
  const uint64_t shift = value >> 32;
  // IntDivider<uint32_t> takes divisors 1 .. INT32_MAX: shift <= 31.
  if (divisor == 0 || divisor > 0x7fffffffu || shift > 31) return false;
  const uint64_t least = divisor == 1 ? 0 : 64 - __builtin_clzll(uint64_t(divisor) - 1);
  if (shift != least) return false;
  const uint64_t magic = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - divisor)) / divisor + 1;
  return uint32_t(magic) == uint32_t(value);
}

// `before`: the 32 bits in front of a struct's word (for int_divider_tail).
void try_pointer(uint64_t value, uint8_t access, const BufferIndex& index, AccessSet* out, bool guess = false,
                 uint32_t before = 0) {
  // Small integers and null are common and never device addresses.
  if (value < 4096) return;
  out->lookups++;
  Buffer b;
  if (!index.find(value, &b)) return;
  if (guess && (two_small_integers(value, b) || int_divider_tail(before, value))) {
    out->integer_words++;
    return;
  }
  out->add(b, access);
}

// PyTorch's OffsetCalculator<N, uint32_t> (OffsetCalculator.cuh, 2.x):
// {int dims; IntDivider sizes_[25]; uint32_t strides_[25][N]}, which the
// elementwise kernels' closures hold by value beside their N data pointers.
// Its constructor fills only the first `dims` entries: the rest are stale
// stack memory, and one such word (0xa00000000, +264 of a mul's closure)
// took the 8B server's 64 GiB KV pool into a launch's set. None of it is a
// pointer. No layout rule can name it (the closure's type is a lambda), so
// it is recognized here by its content: `dims` in 1..25 followed by that
// many IntDividers as the constructor makes them, one at least with a
// divisor over 1 (a chance of about 2^-32 each of being anything else). It
// sits first in the closure (the lambda uses it first), or after the N
// pointers. Returns the bytes [begin, end) to leave out; end covers the
// strides where N is known (from where it sits, or the closure's size:
// the pointers follow it, 8-aligned, then the functor, 16 bytes at most).
struct Span {
  uint32_t begin = 0, end = 0;
};
constexpr uint32_t kCalcMaxDims = 25, kCalcSizesEnd = 4 + 12 * kCalcMaxDims;

Span offset_calculator(const LaunchArgs& args, const ParamLayout& p, size_t index) {
  for (uint32_t at = 0; at <= 32 && at + kCalcSizesEnd <= p.size; at += 8) {
    const uint32_t dims = uint32_t(read_word(args, p, index, at));
    if (dims == 0 || dims > kCalcMaxDims) continue;
    bool whole = true, strong = false;
    for (uint32_t k = 0, d = at + 4; k < dims && whole; k++, d += 12) {  // {divisor, m1, shift} at d
      const uint32_t divisor = uint32_t(read_word(args, p, index, d));
      whole = int_divider_tail(divisor, read_word(args, p, index, d + 4));
      strong = strong || divisor > 1;
    }
    if (!whole || !strong) continue;
    uint32_t n = at / 8;
    for (uint32_t tensors = 1; n == 0 && tensors <= 8; tensors++) {
      const uint32_t data = (kCalcSizesEnd + 100 * tensors + 7) / 8 * 8 + 8 * tensors;
      if (data <= p.size && p.size - data <= 16) n = tensors;
    }
    const uint32_t end = at + kCalcSizesEnd + 100 * n;
    return Span{at, end <= p.size ? end : at + kCalcSizesEnd};
  }
  return {};
}

// Every aligned 8-byte word of the parameter (alignment in the argument
// buffer: a pointer inside a struct sits at a multiple of 8 from the
// buffer's start, the struct being at least 8-aligned), but an offset
// calculator's.
void scan_words(const LaunchArgs& args, const ParamLayout& p, size_t index, const BufferIndex& buffers,
                AccessSet* out) {
  const Span calculator = p.size >= kCalcSizesEnd + 100 ? offset_calculator(args, p, index) : Span{};
  uint32_t first = (8 - p.offset % 8) % 8;
  // The 32 bits in front of each word: the last word's high half after the first.
  uint32_t before = first >= 4 ? uint32_t(read_word(args, p, index, first - 4)) : 0;
  for (uint32_t off = first; off + 8 <= p.size; off += 8) {
    const uint64_t value = read_word(args, p, index, off);
    const uint32_t front = std::exchange(before, uint32_t(value >> 32));
    if (off < calculator.end && off + 8 > calculator.begin) {
      out->calculator_words++;
      continue;
    }
    const uint32_t count = out->count;
    try_pointer(value, kRead | kWrite, buffers, out, true, front);
    if (out->count == count) continue;  // no new buffer (or one already in)
    const BufferAccess& b = out->items[out->count - 1];
    GuessedWord& w = out->widest_guess;
    if (b.end - b.start > w.buffer_end - w.buffer_start)
      w = GuessedWord{uint32_t(index), off, value, b.start, b.end};
  }
}

// A layout rule's checks on this launch's bytes (FieldCheck).
bool checks_pass(const LaunchArgs& args, const ParamLayout& p, size_t index) {
  for (const FieldCheck& c : p.checks) {
    if (c.offset + c.size > p.size || c.size == 0 || c.size > 8) return false;
    uint64_t v = read_word(args, p, index, c.offset);
    if (c.size < 8) v &= (uint64_t(1) << (8 * c.size)) - 1;
    if (v < c.min || v > c.max) return false;
  }
  return true;
}

// The packed buffer alone, no layout: every aligned word.
void scan_packed(const LaunchArgs& args, const BufferIndex& buffers, AccessSet* out) {
  for (size_t off = 0; off + 8 <= args.packed_size; off += 8) {
    uint64_t v;
    std::memcpy(&v, args.packed + off, 8);
    try_pointer(v, kRead | kWrite, buffers, out);  // typed pointers among them: no integer filter
  }
}

}  // namespace

const char* set_kind_name(SetKind k) {
  switch (k) {
    case SetKind::kExact: return "exact";
    case SetKind::kSpeculated: return "speculated";
    case SetKind::kUnknown: return "unknown";
  }
  return "?";
}

void AccessSet::add(const Buffer& b, uint8_t access) {
  if (kind == SetKind::kUnknown) return;
  for (uint32_t i = 0; i < count; i++) {
    if (items[i].id == b.id && items[i].start == b.start) {
      items[i].access |= access;
      return;
    }
  }
  if (count == kMax) {
    kind = SetKind::kUnknown;
    return;
  }
  items[count++] = BufferAccess{b.id, b.start, b.end, access};
}

uint32_t AccessSet::reads() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < count; i++) n += (items[i].access & kRead) != 0;
  return n;
}

uint32_t AccessSet::writes() const {
  uint32_t n = 0;
  for (uint32_t i = 0; i < count; i++) n += (items[i].access & kWrite) != 0;
  return n;
}

const BufferAccess* AccessSet::find(uint64_t id) const {
  for (uint32_t i = 0; i < count; i++)
    if (items[i].id == id) return &items[i];
  return nullptr;
}

void speculate_kernel(const KernelLayout& layout, const LaunchArgs& args, const BufferIndex& index, AccessSet* out) {
  out->reset(SetKind::kSpeculated);
  if (!layout.slots_known) {
    // Without a layout, kernelParams cannot be read (no sizes); a packed
    // buffer can still be scanned whole.
    if (args.packed && args.packed_size) return scan_packed(args, index, out);
    out->kind = SetKind::kUnknown;
    return;
  }
  if (!args.params && !args.packed && !layout.params.empty()) {
    out->kind = SetKind::kUnknown;
    return;
  }
  for (size_t i = 0; i < layout.params.size() && out->kind != SetKind::kUnknown; i++) {
    const ParamLayout& p = layout.params[i];
    switch (p.kind) {
      case ParamKind::kScalar: break;
      case ParamKind::kPointer: try_pointer(read_word(args, p, i, 0), kRead | kWrite, index, out); break;
      case ParamKind::kConstPointer: try_pointer(read_word(args, p, i, 0), kRead, index, out); break;
      case ParamKind::kAggregate:
        if (p.fields_known && checks_pass(args, p, i)) {
          for (const PointerField& f : p.pointer_fields)
            try_pointer(read_word(args, p, i, f.offset), f.const_pointee ? kRead : kRead | kWrite, index, out);
          break;
        }
        [[fallthrough]];
      case ParamKind::kUnknown: scan_words(args, p, i, index, out); break;
    }
  }
}

void exact_call(std::span<const CallRange> ranges, const BufferIndex& index, AccessSet* out) {
  out->reset(SetKind::kExact);
  for (const CallRange& r : ranges) {
    if (r.pointer_array) {
      // The array of pointers is read exactly; the matrices behind it live
      // in device memory the hooks cannot read without a copy.
      out->kind = SetKind::kUnknown;
      return;
    }
    out->lookups++;
    if (r.extent_unknown || r.bytes == 0) {
      Buffer b;
      if (index.find(r.address, &b)) out->add(b, r.access);
      continue;
    }
    uint64_t end = r.address + r.bytes < r.address ? UINT64_MAX : r.address + r.bytes;
    index.for_each_overlapping(r.address, end, [&](const Buffer& b) { out->add(b, r.access); });
  }
}

}  // namespace phos::speculation
