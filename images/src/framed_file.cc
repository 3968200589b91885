#include "framed_file.h"

#include <string>

#include "phos/images/bytes.h"
#include "phos/images/crc32c.h"

namespace phos::image {

std::vector<std::byte> frame_file(const char (&magic)[8], uint32_t format_version,
                                  std::span<const std::byte> payload) {
  std::vector<std::byte> out(kFramedHeaderSize + payload.size());
  std::byte* h = out.data();
  for (int i = 0; i < 8; i++) h[i] = std::byte(magic[i]);
  bytes::put_u32(h + 8, format_version);
  bytes::put_u32(h + 12, kFramedHeaderSize);
  bytes::put_u64(h + 16, payload.size());
  bytes::put_u32(h + 24, crc32c(payload));
  bytes::put_u32(h + 28, crc32c(0, h, 28));
  std::copy(payload.begin(), payload.end(), out.begin() + kFramedHeaderSize);
  return out;
}

Result<Unframed> unframe_file(std::span<const std::byte> file, const char (&magic)[8], uint32_t max_version,
                              std::string_view name, std::string_view what) {
  auto fail = [&](const std::string& why) {
    return make_error(std::string(name) + ": " + std::string(what) + ": " + why, EINVAL);
  };
  if (file.size() < kFramedHeaderSize)
    return fail("truncated: " + std::to_string(file.size()) + " bytes, shorter than its " +
                std::to_string(kFramedHeaderSize) + "-byte header");
  if (!bytes::has_magic(file, magic)) return fail("not a phos " + std::string(what) + " file (bad magic)");
  const std::byte* h = file.data();
  if (bytes::get_u32(h + 28) != crc32c(0, h, 28)) return fail("header checksum mismatch (corrupted header)");
  uint32_t version = bytes::get_u32(h + 8);
  if (version == 0 || version > max_version)
    return fail("format version " + std::to_string(version) + " is not supported (this phos reads 1.." +
                std::to_string(max_version) + "; written by a newer phos?)");
  if (bytes::get_u32(h + 12) != kFramedHeaderSize) return fail("unexpected header size");
  uint64_t payload_size = bytes::get_u64(h + 16);
  uint64_t have = file.size() - kFramedHeaderSize;
  if (payload_size > have)
    return fail("truncated: header says " + std::to_string(payload_size) + " payload bytes, file has " +
                std::to_string(have));
  if (payload_size < have)
    return fail("size mismatch: " + std::to_string(have - payload_size) + " bytes after the payload");
  auto payload = file.subspan(kFramedHeaderSize);
  if (bytes::get_u32(h + 24) != crc32c(payload)) return fail("payload checksum mismatch (corrupted contents)");
  return Unframed{version, payload};
}

}  // namespace phos::image
