#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "fixtures.h"
#include "phos/images/crc32c.h"
#include "phos/images/data_file.h"
#include "phos/images/image_dir.h"

using namespace phos::image;
using phos::test::TempDir;
using phos::test::flip_byte;

namespace {

std::vector<std::byte> pattern(size_t n, uint32_t seed, bool compressible) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; i++) v[i] = std::byte(compressible ? (i / 64 + seed) & 0xff : rng() & 0xff);
  return v;
}

// A complete image of pid 42: one allocation per buffer, 64 KiB chunks.
Manifest write_image(const TempDir& dir, const std::vector<std::vector<std::byte>>& buffers,
                     Compression compression) {
  Manifest m;
  m.writer_version = "test";
  m.pid = 42;
  m.chunk_size = 64 << 10;
  m.devices.push_back(phos::GpuDevice{
      .ordinal = 0, .uuid = {}, .name = "test gpu", .total_memory = 1ull << 30, .compute_major = 9, .compute_minor = 0});
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(42, 0), 42, 0);
  REQUIRE(writer.ok());
  uint64_t address = 0x7f0000000000ull;
  for (size_t i = 0; i < buffers.size(); i++) {
    Allocation a{phos::agent::Allocation{i + 1, 0, address, buffers[i].size(), 0}, {}};
    for (uint64_t off = 0; off < buffers[i].size(); off += m.chunk_size) {
      size_t n = std::min<uint64_t>(m.chunk_size, buffers[i].size() - off);
      auto c = (*writer)->write_chunk(off, std::span(buffers[i]).subspan(off, n), compression);
      REQUIRE(c.ok());
      a.chunks.push_back(*c);
    }
    m.allocations.push_back(a);
    address += 1ull << 30;
  }
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  m.data_files.push_back(*file);
  auto written = write_manifest(dir.fd.get(), m);
  REQUIRE(written.ok());
  REQUIRE(write_completion_marker(dir.fd.get(), 42, *written).ok());
  return m;
}

std::vector<std::byte> read_allocation(const TempDir& dir, const Manifest& m, size_t index) {
  ImageReader reader(dir.fd.get(), m);
  std::vector<std::byte> out(m.allocations[index].size);
  for (const auto& c : m.allocations[index].chunks) {
    auto r = reader.read_chunk(c, std::span(out).subspan(c.alloc_offset, c.raw_size));
    REQUIRE(r.ok());
  }
  return out;
}

std::string open_error(const TempDir& dir) {
  auto r = open_process_image(dir.fd.get(), 42, true);
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

}  // namespace

