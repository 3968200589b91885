#include <catch2/catch.hpp>
#include <algorithm>
#include <cstring>
#include <span>

#include "fixtures.h"
#include "phos/images/bytes.h"
#include "phos/images/crc32c.h"
#include "phos/images/manifest.h"

using namespace phos::image;
using phos::test::full_manifest;

namespace {

std::string decode_error(std::span<const std::byte> bytes) {
  auto r = decode_manifest(bytes, "m.img");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

std::string validate_error(const Manifest& m) {
  auto r = validate_manifest(m, "m.img");
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

// Re-frames a manifest file with a different version and valid checksums.
std::vector<std::byte> with_version(std::vector<std::byte> file, uint32_t version) {
  phos::bytes::put_u32(&file[8], version);
  phos::bytes::put_u32(&file[28], phos::crc32c(0, file.data(), 28));
  return file;
}

}  // namespace

TEST_CASE("manifest: round trip keeps every field", "[manifest]") {
  Manifest m = full_manifest();
  auto bytes = encode_manifest(m);
  auto back = decode_manifest(bytes, "m.img");
  REQUIRE(back.ok());
  CHECK(back.value() == m);
}

TEST_CASE("manifest: empty process image round trips", "[manifest]") {
  Manifest m;
  m.writer_version = "0.1.0";
  m.pid = 1;
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->allocations.empty());
  CHECK(back->pid == 1);
}

TEST_CASE("manifest file: truncated header", "[manifest][corrupt]") {
  auto bytes = encode_manifest(full_manifest());
  bytes.resize(10);
  CHECK_THAT(decode_error(bytes), Catch::Contains("m.img: manifest: truncated") && Catch::Contains("header"));
}

TEST_CASE("manifest file: truncated payload", "[manifest][corrupt]") {
  auto bytes = encode_manifest(full_manifest());
  bytes.pop_back();
  CHECK_THAT(decode_error(bytes), Catch::Contains("truncated: header says"));
}

TEST_CASE("manifest file: bytes after the payload", "[manifest][corrupt]") {
  auto bytes = encode_manifest(full_manifest());
  bytes.push_back(std::byte{0});
  CHECK_THAT(decode_error(bytes), Catch::Contains("size mismatch"));
}

TEST_CASE("manifest file: bad magic", "[manifest][corrupt]") {
  auto bytes = encode_manifest(full_manifest());
  bytes[0] = std::byte{'X'};
  CHECK_THAT(decode_error(bytes), Catch::Contains("bad magic"));
}

TEST_CASE("manifest file: corrupted header", "[manifest][corrupt]") {
  auto bytes = encode_manifest(full_manifest());
  bytes[17] ^= std::byte{1};
  CHECK_THAT(decode_error(bytes), Catch::Contains("header checksum mismatch"));
}

TEST_CASE("manifest file: corrupted payload", "[manifest][corrupt]") {
  auto bytes = encode_manifest(full_manifest());
  bytes[bytes.size() / 2] ^= std::byte{0x40};
  CHECK_THAT(decode_error(bytes), Catch::Contains("payload checksum mismatch"));
}

TEST_CASE("manifest file: newer format version is refused", "[manifest][version]") {
  auto bytes = with_version(encode_manifest(full_manifest()), kManifestFormatVersion + 1);
  CHECK_THAT(decode_error(bytes),
             Catch::Contains("format version " + std::to_string(kManifestFormatVersion + 1) + " is not supported") &&
                 Catch::Contains("newer phos"));
}

TEST_CASE("manifest file: version 0 is refused", "[manifest][version]") {
  auto bytes = with_version(encode_manifest(full_manifest()), 0);
  CHECK_THAT(decode_error(bytes), Catch::Contains("format version 0 is not supported"));
}

TEST_CASE("manifest: payload that is not protobuf", "[manifest][corrupt]") {
  Manifest m = full_manifest();
  auto good = encode_manifest(m);
  std::vector<std::byte> junk(64, std::byte{0xff});
  // Frame garbage with valid checksums: only the protobuf parser can object.
  std::vector<std::byte> file(32 + junk.size());
  std::copy_n(good.begin(), 32, file.begin());
  std::copy(junk.begin(), junk.end(), file.begin() + 32);
  phos::bytes::put_u64(&file[16], junk.size());
  phos::bytes::put_u32(&file[24], phos::crc32c(junk));
  phos::bytes::put_u32(&file[28], phos::crc32c(0, file.data(), 28));
  CHECK_THAT(decode_error(file), Catch::Contains("does not parse"));
}

TEST_CASE("manifest validation: accepts the full manifest", "[manifest][validate]") {
  CHECK(validate_manifest(full_manifest(), "m.img").ok());
}

TEST_CASE("manifest validation: chunks leave a gap", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[1].alloc_offset += 1;
  CHECK_THAT(validate_error(m), Catch::Contains("allocation 7 chunk 1 starts at"));
}

TEST_CASE("manifest validation: chunks hold less than the allocation", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].size += 1;
  CHECK_THAT(validate_error(m), Catch::Contains("chunks hold") && Catch::Contains("of its"));
}

