#include "phos/plugin/sum_check.h"

#include <cinttypes>
#include <cstdio>

namespace phos::plugin::sum_check {
namespace {

// 52 MiB, 64 KiB or 4097 bytes: offsets are mostly whole chunks.
std::string size_text(uint64_t bytes) {
  if (bytes && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
}

}  // namespace

void ChunkSums::set(uint64_t chunk, uint64_t fingerprint, bool zero) {
  if (chunk >= value_.size()) return;
  value_[chunk] = fingerprint;
  known_[chunk] = zero ? kKnownZero : kKnown;
}

std::optional<uint64_t> ChunkSums::get(uint64_t chunk) const {
  if (chunk >= value_.size() || !known_[chunk]) return std::nullopt;
  return value_[chunk];
}

bool matches(const ChunkSums& reference, uint64_t chunk, uint64_t copied) {
  auto want = reference.get(chunk);
  return want && *want == copied;
}

void Misses::add(const ChunkPlace& where) {
  count_++;
  if (named_.size() < kNamed) named_.push_back(where);
}

std::string describe_place(const ChunkPlace& where) {
  char address[32];
  std::snprintf(address, sizeof(address), "0x%" PRIx64, where.address);
  return "chunk " + std::to_string(where.chunk) + " (allocation #" + std::to_string(where.allocation_id) + " at " +
         address + ", offset " + size_text(where.offset) + ", from " +
         (where.from_pool ? "its pool slot" : "the process's memory") + ")";
}

std::string describe_misses(const Misses& misses, Against against) {
  if (misses.named().empty()) return "no chunk differed";
  const std::string first = describe_place(misses.named().front());
  if (against == Against::kFinalPass)
    return (misses.count() == 1 ? first : std::to_string(misses.count()) + " chunks, first " + first) +
           " changed while the process was stopped: the copy differs from the final pass's fingerprint "
           "(something wrote device memory with the gate closed)";
  if (misses.count() == 1)
    return first + " differs from its content at the freeze: a write that speculation missed reached it before "
                   "its copy";
  return std::to_string(misses.count()) + " chunks differ from their content at the freeze, first " + first +
         ": writes that speculation missed reached them before their copy";
}

std::string describe_kernels(const std::vector<agent::KernelLaunches>& kernels, uint64_t kernel_count) {
  if (kernels.empty())
    return "no kernel ran on a trusted speculated set in the window (the write came through a call whose exact set "
           "missed it, as a library's kernels reaching memory through structures in device memory may, or from "
           "outside the calls phos sees: another process, a NIC)";
  std::string out = "kernels trusted on speculation in the window: ";
  for (size_t i = 0; i < kernels.size(); i++) {
    out += (i ? ", " : "") + kernels[i].name + " (" + std::to_string(kernels[i].launches) +
           (i == 0 ? (kernels[i].launches == 1 ? " launch)" : " launches)") : ")");
  }
  if (kernel_count > kernels.size()) out += " and " + std::to_string(kernel_count - kernels.size()) + " more";
  return out;
}

std::string describe_suspects(const std::vector<agent::KernelLaunches>& suspects) {
  if (suspects.empty())
    return "no launch on a trusted speculated set pointed into the changed chunk's buffer without writing it (the "
           "write came through a pointer phos does not see among the arguments: one held in device memory, a "
           "library's, or another process's)";
  std::string out = "launches that pointed into the changed chunk's buffer without it in their speculated write set "
                    "(the likely writers): ";
  for (size_t i = 0; i < suspects.size(); i++)
    out += (i ? ", " : "") + suspects[i].name + " (" + std::to_string(suspects[i].launches) +
           (suspects[i].launches == 1 ? " launch)" : " launches)");
  return out;
}

std::vector<agent::AddressRange> missed_ranges(const Misses& misses, uint64_t chunk_size) {
  std::vector<agent::AddressRange> out;
  for (const ChunkPlace& p : misses.named()) out.push_back({.address = p.address + p.offset, .bytes = chunk_size});
  return out;
}

std::string refusal(const std::string& engine_error, const std::vector<agent::KernelLaunches>& kernels,
                    uint64_t kernel_count, const std::vector<agent::KernelLaunches>& suspects) {
  return engine_error + "; " + describe_suspects(suspects) + "; " + describe_kernels(kernels, kernel_count) +
         "; the image is refused (no completion marker); the process runs on; its next dumps copy while it is "
         "stopped";
}

FinalPass plan_final_pass(const copystate::CopyState& table, const ChunkSums& image, const ChunkSums& now,
                          const std::function<bool(uint64_t)>& dead) {
  FinalPass plan;
  for (uint64_t c = 0; c < table.chunk_count(); c++) {
    if (dead && dead(c)) continue;
    if (table.state(c) != copystate::ChunkState::kCopied) {
      plan.copy.push_back(c);
      plan.not_copied++;
      continue;
    }
    auto copied = image.get(c);
    auto current = now.get(c);
    // A copy or a chunk without its fingerprint cannot be shown unchanged:
    // copied again, but no miss of speculation's.
    const bool unknown = !copied || !current;
    if (unknown || *copied != *current) {
      plan.copy.push_back(c);
      plan.changed++;
      if (!unknown && !table.dirty(c)) plan.missed++;
      continue;
    }
    if (table.dirty(c)) plan.unchanged_dirty++;
  }
  return plan;
}

}  // namespace phos::plugin::sum_check
