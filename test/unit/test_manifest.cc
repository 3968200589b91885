#include <catch2/catch.hpp>
#include <cstring>

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
  CHECK_THAT(decode_error(bytes), Catch::Contains("format version 2 is not supported") &&
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
  m.protocol = static_cast<Protocol>(17);
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
  m.protocol = Protocol::kSoftCopyOnWrite;
  m.copy_trust = CopyTrust::kValidated;
  Statistics& s = m.statistics;
  s.stall_ns = 11;
  s.cow_pool_bytes = 2ull << 30;
  s.cow_saved_bytes = 12ull << 20;
  s.cow_calls_checked = 13;
  s.cow_calls_waited = 14;
  s.cow_unknown_waits = 15;
  s.cow_wait_ns = 16;
  s.cow_window_ns = 17;
  return m;
}

}  // namespace

TEST_CASE("manifest: a copy-on-write manifest round trips with its trust and every statistic",
          "[manifest][cow]") {
  Manifest m = cow_manifest();
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->protocol == Protocol::kSoftCopyOnWrite);
  CHECK(back->copy_trust == CopyTrust::kValidated);
  const Statistics& s = back->statistics;
  CHECK(s.stall_ns == 11);
  CHECK(s.cow_pool_bytes == 2ull << 30);
  CHECK(s.cow_saved_bytes == 12ull << 20);
  CHECK(s.cow_calls_checked == 13);
  CHECK(s.cow_calls_waited == 14);
  CHECK(s.cow_unknown_waits == 15);
  CHECK(s.cow_wait_ns == 16);
  CHECK(s.cow_window_ns == 17);
  CHECK(back.value() == m);
}

TEST_CASE("manifest: a soft-recopy manifest round trips with its passes' figures", "[manifest][recopy]") {
  Manifest m = full_manifest();
  m.protocol = Protocol::kSoftRecopy;
  m.copy_trust = CopyTrust::kSpeculated;
  m.statistics.recopy_first_pass_bytes = 64ull << 30;
  m.statistics.recopy_first_pass_ns = 21;
  m.statistics.recopied_bytes = 3ull << 20;
  m.statistics.final_pass_ns = 23;
  auto back = decode_manifest(encode_manifest(m), "m.img");
  REQUIRE(back.ok());
  CHECK(back->protocol == Protocol::kSoftRecopy);
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
  uint64_t Statistics::*fields[] = {&Statistics::stall_ns,          &Statistics::cow_pool_bytes,
                                    &Statistics::cow_saved_bytes,   &Statistics::cow_calls_checked,
                                    &Statistics::cow_calls_waited,  &Statistics::cow_unknown_waits,
                                    &Statistics::cow_wait_ns,       &Statistics::cow_window_ns,
                                    &Statistics::recopy_first_pass_bytes, &Statistics::recopy_first_pass_ns,
                                    &Statistics::recopied_bytes,    &Statistics::final_pass_ns};
  for (size_t i = 0; i < std::size(fields); i++) {
    INFO("field " << i);
    Manifest m = full_manifest();
    m.statistics.*fields[i] = 1000 + i;
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
  CHECK(s.cow_calls_checked == 0);
  CHECK(s.cow_calls_waited == 0);
  CHECK(s.cow_unknown_waits == 0);
  CHECK(s.cow_wait_ns == 0);
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
  CHECK(copy_trust_name(CopyTrust(4)) == "unknown");
}

TEST_CASE("manifest validation: accepts a copy-on-write manifest", "[manifest][validate][cow]") {
  CHECK(validate_manifest(cow_manifest(), "m.img").ok());
}

TEST_CASE("manifest validation: unknown copy trust", "[manifest][validate][cow]") {
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust(9);
  CHECK_THAT(validate_error(m), Catch::Contains("m.img: manifest: unknown copy trust 9"));
}

TEST_CASE("manifest validation: copy trust just past validated", "[manifest][validate][cow]") {
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust(4);
  CHECK_THAT(validate_error(m), Catch::Contains("unknown copy trust 4"));
}

TEST_CASE("manifest: a file with an unknown copy trust is refused when decoded", "[manifest][cow][corrupt]") {
  Manifest m = cow_manifest();
  m.copy_trust = CopyTrust(9);
  CHECK_THAT(decode_error(encode_manifest(m)), Catch::Contains("unknown copy trust 9"));
}