TEST_CASE("manifest validation: chunks hold more than the allocation", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].size -= 1;
  CHECK_THAT(validate_error(m), Catch::Contains("more than its"));
}

TEST_CASE("manifest validation: allocation with no chunks", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks.clear();
  CHECK_THAT(validate_error(m), Catch::Contains("chunks hold 0 of its"));
}

TEST_CASE("manifest validation: chunk larger than the chunk size", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.chunk_size = 4096;
  CHECK_THAT(validate_error(m), Catch::Contains("chunk size is 4096"));
}

TEST_CASE("manifest validation: uncompressed chunk with a different stored size", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[0].stored_size -= 1;
  CHECK_THAT(validate_error(m), Catch::Contains("is uncompressed but stores"));
}

TEST_CASE("manifest validation: chunk outside its data file", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.data_files[0].size = 8192;
  CHECK_THAT(validate_error(m), Catch::Contains("lies outside phos-42-data-0.img"));
}

TEST_CASE("manifest validation: chunk offset that wraps around", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[2].file_offset = ~0ull - 10;
  CHECK_THAT(validate_error(m), Catch::Contains("lies outside"));
}

TEST_CASE("manifest validation: chunk in a data file not listed", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[0].file_index = 3;
  CHECK_THAT(validate_error(m), Catch::Contains("refers to data file 3, not listed"));
}

TEST_CASE("manifest validation: allocation on an unknown device", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].device = 5;
  CHECK_THAT(validate_error(m), Catch::Contains("is on device 5, not listed"));
}

TEST_CASE("manifest validation: overlapping allocations", "[manifest][validate]") {
  Manifest m = full_manifest();
  Allocation b = m.allocations[0];
  b.id = 8;
  b.address += 4096;
  m.allocations.push_back(b);
  CHECK_THAT(validate_error(m), Catch::Contains("allocation 8 overlaps"));
}

TEST_CASE("manifest validation: allocation id used twice", "[manifest][validate]") {
  Manifest m = full_manifest();
  Allocation b = m.allocations[0];
  b.address += 1ull << 30;
  m.allocations.push_back(b);
  CHECK_THAT(validate_error(m), Catch::Contains("allocation 7 listed twice"));
}

TEST_CASE("manifest validation: data file name with a path", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.data_files[0].name = "../../etc/phos-x.img";
  CHECK_THAT(validate_error(m), Catch::Contains("is not a phos-*.img name"));
}

TEST_CASE("manifest validation: unknown compression", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.allocations[0].chunks[1].compression = static_cast<Compression>(9);
  CHECK_THAT(validate_error(m), Catch::Contains("unknown compression"));
}

TEST_CASE("manifest validation: invalid pid and protocol", "[manifest][validate]") {
  Manifest m = full_manifest();
  m.pid = 0;
  CHECK_THAT(validate_error(m), Catch::Contains("invalid pid 0"));
  m = full_manifest();
  m.protocol = static_cast<phos::CopyProtocol>(17);
  CHECK_THAT(validate_error(m), Catch::Contains("unknown protocol 17"));
}

TEST_CASE("completion marker: round trip and mismatch", "[manifest][marker]") {
  auto manifest_file = encode_manifest(full_manifest());
  CompletionMarker mk = marker_for(manifest_file, 99);
  auto back = decode_marker(encode_marker(mk), "c.img");
  REQUIRE(back.ok());
  CHECK(back.value() == mk);
  manifest_file[40] ^= std::byte{1};
  CHECK_FALSE(marker_for(manifest_file, 99) == mk);
}

TEST_CASE("completion marker: corrupted", "[manifest][marker][corrupt]") {
  auto bytes = encode_marker(marker_for(encode_manifest(full_manifest()), 1));
  bytes.back() ^= std::byte{1};
  auto r = decode_marker(bytes, "c.img");
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("c.img: completion marker: payload checksum mismatch"));
}

TEST_CASE("file names: manifest names parse back to pids", "[manifest][names]") {
  CHECK(pid_of_manifest_file(manifest_file_name(1234)) == 1234);
  CHECK_FALSE(pid_of_manifest_file("phos-12x-manifest.img").has_value());
  CHECK_FALSE(pid_of_manifest_file("phos--manifest.img").has_value());
  CHECK_FALSE(pid_of_manifest_file("phos-0-manifest.img").has_value());
  CHECK_FALSE(pid_of_manifest_file("core-1.img").has_value());
}

// --- copy-on-write: the window's trust and its statistics ---

namespace {

using phos::agent::CopyTrust;

Manifest cow_manifest() {
  Manifest m = full_manifest();
  m.protocol = phos::CopyProtocol::kSoftCopyOnWrite;
  m.copy_trust = CopyTrust::kValidated;
  Statistics& s = m.statistics;
  s.stall_ns = 11;
  s.cow_pool_bytes = 2ull << 30;
  s.cow_saved_bytes = 12ull << 20;
  s.copy_window = {.calls_checked = 13, .calls_waited = 14, .unknown_waits = 15, .wait_ns = 16};
  s.cow_window_ns = 17;
  return m;
}

}  // namespace