TEST_CASE("image dir: write and read back, uncompressed", "[image]") {
  TempDir dir;
  std::vector<std::vector<std::byte>> bufs = {pattern(200000, 1, false), pattern(5, 2, false)};
  write_image(dir, bufs, Compression::kNone);
  auto img = open_process_image(dir.fd.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(img->complete);
  CHECK(read_allocation(dir, img->manifest, 0) == bufs[0]);
  CHECK(read_allocation(dir, img->manifest, 1) == bufs[1]);
}

TEST_CASE("image dir: zstd is used where it helps and skipped where it does not", "[image][zstd]") {
  TempDir dir;
  std::vector<std::vector<std::byte>> bufs = {pattern(300000, 3, true), pattern(100000, 4, false)};
  Manifest m = write_image(dir, bufs, Compression::kZstd);
  CHECK(m.allocations[0].chunks[0].compression == Compression::kZstd);
  CHECK(m.allocations[0].chunks[0].stored_size < m.allocations[0].chunks[0].raw_size);
  CHECK(m.allocations[1].chunks[0].compression == Compression::kNone);
  auto img = open_process_image(dir.fd.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(read_allocation(dir, img->manifest, 0) == bufs[0]);
  CHECK(read_allocation(dir, img->manifest, 1) == bufs[1]);
  ImageReader reader(dir.fd.get(), img->manifest);
  auto total = reader.verify_all();
  REQUIRE(total.ok());
  CHECK(*total == 400000);
}

TEST_CASE("image dir: files are created 0600", "[image]") {
  TempDir dir;
  write_image(dir, {pattern(1000, 5, false)}, Compression::kNone);
  for (const auto& f : {manifest_file_name(42), marker_file_name(42), data_file_name(42, 0)}) {
    struct stat st {};
    REQUIRE(::stat(dir.file(f).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
  }
}

TEST_CASE("image dir: several threads write chunks of one data file", "[image][threads]") {
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(42, 0), 42, 0);
  REQUIRE(writer.ok());
  constexpr int kThreads = 4, kChunks = 32;
  std::vector<std::vector<Chunk>> chunks(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++)
    threads.emplace_back([&, t] {
      for (int k = 0; k < kChunks; k++) {
        auto data = pattern(4096 + t * 100 + k, uint32_t(t * 1000 + k), false);
        auto c = (*writer)->write_chunk(0, data, Compression::kNone);
        if (c.ok()) chunks[t].push_back(*c);
      }
    });
  for (auto& th : threads) th.join();
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  phos::UniqueFd fd(::openat(dir.fd.get(), file->name.c_str(), O_RDONLY));
  std::vector<std::byte> scratch;
  for (int t = 0; t < kThreads; t++) {
    REQUIRE(chunks[t].size() == kChunks);
    for (int k = 0; k < kChunks; k++) {
      auto expect = pattern(4096 + t * 100 + k, uint32_t(t * 1000 + k), false);
      std::vector<std::byte> got(expect.size());
      REQUIRE(read_chunk(fd.get(), file->name, chunks[t][k], got, scratch).ok());
      CHECK(got == expect);
    }
  }
}

TEST_CASE("image dir: corrupted chunk is caught by its checksum", "[image][corrupt]") {
  TempDir dir;
  Manifest m = write_image(dir, {pattern(200000, 6, false)}, Compression::kNone);
  const Chunk& c = m.allocations[0].chunks[1];
  flip_byte(dir.file(data_file_name(42, 0)), off_t(c.file_offset + 10));
  ImageReader reader(dir.fd.get(), m);
  std::vector<std::byte> out(c.raw_size);
  auto r = reader.read_chunk(c, out);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("phos-42-data-0.img: checksum mismatch in chunk"));
  CHECK(reader.read_chunk(m.allocations[0].chunks[0], std::span(out).first(m.allocations[0].chunks[0].raw_size)).ok());
}

TEST_CASE("image dir: corrupted zstd chunk does not decompress or fails its checksum", "[image][corrupt][zstd]") {
  TempDir dir;
  Manifest m = write_image(dir, {pattern(100000, 7, true)}, Compression::kZstd);
  const Chunk& c = m.allocations[0].chunks[0];
  REQUIRE(c.compression == Compression::kZstd);
  flip_byte(dir.file(data_file_name(42, 0)), off_t(c.file_offset + c.stored_size / 2));
  ImageReader reader(dir.fd.get(), m);
  std::vector<std::byte> out(c.raw_size);
  auto r = reader.read_chunk(c, out);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("does not decompress") || Catch::Contains("checksum mismatch"));
}

TEST_CASE("image dir: truncated data file", "[image][corrupt]") {
  TempDir dir;
  write_image(dir, {pattern(100000, 8, false)}, Compression::kNone);
  REQUIRE(::truncate(dir.file(data_file_name(42, 0)).c_str(), 50000) == 0);
  CHECK_THAT(open_error(dir), Catch::Contains("phos-42-data-0.img: 50000 bytes, the manifest says") &&
                                  Catch::Contains("(truncated)"));
}

TEST_CASE("image dir: missing data file", "[image][corrupt]") {
  TempDir dir;
  write_image(dir, {pattern(1000, 9, false)}, Compression::kNone);
  REQUIRE(::unlink(dir.file(data_file_name(42, 0)).c_str()) == 0);
  CHECK_THAT(open_error(dir), Catch::Contains("data file phos-42-data-0.img is missing"));
}

TEST_CASE("image dir: data file header damaged", "[image][corrupt]") {
  TempDir dir;
  write_image(dir, {pattern(1000, 10, false)}, Compression::kNone);
  flip_byte(dir.file(data_file_name(42, 0)), 9);
  CHECK_THAT(open_error(dir), Catch::Contains("phos-42-data-0.img: data file: header checksum mismatch"));
}

TEST_CASE("image dir: data file of another process", "[image][corrupt]") {
  TempDir dir;
  write_image(dir, {pattern(1000, 11, false)}, Compression::kNone);
  auto other = DataFileWriter::create(dir.fd.get(), "phos-43-data-0.img", 43, 0);
  REQUIRE(other.ok());
  REQUIRE((*other)->write_chunk(0, pattern(1000, 11, false), Compression::kNone).ok());
  REQUIRE((*other)->finish().ok());
  REQUIRE(::rename(dir.file("phos-43-data-0.img").c_str(), dir.file(data_file_name(42, 0)).c_str()) == 0);
  CHECK_THAT(open_error(dir), Catch::Contains("belongs to process 43"));
}

TEST_CASE("image dir: missing marker means incomplete", "[image][marker]") {
  TempDir dir;
  write_image(dir, {pattern(1000, 12, false)}, Compression::kNone);
  REQUIRE(remove_completion_marker(dir.fd.get(), 42).ok());
  CHECK_THAT(open_error(dir), Catch::Contains("incomplete image: phos-42-complete.img is missing"));
  auto lenient = open_process_image(dir.fd.get(), 42, false);
  REQUIRE(lenient.ok());
  CHECK_FALSE(lenient->complete);
}

TEST_CASE("image dir: manifest rewritten after the marker means incomplete", "[image][marker]") {
  TempDir dir;
  Manifest m = write_image(dir, {pattern(1000, 13, false)}, Compression::kNone);
  m.statistics.total_ns = 777;
  REQUIRE(write_manifest(dir.fd.get(), m).ok());
  CHECK_THAT(open_error(dir), Catch::Contains("does not match phos-42-manifest.img"));
}

TEST_CASE("image dir: lists manifests only", "[image]") {
  TempDir dir;
  write_image(dir, {pattern(10, 14, false)}, Compression::kNone);
  std::ofstream(dir.file("core-1.img")) << "x";
  std::ofstream(dir.file("phos-x-manifest.img")) << "x";
  auto pids = list_process_images(dir.fd.get());
  REQUIRE(pids.ok());
  CHECK(*pids == std::vector<int32_t>{42});
}

TEST_CASE("image dir: a directory without a GPU image lists nothing", "[image]") {
  TempDir dir;
  auto pids = list_process_images(dir.fd.get());
  REQUIRE(pids.ok());
  CHECK(pids->empty());
}

TEST_CASE("image dir: write_file_atomic leaves no temporary file", "[image]") {
  TempDir dir;
  std::vector<std::byte> bytes(100, std::byte{1});
  REQUIRE(write_file_atomic(dir.fd.get(), "phos-1-x.img", bytes).ok());
  CHECK_FALSE(std::filesystem::exists(dir.file("phos-1-x.img.tmp")));
  CHECK(std::filesystem::file_size(dir.file("phos-1-x.img")) == 100);
}

TEST_CASE("image dir: data writer refuses an existing file and an unsafe name", "[image]") {
  TempDir dir;
  std::ofstream(dir.file("phos-1-data-0.img")) << "old";
  auto again = DataFileWriter::create(dir.fd.get(), "phos-1-data-0.img", 1, 0);
  REQUIRE_FALSE(again.ok());
  CHECK(again.error().code == EEXIST);
  CHECK_FALSE(DataFileWriter::create(dir.fd.get(), "../phos-1.img", 1, 0).ok());
}

TEST_CASE("image dir: oversized manifest is refused before it is read", "[image][corrupt]") {
  TempDir dir;
  std::ofstream(dir.file(manifest_file_name(42))) << "x";
  REQUIRE(::truncate(dir.file(manifest_file_name(42)).c_str(), off_t(kMaxManifestBytes + 1)) == 0);
  CHECK_THAT(open_error(dir), Catch::Contains("more than the"));
}

namespace {

// A 4 KiB-aligned copy of `bytes`, as the engine's pinned staging buffers are.
struct AlignedCopy {
  std::byte* p;
  size_t n;
  explicit AlignedCopy(const std::vector<std::byte>& bytes)
      : p(static_cast<std::byte*>(std::aligned_alloc(4096, align_up(bytes.size())))), n(bytes.size()) {
    std::memcpy(p, bytes.data(), n);
  }
  ~AlignedCopy() { std::free(p); }
  std::span<const std::byte> span() const { return {p, n}; }
};

bool has_o_direct(int fd) { return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

// Writes chunks of every shape (aligned, unaligned start, odd length,
// compressed) with O_DIRECT where `dir`'s file system allows it; each must
// read back and pass its checksum.
void write_every_shape_and_read_back(const TempDir& dir, DirectIo direct_io) {
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(42, 0), 42, 0, direct_io);
  REQUIRE(writer.ok());
  INFO(dir.path << ": " << ((*writer)->direct() ? std::string("O_DIRECT") : (*writer)->why_buffered()));
  if (direct_io == DirectIo::kOff) {
    CHECK_FALSE((*writer)->direct());
    CHECK((*writer)->why_buffered() == "direct_io is off");
  }
  auto aligned = pattern(64 << 10, 20, false), odd = pattern(10001, 21, false), packable = pattern(200000, 22, true);
  AlignedCopy staging(aligned);
  std::vector<std::pair<std::vector<std::byte>, Chunk>> written;
  auto write = [&](std::span<const std::byte> bytes, Compression c) {
    auto chunk = (*writer)->write_chunk(0, bytes, c);
    REQUIRE(chunk.ok());
    CHECK(chunk->file_offset % 4096 == 0);
    if (chunk->compression != Compression::kZero) CHECK(chunk->file_offset >= kDataHeaderSize);
    CHECK(chunk->crc32c == phos::crc32c(bytes));
    written.emplace_back(std::vector<std::byte>(bytes.begin(), bytes.end()), *chunk);
  };
  write(staging.span(), Compression::kNone);
  write(std::span(odd), Compression::kNone);
  write(std::span(aligned).subspan(1, 5000), Compression::kNone);
  write(std::span(packable), Compression::kZstd);
  write(staging.span(), Compression::kNone);
  // A chunk of several MiB, not a multiple of the page size.
  auto big = pattern((1 << 20) + 12345, 23, false);
  write(std::span(big), Compression::kNone);
  // A zero chunk among them takes no extent: the next one is still aligned.
  const std::vector<std::byte> zeros(64 << 10);
  write(std::span(zeros), Compression::kZstd);
  write(std::span(odd), Compression::kNone);
  CHECK(written[3].second.compression == Compression::kZstd);
  CHECK(written[6].second.compression == Compression::kZero);
  CHECK(written[6].second.stored_size == 0);
  bool direct = (*writer)->direct();
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  CHECK(file->size % 4096 == 0);
  struct stat st {};
  REQUIRE(::fstatat(dir.fd.get(), file->name.c_str(), &st, 0) == 0);
  CHECK(uint64_t(st.st_size) == file->size);
  phos::UniqueFd fd(::openat(dir.fd.get(), file->name.c_str(), O_RDONLY));
  std::vector<std::byte> scratch;
  ChunkTimes times;
  for (const auto& [bytes, chunk] : written) {
    std::vector<std::byte> got(bytes.size(), std::byte{0xee});
    REQUIRE(read_chunk(fd.get(), file->name, chunk, got, scratch, &times).ok());
    CHECK(got == bytes);
  }
  if (direct_io == DirectIo::kAuto) WARN(dir.path << ": data file written " << (direct ? "with O_DIRECT" : "buffered"));
}

}  // namespace

TEST_CASE("data file: O_DIRECT or its fallback on a disk directory", "[image][direct]") {
  TempDir dir("/tmp");
  write_every_shape_and_read_back(dir, DirectIo::kAuto);
}

TEST_CASE("data file: O_DIRECT or its fallback on tmpfs", "[image][direct]") {
  if (::access("/dev/shm", W_OK) != 0) {
    WARN("no writable /dev/shm: skipped");
    return;
  }
  TempDir dir("/dev/shm");
  write_every_shape_and_read_back(dir, DirectIo::kAuto);
}

TEST_CASE("data file: direct_io off writes through the page cache", "[image][direct]") {
  TempDir dir;
  write_every_shape_and_read_back(dir, DirectIo::kOff);
}

TEST_CASE("data file: a CRC the caller computed is stored as given, and the reader checks it", "[image]") {
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), "phos-7-data-0.img", 7, 0, DirectIo::kOff);
  REQUIRE(writer.ok());
  auto bytes = pattern(100000, 31, false);
  uint32_t right = phos::crc32c(bytes);
  auto good = (*writer)->write_chunk(0, bytes, Compression::kNone, 1, ChunkSum{right, false});
  auto bad = (*writer)->write_chunk(0, bytes, Compression::kNone, 1, ChunkSum{right ^ 1, false});
  REQUIRE(good.ok());
  REQUIRE(bad.ok());
  CHECK(good->crc32c == right);
  CHECK(bad->crc32c == (right ^ 1));
  CHECK((*writer)->times().checksum_ns < 1000000);  // not computed again
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  phos::UniqueFd fd(::openat(dir.fd.get(), file->name.c_str(), O_RDONLY));
  std::vector<std::byte> got(bytes.size()), scratch;
  ChunkTimes times;
  CHECK(read_chunk(fd.get(), file->name, *good, got, scratch, &times).ok());
  auto refused = read_chunk(fd.get(), file->name, *bad, got, scratch, &times);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message, Catch::Contains("checksum mismatch"));
}

