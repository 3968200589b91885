#include "phos/images/data_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <string>

#include <zstd.h>

#include "phos/images/bytes.h"
#include "phos/images/crc32c.h"
#include "phos/images/zero_chunk.h"
#include "phos/support/clock.h"

namespace phos::image {
namespace {

constexpr size_t kHeaderFieldsSize = 24;  // magic, version, pid, file_index, crc


// A heap buffer that starts 4 KiB-aligned and whose capacity is a multiple of
// 4 KiB, as O_DIRECT needs.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size)
      : capacity_(align_up(size)), p_(static_cast<std::byte*>(std::aligned_alloc(kExtentAlignment, capacity_))) {
    if (!p_) throw std::bad_alloc();
  }
  std::byte* data() { return p_.get(); }
  size_t capacity() const { return capacity_; }
  // Zeroes the bytes from `used` to the next 4 KiB boundary; the padded size.
  size_t pad(size_t used) {
    size_t padded = align_up(used);
    std::memset(p_.get() + used, 0, padded - used);
    return padded;
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  size_t capacity_ = 0;
  std::unique_ptr<std::byte, Free> p_;
};

bool is_aligned_extent(const std::byte* p, size_t n) {
  return reinterpret_cast<uintptr_t>(p) % kExtentAlignment == 0 && n % kExtentAlignment == 0;
}

Result<void> disable_direct_io(int fd, const std::string& name) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) != 0) return errno_error("turn off O_DIRECT for " + name);
  return {};
}

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

Result<void> enable_direct_io(int fd, const std::string& name) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) return errno_error("turn on O_DIRECT for " + name);
  return {};
}

// Whether the tmpfs holding `fd` hands out huge pages (mount option huge=
// other than never): its mount is found in /proc/self/mountinfo by device.
bool tmpfs_has_huge_pages(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  std::ifstream mounts("/proc/self/mountinfo");
  const std::string device = std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
  for (std::string line; std::getline(mounts, line);) {
    // id parent major:minor root mount-point options ... - type source super-options
    std::istringstream fields(line);
    std::string id, parent, dev;
    fields >> id >> parent >> dev;
    if (dev != device) continue;
    auto super = line.rfind(' ');
    std::string options = super == std::string::npos ? "" : line.substr(super + 1);
    auto huge = options.find("huge=");
    return huge != std::string::npos && options.compare(huge, 10, "huge=never") != 0;
  }
  return false;
}

Result<void> pwrite_with_fallback(int fd, const std::byte* p, size_t n, uint64_t off, const std::string& name,
                                  std::atomic<bool>& direct, std::string* why_buffered) {
  if (direct) {
    auto written = pwrite_all(fd, p, n, off, name);
    if (written.ok() || written.error().code != EINVAL) return written;
    // Some file systems take O_DIRECT at open and refuse the writes.
    PHOS_TRY(disable_direct_io(fd, name));
    if (direct.exchange(false) && why_buffered) *why_buffered = "O_DIRECT write refused (" + written.error().message + ")";
  }
  return pwrite_all(fd, p, n, off, name);
}

DataFileWriter::DataFileWriter(UniqueFd fd, std::string name, uint32_t file_index, bool direct,
                               std::string why_buffered, Sparse sparse)
    : fd_(std::move(fd)),
      name_(std::move(name)),
      file_index_(file_index),
      sparse_(sparse),
      direct_(direct),
      why_buffered_(std::move(why_buffered)) {}