TEST_CASE("manifest: a copy-on-write manifest round trips with its trust and every statistic",
          "[manifest][cow]") {
  Manifest m = cow_manifest();
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->protocol == phos::CopyProtocol::kSoftCopyOnWrite);
  CHECK(back->copy_trust == CopyTrust::kValidated);
  const Statistics& s = back->statistics;
  CHECK(s.stall_ns == 11);
  CHECK(s.cow_pool_bytes == 2ull << 30);
  CHECK(s.cow_saved_bytes == 12ull << 20);
  CHECK(s.copy_window.calls_checked == 13);
  CHECK(s.copy_window.calls_waited == 14);
  CHECK(s.copy_window.unknown_waits == 15);
  CHECK(s.copy_window.wait_ns == 16);
  CHECK(s.cow_window_ns == 17);
  CHECK(back.value() == m);
}

TEST_CASE("manifest: a soft-recopy manifest round trips with its passes' figures", "[manifest][recopy]") {
  Manifest m = full_manifest();
  m.protocol = phos::CopyProtocol::kSoftRecopy;
  m.copy_trust = CopyTrust::kSpeculated;
  m.statistics.recopy_first_pass_bytes = 64ull << 30;
  m.statistics.recopy_first_pass_ns = 21;
  m.statistics.recopied_bytes = 3ull << 20;
  m.statistics.final_pass_ns = 23;
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->protocol == phos::CopyProtocol::kSoftRecopy);
  CHECK(back->copy_trust == CopyTrust::kSpeculated);
  CHECK(back->statistics.recopy_first_pass_bytes == 64ull << 30);
  CHECK(back->statistics.recopied_bytes == 3ull << 20);
  CHECK(back.value() == m);
}

TEST_CASE("manifest: every copy trust round trips", "[manifest][cow]") {
  for (CopyTrust t : {CopyTrust::kExact, CopyTrust::kSpeculated, CopyTrust::kValidated}) {
    INFO(copy_trust_name(t));
    Manifest m = cow_manifest();
    m.copy_trust = t;
    auto back = decode_manifest(encode_manifest(m), "m.img");
    REQUIRE(back.ok());
    CHECK(back->copy_trust == t);
  }
}

TEST_CASE("manifest: copy-on-write statistics round trip one at a time", "[manifest][cow]") {
  // Each field on its own: a field encoded into another's number shows.
  uint64_t Statistics::*fields[] = {
      &Statistics::stall_ns,       &Statistics::cow_pool_bytes,          &Statistics::cow_saved_bytes,
      &Statistics::cow_window_ns,  &Statistics::recopy_first_pass_bytes, &Statistics::recopy_first_pass_ns,
      &Statistics::recopied_bytes, &Statistics::final_pass_ns,           &Statistics::zero_chunks,
      &Statistics::zero_bytes,     &Statistics::program_transfers,       &Statistics::program_transfer_bytes,
      &Statistics::traffic_pauses, &Statistics::traffic_paused_ns,       &Statistics::recopy_wasted_bytes,
      &Statistics::ipc_stopped_bytes};
  for (size_t i = 0; i < std::size(fields); i++) {
    INFO("field " << i);
    Manifest m = full_manifest();
    m.statistics.*fields[i] = 1000 + i;
    auto back = decode_manifest(encode_manifest(m), "m.img");
    REQUIRE(back.ok());
    CHECK(back->statistics == m.statistics);
  }
  // The copy window's counters, as the close reply carries them.
  uint64_t phos::agent::CopyWindowCounters::*counters[] = {
      &phos::agent::CopyWindowCounters::calls_checked, &phos::agent::CopyWindowCounters::calls_waited,
      &phos::agent::CopyWindowCounters::unknown_waits, &phos::agent::CopyWindowCounters::wait_ns};
  for (size_t i = 0; i < std::size(counters); i++) {
    INFO("counter " << i);
    Manifest m = full_manifest();
    m.statistics.copy_window.*counters[i] = 2000 + i;
    auto back = decode_manifest(encode_manifest(m), "m.img");
    REQUIRE(back.ok());
    CHECK(back->statistics == m.statistics);
  }
}

TEST_CASE("manifest: a manifest without a window decodes with trust none and no copy-on-write figures",
          "[manifest][cow]") {
  Manifest m = full_manifest();
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(uint32_t(back->copy_trust) == 0);
  CHECK(copy_trust_name(back->copy_trust) == "none");
  const Statistics& s = back->statistics;
  CHECK(s.stall_ns == 0);
  CHECK(s.cow_pool_bytes == 0);
  CHECK(s.cow_saved_bytes == 0);
  CHECK(s.copy_window == phos::agent::CopyWindowCounters{});
  CHECK(s.cow_window_ns == 0);
  CHECK(s.recopy_first_pass_bytes == 0);
  CHECK(s.recopied_bytes == 0);
  CHECK(s.quiesce_ns == 1);  // the others are kept
}