TEST_CASE("data file: a file system without O_DIRECT answers EINVAL", "[image][direct]") {
  phos::UniqueFd fd(::open("/proc/self/comm", O_WRONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  auto r = enable_direct_io(fd.get(), "comm");
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EINVAL);
  CHECK_FALSE(has_o_direct(fd.get()));
}

TEST_CASE("data file: a refused O_DIRECT write falls back to the page cache", "[image][direct]") {
  TempDir dir;
  phos::UniqueFd fd(::openat(dir.fd.get(), "f", O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  REQUIRE(fd.valid());
  if (!enable_direct_io(fd.get(), "f").ok()) {
    WARN(dir.path << " has no O_DIRECT: fallback of writes not exercised");
    return;
  }
  std::atomic<bool> direct{true};
  std::string why;
  auto bytes = pattern(5000, 23, false);  // unaligned address and length: O_DIRECT refuses
  REQUIRE(pwrite_with_fallback(fd.get(), bytes.data() + 1, 4999, 4096, "f", direct, &why).ok());
  CHECK_FALSE(direct);
  CHECK(why.find("O_DIRECT write refused") == 0);
  CHECK_FALSE(has_o_direct(fd.get()));
  std::vector<std::byte> got(4999);
  REQUIRE(::pread(fd.get(), got.data(), got.size(), 4096) == 4999);
  CHECK(std::equal(got.begin(), got.end(), bytes.begin() + 1));
}

TEST_CASE("image dir: chunks spread over several data files read back", "[image][files]") {
  TempDir dir;
  constexpr uint32_t kFiles = 3;
  Manifest m;
  m.writer_version = "test";
  m.pid = 42;
  m.chunk_size = 64 << 10;
  m.devices.push_back(phos::GpuDevice{
      .ordinal = 0, .uuid = {}, .name = "test gpu", .total_memory = 1ull << 30, .compute_major = 9, .compute_minor = 0});
  std::vector<std::unique_ptr<DataFileWriter>> writers;
  for (uint32_t i = 0; i < kFiles; i++) {
    auto w = DataFileWriter::create(dir.fd.get(), data_file_name(42, i), 42, i);
    REQUIRE(w.ok());
    writers.push_back(std::move(*w));
  }
  std::vector<std::vector<std::byte>> bufs = {pattern(1000000, 30, false), pattern(300000, 31, true)};
  uint64_t address = 0x7f0000000000ull;
  size_t next = 0;
  for (size_t i = 0; i < bufs.size(); i++) {
    Allocation a{phos::agent::Allocation{i + 1, 0, address + i * (1ull << 30), bufs[i].size(), 0}, {}};
    for (uint64_t off = 0; off < bufs[i].size(); off += m.chunk_size) {
      size_t n = std::min<uint64_t>(m.chunk_size, bufs[i].size() - off);
      auto c = writers[next++ % kFiles]->write_chunk(off, std::span(bufs[i]).subspan(off, n), Compression::kZstd);
      REQUIRE(c.ok());
      a.chunks.push_back(*c);
    }
    m.allocations.push_back(a);
  }
  for (auto& w : writers) {
    auto f = w->finish();
    REQUIRE(f.ok());
    m.data_files.push_back(*f);
  }
  auto written = write_manifest(dir.fd.get(), m);
  REQUIRE(written.ok());
  REQUIRE(write_completion_marker(dir.fd.get(), 42, *written).ok());

  auto img = open_process_image(dir.fd.get(), 42, true);
  REQUIRE(img.ok());
  REQUIRE(img->manifest.data_files.size() == kFiles);
  std::set<uint32_t> used;
  for (const auto& a : img->manifest.allocations)
    for (const auto& c : a.chunks) used.insert(c.file_index);
  CHECK(used.size() == kFiles);
  CHECK(read_allocation(dir, img->manifest, 0) == bufs[0]);
  CHECK(read_allocation(dir, img->manifest, 1) == bufs[1]);
  ImageReader reader(dir.fd.get(), img->manifest);
  auto total = reader.verify_all();
  REQUIRE(total.ok());
  CHECK(*total == 1300000);
  CHECK(reader.times().checksum_ns > 0);

  // A data file swapped for another of the same process is caught by its header.
  REQUIRE(::renameat(dir.fd.get(), data_file_name(42, 1).c_str(), dir.fd.get(), "phos-42-data-x.img") == 0);
  REQUIRE(::renameat(dir.fd.get(), data_file_name(42, 2).c_str(), dir.fd.get(), data_file_name(42, 1).c_str()) == 0);
  REQUIRE(::renameat(dir.fd.get(), "phos-42-data-x.img", dir.fd.get(), data_file_name(42, 2).c_str()) == 0);
  CHECK_FALSE(open_process_image(dir.fd.get(), 42, true).ok());
}

// --- a hostile image directory: links are neither followed nor replaced ---

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A file outside the image directory that a planted link points at.
struct Outside {
  TempDir dir;
  std::string path = dir.file("precious");
  Outside() { std::ofstream(path) << "outside"; }
  bool untouched() const { return slurp(path) == "outside"; }
};

Manifest manifest_of_42() {
  Manifest m = phos::test::full_manifest();
  m.pid = 42;
  return m;
}

}  // namespace

TEST_CASE("image dir: a manifest name planted as a link is refused, the link neither followed nor replaced",
          "[image][hostile]") {
  TempDir dir;
  Outside outside;
  REQUIRE(::symlink(outside.path.c_str(), dir.file(manifest_file_name(42)).c_str()) == 0);
  auto r = write_manifest(dir.fd.get(), manifest_of_42());
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("symbolic link") != std::string::npos);
  CHECK(outside.untouched());
  struct stat st {};
  REQUIRE(::lstat(dir.file(manifest_file_name(42)).c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));  // still the link: not replaced
}

TEST_CASE("image dir: a planted temporary file link is removed, not written through", "[image][hostile]") {
  TempDir dir;
  Outside outside;
  const std::string name = marker_file_name(42);
  REQUIRE(::symlink(outside.path.c_str(), dir.file(name + ".tmp").c_str()) == 0);
  const std::vector<std::byte> bytes(16, std::byte{7});
  REQUIRE(write_file_atomic(dir.fd.get(), name, bytes).ok());
  CHECK(outside.untouched());
  struct stat st {};
  REQUIRE(::lstat(dir.file(name).c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(::access(dir.file(name + ".tmp").c_str(), F_OK) != 0);
}

TEST_CASE("image dir: a name of ours that is a directory is refused", "[image][hostile]") {
  TempDir dir;
  REQUIRE(::mkdir(dir.file(manifest_file_name(42)).c_str(), 0700) == 0);
  auto r = write_manifest(dir.fd.get(), manifest_of_42());
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("not a regular file") != std::string::npos);
}

TEST_CASE("image dir: a data file name planted as a link is not created through", "[image][hostile]") {
  TempDir dir;
  Outside outside;
  REQUIRE(::symlink(outside.path.c_str(), dir.file(data_file_name(42, 0)).c_str()) == 0);
  auto w = DataFileWriter::create(dir.fd.get(), data_file_name(42, 0), 42, 0);
  CHECK_FALSE(w.ok());
  CHECK(outside.untouched());
}

TEST_CASE("image dir: restore reads no file through a link", "[image][hostile]") {
  TempDir dir;
  Manifest m = write_image(dir, {pattern(200 << 10, 1, false)}, Compression::kNone);
  SECTION("the manifest") {
    // The real manifest moved out, a link to it left in its place.
    Outside outside;
    REQUIRE(::rename(dir.file(manifest_file_name(42)).c_str(), outside.path.c_str()) == 0);
    REQUIRE(::symlink(outside.path.c_str(), dir.file(manifest_file_name(42)).c_str()) == 0);
    auto r = open_process_image(dir.fd.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("symbolic link") != std::string::npos);
  }
  SECTION("a data file") {
    Outside outside;
    const std::string data = data_file_name(42, 0);
    REQUIRE(::rename(dir.file(data).c_str(), outside.path.c_str()) == 0);
    REQUIRE(::symlink(outside.path.c_str(), dir.file(data).c_str()) == 0);
    auto r = open_process_image(dir.fd.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("symbolic link") != std::string::npos);
  }
}

// A FIFO under one of our names once held `criu restore` in open() until it
// was killed; it must be refused at once (a hang here is the test's timeout).
TEST_CASE("image dir: restore refuses a FIFO or a directory planted under its names, at once", "[image][hostile]") {
  TempDir dir;
  write_image(dir, {pattern(200 << 10, 1, false)}, Compression::kNone);
  SECTION("a FIFO as the manifest") {
    REQUIRE(::unlink(dir.file(manifest_file_name(42)).c_str()) == 0);
    REQUIRE(::mkfifo(dir.file(manifest_file_name(42)).c_str(), 0600) == 0);
    auto r = open_process_image(dir.fd.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains(manifest_file_name(42)) && Catch::Contains("not a regular file"));
  }
  SECTION("a FIFO as a data file") {
    const std::string data = data_file_name(42, 0);
    REQUIRE(::unlink(dir.file(data).c_str()) == 0);
    REQUIRE(::mkfifo(dir.file(data).c_str(), 0600) == 0);
    auto r = open_process_image(dir.fd.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains(data) && Catch::Contains("not a regular file"));
  }
  SECTION("a directory as the manifest") {
    REQUIRE(::unlink(dir.file(manifest_file_name(42)).c_str()) == 0);
    REQUIRE(::mkdir(dir.file(manifest_file_name(42)).c_str(), 0700) == 0);
    auto r = open_process_image(dir.fd.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("not a regular file"));
  }
}

// --- sparse images: zero chunks ---

TEST_CASE("data file: a zero chunk is recorded with its CRC, not written", "[image][sparse]") {
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(7, 0), 7, 0, DirectIo::kOff);
  REQUIRE(writer.ok());
  const std::vector<std::byte> zeros(300000);
  auto data = pattern(5000, 40, false);
  auto zero = (*writer)->write_chunk(1 << 20, zeros, Compression::kNone);
  auto stored = (*writer)->write_chunk(0, data, Compression::kNone);
  REQUIRE(zero.ok());
  REQUIRE(stored.ok());
  CHECK(zero->compression == Compression::kZero);
  CHECK(zero->stored_size == 0);
  CHECK(zero->file_offset == 0);
  CHECK(zero->file_index == 0);
  CHECK(zero->raw_size == zeros.size());
  CHECK(zero->alloc_offset == 1 << 20);
  CHECK(zero->crc32c == phos::crc32c(zeros));
  // The data chunk after it goes where the first extent goes.
  CHECK(stored->file_offset == kDataHeaderSize);
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  CHECK(file->size == kDataHeaderSize + align_up(data.size()));
  // Read back: zeros, whatever the buffer held, and the CRC checked.
  std::vector<std::byte> got(zeros.size(), std::byte{0xff}), scratch;
  ChunkTimes times;
  REQUIRE(read_chunk(-1, "none", *zero, got, scratch, &times).ok());
  CHECK(got == zeros);
  CHECK(times.io_ns == 0);
}

TEST_CASE("data file: sparse off writes a zero chunk like any other", "[image][sparse]") {
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(7, 0), 7, 0, DirectIo::kOff, Sparse::kOff);
  REQUIRE(writer.ok());
  const std::vector<std::byte> zeros(8192);
  auto plain = (*writer)->write_chunk(0, zeros, Compression::kNone);
  // With zstd the zeros compress, as any chunk would.
  auto packed = (*writer)->write_chunk(8192, zeros, Compression::kZstd);
  // What the GPU says changes nothing either.
  auto told = (*writer)->write_chunk(16384, zeros, Compression::kNone, 1, ChunkSum{phos::crc32c(zeros), true});
  REQUIRE(plain.ok());
  REQUIRE(packed.ok());
  REQUIRE(told.ok());
  CHECK(plain->compression == Compression::kNone);
  CHECK(plain->stored_size == zeros.size());
  CHECK(packed->compression == Compression::kZstd);
  CHECK(told->compression == Compression::kNone);
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  CHECK(file->size > kDataHeaderSize + 2 * zeros.size());
}