Result<std::unique_ptr<DataFileWriter>> DataFileWriter::create(int dirfd, std::string name, int32_t pid,
                                                               uint32_t file_index, DirectIo direct_io,
                                                               Sparse sparse) {
  if (!is_safe_data_file_name(name)) return make_error("data file name '" + name + "' is not a phos-*.img name");
  // Created without O_DIRECT and switched over after the header: open(O_CREAT
  // | O_EXCL | O_DIRECT) on a file system without O_DIRECT creates the file,
  // then fails, so a retry without it would find the file there.
  UniqueFd fd(::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_error("create " + name);
  auto header = encode_data_header(DataHeader{kDataFormatVersion, pid, file_index});
  PHOS_TRY(pwrite_all(fd.get(), header.data(), header.size(), 0, name));
  bool direct = false;
  std::string why_buffered = "direct_io is off";
  struct statfs fs {};
  if (direct_io == DirectIo::kAuto && ::fstatfs(fd.get(), &fs) == 0 && fs.f_type == TMPFS_MAGIC) {
    // tmpfs takes O_DIRECT but still copies through its page cache (the
    // pages are the storage), and writes slower with it
    // (docs/benchmarks/architecture-figures.md).
    why_buffered = "tmpfs: its page cache is the storage";
    if (!tmpfs_has_huge_pages(fd.get()))
      why_buffered += "; without huge pages (a tmpfs mounted with huge=within_size took 32 GiB at 41 GB/s on an "
                      "H200 host where /dev/shm took 30 GB/s)";
  } else if (direct_io == DirectIo::kAuto) {
    auto enabled = enable_direct_io(fd.get(), name);
    if (!enabled && enabled.error().code != EINVAL) return enabled.error();
    direct = enabled.ok();
    why_buffered = direct ? "" : "the file system refuses O_DIRECT";
  }
  return std::unique_ptr<DataFileWriter>(
      new DataFileWriter(std::move(fd), std::move(name), file_index, direct, std::move(why_buffered), sparse));
}

std::string DataFileWriter::why_buffered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_buffered_;
}

ChunkTimes DataFileWriter::times() const {
  std::lock_guard<std::mutex> lock(mu_);
  return times_;
}

Result<void> DataFileWriter::write_extent(const std::byte* p, size_t n, uint64_t off) {
  std::string why;
  auto written = pwrite_with_fallback(fd_.get(), p, n, off, name_, direct_, &why);
  if (!why.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    why_buffered_ = why;
  }
  return written;
}

ChunkSum DataFileWriter::sum_of(std::span<const std::byte> raw, ChunkTimes& t) const {
  uint64_t t0 = monotonic_ns();
  ChunkSum sum{crc32c(raw), sparse_ == Sparse::kAuto && zero_chunk::all_zero(raw.data(), raw.size())};
  t.checksum_ns += monotonic_ns() - t0;
  return sum;
}

Result<Chunk> DataFileWriter::write_chunk(uint64_t alloc_offset, std::span<const std::byte> raw,
                                          Compression compression, int zstd_level, std::optional<ChunkSum> sum) {
  if (raw.empty() || raw.size() > kMaxChunkSize)
    return make_error(name_ + ": chunk of " + std::to_string(raw.size()) + " bytes is outside 1.." +
                      std::to_string(kMaxChunkSize));
  ChunkTimes t;
  if (!sum) sum = sum_of(raw, t);
  Chunk c;
  c.alloc_offset = alloc_offset;
  c.raw_size = uint32_t(raw.size());
  c.crc32c = sum->crc32c;
  if (sum->zero && sparse_ == Sparse::kAuto) {
    // Nothing to write: no extent, and no data file named (validate_manifest
    // refuses a zero chunk that names one).
    c.compression = Compression::kZero;
    std::lock_guard<std::mutex> lock(mu_);
    times_ += t;
    return c;
  }
  c.file_index = file_index_;

  // What goes to the file: `extent` bytes from `out`, `stored` of them the chunk's.
  const std::byte* out = raw.data();
  size_t stored = raw.size(), extent = raw.size();
  AlignedBuffer aligned;
  if (compression == Compression::kZstd) {
    const uint64_t t0 = monotonic_ns();
    aligned = AlignedBuffer(ZSTD_compressBound(raw.size()));
    size_t n = ZSTD_compress(aligned.data(), aligned.capacity(), raw.data(), raw.size(), zstd_level);
    t.compress_ns = monotonic_ns() - t0;
    if (ZSTD_isError(n)) return make_error(name_ + ": zstd: " + ZSTD_getErrorName(n), EIO);
    if (n < raw.size()) {
      c.compression = Compression::kZstd;
      out = aligned.data();
      stored = n;
      extent = aligned.pad(n);
    }
  }
  if (c.compression == Compression::kNone && direct_ && !is_aligned_extent(raw.data(), raw.size())) {
    aligned = AlignedBuffer(raw.size());
    std::memcpy(aligned.data(), raw.data(), raw.size());
    out = aligned.data();
    extent = aligned.pad(raw.size());
  }
  c.stored_size = uint32_t(stored);
  // Every extent starts aligned, whichever way it is written.
  c.file_offset = end_.fetch_add(align_up(stored));
  const uint64_t t0 = monotonic_ns();
  PHOS_TRY(write_extent(out, extent, c.file_offset));
  t.io_ns = monotonic_ns() - t0;
  std::lock_guard<std::mutex> lock(mu_);
  times_ += t;
  return c;
}