TEST_CASE("manifest: without a window the trust and the figures are left off the wire", "[manifest][cow]") {
  // An image without a window reads the same to a phos from before
  // copy-on-write: one small field each adds its tag and a one-byte value.
  const size_t plain = encode_manifest(full_manifest()).size();
  Manifest trusted = full_manifest();
  trusted.copy_trust = CopyTrust::kExact;
  CHECK(encode_manifest(trusted).size() == plain + 2);
  Manifest stalled = full_manifest();
  stalled.statistics.stall_ns = 1;
  CHECK(encode_manifest(stalled).size() == plain + 2);
}

TEST_CASE("manifest: copy trust names", "[manifest][cow]") {
  CHECK(copy_trust_name(CopyTrust(0)) == "none");
  CHECK(copy_trust_name(CopyTrust::kExact) == "exact");
  CHECK(copy_trust_name(CopyTrust::kSpeculated) == "speculated");
  CHECK(copy_trust_name(CopyTrust::kValidated) == "validated");
  CHECK(copy_trust_name(CopyTrust::kChecksum) == "checksum");
  CHECK(copy_trust_name(CopyTrust(5)) == "unknown");
}

TEST_CASE("manifest validation: accepts a copy-on-write manifest", "[manifest][validate][cow]") {
  CHECK(validate_manifest(cow_manifest(), "m.img").ok());
}

TEST_CASE("manifest validation: unknown copy trust", "[manifest][validate][cow]") {
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust(9);
  CHECK_THAT(validate_error(m), Catch::Contains("m.img: manifest: unknown copy trust 9"));
}

TEST_CASE("manifest validation: copy trust just past checksum", "[manifest][validate][cow]") {
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust(5);
  CHECK_THAT(validate_error(m), Catch::Contains("unknown copy trust 5"));
}

TEST_CASE("manifest: a checksum dump records speculated trust and its validation, with its figures",
          "[manifest][checksum]") {
  // What a dump with cow_trust=checksum writes: trust 2, which every phos
  // with copy-on-write reads, and the validation beside it.
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust::kSpeculated;
  m.validation = Validation::kChecksum;
  m.statistics.sum_pass_ns = 21'400'000;
  m.statistics.sum_checked_chunks = 20480;
  m.statistics.sum_missed_chunks = 3;
  m.statistics.sum_unchanged_dirty_chunks = 7;
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->validation == Validation::kChecksum);
  CHECK(back->copy_trust == CopyTrust::kSpeculated);
  CHECK(back->statistics.sum_checked_chunks == 20480);
  CHECK(back->statistics.sum_missed_chunks == 3);
  CHECK(back.value() == m);
  CHECK(format_version_for(m) == format_version_for(cow_manifest()));  // no new format version
  CHECK(validation_name(Validation::kNone) == "none");
  CHECK(validation_name(Validation::kChecksum) == "checksum");
  CHECK(validation_name(Validation(2)) == "unknown");
}

TEST_CASE("manifest: without validation the field is left off the wire", "[manifest][checksum]") {
  const size_t plain = encode_manifest(cow_manifest()).size();
  Manifest checked = cow_manifest();
  checked.validation = Validation::kChecksum;
  CHECK(encode_manifest(checked).size() > plain);
  Manifest none = cow_manifest();
  none.validation = Validation::kNone;
  CHECK(encode_manifest(none).size() == plain);
}

TEST_CASE("manifest validation: an unknown validation is refused", "[manifest][validate][checksum]") {
  Manifest m = cow_manifest();
  m.validation = Validation(7);
  CHECK_THAT(validate_error(m), Catch::Contains("unknown validation 7"));
}

TEST_CASE("manifest: a file with an unknown copy trust is refused when decoded", "[manifest][cow][corrupt]") {
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust(9);
  CHECK_THAT(decode_error(encode_manifest(m)), Catch::Contains("unknown copy trust 9"));
}

// --- sparse images: zero chunks ---

