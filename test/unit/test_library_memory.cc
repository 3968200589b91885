#include <catch2/catch.hpp>
#include <vector>

#include "phos/hooks/library_memory.h"

using phos::hooks::LibraryMemory;
using Range = LibraryMemory::Range;

namespace {
std::vector<std::pair<uint64_t, uint64_t>> written(const LibraryMemory& m, const void* handle, size_t max = 8) {
  Range out[8];
  size_t n = m.written(handle, out, max);
  std::vector<std::pair<uint64_t, uint64_t>> v;
  for (size_t i = 0; i < n; i++) v.emplace_back(out[i].address, out[i].bytes);
  return v;
}
const void* const h1 = reinterpret_cast<const void*>(0x10);
const void* const h2 = reinterpret_cast<const void*>(0x20);
}  // namespace

TEST_CASE("library memory: a handle's workspace, until set to none or the handle forgotten", "[library_memory]") {
  LibraryMemory m;
  CHECK(written(m, h1).empty());
  m.set_workspace(h1, 0x100000, 4096);
  m.set_workspace(h2, 0x200000, 8192);
  CHECK(written(m, h1) == std::vector<std::pair<uint64_t, uint64_t>>{{0x100000, 4096}});
  CHECK(written(m, h2) == std::vector<std::pair<uint64_t, uint64_t>>{{0x200000, 8192}});
  CHECK(written(m, nullptr).empty());  // cublasLt: no handle workspace
  m.set_workspace(h1, 0x300000, 4096);  // replaced
  CHECK(written(m, h1) == std::vector<std::pair<uint64_t, uint64_t>>{{0x300000, 4096}});
  m.set_workspace(h1, 0, 0);
  CHECK(written(m, h1).empty());
  m.forget_handle(h2);
  CHECK(written(m, h2).empty());
}

TEST_CASE("library memory: its own allocations, on every handle, after the workspace, until freed",
          "[library_memory]") {
  LibraryMemory m;
  m.freed(0x500000);  // nothing owned: nothing to do
  m.allocated(0x600000, 1 << 20);
  m.allocated(0x500000, 4096);
  m.set_workspace(h1, 0x100000, 4096);
  CHECK(written(m, h1) ==
        std::vector<std::pair<uint64_t, uint64_t>>{{0x100000, 4096}, {0x500000, 4096}, {0x600000, 1 << 20}});
  CHECK(written(m, h2) == std::vector<std::pair<uint64_t, uint64_t>>{{0x500000, 4096}, {0x600000, 1 << 20}});
  m.freed(0x500000);
  m.freed(0x700000);  // not the library's
  CHECK(written(m, h2) == std::vector<std::pair<uint64_t, uint64_t>>{{0x600000, 1 << 20}});
}

TEST_CASE("library memory: the closest neighbours merged where they do not fit", "[library_memory]") {
  LibraryMemory m;
  m.allocated(0x100000, 0x1000);
  m.allocated(0x102000, 0x1000);  // 4 KiB after the first
  m.allocated(0x900000, 0x1000);
  m.allocated(0x200000, 0x1000);
  CHECK(written(m, h1, 3) ==
        std::vector<std::pair<uint64_t, uint64_t>>{{0x100000, 0x3000}, {0x200000, 0x1000}, {0x900000, 0x1000}});
  CHECK(written(m, h1, 2) == std::vector<std::pair<uint64_t, uint64_t>>{{0x100000, 0x101000}, {0x900000, 0x1000}});
  CHECK(written(m, h1, 1) == std::vector<std::pair<uint64_t, uint64_t>>{{0x100000, 0x801000}});
  // Beside a workspace with room for one: one range around both.
  m.set_workspace(h1, 0xa00000, 0x1000);
  CHECK(written(m, h1, 1) == std::vector<std::pair<uint64_t, uint64_t>>{{0x100000, 0x901000}});
  CHECK(written(m, h1, 0).empty());
}

TEST_CASE("library memory: allocations are the library's inside a scope only", "[library_memory]") {
  CHECK_FALSE(LibraryMemory::inside());
  {
    LibraryMemory::Scope outer;
    CHECK(LibraryMemory::inside());
    {
      LibraryMemory::Scope inner;
      CHECK(LibraryMemory::inside());
    }
    CHECK(LibraryMemory::inside());
  }
  CHECK_FALSE(LibraryMemory::inside());
}
