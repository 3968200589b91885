#include "phos/images/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <zstd.h>

#include "bytes.h"
#include "phos/images/crc32c.h"

namespace phos::image {
namespace {

constexpr size_t kHeaderFieldsSize = 24;  // magic, version, pid, file_index, crc

Result<void> pwrite_all(int fd, const std::byte* p, size_t n, uint64_t off, const std::string& name) {
  while (n) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno_error("write " + name);
    if (w == 0) return make_error("write " + name + ": no progress", EIO);
    p += w;
    n -= size_t(w);
    off += uint64_t(w);
  }
  return {};
}

Result<void> pread_all(int fd, std::byte* p, size_t n, uint64_t off, std::string_view name) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_error("read " + std::string(name));
    if (r == 0)
      return make_error(std::string(name) + ": truncated: chunk at offset " + std::to_string(off) + " needs " +
                        std::to_string(n) + " bytes, file ends after " + std::to_string(done));
    done += size_t(r);
  }
  return {};
}

}  // namespace

std::vector<std::byte> encode_data_header(const DataHeader& h) {
  std::vector<std::byte> out(kDataHeaderSize);
  for (int i = 0; i < 8; i++) out[i] = std::byte(kDataMagic[i]);
  bytes::put_u32(&out[8], h.format_version);
  bytes::put_u32(&out[12], uint32_t(h.pid));
  bytes::put_u32(&out[16], h.file_index);
  bytes::put_u32(&out[20], crc32c(0, out.data(), 20));
  return out;
}

Result<DataHeader> decode_data_header(std::span<const std::byte> b, std::string_view name) {
  auto fail = [&](const std::string& why) { return make_error(std::string(name) + ": data file: " + why); };
  if (b.size() < kHeaderFieldsSize) return fail("truncated header");
  if (!bytes::has_magic(b, kDataMagic)) return fail("not a phos data file (bad magic)");
  if (bytes::get_u32(&b[20]) != crc32c(0, b.data(), 20)) return fail("header checksum mismatch");
  DataHeader h{bytes::get_u32(&b[8]), int32_t(bytes::get_u32(&b[12])), bytes::get_u32(&b[16])};
  if (h.format_version == 0 || h.format_version > kDataFormatVersion)
    return fail("format version " + std::to_string(h.format_version) + " is not supported (this phos reads 1.." +
                std::to_string(kDataFormatVersion) + ")");
  return h;
}

DataFileWriter::DataFileWriter(UniqueFd fd, std::string name, uint32_t file_index)
    : fd_(std::move(fd)), name_(std::move(name)), file_index_(file_index) {}

Result<std::unique_ptr<DataFileWriter>> DataFileWriter::create(int dirfd, std::string name, int32_t pid,
                                                               uint32_t file_index) {
  if (!is_safe_data_file_name(name)) return make_error("data file name '" + name + "' is not a phos-*.img name");
  UniqueFd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_error("create " + name);
  auto header = encode_data_header(DataHeader{kDataFormatVersion, pid, file_index});
  PHOS_TRY(pwrite_all(fd.get(), header.data(), header.size(), 0, name));
  return std::unique_ptr<DataFileWriter>(new DataFileWriter(std::move(fd), std::move(name), file_index));
}

Result<Chunk> DataFileWriter::write_chunk(uint64_t alloc_offset, std::span<const std::byte> raw,
                                          Compression compression, int zstd_level) {
  if (raw.empty() || raw.size() > kMaxChunkSize)
    return make_error(name_ + ": chunk of " + std::to_string(raw.size()) + " bytes is outside 1.." +
                      std::to_string(kMaxChunkSize));
  Chunk c;
  c.alloc_offset = alloc_offset;
  c.file_index = file_index_;
  c.raw_size = uint32_t(raw.size());
  c.crc32c = crc32c(raw);
  std::span<const std::byte> stored = raw;
  std::vector<std::byte> packed;
  if (compression == Compression::Zstd) {
    packed.resize(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compress(packed.data(), packed.size(), raw.data(), raw.size(), zstd_level);
    if (ZSTD_isError(n)) return make_error(name_ + ": zstd: " + ZSTD_getErrorName(n), EIO);
    if (n < raw.size()) {
      stored = std::span<const std::byte>(packed.data(), n);
      c.compression = Compression::Zstd;
    }
  }
  c.stored_size = uint32_t(stored.size());
  c.file_offset = end_.fetch_add(stored.size());
  PHOS_TRY(pwrite_all(fd_.get(), stored.data(), stored.size(), c.file_offset, name_));
  return c;
}

Result<DataFile> DataFileWriter::finish() {
  if (::fsync(fd_.get()) != 0) return errno_error("fsync " + name_);
  fd_.reset();
  return DataFile{name_, end_.load()};
}

Result<void> read_chunk(int fd, std::string_view file_name, const Chunk& chunk, std::span<std::byte> out,
                        std::vector<std::byte>& scratch) {
  if (out.size() != chunk.raw_size)
    return make_error(std::string(file_name) + ": chunk buffer of " + std::to_string(out.size()) +
                      " bytes for a chunk of " + std::to_string(chunk.raw_size));
  if (chunk.compression == Compression::None) {
    PHOS_TRY(pread_all(fd, out.data(), out.size(), chunk.file_offset, file_name));
  } else if (chunk.compression == Compression::Zstd) {
    scratch.resize(chunk.stored_size);
    PHOS_TRY(pread_all(fd, scratch.data(), scratch.size(), chunk.file_offset, file_name));
    size_t n = ZSTD_decompress(out.data(), out.size(), scratch.data(), scratch.size());
    if (ZSTD_isError(n) || n != chunk.raw_size)
      return make_error(std::string(file_name) + ": chunk at offset " + std::to_string(chunk.file_offset) +
                        " does not decompress: " + (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size"));
  } else {
    return make_error(std::string(file_name) + ": chunk with unknown compression");
  }
  uint32_t crc = crc32c(out);
  if (crc != chunk.crc32c)
    return make_error(std::string(file_name) + ": checksum mismatch in chunk at file offset " +
                      std::to_string(chunk.file_offset) + " (allocation offset " + std::to_string(chunk.alloc_offset) +
                      ")", EIO);
  return {};
}

}  // namespace phos::image