namespace {

// full_manifest() with a fourth chunk of 1 MiB that is zero: its allocation
// grows by it, nothing more is stored.
Manifest sparse_manifest() {
  Manifest m = full_manifest();
  Allocation& a = m.allocations[0];
  const uint64_t at = a.size;
  a.size += 1 << 20;
  a.chunks.push_back({at, 0, 0, 1 << 20, 0, 0xdeadbeef, Compression::kZero});
  m.format_version = kZeroChunkFormatVersion;
  m.statistics.zero_chunks = 1;
  m.statistics.zero_bytes = 1 << 20;
  return m;
}

// A manifest file written by phos 0.1.0 before sparse images (format
// version 1): one device, an allocation of 1 MiB + 100 bytes in an
// uncompressed and a zstd chunk, raw and stored bytes in its statistics.
constexpr unsigned char kVersion1Manifest[] = {
    0x50, 0x48, 0x4f, 0x53, 0x4d, 0x41, 0x4e, 0x46, 0x01, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00,
    0xb9, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x7b, 0x94, 0xbc, 0x46, 0x3c, 0x5c, 0xbe, 0xcf,
    0x08, 0x01, 0x12, 0x05, 0x30, 0x2e, 0x31, 0x2e, 0x30, 0x18, 0x2a, 0x20, 0x01, 0x28, 0x80, 0x80,
    0x40, 0x30, 0xe8, 0x07, 0x3a, 0x2c, 0x08, 0x00, 0x12, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1a, 0x0b, 0x4e, 0x56, 0x49, 0x44,
    0x49, 0x41, 0x20, 0x48, 0x32, 0x30, 0x30, 0x20, 0x80, 0x80, 0x80, 0x80, 0xd8, 0x04, 0x28, 0x09,
    0x30, 0x00, 0x42, 0x3d, 0x08, 0x07, 0x10, 0x00, 0x18, 0x80, 0x80, 0x80, 0x80, 0x80, 0xe0, 0x1f,
    0x20, 0xe4, 0x80, 0x40, 0x28, 0x00, 0x32, 0x14, 0x08, 0x00, 0x10, 0x00, 0x18, 0x80, 0x20, 0x20,
    0x80, 0x80, 0x40, 0x28, 0x80, 0x80, 0x40, 0x30, 0x91, 0x22, 0x38, 0x00, 0x32, 0x13, 0x08, 0x80,
    0x80, 0x40, 0x10, 0x00, 0x18, 0x80, 0xa0, 0x40, 0x20, 0x64, 0x28, 0x3c, 0x30, 0xa2, 0x44, 0x38,
    0x01, 0x4a, 0x18, 0x0a, 0x12, 0x70, 0x68, 0x6f, 0x73, 0x2d, 0x34, 0x32, 0x2d, 0x64, 0x61, 0x74,
    0x61, 0x2d, 0x30, 0x2e, 0x69, 0x6d, 0x67, 0x10, 0x80, 0xc0, 0x40, 0x52, 0x1a, 0x08, 0x00, 0x10,
    0x00, 0x18, 0x00, 0x20, 0xe4, 0x80, 0x40, 0x28, 0x80, 0xc0, 0x40, 0x30, 0x00, 0x38, 0x00, 0x40,
    0x00, 0x48, 0x00, 0x50, 0x00, 0x58, 0x00, 0x5a, 0x00,
};

std::span<const std::byte> version1_manifest() { return std::as_bytes(std::span(kVersion1Manifest)); }

}  // namespace

TEST_CASE("manifest: a zero chunk round trips with its CRC and the zero statistics", "[manifest][sparse]") {
  Manifest m = sparse_manifest();
  REQUIRE(validate_manifest(m, "m.img").ok());
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  const Chunk& zero = back->allocations[0].chunks.back();
  CHECK(zero.compression == Compression::kZero);
  CHECK(zero.stored_size == 0);
  CHECK(zero.crc32c == 0xdeadbeef);
  CHECK(back->format_version == 2);
  CHECK(back->statistics.zero_chunks == 1);
  CHECK(back->statistics.zero_bytes == 1 << 20);
  CHECK(back.value() == m);
  CHECK(chunk_compression_name(Compression::kZero) == "zero");
}

TEST_CASE("manifest: an image of format version 1, from before zero chunks, still reads", "[manifest][sparse]") {
  auto m = decode_manifest(version1_manifest(), "old.img");
  REQUIRE(m.ok());
  CHECK(m->format_version == 1);
  CHECK(m->writer_version == "0.1.0");
  CHECK(m->pid == 42);
  REQUIRE(m->allocations.size() == 1);
  REQUIRE(m->allocations[0].chunks.size() == 2);
  CHECK(m->allocations[0].chunks[0].compression == Compression::kNone);
  CHECK(m->allocations[0].chunks[1].compression == Compression::kZstd);
  CHECK(m->allocations[0].chunks[1].stored_size == 60);
  CHECK(m->statistics.raw_bytes == (1 << 20) + 100);
  CHECK(m->statistics.zero_chunks == 0);
  CHECK(m->statistics.zero_bytes == 0);
  // What this phos writes of it is what phos 0.1.0 wrote, byte for byte.
  auto again = encode_manifest(*m);
  CHECK(std::equal(again.begin(), again.end(), version1_manifest().begin(), version1_manifest().end()));
}

TEST_CASE("manifest: the format version a dump writes is the oldest that holds it", "[manifest][sparse]") {
  CHECK(format_version_for(full_manifest()) == 1);
  CHECK(format_version_for(Manifest{}) == 1);
  CHECK(format_version_for(sparse_manifest()) == kZeroChunkFormatVersion);
  CHECK(kZeroChunkFormatVersion <= kManifestFormatVersion);
}

TEST_CASE("manifest: without zero chunks the zero statistics are left off the wire", "[manifest][sparse]") {
  // So a version 1 image this phos writes is the one phos 0.1.0 wrote.
  const size_t plain = encode_manifest(full_manifest()).size();
  Manifest counted = full_manifest();
  counted.statistics.zero_chunks = 1;
  CHECK(encode_manifest(counted).size() == plain + 3);  // a two-byte tag (field 24), a one-byte value
}

TEST_CASE("manifest file: a reader of version 1 refuses a sparse image by its version", "[manifest][sparse][version]") {
  // A phos of before sparse images reads versions 1..1: the frame's version
  // stops it before it could misread a zero chunk.
  auto bytes = encode_manifest(sparse_manifest());
  CHECK(phos::bytes::get_u32(&bytes[8]) == kZeroChunkFormatVersion);
  CHECK(kZeroChunkFormatVersion > 1);
}

