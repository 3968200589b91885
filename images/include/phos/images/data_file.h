// Data files of a GPU image: a 4 KiB header, then chunks of buffer contents,
// each at the file offset its manifest entry records, with a CRC-32C of the
// raw bytes and optional zstd compression. A chunk whose every byte is 0
// (zero_chunk.h) takes no room in the file: its manifest entry says so.
//
// Chunks are written at 4 KiB-aligned offsets in extents padded to 4 KiB, so
// that a writer can use O_DIRECT; the manifest records the bytes a chunk
// stores (stored_size), the padding after them is unused. Readers accept any
// offset (images of earlier writers are not aligned).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "phos/images/manifest.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::image {

inline constexpr uint32_t kExtentAlignment = 4096;

inline constexpr uint64_t align_up(uint64_t n, uint64_t alignment = kExtentAlignment) {
  return (n + alignment - 1) / alignment * alignment;
}

struct DataHeader {
  uint32_t format_version = kDataFormatVersion;
  int32_t pid = 0;
  uint32_t file_index = 0;
};

std::vector<std::byte> encode_data_header(const DataHeader& h);
Result<DataHeader> decode_data_header(std::span<const std::byte> bytes, std::string_view name);

// kAuto: O_DIRECT where the file system allows it; kOff: the page cache.
enum class DirectIo { kAuto, kOff };

// kAuto: a chunk whose every byte is 0 is not written, only recorded as a
// zero chunk (Compression::kZero); kOff: it is written like any other.
enum class Sparse { kAuto, kOff };

// What the caller knows of a chunk already: the engine computes both on the
// GPU while the chunk is copied (plugin/gpu/chunk_crc.cu).
struct ChunkSum {
  uint32_t crc32c = 0;
  bool zero = false;  // every byte is 0
};

// Time spent in each step of writing or reading chunks, summed over calls.
struct ChunkTimes {
  uint64_t checksum_ns = 0;
  uint64_t compress_ns = 0;  // compressing, or decompressing when reading
  uint64_t io_ns = 0;        // pwrite / pread
  ChunkTimes& operator+=(const ChunkTimes& o) {
    checksum_ns += o.checksum_ns;
    compress_ns += o.compress_ns;
    io_ns += o.io_ns;
    return *this;
  }
};

// Turns O_DIRECT on for `fd`; EINVAL: the file system does not allow it.
Result<void> enable_direct_io(int fd, const std::string& name);

// Writes `n` bytes at `off`. While `direct` is set (fd has O_DIRECT), an
// EINVAL from the write turns O_DIRECT off on the fd, clears `direct`, sets
// `why_buffered` and writes again through the page cache.
Result<void> pwrite_with_fallback(int fd, const std::byte* p, size_t n, uint64_t off, const std::string& name,
                                  std::atomic<bool>& direct, std::string* why_buffered);

// Appends chunks to one data file. write_chunk may be called from several
// threads at once: each call reserves its own extent of the file.
class DataFileWriter {
 public:
  // Creates `name` in `dirfd` (0600, failing if it exists).
  static Result<std::unique_ptr<DataFileWriter>> create(int dirfd, std::string name, int32_t pid,
                                                        uint32_t file_index, DirectIo direct_io = DirectIo::kAuto,
                                                        Sparse sparse = Sparse::kAuto);

  // Stores `raw` (at most kMaxChunkSize bytes) as the bytes of the allocation
  // at `alloc_offset`. zstd is kept only where it makes the chunk smaller.
  // With O_DIRECT, `raw` goes to the file as it is when it starts 4 KiB-aligned
  // and its size is a multiple of 4 KiB; other chunks go through an aligned
  // copy. With Sparse::kAuto a chunk of zero bytes is not written (kZero).
  // `sum`: the chunk's CRC-32C and whether it is zero when the caller has
  // them already (the engine computes them on the GPU); otherwise they are
  // computed here.
  Result<Chunk> write_chunk(uint64_t alloc_offset, std::span<const std::byte> raw, Compression compression,
                            int zstd_level = 1, std::optional<ChunkSum> sum = std::nullopt);

  // Flushes to stable storage and closes; the DataFile goes in the manifest.
  Result<DataFile> finish();

  const std::string& name() const { return name_; }
  // Whether chunks go to the file with O_DIRECT, and why not if they do not.
  bool direct() const { return direct_; }
  std::string why_buffered() const;
  // Summed over every write_chunk so far.
  ChunkTimes times() const;

 private:
  DataFileWriter(UniqueFd fd, std::string name, uint32_t file_index, bool direct, std::string why_buffered,
                 Sparse sparse);
  Result<void> write_extent(const std::byte* p, size_t n, uint64_t off);
  // The chunk's CRC-32C, and whether it is zero where that matters (kAuto).
  ChunkSum sum_of(std::span<const std::byte> raw, ChunkTimes& t) const;

  UniqueFd fd_;
  std::string name_;
  uint32_t file_index_;
  Sparse sparse_;
  std::atomic<uint64_t> end_{kDataHeaderSize};
  std::atomic<bool> direct_;
  mutable std::mutex mu_;  // guards why_buffered_ and times_
  std::string why_buffered_;
  ChunkTimes times_;
};

// Whether read_chunk checks a chunk's CRC, or leaves that to the caller
// (the engine checks it on the GPU, after the chunk went there).
enum class CrcCheck { kHere, kByCaller };

// Reads one chunk into `out` (exactly chunk.raw_size bytes) and checks its
// CRC; `scratch` holds compressed bytes between calls; `times`, if given,
// accumulates the time of each step. A zero chunk reads nothing: `out` is
// set to 0 (and checked against its CRC, if asked).
Result<void> read_chunk(int fd, std::string_view file_name, const Chunk& chunk, std::span<std::byte> out,
                        std::vector<std::byte>& scratch, ChunkTimes* times = nullptr,
                        CrcCheck check = CrcCheck::kHere);

// The error of a chunk whose data does not match its CRC.
Error checksum_mismatch(std::string_view file_name, const Chunk& chunk);

}  // namespace phos::image
