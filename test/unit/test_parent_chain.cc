// Incremental images: parent chunks in the manifest, and the chain of
// parents that open_process_image resolves.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <random>

#include "fixtures.h"
#include "phos/images/crc32c.h"
#include "phos/images/data_file.h"
#include "phos/images/image_dir.h"

using namespace phos::image;
using phos::test::full_manifest;
using phos::test::TempDir;
using phos::test::flip_byte;

namespace {

constexpr uint32_t kChunk = 64 << 10;

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  return v;
}

// The manifest file of `dir` (pid 42) as a parent reference.
ParentImage reference_to(int dirfd, const std::string& path) {
  auto img = open_process_image(dirfd, 42, true);
  REQUIRE(img.ok());
  return ParentImage{.path = path,
                     .manifest_size = img->manifest_size,
                     .manifest_crc32c = img->manifest_crc32c,
                     .created_unix_ns = img->manifest.created_unix_ns};
}

// A complete image of pid 42 in `sub` of `base`, one allocation per buffer.
// With a parent (`parent_path`, relative to `sub`), a chunk whose CRC and
// size are those of the parent's chunk at the same place is a parent chunk,
// as the engine makes them.
Manifest write_image(const TempDir& base, const std::string& sub, const std::vector<std::vector<std::byte>>& buffers,
                     const std::string& parent_path = "", uint64_t created = 1) {
  ::mkdir(base.file(sub).c_str(), 0700);
  phos::UniqueFd dir(::open(base.file(sub).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(dir.valid());
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> parent_crc;
  Manifest m;
  m.writer_version = "test";
  m.pid = 42;
  m.chunk_size = kChunk;
  m.created_unix_ns = created;
  if (!parent_path.empty()) {
    phos::UniqueFd pdir;
    auto parent = open_parent_image(dir.get(), parent_path, 42, pdir);
    REQUIRE(parent.ok());
    for (const auto& a : parent->manifest.allocations)
      for (const auto& c : a.chunks) parent_crc[{a.id, c.alloc_offset}] = c.crc32c;
    m.parent = reference_to(pdir.get(), parent_path);
  }
  m.devices.push_back(phos::GpuDevice{.ordinal = 0, .uuid = {}, .name = "test gpu", .total_memory = 1ull << 30});
  auto writer = DataFileWriter::create(dir.get(), data_file_name(42, 0), 42, 0);
  REQUIRE(writer.ok());
  for (size_t i = 0; i < buffers.size(); i++) {
    Allocation a{phos::agent::Allocation{i + 1, 0, 0x7f0000000000ull + (i << 30), buffers[i].size(), 0}, {}};
    for (uint64_t off = 0; off < buffers[i].size(); off += kChunk) {
      auto bytes = std::span(buffers[i]).subspan(off, std::min<uint64_t>(kChunk, buffers[i].size() - off));
      const uint32_t crc = phos::crc32c(bytes);
      auto it = parent_crc.find({a.id, off});
      if (it != parent_crc.end() && it->second == crc) {
        a.chunks.push_back(Chunk{.alloc_offset = off, .raw_size = uint32_t(bytes.size()), .crc32c = crc,
                                 .compression = Compression::kParent});
        continue;
      }
      auto c = (*writer)->write_chunk(off, bytes, Compression::kNone);
      REQUIRE(c.ok());
      a.chunks.push_back(*c);
    }
    m.allocations.push_back(a);
  }
  auto file = (*writer)->finish();
  REQUIRE(file.ok());
  m.data_files.push_back(*file);
  m.format_version = format_version_for(m);
  auto written = write_manifest(dir.get(), m);
  REQUIRE(written.ok());
  REQUIRE(write_completion_marker(dir.get(), 42, *written).ok());
  return m;
}

std::vector<std::byte> read_back(const ProcessImage& img, int dirfd, size_t index) {
  ImageReader reader(dirfd, img.manifest);
  std::vector<std::byte> out(img.manifest.allocations[index].size);
  for (const auto& c : img.manifest.allocations[index].chunks) {
    auto r = reader.read_chunk(c, std::span(out).subspan(c.alloc_offset, c.raw_size));
    REQUIRE(r.ok());
  }
  return out;
}

phos::UniqueFd open_dir(const TempDir& base, const std::string& sub) {
  return phos::UniqueFd(::open(base.file(sub).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
}

}  // namespace

TEST_CASE("manifest: a parent and parent chunks round trip, at format version 6", "[manifest][parent]") {
  Manifest m = full_manifest();
  m.parent = ParentImage{.path = "../img1", .manifest_size = 321, .manifest_crc32c = 0xabcd, .created_unix_ns = 77};
  m.allocations[0].chunks[1] = Chunk{.alloc_offset = 1 << 20, .raw_size = 1 << 20, .crc32c = 0x2222,
                                     .compression = Compression::kParent};
  m.format_version = format_version_for(m);
  CHECK(m.format_version == kParentFormatVersion);
  CHECK(kParentFormatVersion == kManifestFormatVersion);
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back.value() == m);
}

TEST_CASE("manifest: parent chunks need a parent and version 6, and store nothing", "[manifest][parent]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[1] = Chunk{.alloc_offset = 1 << 20, .raw_size = 1 << 20, .crc32c = 0x2222,
                                     .compression = Compression::kParent};
  m.format_version = kParentFormatVersion;
  auto r = validate_manifest(m, "m.img");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("names no parent image"));
  m.parent = ParentImage{.path = "../p", .manifest_size = 1, .manifest_crc32c = 1, .created_unix_ns = 1};
  CHECK(validate_manifest(m, "m.img").ok());
  m.format_version = kIpcFormatVersion;
  r = validate_manifest(m, "m.img");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("format version 5 does not have"));
  m.format_version = kParentFormatVersion;
  m.allocations[0].chunks[1].stored_size = 10;
  r = validate_manifest(m, "m.img");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("is a parent chunk but names 10 stored bytes"));
}