TEST_CASE("manifest validation: a zero chunk in a version 1 manifest", "[manifest][validate][sparse]") {
  Manifest m = sparse_manifest();
  m.format_version = 1;
  CHECK_THAT(validate_error(m), Catch::Contains("allocation 7 chunk 3 is a zero chunk, which format version 1"));
}

TEST_CASE("manifest validation: a zero chunk that names stored bytes", "[manifest][validate][sparse]") {
  for (auto spoil : {+[](Chunk& c) { c.stored_size = 100; }, +[](Chunk& c) { c.file_offset = 4096; },
                     +[](Chunk& c) { c.file_index = 1; }}) {
    Manifest m = sparse_manifest();
    spoil(m.allocations[0].chunks.back());
    CHECK_THAT(validate_error(m), Catch::Contains("allocation 7 chunk 3 is a zero chunk but names"));
  }
}

TEST_CASE("manifest validation: a zero chunk still covers its bytes exactly", "[manifest][validate][sparse]") {
  Manifest m = sparse_manifest();
  m.allocations[0].size -= 1;
  CHECK_THAT(validate_error(m), Catch::Contains("more than its"));
  m = sparse_manifest();
  m.allocations[0].chunks.back().raw_size = m.chunk_size + 1;
  CHECK_THAT(validate_error(m), Catch::Contains("chunk size is"));
}

TEST_CASE("manifest: a zero chunk needs no data file", "[manifest][validate][sparse]") {
  // Every chunk zero: the workers' data files hold their headers only, or
  // a manifest may list none.
  Manifest m = sparse_manifest();
  Allocation& a = m.allocations[0];
  a.chunks.erase(a.chunks.begin(), a.chunks.end() - 1);
  a.chunks[0].alloc_offset = 0;
  a.size = a.chunks[0].raw_size;
  m.data_files.clear();
  CHECK(validate_manifest(m, "m.img").ok());
}

TEST_CASE("completion marker: keeps format version 1", "[manifest][marker][sparse]") {
  // A phos of before sparse images reads the marker of an image it can read.
  auto manifest_file = encode_manifest(full_manifest());
  CompletionMarker mk = marker_for(manifest_file, 5);
  CHECK(mk.format_version == 1);
  auto file = encode_marker(mk);
  CHECK(phos::bytes::get_u32(&file[8]) == 1);
  CHECK(decode_marker(file, "c.img").ok());
}

TEST_CASE("manifest: the recorded fill order round trips, in order, duplicates and all", "[manifest][lazy]") {
  Manifest m = full_manifest();
  m.fill_order = {9, 2, 14, 2};
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->fill_order == std::vector<uint64_t>{9, 2, 14, 2});
  CHECK(back.value() == m);
  m.fill_order.clear();
  auto none = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(none.ok());
  CHECK(none->fill_order.empty());
}

namespace {

// A migration's manifest: its allocations' data kept by phos-keeper.
Manifest kept_manifest() {
  Manifest m = full_manifest();
  for (auto& a : m.allocations) a.chunks.clear();
  m.data_files.clear();
  std::array<uint8_t, 16> uuid{};
  uuid[0] = 0xbb;
  m.kept = KeptMemory{.migration = "0123456789abcdef",
                      .device = {.uuid = uuid, .name = "NVIDIA H200"},
                      .in_place = false,
                      .kept_bytes = 6u << 20,
                      .targets = {}};
  m.statistics.gate_closed_unix_ns = 1700000000123456789ull;
  m.format_version = format_version_for(m);
  return m;
}

}  // namespace

TEST_CASE("manifest: a migration's manifest round trips with its kept memory", "[manifest][migrate]") {
  Manifest m = kept_manifest();
  CHECK(m.format_version == kKeptMemoryFormatVersion);
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(*back == m);
  REQUIRE(back->kept);
  CHECK(back->kept->migration == "0123456789abcdef");
  CHECK(back->statistics.gate_closed_unix_ns == 1700000000123456789ull);
}

TEST_CASE("manifest: the format version of a migration is the kept-memory one", "[manifest][migrate]") {
  CHECK(format_version_for(kept_manifest()) == kKeptMemoryFormatVersion);
  CHECK(kKeptMemoryFormatVersion <= kManifestFormatVersion);
  CHECK(format_version_for(full_manifest()) < kKeptMemoryFormatVersion);
}

TEST_CASE("manifest validation: kept memory in a manifest of an older version", "[manifest][validate][migrate]") {
  Manifest m = kept_manifest();
  m.format_version = kZeroChunkFormatVersion;
  CHECK_THAT(validate_error(m), Catch::Contains("names GPU data kept in device memory, which format version 2"));
}

