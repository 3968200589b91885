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
#include "phos/images/fingerprint.h"
#include "phos/images/image_dir.h"
#include "phos/images/parent_index.h"

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

// A complete image of pid 42 in `sub` of `base`, one allocation per buffer,
// each chunk with its fingerprint. With a parent (`parent_path`, relative to
// `sub`), a chunk the parent's index (parent_index.h) finds unchanged is a
// parent chunk, as the engine makes them; a parent the index refuses is not
// used, as the dump does not. Without `fingerprints`, as a phos of format
// version 6 wrote images: no fingerprints, unchanged by CRC-32C and size.
Manifest write_image(const TempDir& base, const std::string& sub, const std::vector<std::vector<std::byte>>& buffers,
                     const std::string& parent_path = "", uint64_t created = 1, bool fingerprints = true) {
  ::mkdir(base.file(sub).c_str(), 0700);
  phos::UniqueFd dir(::open(base.file(sub).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(dir.valid());
  ParentIndex index;
  std::map<std::pair<uint64_t, uint64_t>, uint32_t> v6_parent_crc;
  Manifest m;
  m.writer_version = "test";
  m.pid = 42;
  m.chunk_size = kChunk;
  m.created_unix_ns = created;
  if (!parent_path.empty()) {
    phos::UniqueFd pdir;
    auto parent = open_parent_image(dir.get(), parent_path, 42, pdir);
    REQUIRE(parent.ok());
    auto of = ParentIndex::of(parent->manifest);
    if (!fingerprints) {
      for (const auto& a : parent->manifest.allocations)
        for (const auto& c : a.chunks) v6_parent_crc[{a.id, c.alloc_offset}] = c.crc32c;
      m.parent = reference_to(pdir.get(), parent_path);
    } else if (of.ok()) {
      index = std::move(*of);
      m.parent = reference_to(pdir.get(), parent_path);
    }
  }
  m.devices.push_back(phos::GpuDevice{.ordinal = 0, .uuid = {}, .name = "test gpu", .total_memory = 1ull << 30});
  auto writer = DataFileWriter::create(dir.get(), data_file_name(42, 0), 42, 0);
  REQUIRE(writer.ok());
  for (size_t i = 0; i < buffers.size(); i++) {
    Allocation a{phos::agent::Allocation{i + 1, 0, 0x7f0000000000ull + (i << 30), buffers[i].size(), 0}, {}};
    for (uint64_t off = 0; off < buffers[i].size(); off += kChunk) {
      auto bytes = std::span(buffers[i]).subspan(off, std::min<uint64_t>(kChunk, buffers[i].size() - off));
      const uint32_t crc = phos::crc32c(bytes);
      const uint64_t fp = phos::fingerprint::of(bytes.data(), bytes.size());
      auto it = v6_parent_crc.find({a.id, off});
      if ((fingerprints && index.unchanged(a.id, off, {uint32_t(bytes.size()), crc, fp})) ||
          (it != v6_parent_crc.end() && it->second == crc)) {
        a.chunks.push_back(Chunk{.alloc_offset = off, .raw_size = uint32_t(bytes.size()), .crc32c = crc,
                                 .compression = Compression::kParent,
                                 .fingerprint = fingerprints ? std::optional(fp) : std::nullopt});
        continue;
      }
      auto c = (*writer)->write_chunk(off, bytes, Compression::kNone);
      REQUIRE(c.ok());
      if (fingerprints) c->fingerprint = fp;
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

// `sub`'s manifest (pid 42, as stored: its parent chunks unresolved)
// changed by `edit` and written again, with a new completion marker.
template <class Edit>
void rewrite_manifest(const TempDir& base, const std::string& sub, Edit edit) {
  phos::UniqueFd dir(::open(base.file(sub).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(dir.valid());
  auto bytes = read_small_file(dir.get(), manifest_file_name(42), kMaxManifestBytes);
  REQUIRE(bytes.ok());
  auto m = decode_manifest(*bytes, "m.img");
  REQUIRE(m.ok());
  edit(*m);
  auto written = write_manifest(dir.get(), *m);
  REQUIRE(written.ok());
  REQUIRE(write_completion_marker(dir.get(), 42, *written).ok());
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

// validate_manifest refuses `m`, saying `says`.
void check_refused(const Manifest& m, const std::string& says) {
  auto r = validate_manifest(m, "m.img");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains(says));
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
  CHECK(kParentFormatVersion < kManifestFormatVersion);
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back.value() == m);
}

TEST_CASE("manifest: parent chunks need a parent and version 6, and store nothing", "[manifest][parent]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[1] = Chunk{.alloc_offset = 1 << 20, .raw_size = 1 << 20, .crc32c = 0x2222,
                                     .compression = Compression::kParent};
  m.format_version = kParentFormatVersion;
  check_refused(m, "names no parent image");
  m.parent = ParentImage{.path = "../p", .manifest_size = 1, .manifest_crc32c = 1, .created_unix_ns = 1};
  CHECK(validate_manifest(m, "m.img").ok());
  m.format_version = kIpcFormatVersion;
  check_refused(m, "format version 5 does not have");
  m.format_version = kParentFormatVersion;
  m.allocations[0].chunks[1].stored_size = 10;
  check_refused(m, "is a parent chunk but names 10 stored bytes");
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

TEST_CASE("manifest: fingerprints round trip at format version 7, and no older version or dead chunk has one",
          "[manifest][parent][fingerprint]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[0].fingerprint = 0x0123456789abcdefull;
  m.format_version = format_version_for(m);
  CHECK(m.format_version == kFingerprintFormatVersion);
  CHECK(kFingerprintFormatVersion <= kManifestFormatVersion);
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->allocations[0].chunks[0].fingerprint == 0x0123456789abcdefull);
  CHECK_FALSE(back->allocations[0].chunks[1].fingerprint);
  CHECK(back.value() == m);
  m.format_version = kParentFormatVersion;
  check_refused(m, "has a fingerprint, which format version 6 does not have");
  m.format_version = kFingerprintFormatVersion;
  m.allocations[0].chunks[0] = Chunk{.alloc_offset = 0, .raw_size = 1 << 20, .compression = Compression::kDead,
                                     .fingerprint = 1};
  check_refused(m, "dead chunk with a fingerprint");
}

TEST_CASE("parent index: unchanged only where size, CRC-32C and fingerprint all equal the parent's",
          "[parent][fingerprint]") {
  Manifest p;
  p.format_version = kFingerprintFormatVersion;
  p.allocations.push_back(Allocation{phos::agent::Allocation{7, 0, 0x1000, 3 * kChunk, 0}, {}});
  p.allocations[0].chunks = {
      Chunk{.alloc_offset = 0, .file_index = 0, .file_offset = 4096, .raw_size = kChunk, .stored_size = kChunk,
            .crc32c = 0xc0ffee, .compression = Compression::kNone, .fingerprint = 0xf1},
      Chunk{.alloc_offset = kChunk, .raw_size = kChunk, .crc32c = 0, .compression = Compression::kZero,
            .fingerprint = 0xf2},
      Chunk{.alloc_offset = 2 * kChunk, .raw_size = kChunk, .compression = Compression::kDead}};
  auto index = ParentIndex::of(p);
  REQUIRE(index.ok());
  CHECK(index->unchanged(7, 0, {kChunk, 0xc0ffee, 0xf1}));
  // A CRC collision: the same size and CRC-32C, another fingerprint.
  CHECK_FALSE(index->unchanged(7, 0, {kChunk, 0xc0ffee, 0xf3}));
  CHECK_FALSE(index->unchanged(7, 0, {kChunk, 0xc0ffef, 0xf1}));
  CHECK_FALSE(index->unchanged(7, 0, {kChunk - 1, 0xc0ffee, 0xf1}));
  CHECK_FALSE(index->unchanged(8, 0, {kChunk, 0xc0ffee, 0xf1}));
  CHECK_FALSE(index->unchanged(7, kChunk, {kChunk, 0, 0xf2}));          // zero: stored nowhere, costs nothing
  CHECK_FALSE(index->unchanged(7, 2 * kChunk, {kChunk, 0, 0}));         // dead: no bytes
  p.allocations[0].chunks[0].fingerprint.reset();
  auto refused = ParentIndex::of(p);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.error().message, Catch::Contains("chunk at offset 0 of allocation 7 records no 64-bit fingerprint"));
}

TEST_CASE("parent chain: a changed chunk whose CRC-32C and size collide with the parent's is stored, not taken",
          "[image][parent][fingerprint]") {
  TempDir base;
  auto a0 = random_bytes(4 * kChunk, 21);
  write_image(base, "img0", {a0}, "", 10);
  auto a1 = a0;
  for (size_t i = 2 * kChunk; i < 3 * kChunk; i++) a1[i] ^= std::byte(0x5a);  // chunk 2 changes
  const auto changed = std::span(a1).subspan(2 * kChunk, kChunk);
  // The collision, forged: the parent records chunk 2 with the changed
  // bytes' CRC-32C (and size), its fingerprint still the old bytes'.
  rewrite_manifest(base, "img0", [&](Manifest& m) { m.allocations[0].chunks[2].crc32c = phos::crc32c(changed); });
  {
    auto pdir = open_dir(base, "img0");
    auto parent = open_process_image(pdir.get(), 42, true);
    REQUIRE(parent.ok());
    const Chunk& forged = parent->manifest.allocations[0].chunks[2];
    REQUIRE(forged.crc32c == phos::crc32c(changed));
    REQUIRE(forged.raw_size == changed.size());
    REQUIRE(forged.fingerprint != phos::fingerprint::of(changed.data(), changed.size()));
  }
  auto m1 = write_image(base, "img1", {a1}, "../img0", 11);
  REQUIRE(m1.parent);
  CHECK(m1.allocations[0].chunks[0].compression == Compression::kParent);
  CHECK(m1.allocations[0].chunks[2].compression == Compression::kNone);  // by CRC and size alone: taken
  CHECK(m1.allocations[0].chunks[2].fingerprint == phos::fingerprint::of(changed.data(), changed.size()));
  auto dir = open_dir(base, "img1");
  auto img = open_process_image(dir.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(img->chain[0].stored_chunks == 1);
  CHECK(img->chain[0].referenced_chunks == 3);
  CHECK(read_back(*img, dir.get(), 0) == a1);
}

TEST_CASE("parent chain: a parent chunk whose fingerprint is not the one the image references is refused",
          "[image][parent][fingerprint][corrupt]") {
  TempDir base;
  auto a0 = random_bytes(3 * kChunk, 22);
  write_image(base, "img0", {a0}, "", 10);
  auto a1 = a0;
  a1[0] ^= std::byte(1);
  write_image(base, "img1", {a1}, "../img0", 11);
  rewrite_manifest(base, "img1", [](Manifest& m) {
    REQUIRE(m.allocations[0].chunks[1].compression == Compression::kParent);
    *m.allocations[0].chunks[1].fingerprint ^= 1;
  });
  auto dir = open_dir(base, "img1");
  auto r = open_process_image(dir.get(), 42, true);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("parent image ../img0") &&
                                    Catch::Contains("chunk at offset " + std::to_string(kChunk) +
                                                    " is not the one the image references") &&
                                    Catch::Contains("fingerprint"));
}

TEST_CASE("parent chain: images of format version 6, without fingerprints, still restore but are no parent",
          "[image][parent][fingerprint]") {
  TempDir base;
  auto a0 = random_bytes(3 * kChunk + 17, 23);
  auto m0 = write_image(base, "img0", {a0}, "", 10, /*fingerprints=*/false);
  auto a1 = a0;
  a1[kChunk] ^= std::byte(1);
  auto m1 = write_image(base, "img1", {a1}, "../img0", 11, /*fingerprints=*/false);
  CHECK(m1.format_version == kParentFormatVersion);
  auto dir = open_dir(base, "img1");
  auto img = open_process_image(dir.get(), 42, true);
  REQUIRE(img.ok());
  CHECK(img->chain[0].referenced_chunks == 3);
  CHECK(read_back(*img, dir.get(), 0) == a1);
  // As a parent: refused by the index, so a dump against it stores every chunk.
  auto index = ParentIndex::of(img->manifest);
  REQUIRE_FALSE(index.ok());
  CHECK_THAT(index.error().message, Catch::Contains("records no 64-bit fingerprint (format version 6"));
  auto a2 = a1;
  auto m2 = write_image(base, "img2", {a2}, "../img1", 12);
  CHECK_FALSE(m2.parent);
  for (const auto& c : m2.allocations[0].chunks) CHECK(c.compression == Compression::kNone);
}

TEST_CASE("parent chain: merge keeps the fingerprints, and refuses bytes that do not have theirs",
          "[image][parent][merge][fingerprint]") {
  TempDir base;
  auto a0 = random_bytes(3 * kChunk, 24);
  write_image(base, "img0", {a0}, "", 10);
  auto a1 = a0;
  a1[2 * kChunk] ^= std::byte(1);
  auto m1 = write_image(base, "img1", {a1}, "../img0", 11);
  ::mkdir(base.file("out").c_str(), 0700);
  auto dir = open_dir(base, "img1");
  auto out = open_dir(base, "out");
  SECTION("kept") {
    auto merged = merge_chain(dir.get(), 42, out.get());
    REQUIRE(merged.ok());
    CHECK(merged->format_version == kFingerprintFormatVersion);
    for (size_t k = 0; k < 3; k++)
      CHECK(merged->allocations[0].chunks[k].fingerprint == m1.allocations[0].chunks[k].fingerprint);
    // The merged image is a parent again.
    CHECK(write_image(base, "out2", {a1}, "../out", 12).parent);
  }
  SECTION("a stored chunk's recorded fingerprint wrong: verify and merge refuse it, naming its file") {
    rewrite_manifest(base, "img1", [](Manifest& m) { *m.allocations[0].chunks[2].fingerprint ^= 1; });
    auto img = open_process_image(dir.get(), 42, true);
    REQUIRE(img.ok());
    ImageReader reader(dir.get(), img->manifest);
    auto v = reader.verify_all();
    REQUIRE_FALSE(v.ok());
    CHECK_THAT(v.error().message, Catch::Contains(data_file_name(42, 0)) &&
                                      Catch::Contains("do not have the fingerprint the manifest records"));
    auto r = merge_chain(dir.get(), 42, out.get());
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("do not have the fingerprint the manifest records"));
  }
}