TEST_CASE("data file: the caller's word on a zero chunk is taken, as its CRC is", "[image][sparse]") {
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(7, 0), 7, 0, DirectIo::kOff);
  REQUIRE(writer.ok());
  const std::vector<std::byte> zeros(1 << 20);
  const uint32_t crc = phos::crc32c(zeros);
  // The GPU says zero: not looked at again.
  auto zero = (*writer)->write_chunk(0, zeros, Compression::kNone, 1, ChunkSum{crc, true});
  // The GPU says not zero (it checks what the DMA copies): written.
  auto kept = (*writer)->write_chunk(0, zeros, Compression::kNone, 1, ChunkSum{crc, false});
  REQUIRE(zero.ok());
  REQUIRE(kept.ok());
  CHECK(zero->compression == Compression::kZero);
  CHECK(zero->crc32c == crc);
  CHECK(kept->compression == Compression::kNone);
  CHECK(kept->stored_size == zeros.size());
  CHECK((*writer)->times().checksum_ns < 1000000);  // neither computed here
}

TEST_CASE("data file: one nonzero byte keeps a chunk stored", "[image][sparse]") {
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(7, 0), 7, 0, DirectIo::kOff);
  REQUIRE(writer.ok());
  for (size_t at : {size_t(0), size_t(4095), size_t(65535)}) {
    std::vector<std::byte> almost(65536);
    almost[at] = std::byte{1};
    auto c = (*writer)->write_chunk(0, almost, Compression::kNone);
    REQUIRE(c.ok());
    INFO("nonzero byte at " << at);
    CHECK(c->compression == Compression::kNone);
    CHECK(c->stored_size == almost.size());
  }
}