TEST_CASE("manifest validation: kept memory with chunks", "[manifest][validate][migrate]") {
  Manifest m = kept_manifest();
  m.allocations[0].chunks = full_manifest().allocations[0].chunks;
  m.data_files = full_manifest().data_files;
  CHECK_THAT(validate_error(m), Catch::Contains("kept memory: the image also lists data files"));
  m.data_files.clear();
  CHECK_THAT(validate_error(m), Catch::Contains("has chunks, but its data is kept in device memory"));
}

TEST_CASE("manifest validation: a migration name that is not 16 hex digits", "[manifest][validate][migrate]") {
  for (const char* bad : {"", "0123456789ABCDEF", "0123456789abcde", "../../etc/passwd", "0123456789abcdef0"}) {
    INFO(bad);
    Manifest m = kept_manifest();
    m.kept->migration = bad;
    CHECK_THAT(validate_error(m), Catch::Contains("kept memory: invalid migration name"));
  }
}

namespace {

// A migration of a process on several GPUs: each image device's memory on
// its own target (format 7).
Manifest kept_targets_manifest() {
  Manifest m = kept_manifest();
  std::array<uint8_t, 16> a{}, b{};
  a[0] = 0xaa;
  b[0] = 0xbb;
  for (const auto& d : m.devices) m.kept->targets[d.ordinal] = phos::GpuDevice{.uuid = d.ordinal % 2 ? a : b, .name = "NVIDIA H200"};
  m.kept->device = m.kept->targets.begin()->second;
  m.format_version = format_version_for(m);
  return m;
}

}  // namespace

TEST_CASE("manifest: a migration over several GPUs round trips with a target per device, at format 8",
          "[manifest][migrate]") {
  Manifest m = kept_targets_manifest();
  REQUIRE(m.devices.size() >= 1);
  CHECK(m.format_version == kKeptTargetsFormatVersion);
  CHECK(kKeptTargetsFormatVersion == kManifestFormatVersion);
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(*back == m);
  CHECK(back->kept->targets.size() == m.devices.size());
  for (const auto& d : m.devices) CHECK(back->kept->target_of(d.ordinal) == m.kept->targets.at(d.ordinal));
  // One GPU: no targets, format 3 as before; every device's memory on `device`.
  Manifest one = kept_manifest();
  CHECK(one.format_version == kKeptMemoryFormatVersion);
  CHECK(one.kept->target_of(0) == one.kept->device);
}

TEST_CASE("manifest validation: kept targets that do not fit the devices", "[manifest][validate][migrate]") {
  Manifest old = kept_targets_manifest();
  old.format_version = kKeptMemoryFormatVersion;
  CHECK_THAT(validate_error(old), Catch::Contains("keeps memory on several GPUs, which format version 3"));
  Manifest missing = kept_targets_manifest();
  missing.kept->targets.erase(missing.devices[0].ordinal);
  if (!missing.kept->targets.empty())
    CHECK_THAT(validate_error(missing), Catch::Contains("kept memory: device " + std::to_string(missing.devices[0].ordinal) +
                                                        " has no target GPU"));
  Manifest extra = kept_targets_manifest();
  extra.kept->targets[77] = extra.kept->device;
  CHECK_THAT(validate_error(extra), Catch::Contains("a target for device 77, which the image does not have"));
}

TEST_CASE("manifest: migration names are 16 lower-case hex digits", "[manifest][migrate]") {
  CHECK(is_migration_id("0123456789abcdef"));
  CHECK_FALSE(is_migration_id("0123456789abcdeg"));
  CHECK_FALSE(is_migration_id("0123456789abcde"));
  CHECK_FALSE(is_migration_id("phos-kept.01234567"));
}

// --- gpu.proto: the Device and Allocation the agent, the keeper and the image share ---

namespace {

// A manifest file around `payload`, framed as encode_manifest frames one.
std::vector<std::byte> manifest_file(const phos::test::PbWriter& payload) {
  const auto& p = payload.payload();
  std::vector<std::byte> file(32 + p.size());
  std::memcpy(file.data(), kManifestMagic, 8);
  phos::bytes::put_u32(&file[8], 1);
  phos::bytes::put_u32(&file[12], 32);
  phos::bytes::put_u64(&file[16], p.size());
  phos::bytes::put_u32(&file[24], phos::crc32c(p));
  phos::bytes::put_u32(&file[28], phos::crc32c(0, file.data(), 28));
  std::copy(p.begin(), p.end(), file.begin() + 32);
  return file;
}

// A version 1 manifest of pid 42 with `device` and nothing else, copied
// with manifest.proto's Protocol `protocol`.
phos::test::PbWriter manifest_with_device(const phos::test::PbWriter& device, uint32_t protocol = 1) {
  return phos::test::PbWriter()
      .varint(1, 1)
      .text(2, "test")
      .varint(3, 42)
      .varint(4, protocol)
      .varint(5, 1 << 20)
      .varint(6, 1)
      .message(7, device);
}

phos::test::PbWriter device_with_uuid(size_t uuid_bytes) {
  std::vector<std::byte> uuid(uuid_bytes, std::byte{0xab});
  return phos::test::PbWriter().varint(1, 0).bytes(2, uuid);
}

}  // namespace

