// The 32-byte header of framed image files (manifest, marker):
//   magic[8] | u32 format_version | u32 header_size | u64 payload_size |
//   u32 payload_crc32c | u32 header_crc32c (of the 28 bytes before it)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "phos/support/result.h"

namespace phos::image {

inline constexpr size_t kFramedHeaderSize = 32;

std::vector<std::byte> frame_file(const char (&magic)[8], uint32_t format_version,
                                  std::span<const std::byte> payload);

struct Unframed {
  uint32_t format_version;
  std::span<const std::byte> payload;
};

// Checks magic, header checksum, version (1..max_version), size and payload
// checksum; `what` ("manifest", "completion marker") goes into messages.
Result<Unframed> unframe_file(std::span<const std::byte> file, const char (&magic)[8], uint32_t max_version,
                              std::string_view name, std::string_view what);

}  // namespace phos::image