TEST_CASE("image dir: a sparse image reads back, verifies and stores only its data", "[image][sparse]") {
  TempDir dir;
  // 64 KiB chunks: data, zero, zero, data, then a zero tail shorter than a chunk.
  std::vector<std::byte> buf(4 * (64 << 10) + 1000);
  auto data = pattern(64 << 10, 41, false);
  std::copy(data.begin(), data.end(), buf.begin());
  std::copy(data.begin(), data.end(), buf.begin() + 3 * (64 << 10));
  std::vector<std::vector<std::byte>> bufs = {buf, std::vector<std::byte>(100)};
  Manifest m = write_image(dir, bufs, Compression::kZstd);
  std::vector<Compression> kinds;
  for (const auto& c : m.allocations[0].chunks) kinds.push_back(c.compression);
  CHECK(kinds == std::vector<Compression>{Compression::kNone, Compression::kZero, Compression::kZero,
                                          Compression::kNone, Compression::kZero});
  CHECK(m.allocations[1].chunks[0].compression == Compression::kZero);
  CHECK(m.data_files[0].size == kDataHeaderSize + 2 * (64 << 10));
  auto img = open_process_image(dir.fd.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(read_allocation(dir, img->manifest, 0) == bufs[0]);
  CHECK(read_allocation(dir, img->manifest, 1) == bufs[1]);
  ImageReader reader(dir.fd.get(), img->manifest);
  auto total = reader.verify_all();
  REQUIRE(total.ok());
  CHECK(*total == buf.size() + 100);
}

TEST_CASE("image dir: a zero chunk whose recorded CRC is not that of zeros fails", "[image][sparse][corrupt]") {
  TempDir dir;
  Manifest m = write_image(dir, {std::vector<std::byte>(70000)}, Compression::kNone);
  Chunk c = m.allocations[0].chunks[1];
  REQUIRE(c.compression == Compression::kZero);
  c.crc32c ^= 1;
  ImageReader reader(dir.fd.get(), m);
  std::vector<std::byte> out(c.raw_size);
  auto r = reader.read_chunk(c, out);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("zero chunk at allocation offset 65536") &&
                                    Catch::Contains("not that of zero bytes"));
  // Left to its caller, the check is not made: nothing was read to check.
  CHECK(reader.read_chunk(c, out, CrcCheck::kByCaller).ok());
}

