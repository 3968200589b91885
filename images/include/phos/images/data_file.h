// Data files of a GPU image: a 4 KiB header, then chunks of buffer contents,
// each at the file offset its manifest entry records, with a CRC-32C of the
// raw bytes and optional zstd compression.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "phos/images/manifest.h"
#include "phos/images/result.h"
#include "phos/images/unique_fd.h"

namespace phos::image {

struct DataHeader {
  uint32_t format_version = kDataFormatVersion;
  int32_t pid = 0;
  uint32_t file_index = 0;
};

std::vector<std::byte> encode_data_header(const DataHeader& h);
Result<DataHeader> decode_data_header(std::span<const std::byte> bytes, std::string_view name);

// Appends chunks to one data file. write_chunk may be called from several
// threads at once: each call reserves its own extent of the file.
class DataFileWriter {
 public:
  // Creates `name` in `dirfd` (0600, failing if it exists).
  static Result<std::unique_ptr<DataFileWriter>> create(int dirfd, std::string name, int32_t pid,
                                                        uint32_t file_index);

  // Stores `raw` (at most kMaxChunkSize bytes) as the bytes of the allocation
  // at `alloc_offset`. zstd is kept only where it makes the chunk smaller.
  Result<Chunk> write_chunk(uint64_t alloc_offset, std::span<const std::byte> raw,
                            Compression compression, int zstd_level = 1);

  // Flushes to stable storage and closes; the DataFile goes in the manifest.
  Result<DataFile> finish();

  const std::string& name() const { return name_; }

 private:
  DataFileWriter(UniqueFd fd, std::string name, uint32_t file_index);
  UniqueFd fd_;
  std::string name_;
  uint32_t file_index_;
  std::atomic<uint64_t> end_{kDataHeaderSize};
};

// Reads one chunk into `out` (exactly chunk.raw_size bytes) and checks its
// CRC; `scratch` holds compressed bytes between calls.
Result<void> read_chunk(int fd, std::string_view file_name, const Chunk& chunk,
                       std::span<std::byte> out, std::vector<std::byte>& scratch);

}  // namespace phos::image