TEST_CASE("parent chain: a chain of three reads back bitwise, each chunk from the image that stores it",
          "[image][parent]") {
  TempDir base;
  auto a0 = random_bytes(5 * kChunk + 100, 1), b0 = random_bytes(3 * kChunk, 2);
  write_image(base, "img0", {a0, b0}, "", 10);
  auto a1 = a0, b1 = b0;
  a1[kChunk + 5] ^= std::byte(1);  // chunk 1 of the first allocation changes
  auto m1 = write_image(base, "img1", {a1, b1}, "../img0", 11);
  auto a2 = a1, b2 = b1;
  b2[2 * kChunk] ^= std::byte(1);  // chunk 2 of the second
  auto m2 = write_image(base, "img2", {a2, b2}, "../img1", 12);
  CHECK(m2.parent->path == "../img1");

  auto dir = open_dir(base, "img2");
  auto img = open_process_image(dir.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(read_back(*img, dir.get(), 0) == a2);
  CHECK(read_back(*img, dir.get(), 1) == b2);
  REQUIRE(img->chain.size() == 3);
  CHECK(img->chain[0].dir == ".");
  CHECK(img->chain[1].dir == "../img1");
  CHECK(img->chain[2].dir == "../img1/../img0");
  CHECK(img->chain[0].stored_chunks == 1);
  CHECK(img->chain[0].referenced_chunks == 8);
  CHECK(img->chain[1].stored_chunks == 1);
  CHECK(img->chain[1].referenced_chunks == 8);
  CHECK(img->chain[2].stored_chunks == 9);
  CHECK(img->chain[2].referenced_chunks == 0);
  ImageReader reader(dir.get(), img->manifest);
  auto all = reader.verify_all();
  REQUIRE(all.ok());
  CHECK(*all == a2.size() + b2.size());
}

TEST_CASE("parent chain: a missing, changed or broken parent is refused, naming it", "[image][parent][corrupt]") {
  TempDir base;
  auto a0 = random_bytes(4 * kChunk, 3);
  write_image(base, "img0", {a0}, "", 10);
  auto a1 = a0;
  a1[0] ^= std::byte(1);
  write_image(base, "img1", {a1}, "../img0", 11);
  auto dir = open_dir(base, "img1");
  SECTION("missing") {
    std::filesystem::remove_all(base.file("img0"));
    auto r = open_process_image(dir.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0") && Catch::Contains("No such file"));
  }
  SECTION("its manifest replaced by another complete image") {
    write_image(base, "other", {a0}, "", 99);
    std::filesystem::remove_all(base.file("img0"));
    std::filesystem::rename(base.file("other"), base.file("img0"));
    auto r = open_process_image(dir.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0") && Catch::Contains("changed or replaced"));
  }
  SECTION("incomplete") {
    REQUIRE(::unlink(base.file("img0/" + marker_file_name(42)).c_str()) == 0);
    auto r = open_process_image(dir.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0") && Catch::Contains("incomplete"));
  }
  SECTION("a flipped byte in its data file") {
    flip_byte(base.file("img0/" + data_file_name(42, 0)), kDataHeaderSize + 2 * kChunk + 7);
    auto img = open_process_image(dir.get(), 42, true);
    REQUIRE(img.ok());
    ImageReader reader(dir.get(), img->manifest);
    auto r = reader.verify_all();
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0") && Catch::Contains("checksum"));
  }
  SECTION("a FIFO planted as its data file") {
    REQUIRE(::unlink(base.file("img0/" + data_file_name(42, 0)).c_str()) == 0);
    REQUIRE(::mkfifo(base.file("img0/" + data_file_name(42, 0)).c_str(), 0600) == 0);
    auto r = open_process_image(dir.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0") && Catch::Contains("not a regular file"));
  }
  SECTION("an image that is its own parent") {
    write_image(base, "loop", {a0}, "", 5);
    auto loop = open_dir(base, "loop");
    auto m = open_process_image(loop.get(), 42, true);
    REQUIRE(m.ok());
    Manifest self = m->manifest;
    self.parent = ParentImage{.path = ".", .manifest_size = 0, .manifest_crc32c = 0, .created_unix_ns = 0};
    self.format_version = format_version_for(self);
    auto written = write_manifest(loop.get(), self);
    REQUIRE(written.ok());
    REQUIRE(write_completion_marker(loop.get(), 42, *written).ok());
    auto r = open_process_image(loop.get(), 42, true);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ."));
  }
}

TEST_CASE("parent chain: merged into one image that names no parent and reads back the same", "[image][parent][merge]") {
  TempDir base;
  auto a0 = random_bytes(4 * kChunk + 10, 5), b0 = std::vector<std::byte>(2 * kChunk);  // b0: zero chunks
  write_image(base, "img0", {a0, b0}, "", 10);
  auto a1 = a0;
  a1[3 * kChunk] ^= std::byte(1);
  write_image(base, "img1", {a1, b0}, "../img0", 11);
  ::mkdir(base.file("out").c_str(), 0700);
  auto dir = open_dir(base, "img1");
  auto out = open_dir(base, "out");
  SECTION("merged") {
    auto merged = merge_chain(dir.get(), 42, out.get());
    REQUIRE(merged.ok());
    CHECK_FALSE(merged->parent);
    std::filesystem::remove_all(base.file("img0"));  // no longer needed
    auto img = open_process_image(out.get(), 42, true);
    REQUIRE(img.ok());
    CHECK(img->chain.size() == 1);
    CHECK(img->chain[0].referenced_chunks == 0);
    CHECK(read_back(*img, out.get(), 0) == a1);
    CHECK(read_back(*img, out.get(), 1) == b0);
  }
  SECTION("a chain whose parent is gone is not merged, naming it") {
    std::filesystem::remove_all(base.file("img0"));
    auto r = merge_chain(dir.get(), 42, out.get());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0"));
  }
  SECTION("a manifest name planted as a link in the target is refused, not written through") {
    REQUIRE(::symlink("/nonexistent", base.file("out/" + manifest_file_name(42)).c_str()) == 0);
    auto r = merge_chain(dir.get(), 42, out.get());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("symbolic link"));
  }
}