TEST_CASE("image dir: a chunk copied twice reads as its last copy, zero or not", "[image][sparse][recopy]") {
  // Soft recopy writes a chunk again after the process wrote it; the
  // manifest names the last copy. Zero first, then data; and data first,
  // then zero (its data stays in the file, unreferenced).
  TempDir dir;
  auto writer = DataFileWriter::create(dir.fd.get(), data_file_name(42, 0), 42, 0, DirectIo::kOff);
  REQUIRE(writer.ok());
  const std::vector<std::byte> zeros(64 << 10);
  auto data = pattern(64 << 10, 43, false);
  auto first_zero = (*writer)->write_chunk(0, zeros, Compression::kNone);
  auto then_data = (*writer)->write_chunk(0, data, Compression::kNone);
  auto first_data = (*writer)->write_chunk(0, data, Compression::kNone);
  auto then_zero = (*writer)->write_chunk(0, zeros, Compression::kNone);
  REQUIRE(first_zero.ok());
  REQUIRE(then_data.ok());
  REQUIRE(first_data.ok());
  REQUIRE(then_zero.ok());
  CHECK(first_zero->compression == Compression::kZero);
  CHECK(then_zero->compression == Compression::kZero);
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  Manifest m;
  m.writer_version = "test";
  m.pid = 42;
  m.chunk_size = 64 << 10;
  m.devices.push_back(phos::GpuDevice{
      .ordinal = 0, .uuid = {}, .name = "test gpu", .total_memory = 1ull << 30, .compute_major = 9, .compute_minor = 0});
  m.data_files.push_back(*file);
  m.allocations.push_back({{1, 0, 0x7f0000000000ull, zeros.size(), 0, std::nullopt}, {*then_data}});
  m.allocations.push_back({{2, 0, 0x7f0040000000ull, zeros.size(), 0, std::nullopt}, {*then_zero}});
  m.format_version = format_version_for(m);
  CHECK(m.format_version == kZeroChunkFormatVersion);
  auto written = write_manifest(dir.fd.get(), m);
  REQUIRE(written.ok());
  REQUIRE(write_completion_marker(dir.fd.get(), 42, *written).ok());
  auto img = open_process_image(dir.fd.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(read_allocation(dir, img->manifest, 0) == data);
  CHECK(read_allocation(dir, img->manifest, 1) == zeros);
}