TEST_CASE("manifest: a device that a phos of before could read is read", "[manifest][gpu]") {
  auto m = decode_manifest(
      manifest_file(manifest_with_device(device_with_uuid(16).text(3, "NVIDIA H200").varint(4, 7))), "m.img");
  REQUIRE(m.ok());
  REQUIRE(m->devices.size() == 1);
  CHECK(m->devices[0].name == "NVIDIA H200");
  CHECK(m->devices[0].total_memory == 7);
  CHECK(m->devices[0].compute_major == 0);  // optional then as now
  CHECK(m->devices[0].uuid[15] == 0xab);
}

TEST_CASE("manifest: a device without its name or memory size is refused, as when the schema required them",
          "[manifest][gpu][corrupt]") {
  CHECK_THAT(decode_error(manifest_file(manifest_with_device(device_with_uuid(16).varint(4, 7)))),
             Catch::Equals("m.img: manifest: device 0 has no name or no memory size"));
  CHECK_THAT(decode_error(manifest_file(manifest_with_device(device_with_uuid(16).text(3, "NVIDIA H200")))),
             Catch::Equals("m.img: manifest: device 0 has no name or no memory size"));
}

TEST_CASE("manifest: a device whose UUID is not 16 bytes is refused", "[manifest][gpu][corrupt]") {
  CHECK_THAT(decode_error(manifest_file(manifest_with_device(device_with_uuid(3).text(3, "x").varint(4, 7)))),
             Catch::Equals("m.img: manifest: device 0 has a UUID of 3 bytes, not 16"));
}

// --- CopyProtocol: one numbering for the manifest, the copy table and the dump ---

TEST_CASE("manifest: a dump's protocols have manifest.proto's numbers", "[manifest][protocol]") {
  const std::pair<uint32_t, phos::CopyProtocol> wire[] = {{1, phos::CopyProtocol::kStopTheWorld},
                                                          {2, phos::CopyProtocol::kSoftRecopy},
                                                          {3, phos::CopyProtocol::kSoftCopyOnWrite}};
  for (auto [number, protocol] : wire) {
    auto device = device_with_uuid(16).text(3, "NVIDIA H200").varint(4, 7);
    auto m = decode_manifest(manifest_file(manifest_with_device(device, number)), "m.img");
    REQUIRE(m.ok());
    CHECK(m->protocol == protocol);
    CHECK(phos::is_dump_protocol(protocol));
  }
  CHECK(phos::copy_protocol_name(phos::CopyProtocol::kSoftCopyOnWrite) == "soft-copy-on-write");
}

TEST_CASE("manifest validation: an on-demand fill is no dump's protocol", "[manifest][validate][protocol]") {
  Manifest m = full_manifest();
  m.protocol = phos::CopyProtocol::kOnDemandFill;
  CHECK_FALSE(phos::is_dump_protocol(m.protocol));
  CHECK_THAT(validate_error(m), Catch::Contains("m.img: manifest: protocol 4 (on-demand-fill) is no dump's"));
}

// --- dead chunks: free memory of the program's allocator, not stored ---

namespace {

// full_manifest() with a fourth chunk of 1 MiB that is dead.
Manifest dead_manifest() {
  Manifest m = full_manifest();
  Allocation& a = m.allocations[0];
  const uint64_t at = a.size;
  a.size += 1 << 20;
  a.chunks.push_back({.alloc_offset = at, .raw_size = 1 << 20, .compression = Compression::kDead});
  m.format_version = kDeadChunkFormatVersion;
  return m;
}

}  // namespace

TEST_CASE("manifest: a dead chunk round trips and needs format version 4", "[manifest][dead]") {
  Manifest m = dead_manifest();
  REQUIRE(validate_manifest(m, "m.img").ok());
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->allocations[0].chunks.back().compression == Compression::kDead);
  CHECK(back.value() == m);
  CHECK(chunk_compression_name(Compression::kDead) == "dead");
  CHECK(format_version_for(m) == kDeadChunkFormatVersion);
  // With zero chunks too, the dead chunk's version (the newer) is the one.
  Manifest both = m;
  both.allocations[0].chunks[0].compression = Compression::kZero;
  CHECK(format_version_for(both) == kDeadChunkFormatVersion);
  CHECK(kDeadChunkFormatVersion <= kManifestFormatVersion);
}

TEST_CASE("manifest validation: a dead chunk in an older format, or one that names stored bytes",
          "[manifest][validate][dead]") {
  Manifest m = dead_manifest();
  m.format_version = kKeptMemoryFormatVersion;
  CHECK_THAT(validate_error(m), Catch::Contains("allocation 7 chunk 3 is a dead chunk, which format version 3"));
  for (auto spoil : {+[](Chunk& c) { c.stored_size = 100; }, +[](Chunk& c) { c.file_offset = 4096; },
                     +[](Chunk& c) { c.file_index = 1; }, +[](Chunk& c) { c.crc32c = 5; }}) {
    Manifest spoilt = dead_manifest();
    spoil(spoilt.allocations[0].chunks.back());
    CHECK_THAT(validate_error(spoilt), Catch::Contains("allocation 7 chunk 3 is a dead chunk but names"));
  }
}