Result<DataFile> DataFileWriter::finish() {
  // The last extent's padding may not have been written (buffered writes).
  if (::ftruncate(fd_.get(), off_t(end_.load())) != 0) return errno_error("set the size of " + name_);
  if (::fsync(fd_.get()) != 0) return errno_error("fsync " + name_);
  fd_.reset();
  return DataFile{name_, end_.load()};
}

Error checksum_mismatch(std::string_view file_name, const Chunk& chunk) {
  if (chunk.compression == Compression::kZero)  // stored nowhere: its record is wrong
    return make_error("zero chunk at allocation offset " + std::to_string(chunk.alloc_offset) +
                          ": its CRC-32C is not that of zero bytes",
                      EIO);
  return make_error(std::string(file_name) + ": checksum mismatch in chunk at file offset " +
                        std::to_string(chunk.file_offset) + " (allocation offset " +
                        std::to_string(chunk.alloc_offset) + ")",
                    EIO);
}

Result<void> read_chunk(int fd, std::string_view file_name, const Chunk& chunk, std::span<std::byte> out,
                        std::vector<std::byte>& scratch, ChunkTimes* times, CrcCheck check) {
  ChunkTimes t;
  uint64_t t0 = monotonic_ns();
  if (out.size() != chunk.raw_size)
    return make_error(std::string(file_name) + ": chunk buffer of " + std::to_string(out.size()) +
                      " bytes for a chunk of " + std::to_string(chunk.raw_size));
  if (chunk.compression == Compression::kZero) {
    std::memset(out.data(), 0, out.size());
  } else if (chunk.compression == Compression::kNone) {
    PHOS_TRY(pread_all(fd, out.data(), out.size(), chunk.file_offset, file_name));
    t.io_ns = monotonic_ns() - t0;
  } else if (chunk.compression == Compression::kZstd) {
    scratch.resize(chunk.stored_size);
    PHOS_TRY(pread_all(fd, scratch.data(), scratch.size(), chunk.file_offset, file_name));
    uint64_t t1 = monotonic_ns();
    t.io_ns = t1 - t0;
    size_t n = ZSTD_decompress(out.data(), out.size(), scratch.data(), scratch.size());
    if (ZSTD_isError(n) || n != chunk.raw_size)
      return make_error(std::string(file_name) + ": chunk at offset " + std::to_string(chunk.file_offset) +
                        " does not decompress: " + (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size"));
    t.compress_ns = monotonic_ns() - t1;
  } else if (chunk.compression == Compression::kDead) {
    return make_error(std::string(file_name) + ": dead chunk at allocation offset " +
                      std::to_string(chunk.alloc_offset) + " holds no bytes (free memory at the checkpoint)");
  } else {
    return make_error(std::string(file_name) + ": chunk with unknown compression");
  }
  if (check == CrcCheck::kByCaller) {
    if (times) *times += t;
    return {};
  }
  t0 = monotonic_ns();
  uint32_t crc = crc32c(out);
  t.checksum_ns = monotonic_ns() - t0;
  if (times) *times += t;
  if (crc != chunk.crc32c) return checksum_mismatch(file_name, chunk);
  return {};
}

}  // namespace phos::image
