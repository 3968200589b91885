// Shared helpers of the unit tests: a temporary image directory, a
// manifest with every field set, and protobuf messages written by hand.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "phos/images/manifest.h"
#include "phos/images/unique_fd.h"

namespace phos::test {

// A connected pair of unix stream sockets, for the agent protocol's ends.
struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

// A protobuf message written field by field (proto2 wire format).
class PbWriter {
 public:
  PbWriter& varint(uint32_t field, uint64_t v) {
    put_varint(uint64_t(field) << 3);
    put_varint(v);
    return *this;
  }
  PbWriter& bytes(uint32_t field, std::span<const std::byte> b) {
    put_varint(uint64_t(field) << 3 | 2);
    put_varint(b.size());
    out_.insert(out_.end(), b.begin(), b.end());
    return *this;
  }
  PbWriter& text(uint32_t field, const std::string& s) {
    return bytes(field, std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  PbWriter& message(uint32_t field, const PbWriter& m) { return bytes(field, m.out_); }
  PbWriter& float64(uint32_t field, double v) {
    put_varint(uint64_t(field) << 3 | 1);
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    for (int i = 0; i < 8; i++) out_.push_back(std::byte(bits >> (8 * i)));
    return *this;
  }
  const std::vector<std::byte>& payload() const { return out_; }

 private:
  void put_varint(uint64_t v) {
    do {
      uint8_t b = v & 0x7f;
      v >>= 7;
      out_.push_back(std::byte(b | (v ? 0x80 : 0)));
    } while (v);
  }
  std::vector<std::byte> out_;
};

struct TempDir {
  std::string path;
  UniqueFd fd;
  // In `base`: /tmp (a disk here), or /dev/shm for tmpfs.
  explicit TempDir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/phos-unit.XXXXXX";
    path = ::mkdtemp(tmpl.data());
    fd.reset(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

// Flips the bits of one byte of a file (a damaged image).
inline void flip_byte(const std::string& path, off_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x5a;
  f.seekp(offset);
  f.write(&c, 1);
}

inline image::Manifest full_manifest() {
  image::Manifest m;
  m.writer_version = "test";
  m.pid = 42;
  m.protocol = CopyProtocol::kSoftRecopy;
  m.chunk_size = 1 << 20;
  m.created_unix_ns = 1234567890123ull;
  GpuDevice d;
  d.ordinal = 0;
  for (int i = 0; i < 16; i++) d.uuid[i] = uint8_t(i * 17);
  d.name = "NVIDIA H200";
  d.total_memory = 150ull << 30;
  d.compute_major = 9;
  d.compute_minor = 0;
  m.devices.push_back(d);
  m.data_files.push_back({"phos-42-data-0.img", 4096 + (3 << 20)});
  image::Allocation a{{7, 0, 0x7f0000000000ull, (2 << 20) + 100, image::kAllocAsync}, {}};
  a.chunks.push_back({0, 0, 4096, 1 << 20, 1 << 20, 0x1111, image::Compression::kNone});
  a.chunks.push_back({1 << 20, 0, 4096 + (1 << 20), 1 << 20, 1000, 0x2222, image::Compression::kZstd});
  a.chunks.push_back({2 << 20, 0, 4096 + (1 << 20) + 1000, 100, 100, 0x3333, image::Compression::kNone});
  m.allocations.push_back(a);
  m.statistics = {.quiesce_ns = 1,
                  .copy_ns = 2,
                  .write_ns = 3,
                  .raw_bytes = 4,
                  .stored_bytes = 5,
                  .total_ns = 6,
                  .dma_wait_ns = 7,
                  .checksum_ns = 8,
                  .compress_ns = 9,
                  .workers = 10,
                  .direct_io = true};
  m.launch_log.push_back({1, "gemm_kernel", {7}, {7}});
  m.unsupported_calls = {"cuIpcOpenMemHandle"};
  return m;
}

}  // namespace phos::test
