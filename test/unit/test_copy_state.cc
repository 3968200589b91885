// The copy state of a concurrent dump (phos/images/copy_state.h): the
// table the engine and the hooks share, its states, its checks when mapped,
// and, on simulated device memory, that an image taken while writers keep
// writing is the state at the freeze.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "phos/images/copy_state.h"
#include "phos/support/clock.h"

using namespace phos;
using namespace phos::copystate;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kChunk = 4096;

Result<void> no_save(uint64_t, uint64_t, uint32_t) { return make_error("no save expected"); }

CopyState make(CopyProtocol p, std::vector<Region> regions, uint32_t slots) {
  auto s = CopyState::create(p, kChunk, regions, slots);
  REQUIRE(s.ok());
  return std::move(s.value());
}

// Drains every chunk the engine can claim now, marking each copied.
int drain(CopyState& s) {
  int n = 0;
  while (auto c = s.claim_next()) {
    s.copied(*c);
    n++;
  }
  return n;
}

}  // namespace

TEST_CASE("copy state: chunks of each allocation, in address order, all pending", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{7, 0x200000, 3 * kChunk + 1}, {3, 0x100000, kChunk}}, 2);
  CHECK(s.chunk_count() == 5);
  REQUIRE(s.regions().size() == 2);
  CHECK(s.regions()[0].id == 3);  // sorted by address
  CHECK(s.regions()[1].id == 7);
  for (uint64_t c = 0; c < 5; c++) CHECK(s.state(c) == ChunkState::kPending);
  CHECK(s.window() == Window::kOpen);
  auto c = s.claim_next();
  REQUIRE(c);
  CHECK(c->chunk == 0);
  CHECK(c->region == 0);
  CHECK(c->bytes == kChunk);
  // The last chunk of a region is short.
  for (int i = 0; i < 4; i++) c = s.claim_next();
  REQUIRE(c);
  CHECK(c->chunk == 4);
  CHECK(c->offset == 3 * kChunk);
  CHECK(c->bytes == 1);
}

TEST_CASE("copy state: create refuses overlapping, empty and wrapping allocations and odd chunk sizes",
          "[copy_state]") {
  auto overlap = CopyState::create(CopyProtocol::kSoftCopyOnWrite, kChunk,
                                   std::vector<Region>{{1, 0x1000, 0x2000}, {2, 0x2000, 0x1000}}, 0);
  REQUIRE_FALSE(overlap.ok());
  CHECK_THAT(overlap.error().message, Catch::Contains("overlap"));
  CHECK_FALSE(CopyState::create(CopyProtocol::kSoftCopyOnWrite, kChunk, std::vector<Region>{{1, 0x1000, 0}}, 0).ok());
  CHECK_FALSE(
      CopyState::create(CopyProtocol::kSoftCopyOnWrite, kChunk, std::vector<Region>{{1, ~0ull - 10, 100}}, 0).ok());
  auto odd = CopyState::create(CopyProtocol::kSoftCopyOnWrite, 1000, std::vector<Region>{{1, 0x1000, 0x1000}}, 0);
  REQUIRE_FALSE(odd.ok());
  CHECK_THAT(odd.error().message, Catch::Contains("chunk size"));
}

TEST_CASE("copy state: the table's header holds the protocol numbers it always had", "[copy_state][protocol]") {
  // 1 copy-on-write, 2 recopy, 3 fill, after the magic and the version: an
  // agent of an earlier build reads a table of this one alike.
  const std::pair<CopyProtocol, uint32_t> numbers[] = {
      {CopyProtocol::kSoftCopyOnWrite, 1}, {CopyProtocol::kSoftRecopy, 2}, {CopyProtocol::kOnDemandFill, 3}};
  for (auto [protocol, number] : numbers) {
    CopyState s = make(protocol, {{1, 0x10000, kChunk}}, 0);
    uint32_t stored = 0;
    REQUIRE(::pread(s.fd(), &stored, sizeof(stored), 12) == ssize_t(sizeof(stored)));
    CHECK(stored == number);
    auto hooks = CopyState::attach(s.fd());
    REQUIRE(hooks.ok());
    CHECK(hooks->protocol() == protocol);
  }
}

TEST_CASE("copy state: a stopped copy has no table", "[copy_state][protocol]") {
  auto r = CopyState::create(CopyProtocol::kStopTheWorld, kChunk, std::vector<Region>{{1, 0x10000, kChunk}}, 0);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.error().message, Catch::Contains("stop-the-world has no copy table"));
}

TEST_CASE("copy state: attach maps the same table; refuses what is not one", "[copy_state]") {
  CopyState engine = make(CopyProtocol::kSoftRecopy, {{1, 0x10000, 8 * kChunk}}, 0);
  auto hooks = CopyState::attach(engine.fd());
  REQUIRE(hooks.ok());
  CHECK(hooks->protocol() == CopyProtocol::kSoftRecopy);
  CHECK(hooks->chunk_count() == 8);
  REQUIRE(hooks->before_write(0x10000 + 3 * kChunk, 10, no_save, 1s).ok());
  CHECK(engine.dirty(3));  // one table

  SECTION("a memfd that is not sealed") {
    int fd = ::memfd_create("not-a-table", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 8192) == 0);
    auto r = CopyState::attach(fd);
    ::close(fd);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == EPROTO);
  }
  SECTION("a sealed memfd with garbage") {
    int fd = ::memfd_create("garbage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0);
    std::vector<char> junk(8192, 'x');
    REQUIRE(::write(fd, junk.data(), junk.size()) == ssize_t(junk.size()));
    REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
    auto r = CopyState::attach(fd);
    ::close(fd);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.error().message, Catch::Contains("magic"));
  }
  SECTION("a table whose allocation records were scribbled on") {
    void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, engine.fd(), 0);
    REQUIRE(map != MAP_FAILED);
    auto* words = static_cast<uint64_t*>(map);
    // The first region record follows the 64-byte aligned header; its size field.
    uint64_t* size = nullptr;
    for (size_t i = 0; i < 4096 / 8 - 3; i++)
      if (words[i] == 1 && words[i + 1] == 0x10000 && words[i + 2] == 8 * kChunk) size = &words[i + 2];
    REQUIRE(size != nullptr);
    *size = 3 * kChunk;
    auto r = CopyState::attach(engine.fd());
    ::munmap(map, 4096);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == EPROTO);
  }
}

TEST_CASE("copy state: a call's saves start together and complete with one wait; the engine passes them over until then",
          "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}}, 4);
  std::vector<uint64_t> started;
  int completes = 0;
  bool engine_found_one = false;
  SaveChunks saves{
      .enqueue = [&](uint64_t a, uint64_t, uint32_t) -> Result<void> {
        started.push_back(a);
        return {};
      },
      .complete = [&]() -> Result<void> {
        completes++;
        // Started, not yet complete: saving, which the engine's scan passes
        // over (a claim now would copy a chunk the program may already write).
        CHECK(s.state(0) == ChunkState::kSaving);
        CHECK(s.state(2) == ChunkState::kSaving);
        if (auto c = s.claim_next()) {
          engine_found_one = c->chunk < 3;
          s.unclaim(*c);
        }
        return {};
      },
  };
  auto r = s.before_write(0x10000, 3 * kChunk, saves, 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 3);
  CHECK(started.size() == 3);
  CHECK(completes == 1);
  CHECK_FALSE(engine_found_one);
  for (uint64_t c = 0; c < 3; c++) CHECK(s.state(c) == ChunkState::kSaved);
  CHECK(s.statistics().saved == 3);
}

TEST_CASE("copy state: a batch of saves that fails to complete puts its chunks back pending, frees their slots and "
          "aborts the window", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}}, 2);
  SaveChunks failing{
      .enqueue = [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; },
      .complete = []() -> Result<void> { return make_error("the pool's stream failed", EIO); },
  };
  auto r = s.before_write(0x10000, 2 * kChunk, failing, 1s);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EIO);
  CHECK(r.error().message.find("save 2 chunks") != std::string::npos);
  CHECK(s.state(0) == ChunkState::kPending);
  CHECK(s.state(1) == ChunkState::kPending);
  CHECK(s.window() == Window::kAborted);
}

TEST_CASE("copy state: copy-on-write saves a pending chunk once, the engine takes it from its slot",
          "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}}, 2);
  std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> saves;
  auto save = [&](uint64_t a, uint64_t b, uint32_t slot) -> Result<void> {
    saves.emplace_back(a, b, slot);
    return {};
  };
  // Bytes 100.. of chunk 1 through byte 10 of chunk 2: both saved.
  auto r = s.before_write(0x10000 + kChunk + 100, kChunk, save, 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 2);
  REQUIRE(saves.size() == 2);
  CHECK(std::get<0>(saves[0]) == 0x10000 + kChunk);
  CHECK(std::get<1>(saves[0]) == kChunk);
  CHECK(std::get<2>(saves[0]) != std::get<2>(saves[1]));
  CHECK(s.state(1) == ChunkState::kSaved);
  CHECK(s.state(2) == ChunkState::kSaved);
  // Written again: nothing more to save.
  REQUIRE(s.before_write(0x10000 + kChunk, 2 * kChunk, save, 1s).ok());
  CHECK(saves.size() == 2);
  // Outside every allocation: not the dump's.
  REQUIRE(s.before_write(0x90000, kChunk, save, 1s).ok());
  CHECK(saves.size() == 2);

  // The engine takes the chunks waiting in the pool first (freeing their
  // slots), then the rest in order.
  std::vector<Claim> claims;
  while (auto c = s.claim_next()) claims.push_back(*c);
  REQUIRE(claims.size() == 4);
  REQUIRE(claims[0].pool_slot);
  REQUIRE(claims[1].pool_slot);
  CHECK(std::set<uint64_t>{claims[0].chunk, claims[1].chunk} == std::set<uint64_t>{1, 2});
  CHECK(*claims[claims[0].chunk == 1 ? 0 : 1].pool_slot == std::get<2>(saves[0]));
  CHECK(claims[2].chunk == 0);
  CHECK_FALSE(claims[2].pool_slot);
  CHECK(claims[3].chunk == 3);
  for (auto& c : claims) s.copied(c);
  CHECK(s.all_copied());
  CHECK(s.statistics().saved == 2);
  // The slots are free again: a new table's worth of saves fits.
  auto again = s.before_write(0x10000, kChunk, save, 1s);
  REQUIRE(again.ok());
  CHECK(again->saved == 0);  // copied already
}

TEST_CASE("copy state: the chunks of chosen regions; copied before the window, a write to them saves nothing",
          "[copy_state][cow][ipc]") {
  // Regions in address order: #3 (1 chunk), #7 (4: the last short), #5 (2).
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite,
                     {{7, 0x200000, 3 * kChunk + 1}, {3, 0x100000, kChunk}, {5, 0x300000, 2 * kChunk}}, 4);
  CHECK(s.region_chunks({7}) == std::vector<uint64_t>{1, 2, 3, 4});
  CHECK(s.region_chunks({5, 3}) == std::vector<uint64_t>{0, 5, 6});
  CHECK(s.region_chunks({42}).empty());
  CHECK(s.region_chunks({}).empty());
  // Memory other processes map (CUDA IPC): the engine copies its chunks
  // while they are stopped, before the window opens.
  for (uint64_t c : s.region_chunks({7})) {
    auto claim = s.claim(c);
    REQUIRE(claim);
    CHECK_FALSE(claim->pool_slot);
    s.copied(*claim);
  }
  // In the window: a write there needs no save, one to the rest does.
  auto shared = s.before_write(0x200000, 3 * kChunk + 1, no_save, 1s);
  REQUIRE(shared.ok());
  CHECK(shared->saved == 0);
  CHECK(shared->waited == 0);
  int saves = 0;
  auto save = [&](uint64_t, uint64_t, uint32_t) -> Result<void> {
    saves++;
    return {};
  };
  auto own = s.before_write(0x300000, 2 * kChunk, save, 1s);
  REQUIRE(own.ok());
  CHECK(own->saved == 2);
  CHECK(saves == 2);
  // The engine's window copy takes the rest only: 3 chunks, 2 from the pool.
  CHECK(drain(s) == 3);
  CHECK(s.all_copied());
}

TEST_CASE("copy state: over two GPUs, each region's chunks take slots of its GPU's pool only",
          "[copy_state][multi_gpu]") {
  // Region at 0x10000 on GPU 0 (pool slots 0..69), at 0x900000 on GPU 1
  // (pool slots 70..71): slot ranges that do not start or end on a word.
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 80 * kChunk}, {2, 0x900000, 4 * kChunk}}, 72);
  REQUIRE(s.set_region_slots({{0, 70}, {70, 72}}).ok());
  std::vector<std::pair<uint64_t, uint32_t>> saves;
  auto save = [&](uint64_t a, uint64_t, uint32_t slot) -> Result<void> {
    saves.emplace_back(a, slot);
    return {};
  };
  // GPU 1's region: two slots, then its pool is full, though GPU 0's has 70 free.
  REQUIRE(s.before_write(0x900000, 2 * kChunk, save, 1s).ok());
  REQUIRE(saves.size() == 2);
  for (const auto& [a, slot] : saves) CHECK((slot == 70 || slot == 71));
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto r = s.before_write(0x900000 + 3 * kChunk, 8, save, 5s);
    CHECK(r.ok());
    CHECK(r->waited == 1);
    CHECK(r->saved == 0);
    done = true;
  });
  // The engine is asked for the chunk (no slot on its GPU), not handed
  // one of GPU 0's.
  std::optional<Claim> c;
  for (int i = 0; i < 2000 && !c; i++) {
    std::this_thread::sleep_for(1ms);
    c = s.claim_urgent();
  }
  REQUIRE(c);
  CHECK(c->chunk == 83);
  CHECK_FALSE(c->pool_slot);
  s.copied(*c);
  writer.join();
  CHECK(done.load());
  CHECK(saves.size() == 2);
  // GPU 0's region: all 70 of its slots, none of GPU 1's.
  REQUIRE(s.before_write(0x10000, 70 * kChunk, save, 1s).ok());
  REQUIRE(saves.size() == 72);
  std::set<uint32_t> gpu0;
  for (size_t i = 2; i < saves.size(); i++) gpu0.insert(saves[i].second);
  CHECK(gpu0.size() == 70);
  CHECK(*gpu0.rbegin() == 69);
}

TEST_CASE("copy state: slot ranges are refused for another count of regions or past the pool",
          "[copy_state][multi_gpu]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, kChunk}, {2, 0x900000, kChunk}}, 4);
  CHECK_FALSE(s.set_region_slots({{0, 4}}).ok());
  auto past = s.set_region_slots({{0, 2}, {2, 5}});
  REQUIRE_FALSE(past.ok());
  CHECK_THAT(past.error().message, Catch::Contains("outside the pool's 4 slots"));
  CHECK(s.set_region_slots({{0, 2}, {2, 4}}).ok());
}

TEST_CASE("copy state: a write waits for a chunk the engine is copying", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 4);
  auto c = s.claim_next();
  REQUIRE(c);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto r = s.before_write(0x10000, 8, no_save, 5s);
    CHECK(r.ok());
    CHECK(r->waited == 1);
    CHECK(r->saved == 0);
    done = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done.load());
  s.copied(*c);
  writer.join();
  CHECK(done.load());
}

TEST_CASE("copy state: with the pool full, the chunk goes to the engine first and the write waits",
          "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 64 * kChunk}}, 0);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto r = s.before_write(0x10000 + 40 * kChunk, 8, no_save, 5s);
    CHECK(r.ok());
    done = true;
  });
  // Once the writer has asked, the engine's next claim is the chunk it
  // waits for, not the next in order (those are put back until then).
  std::optional<Claim> c;
  for (int i = 0; i < 2000 && !c; i++) {
    std::this_thread::sleep_for(1ms);
    c = s.claim_next();
    if (c && c->chunk != 40) {
      s.unclaim(*c);
      c = std::nullopt;
    }
  }
  REQUIRE(c);
  CHECK(c->chunk == 40);
  CHECK_FALSE(done.load());
  s.copied(*c);
  writer.join();
  CHECK(s.statistics().waits == 1);
}

TEST_CASE("copy state: with the pool full, a write over several chunks asks for all of them before it waits",
          "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 64 * kChunk}}, 0);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto r = s.before_write(0x10000 + 10 * kChunk, 5 * kChunk, no_save, 5s);
    CHECK(r.ok());
    CHECK(r->waited >= 1);  // those still being copied when it got to them
    done = true;
  });
  // None copied yet, all five asked for: one round trip, not five.
  std::vector<Claim> asked;
  for (int i = 0; i < 2000 && asked.size() < 5; i++) {
    if (auto c = s.claim_urgent()) asked.push_back(*c);
    else std::this_thread::sleep_for(1ms);
  }
  REQUIRE(asked.size() == 5);
  std::set<uint64_t> chunks;
  for (const Claim& c : asked) chunks.insert(c.chunk);
  CHECK(chunks == std::set<uint64_t>{10, 11, 12, 13, 14});
  CHECK_FALSE(done.load());
  for (const Claim& c : asked) s.copied(c);
  writer.join();
  CHECK(done.load());
}

TEST_CASE("copy state: a write over chunks being copied saves the others before it waits", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}}, 4);
  auto busy = s.claim_next();  // chunk 0, the engine's
  REQUIRE(busy);
  REQUIRE(busy->chunk == 0);
  std::atomic<int> saves{0};
  std::thread writer([&] {
    auto r = s.before_write(0x10000, 4 * kChunk, [&](uint64_t, uint64_t, uint32_t) -> Result<void> {
      saves++;
      return {};
    }, 5s);
    CHECK(r.ok());
    CHECK(r->saved == 3);
    CHECK(r->waited == 1);
  });
  for (int i = 0; i < 2000 && saves.load() < 3; i++) std::this_thread::sleep_for(1ms);
  CHECK(saves.load() == 3);  // chunks 1-3 saved while chunk 0 is still being copied
  s.copied(*busy);
  writer.join();
}

TEST_CASE("copy state: a saved chunk put back keeps its place before the rest", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 8 * kChunk}}, 2);
  auto save = [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; };
  REQUIRE(s.before_write(0x10000 + 6 * kChunk, 8, save, 1s).ok());
  auto c = s.claim_next();
  REQUIRE(c);
  CHECK(c->chunk == 6);
  REQUIRE(c->pool_slot);
  s.unclaim(*c);
  auto again = s.claim_next();
  REQUIRE(again);
  CHECK(again->chunk == 6);
  CHECK(again->pool_slot == c->pool_slot);
  s.copied(*again);
  CHECK(drain(s) == 7);
  CHECK(s.all_copied());
}

TEST_CASE("copy state: the pool's list is empty again once every chunk is copied", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 16 * kChunk}}, 3);
  auto save = [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; };
  struct stat st {};
  REQUIRE(::fstat(s.fd(), &st) == 0);
  void* map = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, s.fd(), 0);
  REQUIRE(map != MAP_FAILED);
  auto count = [&] {
    uint64_t n = 0;
    std::memcpy(&n, static_cast<std::byte*>(map) + 192, 8);  // Header::in_pool
    return n;
  };
  // Saves, a claim put back, saves into freed slots, the rest in order.
  REQUIRE(s.before_write(0x10000 + 2 * kChunk, 3 * kChunk, save, 1s).ok());
  CHECK(count() == 3);
  auto c = s.claim_next();
  REQUIRE(c);
  REQUIRE(c->pool_slot);
  CHECK(count() == 2);
  s.unclaim(*c);
  CHECK(count() == 3);
  for (int i = 0; i < 3; i++) {
    auto k = s.claim_next();
    REQUIRE(k);
    CHECK(k->pool_slot);
    s.copied(*k);
  }
  CHECK(count() == 0);
  REQUIRE(s.before_write(0x10000 + 10 * kChunk, 2 * kChunk, save, 1s).ok());
  CHECK(count() == 2);
  drain(s);
  CHECK(s.all_copied());
  CHECK(count() == 0);
  ::munmap(map, size_t(st.st_size));
}

TEST_CASE("copy state: claims stay within the table when the pool's chunk list is scribbled on",
          "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 8 * kChunk}}, 4);
  auto save = [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; };
  REQUIRE(s.before_write(0x10000 + 2 * kChunk, 8, save, 1s).ok());
  // The application writes over the pool's list (Header::in_pool_offset at
  // byte 184): nonsense, and a chunk that is not in the pool.
  struct stat st {};
  REQUIRE(::fstat(s.fd(), &st) == 0);
  void* map = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, s.fd(), 0);
  REQUIRE(map != MAP_FAILED);
  uint64_t at = 0;
  std::memcpy(&at, static_cast<std::byte*>(map) + 184, 8);
  REQUIRE(at + 16 <= uint64_t(st.st_size));
  auto* list = reinterpret_cast<uint32_t*>(static_cast<std::byte*>(map) + at);
  CHECK(list[0] == 3);  // chunk 2, + 1, in slot 0
  const uint32_t lies[4] = {0xffffffffu, 6, 9, 0x7fffffffu};  // chunk 5 is pending, not in slot 1
  std::memcpy(list, lies, sizeof lies);
  const uint64_t many = ~uint64_t(0);
  std::memcpy(static_cast<std::byte*>(map) + 192, &many, 8);
  std::set<uint64_t> seen;
  while (auto c = s.claim_next()) {
    CHECK(c->chunk < 8);
    CHECK((!c->pool_slot || *c->pool_slot < 4));
    seen.insert(c->chunk);
    s.copied(*c);
  }
  CHECK(seen.size() == 8);
  ::munmap(map, size_t(st.st_size));
}

TEST_CASE("copy state: a failed save or a wait past its time aborts the window", "[copy_state]") {
  SECTION("a failed save") {
    CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 2);
    auto r = s.before_write(0x10000, 8, [](uint64_t, uint64_t, uint32_t) -> Result<void> {
      return make_error("device to device copy failed", EIO);
    }, 1s);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == EIO);
    CHECK_THAT(r.error().message, Catch::Contains("chunk 0"));
    CHECK(s.state(0) == ChunkState::kPending);
    CHECK(s.window() == Window::kAborted);
    CHECK_FALSE(s.claim_next());  // the engine stops
  }
  SECTION("a wait past its time") {
    CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 0);
    auto r = s.before_write(0x10000, 8, no_save, 30ms);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().code == ETIMEDOUT);
    CHECK(s.window() == Window::kAborted);
  }
  SECTION("closed: writes and unknown sets go on at once") {
    CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 0);
    std::thread unknown([&] { CHECK(s.wait_closed(5s).ok()); });
    CHECK(drain(s) == 2);
    CHECK(s.all_copied());
    s.close(Window::kClosed);
    unknown.join();
    CHECK(s.before_write(0x10000, 8, no_save, 10ms).ok());
    s.close(Window::kAborted);  // the first close counts
    CHECK(s.window() == Window::kClosed);
  }
}

TEST_CASE("copy state: recopy marks written chunks dirty and copies them again at the end", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x10000, 8 * kChunk}}, 0);
  auto c0 = s.claim_next();
  REQUIRE(c0);
  s.copied(*c0);
  auto r = s.before_write(0x10000, 3 * kChunk, no_save, 1s);  // chunks 0 (copied), 1, 2 (pending)
  REQUIRE(r.ok());
  CHECK(r->dirtied == 3);
  CHECK(r->waited == 0);
  REQUIRE(s.before_write(0x10000, 8, no_save, 1s)->dirtied == 0);  // dirty already
  std::vector<uint64_t> first;
  while (auto c = s.claim_next()) {
    first.push_back(c->chunk);
    s.copied(*c);
  }
  CHECK(first == std::vector<uint64_t>{3, 4, 5, 6, 7});  // the dirty ones wait for the end
  CHECK_FALSE(s.all_copied());
  std::vector<uint64_t> again;
  while (auto c = s.claim_dirty()) {
    again.push_back(c->chunk);
    s.copied(*c);
  }
  CHECK(again == std::vector<uint64_t>{0, 1, 2});
  CHECK(s.all_copied());
}

TEST_CASE("copy state: recopy marks every chunk dirty for a call it cannot read", "[copy_state][recopy]") {
  // 70 chunks: the dirty bitmap's second word is partly used.
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 64 * kChunk}, {2, 0x200000, 6 * kChunk}}, 0);
  REQUIRE(s.chunk_count() == 70);
  CHECK(drain(s) == 70);  // the first pass: nothing dirty yet
  s.mark_all_dirty();
  for (uint64_t c = 0; c < s.chunk_count(); c++) CHECK(s.dirty(c));
  CHECK(s.statistics().dirtied == 70);
  CHECK_FALSE(s.all_copied());
  std::vector<uint64_t> again;
  while (auto c = s.claim_dirty()) {
    REQUIRE(c->chunk < s.chunk_count());
    again.push_back(c->chunk);
    s.copied(*c);
  }
  CHECK(again.size() == 70);  // each once, none past the table
  CHECK(s.all_copied());
}

TEST_CASE("copy state: dirty_count counts the chunks dirty now, across bitmap words", "[copy_state][recopy]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 70 * kChunk}}, 0);
  CHECK(s.dirty_count() == 0);
  REQUIRE(s.before_write(0x100000 + 63 * kChunk, 2 * kChunk, no_save, 1s).ok());  // chunks 63, 64
  CHECK(s.dirty_count() == 2);
  s.mark_all_dirty();
  CHECK(s.dirty_count() == 70);
  auto c = s.claim_dirty();
  REQUIRE(c);
  CHECK(s.dirty_count() == 69);
}

TEST_CASE("copy state: marking all dirty twice counts each chunk once", "[copy_state][recopy]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 3 * kChunk}}, 0);
  REQUIRE(s.before_write(0x100000, 8, no_save, 1s)->dirtied == 1);
  s.mark_all_dirty();
  s.mark_all_dirty();
  CHECK(s.statistics().dirtied == 3);
}

TEST_CASE("copy state: the hooks in another process share the table", "[copy_state]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}}, 4);
  auto c0 = s.claim_next();
  auto c = s.claim_next();  // chunk 1 is being copied
  REQUIRE(c0);
  REQUIRE(c);
  REQUIRE(c->chunk == 1);
  s.unclaim(*c0);  // chunk 0 pending again
  pid_t child = ::fork();
  if (child == 0) {
    auto hooks = CopyState::attach(s.fd());
    if (!hooks) _exit(2);
    // Chunk 0 saved here, chunk 1 waited for until the parent copies it.
    auto r = hooks->before_write(0x10000, 2 * kChunk, [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; }, 5s);
    _exit(r && r->saved == 1 && r->waited == 1 ? 0 : 1);
  }
  REQUIRE(child > 0);
  for (int i = 0; i < 500 && s.state(0) != ChunkState::kSaved; i++) std::this_thread::sleep_for(1ms);
  CHECK(s.state(0) == ChunkState::kSaved);
  s.copied(*c);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// Writers keep changing simulated device memory while the engine copies it:
// the image must equal the memory at the freeze, byte for byte, whatever the
// pool's size.
TEST_CASE("copy state: an image taken under concurrent writes is the state at the freeze", "[copy_state]") {
  const uint32_t slots = GENERATE(0u, 3u, 64u);
  const uint64_t chunks = 48;
  std::vector<Region> regions{{1, 0x100000, 20 * kChunk}, {2, 0x200000, 28 * kChunk - 100}};
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, regions, slots);
  auto addr_of = [&](uint64_t address) -> size_t {
    return address >= 0x200000 ? 20 * kChunk + (address - 0x200000) : address - 0x100000;
  };
  const size_t bytes = 20 * kChunk + 28 * kChunk - 100;
  std::vector<uint8_t> device(bytes);
  std::mt19937_64 rng(42);
  for (auto& b : device) b = uint8_t(rng());
  const std::vector<uint8_t> frozen = device;
  std::vector<uint8_t> image(bytes, 0);
  std::vector<std::vector<uint8_t>> pool(slots, std::vector<uint8_t>(kChunk));

  auto save = [&](uint64_t address, uint64_t n, uint32_t slot) -> Result<void> {
    std::memcpy(pool[slot].data(), device.data() + addr_of(address), n);
    return {};
  };
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; t++)
    writers.emplace_back([&, t] {
      std::mt19937_64 r(t + 1);
      while (!stop) {
        const Region& reg = regions[r() % 2];
        uint64_t off = r() % reg.size, n = 1 + r() % std::min<uint64_t>(3 * kChunk, reg.size - off);
        auto w = s.before_write(reg.address + off, n, save, 10s);
        if (!w) FAIL(w.error().message);
        std::memset(device.data() + addr_of(reg.address + off), int(r()), n);
      }
    });
  uint64_t copied = 0;
  while (copied < chunks) {
    auto c = s.claim_next();
    if (!c) {
      std::this_thread::yield();
      continue;
    }
    size_t at = addr_of(regions[c->region].address + c->offset);
    const uint8_t* from = c->pool_slot ? pool[*c->pool_slot].data() : device.data() + at;
    std::memcpy(image.data() + at, from, c->bytes);
    s.copied(*c);
    copied++;
  }
  CHECK(s.all_copied());
  s.close(Window::kClosed);
  stop = true;
  for (auto& w : writers) w.join();
  CHECK(image == frozen);
  INFO("pool slots " << slots << ": saved " << s.statistics().saved << ", waits " << s.statistics().waits);
  if (slots == 0) CHECK(s.statistics().saved == 0);
}

// Soft recopy on simulated device memory: writers run while the first pass
// copies (torn copies included), then stop (the gate closes, the streams
// drain); the final pass takes what is left and what is dirty. The image
// must equal the memory at that last moment, byte for byte, whether or not
// some calls had an unknown write set.
TEST_CASE("copy state: recopy's two passes under concurrent writes give the state at the final quiesce",
          "[copy_state][recopy]") {
  const bool unknown_calls = GENERATE(false, true);
  std::vector<Region> regions{{1, 0x100000, 20 * kChunk}, {2, 0x200000, 28 * kChunk - 100}};
  CopyState s = make(CopyProtocol::kSoftRecopy, regions, 0);
  auto at_of = [&](uint64_t address) -> size_t {
    return address >= 0x200000 ? 20 * kChunk + (address - 0x200000) : address - 0x100000;
  };
  const size_t bytes = 20 * kChunk + 28 * kChunk - 100;
  std::vector<uint8_t> device(bytes), image(bytes, 0);
  std::mt19937_64 rng(7);
  for (auto& b : device) b = uint8_t(rng());
  // Bytes read and written concurrently, as the GPU would: relaxed atomics.
  auto load = [&](size_t i) { return std::atomic_ref<uint8_t>(device[i]).load(std::memory_order_relaxed); };
  auto store = [&](size_t i, uint8_t v) { std::atomic_ref<uint8_t>(device[i]).store(v, std::memory_order_relaxed); };
  auto copy = [&](const Claim& c) {
    size_t at = at_of(regions[c.region].address + c.offset);
    for (size_t i = 0; i < c.bytes; i++) image[at + i] = load(at + i);
    s.copied(c);
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; t++)
    writers.emplace_back([&, t] {
      std::mt19937_64 r(t + 11);
      while (!stop) {
        if (unknown_calls && r() % 500 == 0) {
          s.mark_all_dirty();
          continue;
        }
        const Region& reg = regions[r() % 2];
        uint64_t off = r() % reg.size, n = 1 + r() % std::min<uint64_t>(2 * kChunk, reg.size - off);
        auto w = s.before_write(reg.address + off, n, no_save, 1s);  // marks; never waits, never saves
        REQUIRE(w.ok());
        CHECK(w->waited == 0);
        CHECK(w->saved == 0);
        const uint8_t v = uint8_t(r());
        for (size_t i = 0; i < n; i++) store(at_of(reg.address + off) + i, v);
        writes++;
        std::this_thread::sleep_for(20us);  // a program between its calls
      }
    });
  int first = 0;
  while (auto c = s.claim_next()) {  // the first pass, while they write
    copy(*c);
    first++;
    if (first % 8 == 0) std::this_thread::sleep_for(50us);
  }
  while (writes < 200) std::this_thread::sleep_for(50us);  // some writes after the pass too
  stop = true;  // the gate closes; the writes drain
  for (auto& w : writers) w.join();
  const std::vector<uint8_t> final_state = device;
  int last = 0;
  for (;;) {  // the final pass
    auto c = s.claim_next();
    if (!c) c = s.claim_dirty();
    if (!c) break;
    copy(*c);
    last++;
  }
  INFO("unknown calls " << unknown_calls << ": " << writes << " writes, first pass " << first << " chunks, final "
                        << last);
  CHECK(writes > 0);
  CHECK(s.all_copied());
  CHECK(image == final_state);
  CHECK(first > 0);
  CHECK(last <= 48);  // each chunk at most once at the end
}

// --- forget: a region the program freed is no longer the dump's ---

namespace {

// A save that records what it was asked to save.
struct Saves {
  std::vector<std::tuple<uint64_t, uint64_t, uint32_t>> calls;
  SaveChunk fn() {
    return [this](uint64_t address, uint64_t bytes, uint32_t slot) -> Result<void> {
      calls.emplace_back(address, bytes, slot);
      return {};
    };
  }
};

}  // namespace

TEST_CASE("copy state: forget stops before_write saving a freed region", "[copy_state][forget]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}, {2, 0x40000, 4 * kChunk}}, 8);
  s.forget(0x10000);
  Saves saves;
  auto r = s.before_write(0x10000, 4 * kChunk, saves.fn(), 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 0);
  CHECK(r->waited == 0);
  CHECK(saves.calls.empty());
  for (uint64_t c = 0; c < 4; c++) CHECK(s.state(c) == ChunkState::kPending);
  CHECK(s.statistics().saved == 0);
}

TEST_CASE("copy state: forget of a region leaves the other regions saved", "[copy_state][forget]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}, {2, 0x40000, 4 * kChunk}}, 8);
  s.forget(0x10000);
  Saves saves;
  auto r = s.before_write(0x40000 + kChunk, 8, saves.fn(), 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 1);
  REQUIRE(saves.calls.size() == 1);
  CHECK(std::get<0>(saves.calls[0]) == 0x40000 + kChunk);
  CHECK(s.state(5) == ChunkState::kSaved);
}

TEST_CASE("copy state: a write spanning a forgotten and a live region saves only the live one",
          "[copy_state][forget]") {
  // Adjacent regions: one write runs from the first into the second.
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}, {2, 0x12000, 2 * kChunk}}, 8);
  s.forget(0x12000);
  Saves saves;
  auto r = s.before_write(0x10000 + kChunk, 2 * kChunk, saves.fn(), 1s);  // chunk 1 of region 1, chunk 0 of region 2
  REQUIRE(r.ok());
  CHECK(r->saved == 1);
  REQUIRE(saves.calls.size() == 1);
  CHECK(std::get<0>(saves.calls[0]) == 0x10000 + kChunk);
  CHECK(s.state(1) == ChunkState::kSaved);
  CHECK(s.state(2) == ChunkState::kPending);
}

TEST_CASE("copy state: a write to a forgotten region does not wait for a full pool", "[copy_state][forget]") {
  // No pool: a write to a pending chunk would wait for the engine (and,
  // with nobody copying, time out and abort the window).
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 0);
  s.forget(0x10000);
  auto r = s.before_write(0x10000, 2 * kChunk, no_save, 20ms);
  REQUIRE(r.ok());
  CHECK(r->waited == 0);
  CHECK(s.statistics().waits == 0);
  CHECK(s.window() == Window::kOpen);
}

TEST_CASE("copy state: a write to a forgotten region does not wait for a chunk being copied",
          "[copy_state][forget]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 4);
  auto c = s.claim_next();
  REQUIRE(c);
  REQUIRE(c->chunk == 0);
  s.forget(0x10000);
  auto r = s.before_write(0x10000, 8, no_save, 20ms);
  REQUIRE(r.ok());
  CHECK(r->waited == 0);
  CHECK(s.state(0) == ChunkState::kCopying);  // the engine's copy goes on
  CHECK(s.window() == Window::kOpen);
}

TEST_CASE("copy state: forget in recopy leaves a freed region's chunks clean", "[copy_state][forget]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x10000, 2 * kChunk}, {2, 0x40000, 2 * kChunk}}, 0);
  s.forget(0x40000);
  auto r = s.before_write(0x10000, 0x40000 + 2 * kChunk - 0x10000, no_save, 1s);
  REQUIRE(r.ok());
  CHECK(r->dirtied == 2);
  CHECK(s.dirty(0));
  CHECK(s.dirty(1));
  CHECK_FALSE(s.dirty(2));
  CHECK_FALSE(s.dirty(3));
}

TEST_CASE("copy state: forget of an address inside a region changes nothing", "[copy_state][forget]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 4 * kChunk}}, 8);
  s.forget(0x10000 + kChunk);  // inside, not the start
  s.forget(0x10000 + 1);
  Saves saves;
  auto r = s.before_write(0x10000, 4 * kChunk, saves.fn(), 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 4);
  CHECK(saves.calls.size() == 4);
}

TEST_CASE("copy state: forget of an address outside every region changes nothing", "[copy_state][forget]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}, {2, 0x40000, 2 * kChunk}}, 8);
  for (uint64_t a : {uint64_t(0), uint64_t(0x8000), uint64_t(0x10000 + 2 * kChunk), uint64_t(0x20000),
                     uint64_t(0x40000 + 2 * kChunk), ~uint64_t(0)})
    s.forget(a);
  Saves saves;
  auto r = s.before_write(0x10000, 0x40000 + 2 * kChunk - 0x10000, saves.fn(), 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 4);
  CHECK(saves.calls.size() == 4);
}

TEST_CASE("copy state: forget on the hooks' side leaves the engine's claims whole", "[copy_state][forget]") {
  CopyState engine = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 3 * kChunk}}, 4);
  auto hooks = CopyState::attach(engine.fd());
  REQUIRE(hooks.ok());
  hooks->forget(0x10000);
  Saves saves;
  REQUIRE(hooks->before_write(0x10000, 3 * kChunk, saves.fn(), 1s).ok());
  CHECK(saves.calls.empty());
  // The engine still copies every chunk of the freed region: its memory
  // lives on in the engine's mapping, as it was at the freeze.
  CHECK(drain(engine) == 3);
  CHECK(engine.all_copied());
}

TEST_CASE("copy state: forget is the forgetting side's own; another attach still saves", "[copy_state][forget]") {
  CopyState engine = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 4);
  auto a = CopyState::attach(engine.fd());
  auto b = CopyState::attach(engine.fd());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  a->forget(0x10000);
  Saves saves;
  auto r = b->before_write(0x10000, 8, saves.fn(), 1s);
  REQUIRE(r.ok());
  CHECK(r->saved == 1);
}

// --- the application scribbling on the shared table ---

namespace {

// The table's region records, as the engine wrote them (copy_state.cc:
// RegionRecord after the 64-byte aligned Header, whose regions_offset is
// its 6th field, at byte 40).
struct Records {
  void* map = MAP_FAILED;
  size_t bytes = 0;
  uint64_t* words = nullptr;  // 4 words a record: id, address, size, first_chunk
  uint32_t count = 0;

  explicit Records(const CopyState& s) {
    struct stat st {};
    REQUIRE(::fstat(s.fd(), &st) == 0);
    bytes = size_t(st.st_size);
    map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd(), 0);
    REQUIRE(map != MAP_FAILED);
    auto* base = static_cast<std::byte*>(map);
    uint32_t region_count = 0;
    uint64_t regions_offset = 0;
    std::memcpy(&region_count, base + 32, 4);
    std::memcpy(&regions_offset, base + 40, 8);
    REQUIRE(region_count == s.regions().size());
    REQUIRE(regions_offset % 64 == 0);
    REQUIRE(regions_offset + uint64_t(region_count) * 32 <= bytes);
    words = reinterpret_cast<uint64_t*>(base + regions_offset);
    count = region_count;
    // Where the layout says: the first record is the first region's.
    REQUIRE(words[0] == s.regions()[0].id);
    REQUIRE(words[1] == s.regions()[0].address);
    REQUIRE(words[2] == s.regions()[0].size);
    REQUIRE(words[3] == 0);
  }
  ~Records() {
    if (map != MAP_FAILED) ::munmap(map, bytes);
  }
  Records(const Records&) = delete;
  Records& operator=(const Records&) = delete;

  void fill(uint64_t (*garbage)(size_t word)) {
    for (size_t i = 0; i < size_t(count) * 4; i++) words[i] = garbage(i);
  }
};

// Claims every chunk there is; each must lie within its region.
void claims_stay_within_regions(CopyState& s, const std::vector<Region>& expected) {
  REQUIRE(s.regions().size() == expected.size());
  for (size_t i = 0; i < expected.size(); i++) {
    CHECK(s.regions()[i].id == expected[i].id);
    CHECK(s.regions()[i].address == expected[i].address);
    CHECK(s.regions()[i].size == expected[i].size);
  }
  std::vector<int> claimed(s.chunk_count());
  uint64_t total = 0;
  while (auto c = s.claim_next()) {
    INFO("chunk " << c->chunk << " region " << c->region << " offset " << c->offset << " bytes " << c->bytes);
    REQUIRE(c->chunk < s.chunk_count());
    REQUIRE(c->region < s.regions().size());
    CHECK(c->bytes > 0);
    CHECK(c->offset % s.chunk_size() == 0);
    CHECK(c->offset + c->bytes <= s.regions()[c->region].size);
    claimed[c->chunk]++;
    total += c->bytes;
    s.copied(*c);
  }
  for (uint64_t c = 0; c < s.chunk_count(); c++) CHECK(claimed[c] == 1);
  uint64_t sizes = 0;
  for (const auto& r : expected) sizes += r.size;
  CHECK(total == sizes);
  CHECK(s.all_copied());
}

const std::vector<Region> kScribbled{{1, 0x100000, 3 * kChunk + 100}, {2, 0x200000, kChunk}, {3, 0x300000, 5 * kChunk}};

}  // namespace

TEST_CASE("copy state: claims stay within the regions when the records are all ones", "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  Records records(s);
  records.fill([](size_t) { return ~uint64_t(0); });
  claims_stay_within_regions(s, kScribbled);
}

TEST_CASE("copy state: claims stay within the regions when the records are all zeros", "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  Records records(s);
  records.fill([](size_t) { return uint64_t(0); });
  claims_stay_within_regions(s, kScribbled);
}

TEST_CASE("copy state: claims stay within the regions when the records are random", "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  Records records(s);
  records.fill([](size_t i) { return std::mt19937_64(i + 7)(); });
  claims_stay_within_regions(s, kScribbled);
}

TEST_CASE("copy state: claims stay within the regions when the records claim more chunks", "[copy_state][scribble]") {
  // Plausible lies: every region larger, every first chunk shifted.
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  Records records(s);
  for (uint32_t i = 0; i < records.count; i++) {
    records.words[i * 4 + 2] *= 1000;
    records.words[i * 4 + 3] += 2;
  }
  claims_stay_within_regions(s, kScribbled);
}

TEST_CASE("copy state: recopy's dirty claims stay within the regions when the records are scribbled on",
          "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, kScribbled, 0);
  REQUIRE(s.before_write(0x100000, 0x300000 + 5 * kChunk - 0x100000, no_save, 1s).ok());  // every chunk dirty
  Records records(s);
  records.fill([](size_t) { return ~uint64_t(0); });
  CHECK_FALSE(s.claim_next());  // dirty chunks wait for the end
  uint64_t n = 0;
  while (auto c = s.claim_dirty()) {
    INFO("chunk " << c->chunk);
    REQUIRE(c->region < s.regions().size());
    CHECK(c->offset + c->bytes <= s.regions()[c->region].size);
    s.copied(*c);
    n++;
  }
  CHECK(n == s.chunk_count());
}

TEST_CASE("copy state: the hooks save the region they attached to when the records are scribbled on later",
          "[copy_state][scribble]") {
  CopyState engine = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  auto hooks = CopyState::attach(engine.fd());
  REQUIRE(hooks.ok());
  Records records(engine);
  records.fill([](size_t) { return uint64_t(0); });
  Saves saves;
  auto r = hooks->before_write(0x200000, 8, saves.fn(), 1s);  // region 2, chunk 4
  REQUIRE(r.ok());
  CHECK(r->saved == 1);
  REQUIRE(saves.calls.size() == 1);
  CHECK(std::get<0>(saves.calls[0]) == 0x200000);
  CHECK(std::get<1>(saves.calls[0]) == kChunk);
  CHECK(engine.state(4) == ChunkState::kSaved);
}

TEST_CASE("copy state: a scribbled table is refused by a later attach", "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  Records records(s);
  records.fill([](size_t) { return ~uint64_t(0); });
  auto r = CopyState::attach(s.fd());
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code == EPROTO);
  CHECK_THAT(r.error().message, Catch::Contains("allocation record 0"));
}

// The application may scribble on the shared header just as on the records:
// the engine's claims must still come from the sizes it checked (else a
// claim lies outside its region, names a chunk the table does not have, or
// a pool slot the pool does not have).
namespace {

std::byte* header_of(Records& r) { return static_cast<std::byte*>(r.map); }

}  // namespace

TEST_CASE("copy state: claims stay within the regions when the header's chunk size is scribbled on",
          "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  const uint64_t chunks = s.chunk_count();
  Records records(s);
  uint64_t lie = 2 * kChunk;
  std::memcpy(header_of(records) + 16, &lie, 8);  // Header::chunk_size
  CHECK(s.chunk_size() == kChunk);
  uint64_t n = 0;
  while (auto c = s.claim_next()) {
    INFO("chunk " << c->chunk << " region " << c->region << " offset " << c->offset << " bytes " << c->bytes);
    REQUIRE(c->region < kScribbled.size());
    CHECK(c->offset + c->bytes <= kScribbled[c->region].size);
    CHECK(c->bytes <= kChunk);
    s.copied(*c);
    n++;
  }
  CHECK(n == chunks);
}

TEST_CASE("copy state: claims name only the table's chunks when the header's chunk count is scribbled on",
          "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  const uint64_t chunks = s.chunk_count();
  Records records(s);
  uint64_t lie = chunks + 1;  // the word after the last chunk is padding: in the mapping, reads as pending
  std::memcpy(header_of(records) + 24, &lie, 8);  // Header::chunk_count
  CHECK(s.chunk_count() == chunks);
  uint64_t n = 0;
  while (auto c = s.claim_next()) {
    INFO("chunk " << c->chunk << " region " << c->region << " offset " << c->offset << " bytes " << c->bytes);
    CHECK(c->chunk < chunks);
    CHECK(c->bytes > 0);
    if (c->chunk < chunks) s.copied(*c);
    n++;
  }
  CHECK(n == chunks);
}

TEST_CASE("copy state: claims name only the pool's slots when the header's pool size is scribbled on",
          "[copy_state][scribble]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, kScribbled, 4);
  Records records(s);
  uint32_t lie = 1u << 20;
  std::memcpy(header_of(records) + 36, &lie, 4);  // Header::pool_slots
  uint64_t chunks_offset = 0;
  std::memcpy(&chunks_offset, header_of(records) + 48, 8);  // Header::chunks_offset
  // Chunk 0 "saved" in slot 1000 (copy_state.cc: state | (slot + 1) << 4).
  uint32_t word = uint32_t(ChunkState::kSaved) | (1000u + 1) << 4;
  std::memcpy(header_of(records) + chunks_offset, &word, 4);
  CHECK(s.pool_slots() == 4);
  while (auto c = s.claim_next()) {
    INFO("chunk " << c->chunk << " slot " << (c->pool_slot ? int64_t(*c->pool_slot) : -1));
    CHECK((!c->pool_slot || *c->pool_slot < 4));
    if (c->pool_slot && *c->pool_slot >= 4) continue;  // copied() would free a slot past the pool's bitmap
    s.copied(*c);
  }
}

// ---- on-demand restore (CopyProtocol::kOnDemandFill) ----------------------------------

TEST_CASE("copy state: fill: a read of a chunk not yet filled waits, and the engine takes it first",
          "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 64 * kChunk}}, 0);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    auto r = s.before_use(0x10000 + 40 * kChunk + 8, 16, /*overwrite=*/false, 5s);
    CHECK(r.ok());
    CHECK(r->waited == 1);
    done = true;
  });
  std::optional<Claim> c;
  for (int i = 0; i < 2000 && !c; i++) {
    std::this_thread::sleep_for(1ms);
    c = s.claim_urgent();
  }
  REQUIRE(c);
  CHECK(c->chunk == 40);
  CHECK_FALSE(done.load());
  s.copied(*c);
  reader.join();
  CHECK(done.load());
}

TEST_CASE("copy state: fill: a filled chunk is used at once", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 4 * kChunk}}, 0);
  auto c = s.claim(2);
  REQUIRE(c);
  CHECK_FALSE(s.claim(2));  // claimed once
  s.copied(*c);
  auto r = s.before_use(0x10000 + 2 * kChunk, kChunk, false, 1ms);
  REQUIRE(r.ok());
  CHECK(r->waited == 0);
}

TEST_CASE("copy state: fill: whole chunks a call only overwrites need no fill; the edges do",
          "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 8 * kChunk}}, 0);
  // Chunks 1..3 lie wholly inside; 0 and 4 only partly: those wait.
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto r = s.before_use(0x10000 + kChunk - 8, 3 * kChunk + 16, /*overwrite=*/true, 5s);
    CHECK(r.ok());
    CHECK(r->overwritten == 3);
    done = true;
  });
  std::set<uint64_t> filled;
  for (int i = 0; i < 4000 && filled.size() < 2; i++) {
    std::this_thread::sleep_for(1ms);
    if (auto c = s.claim_urgent()) {
      filled.insert(c->chunk);
      s.copied(*c);
    }
  }
  writer.join();
  CHECK(filled == std::set<uint64_t>{0, 4});
  for (uint64_t c = 1; c <= 3; c++) CHECK(s.state(c) == ChunkState::kCopied);
  CHECK_FALSE(s.claim(2));  // the engine does not fill it over the program's data
  CHECK(s.statistics().overwritten == 3);
}

TEST_CASE("copy state: fill: a call with an unknown set waits for the whole fill", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 4 * kChunk}}, 0);
  std::atomic<bool> done{false};
  std::thread caller([&] {
    CHECK(s.wait_closed(5s).ok());
    done = true;
  });
  for (uint64_t c = 0; c < 4; c++) {
    auto claim = s.claim(c);
    REQUIRE(claim);
    s.copied(*claim);
    std::this_thread::sleep_for(5ms);
    CHECK_FALSE(done.load());
  }
  CHECK(s.all_copied());
  s.close(Window::kClosed);
  caller.join();
  CHECK(done.load());
}

TEST_CASE("copy state: fill: a fill given up lets no call through", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 4 * kChunk}}, 0);
  auto c = s.claim(0);
  REQUIRE(c);
  s.copied(*c);
  std::atomic<int> refused{0};
  std::thread waiting([&] {
    auto r = s.before_use(0x10000 + 3 * kChunk, 8, false, 5s);
    if (!r) refused++;
  });
  std::this_thread::sleep_for(20ms);
  s.close(Window::kAborted);
  waiting.join();
  CHECK(refused == 1);
  // Even memory that was filled: the process must not go on.
  CHECK_FALSE(s.before_use(0x10000, 8, false, 1s).ok());
  CHECK_FALSE(s.wait_closed(1s).ok());
}

TEST_CASE("copy state: fill: a wait past its time is an error", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 2 * kChunk}}, 0);
  auto r = s.before_use(0x10000, 8, false, 30ms);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find("not filled in time") != std::string::npos);
}

TEST_CASE("copy state: fill: memory outside every region is not the restore's", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 2 * kChunk}}, 0);
  auto r = s.before_use(0x90000, 4 * kChunk, false, 1ms);
  REQUIRE(r.ok());
  CHECK(r->waited == 0);
}

TEST_CASE("copy state: fill: attach accepts a fill table and refuses a pool with it", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, 0x10000, 2 * kChunk}}, 0);
  auto other = CopyState::attach(s.fd());
  REQUIRE(other.ok());
  CHECK(other->protocol() == CopyProtocol::kOnDemandFill);
  CHECK(CopyState::create(CopyProtocol::kOnDemandFill, kChunk, std::vector<Region>{{1, 0x10000, kChunk}}, 4).ok());
  auto pooled = CopyState::create(CopyProtocol::kOnDemandFill, kChunk, std::vector<Region>{{1, 0x10000, kChunk}}, 4);
  REQUIRE(pooled.ok());
  auto refused = CopyState::attach(pooled->fd());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("pool") != std::string::npos);
}

TEST_CASE("copy state: chunk_at names the chunk of a region's offset", "[copy_state][fill]") {
  CopyState s = make(CopyProtocol::kOnDemandFill, {{2, 0x200000, 3 * kChunk}, {1, 0x100000, 2 * kChunk + 5}}, 0);
  CHECK(s.chunk_at(0, 0) == 0);           // 0x100000, first in address order
  CHECK(s.chunk_at(0, 2 * kChunk) == 2);  // its short last chunk
  CHECK(s.chunk_at(1, kChunk) == 4);
}

// On simulated device memory: readers and a writer run from the start while
// the engine fills in its own order; no read ever sees memory the fill has
// not reached (a poison value), and the memory at the end is the image plus
// what the program wrote.
TEST_CASE("copy state: fill: under concurrent readers and writers no read sees unfilled memory",
          "[copy_state][fill]") {
  const uint64_t chunks = 48;
  const size_t bytes = chunks * kChunk;
  const uint64_t base = 0x400000;
  CopyState s = make(CopyProtocol::kOnDemandFill, {{1, base, bytes}}, 0);
  std::vector<uint8_t> image(bytes);
  std::mt19937_64 rng(7);
  for (auto& b : image) b = uint8_t(1 + rng() % 255);  // never 0: 0 is the poison
  std::vector<std::atomic<uint8_t>> device(bytes);
  for (auto& b : device) b.store(0);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, poisoned{0};
  std::vector<std::thread> users;
  for (int t = 0; t < 3; t++)
    users.emplace_back([&, t] {
      std::mt19937_64 r(t + 11);
      // Thread 0 writes and reads the upper half, one call after the other
      // (like one stream); the others only read the lower half. A read
      // racing another thread's write would race on a GPU as well.
      const uint64_t from = t == 0 ? bytes / 2 : 0, span = bytes / 2;
      while (!stop) {
        uint64_t off = from + r() % span, n = 1 + r() % std::min<uint64_t>(2 * kChunk, from + span - off);
        const bool write = t == 0 && r() % 3 == 0;
        auto u = s.before_use(base + off, n, /*overwrite=*/write, 10s);
        if (!u) FAIL(u.error().message);
        for (uint64_t i = 0; i < n; i++) {
          if (write) device[off + i].store(uint8_t(1 + r() % 255));
          else if (device[off + i].load() == 0) poisoned++;
        }
        reads++;
      }
    });
  // The engine: the urgent chunks first, then a fixed shuffled order.
  std::vector<uint64_t> order(chunks);
  for (uint64_t i = 0; i < chunks; i++) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  size_t next = 0;
  while (!s.all_copied()) {
    std::optional<Claim> c = s.claim_urgent();
    while (!c && next < order.size()) c = s.claim(order[next++]);
    if (!c) {
      std::this_thread::yield();
      continue;
    }
    for (uint64_t i = 0; i < c->bytes; i++) device[c->offset + i].store(image[c->offset + i]);
    std::this_thread::sleep_for(200us);
    s.copied(*c);
  }
  s.close(Window::kClosed);
  std::this_thread::sleep_for(20ms);
  stop = true;
  for (auto& u : users) u.join();
  CHECK(reads > 0);
  CHECK(poisoned == 0);
  for (size_t i = 0; i < bytes; i++)
    if (device[i].load() == 0) FAIL("byte " << i << " never filled");
}

TEST_CASE("copy state: fill: unfilled_ranges merges adjacent chunks across regions, in address order",
          "[copy_state][fill]") {
  // Two regions that touch: 0x10000 + 3 chunks, then 2 chunks right after.
  CopyState s = make(CopyProtocol::kOnDemandFill, {{2, 0x10000 + 3 * kChunk, 2 * kChunk}, {1, 0x10000, 3 * kChunk}}, 0);
  using R = std::vector<std::pair<uint64_t, uint64_t>>;
  CHECK(s.unfilled_ranges() == R{{0x10000, 0x10000 + 5 * kChunk}});
  auto c = s.claim(1);
  REQUIRE(c);
  CHECK(s.unfilled_ranges() == R{{0x10000, 0x10000 + 5 * kChunk}});  // being filled is not filled
  s.copied(*c);
  CHECK(s.unfilled_ranges() == R{{0x10000, 0x10000 + kChunk}, {0x10000 + 2 * kChunk, 0x10000 + 5 * kChunk}});
  for (uint64_t k = 0; k < s.chunk_count(); k++)
    if (auto claim = s.claim(k)) s.copied(*claim);
  CHECK(s.unfilled_ranges().empty());
}

// --- PhOS §5: recopy's order, and the program's own transfers ---

namespace {

// The chunks the engine claims now, in order, each marked copied.
std::vector<uint64_t> claim_order(CopyState& s) {
  std::vector<uint64_t> order;
  while (auto c = s.claim_next()) {
    order.push_back(c->chunk);
    s.copied(*c);
  }
  return order;
}

// Three allocations of 3 chunks each: chunks 0-2, 3-5, 6-8.
CopyState three_regions(CopyProtocol p = CopyProtocol::kSoftRecopy) {
  return make(p, {{1, 0x100000, 3 * kChunk}, {2, 0x200000, 3 * kChunk}, {3, 0x300000, 3 * kChunk}}, 0);
}

}  // namespace

TEST_CASE("copy state: recopy with cold_first takes unwritten allocations first", "[copy_state][traffic]") {
  CopyState s = three_regions();
  s.set_cold_first(true);
  // The program wrote the middle allocation's first chunk: its other two
  // are clean, but taken last.
  REQUIRE(s.before_write(0x200000, 8, no_save, 1s).ok());
  CHECK_FALSE(s.region_written(0));
  CHECK(s.region_written(1));
  CHECK_FALSE(s.region_written(2));
  CHECK(claim_order(s) == std::vector<uint64_t>{0, 1, 2, 6, 7, 8, 4, 5});
}

TEST_CASE("copy state: recopy without cold_first keeps the address order", "[copy_state][traffic]") {
  CopyState s = three_regions();
  REQUIRE(s.before_write(0x200000, 8, no_save, 1s).ok());
  CHECK(s.region_written(1));  // marked all the same: the order is the engine's choice
  CHECK(claim_order(s) == std::vector<uint64_t>{0, 1, 2, 4, 5, 6, 7, 8});
}

TEST_CASE("copy state: an allocation written while the cold scan runs is left for the end",
          "[copy_state][traffic]") {
  CopyState s = three_regions();
  s.set_cold_first(true);
  std::vector<uint64_t> order;
  auto c = s.claim_next();
  REQUIRE(c);
  CHECK(c->chunk == 0);
  s.copied(*c);
  // The first allocation is written after its first chunk was copied: the
  // rest of it waits; chunk 1 is dirty, chunk 2 is clean.
  REQUIRE(s.before_write(0x100000 + kChunk, 8, no_save, 1s).ok());
  CHECK(claim_order(s) == std::vector<uint64_t>{3, 4, 5, 6, 7, 8, 2});
  CHECK(s.copied_dirty_count() == 0);  // chunk 1 was written before its copy
  std::vector<uint64_t> again;
  while (auto d = s.claim_dirty()) {
    again.push_back(d->chunk);
    s.copied(*d);
  }
  CHECK(again == std::vector<uint64_t>{1});
  CHECK(s.all_copied());
}

TEST_CASE("copy state: copy-on-write marks no allocation written, and its order stays", "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x100000, 2 * kChunk}, {2, 0x200000, 2 * kChunk}}, 4);
  s.set_cold_first(true);  // recopy's alone
  REQUIRE(s.before_write(0x100000, 8, [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; }, 1s).ok());
  CHECK_FALSE(s.region_written(0));
  CHECK(claim_order(s) == std::vector<uint64_t>{0, 1, 2, 3});
}

TEST_CASE("copy state: copied_dirty_count counts the first pass's chunks written after their copy",
          "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 8 * kChunk}}, 0);
  for (int i = 0; i < 3; i++) s.copied(*s.claim_next());  // chunks 0-2 copied
  // Chunks 1 and 2 copied then written; 3 written before its copy.
  REQUIRE(s.before_write(0x100000 + kChunk, 3 * kChunk, no_save, 1s).ok());
  CHECK(s.dirty_count() == 3);
  CHECK(s.copied_dirty_count() == 2);
  s.mark_all_dirty();  // a call the hooks cannot read: every copy wasted
  CHECK(s.copied_dirty_count() == 3);
}

TEST_CASE("copy state: the cold scan stays within the table when its cursor is scribbled on",
          "[copy_state][traffic][scribble]") {
  CopyState s = three_regions();
  s.set_cold_first(true);
  void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd(), 0);
  REQUIRE(map != MAP_FAILED);
  // The header's words after its sizes, offsets and window word (the
  // scan's cursors, the counters, the traffic words), all ones.
  auto* words = static_cast<uint64_t*>(map);
  REQUIRE(words[0] == 0x5453504359504850ull);  // the magic: this is the header
  for (size_t i = 12; i < 24; i++) words[i] = ~0ull;
  ::munmap(map, 4096);
  std::set<uint64_t> seen;
  int guard = 0;
  while (auto c = s.claim_next()) {
    REQUIRE(c->chunk < s.chunk_count());
    CHECK(seen.insert(c->chunk).second);
    s.copied(*c);
    REQUIRE(++guard < 100);
  }
  CHECK(seen.size() == s.chunk_count());  // each once, none outside the table
}

TEST_CASE("copy state: a transfer keeps the link busy until its estimate, counted once", "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 4 * kChunk}}, 0);
  s.set_transfer_rate(1'000'000'000);  // 1 byte per ns
  const uint64_t now = realtime_ns();
  CHECK_FALSE(s.traffic().busy(now));
  s.transfer_queued(1 << 20, now);
  CHECK(s.traffic().busy(now));
  CHECK(s.traffic().busy(now + (1 << 20) - 1));
  CHECK_FALSE(s.traffic().busy(now + (1 << 20)));
  CHECK(s.statistics().transfers == 1);
  CHECK(s.statistics().transfer_bytes == 1 << 20);
}

TEST_CASE("copy state: queued transfers keep the link busy for their bytes at the engine's rate, one after another",
          "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x100000, 4 * kChunk}}, 0);
  SECTION("the engine's rate") {
    s.set_transfer_rate(1'000'000'000);  // 1 byte per ns
    s.transfer_queued(5000, 1'000'000);
    CHECK(s.traffic().busy_until_ns == 1'005'000);
    s.transfer_queued(2000, 1'001'000);  // behind the first
    CHECK(s.traffic().busy_until_ns == 1'007'000);
    s.transfer_queued(1000, 2'000'000);  // the others done by then: from now
    CHECK(s.traffic().busy_until_ns == 2'001'000);
    CHECK(s.traffic().busy(2'000'999));
    CHECK_FALSE(s.traffic().busy(2'001'000));
    CHECK(s.statistics().transfers == 3);
    CHECK(s.statistics().transfer_bytes == 8000);
  }
  SECTION("20 GB/s where the engine set none") {
    s.transfer_queued(20'000'000, 0);
    CHECK(s.traffic().busy_until_ns == 1'000'000);
  }
}

TEST_CASE("copy state: transfers told from many threads while the engine claims add up exactly",
          "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 256 * kChunk}}, 0);
  s.set_transfer_rate(1'000'000'000);
  constexpr int kThreads = 8, kEach = 2000;
  std::vector<std::thread> program;
  for (int t = 0; t < kThreads; t++)
    program.emplace_back([&] {
      for (int i = 0; i < kEach; i++) s.transfer_queued(10, 0);  // "at time 0": each adds 10 ns to the sum
    });
  std::set<uint64_t> claimed;
  while (claimed.size() < s.chunk_count()) {
    auto c = s.claim_next();
    if (!c) break;
    CHECK(claimed.insert(c->chunk).second);
    s.copied(*c);
  }
  for (auto& t : program) t.join();
  CHECK(claimed.size() == s.chunk_count());
  CHECK(s.traffic().busy_until_ns == uint64_t(kThreads) * kEach * 10);
  CHECK(s.statistics().transfers == uint64_t(kThreads) * kEach);
  CHECK(s.statistics().transfer_bytes == uint64_t(kThreads) * kEach * 10);
}

TEST_CASE("copy state: a transfer in the program's process is seen by the engine", "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 4 * kChunk}}, 0);
  s.set_transfer_rate(1'000'000'000);
  int go[2];
  REQUIRE(::pipe(go) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    auto hooks = CopyState::attach(s.fd());
    if (!hooks) _exit(2);
    hooks->transfer_queued(1000, 50);
    char b;
    if (::read(go[0], &b, 1) != 1) _exit(3);  // the parent looked
    hooks->transfer_queued(4096, 0);  // behind the first
    _exit(0);
  }
  REQUIRE(child > 0);
  for (int i = 0; i < 2000 && s.traffic().busy_until_ns == 0; i++) std::this_thread::sleep_for(1ms);
  CHECK(s.traffic().busy_until_ns == 1050);
  REQUIRE(::write(go[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(s.traffic().busy_until_ns == 1050 + 4096);
  CHECK(s.statistics().transfers == 2);
  ::close(go[0]);
  ::close(go[1]);
}

TEST_CASE("copy state: urgent_waiting says when a write waits for the engine", "[copy_state][traffic]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x100000, 4 * kChunk}}, 0);
  CHECK_FALSE(s.urgent_waiting());
  std::thread writer([&] { CHECK(s.before_write(0x100000 + 2 * kChunk, 8, no_save, 5s).ok()); });
  for (int i = 0; i < 2000 && !s.urgent_waiting(); i++) std::this_thread::sleep_for(1ms);
  CHECK(s.urgent_waiting());
  auto c = s.claim_urgent();
  REQUIRE(c);
  CHECK(c->chunk == 2);
  CHECK_FALSE(s.urgent_waiting());
  s.copied(*c);
  writer.join();
}

// --- recopy's final pass by checksum (claim_again, clear_dirty, locate) ---

TEST_CASE("copy state: claim_again takes a copied chunk back and clears its dirty mark", "[copy_state][checksum]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 3 * kChunk}}, 0);
  REQUIRE(drain(s) == 3);
  REQUIRE(s.before_write(0x100000 + kChunk, 8, no_save, 100ms).ok());
  CHECK(s.dirty(1));
  auto c = s.claim_again(1);
  REQUIRE(c);
  CHECK(c->chunk == 1);
  CHECK(c->offset == kChunk);
  CHECK(c->bytes == kChunk);
  CHECK_FALSE(c->pool_slot);
  CHECK(s.state(1) == ChunkState::kCopying);
  CHECK_FALSE(s.dirty(1));
  CHECK_FALSE(s.claim_again(1));  // copying now, not copied
  s.copied(*c);
  CHECK(s.all_copied());
}

TEST_CASE("copy state: claim_again refuses chunks that are not copied, and chunks past the table",
          "[copy_state][checksum]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 2 * kChunk}}, 0);
  CHECK_FALSE(s.claim_again(0));  // pending
  auto c = s.claim_next();
  REQUIRE(c);
  CHECK_FALSE(s.claim_again(c->chunk));  // copying
  CHECK_FALSE(s.claim_again(2));
  CHECK_FALSE(s.claim_again(UINT64_MAX));
  s.clear_dirty(UINT64_MAX);  // harmless
}

TEST_CASE("copy state: clear_dirty lets a dirty, unchanged chunk count as copied", "[copy_state][checksum]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{1, 0x100000, 2 * kChunk}}, 0);
  REQUIRE(drain(s) == 2);
  s.mark_all_dirty();
  CHECK_FALSE(s.all_copied());
  s.clear_dirty(0);
  s.clear_dirty(1);
  CHECK(s.dirty_count() == 0);
  CHECK(s.all_copied());
}

TEST_CASE("copy state: a write waits while its chunk is claimed again, and goes on once it is copied",
          "[copy_state][checksum]") {
  // Copy-on-write never claims again; the recopy hooks never wait. The
  // state machine must still hold for a writer of a copy-on-write table
  // that finds a chunk copying: it waits for `copied`.
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x100000, kChunk}}, 0);
  auto first = s.claim_next();
  REQUIRE(first);
  s.copied(*first);
  auto again = s.claim_again(0);
  REQUIRE(again);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto r = s.before_write(0x100000, 8, no_save, 5000ms);
    CHECK(r.ok());
    done = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(done.load());
  s.copied(*again);
  writer.join();
  CHECK(done.load());
}

TEST_CASE("copy state: locate says where a chunk lies, claimed or not", "[copy_state][checksum]") {
  CopyState s = make(CopyProtocol::kSoftRecopy, {{7, 0x200000, 2 * kChunk + 100}, {3, 0x100000, kChunk}}, 0);
  Claim c = s.locate(0);
  CHECK(c.region == 0);  // id 3, the lower address
  CHECK(c.offset == 0);
  Claim last = s.locate(3);
  CHECK(last.region == 1);
  CHECK(last.offset == 2 * kChunk);
  CHECK(last.bytes == 100);
  CHECK(s.state(3) == ChunkState::kPending);  // not claimed by looking
}

TEST_CASE("copy state: the pool asked back takes no chunk more; given back once no slot holds one",
          "[copy_state][pool_back]") {
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 8 * kChunk}}, 4);
  auto hooks = CopyState::attach(s.fd());
  REQUIRE(hooks.ok());
  std::vector<uint32_t> slots;
  auto save = [&](uint64_t, uint64_t, uint32_t slot) -> Result<void> {
    slots.push_back(slot);
    return {};
  };
  REQUIRE(hooks->before_write(0x10000, 2 * kChunk, save, 1s).ok());  // chunks 0 and 1 in the pool
  CHECK(slots.size() == 2);
  CHECK(s.pool_back() == PoolBack::kInUse);
  CHECK(s.pool_in_use());

  // The program's allocation asks for the pool: both sides see it.
  CHECK(hooks->ask_pool_back() == PoolBack::kAsked);
  CHECK(s.pool_back() == PoolBack::kAsked);
  // A write now takes no slot: its chunk goes to the engine first, the
  // write waits for that copy.
  std::atomic<bool> written{false};
  std::thread writer([&] {
    auto r = hooks->before_write(0x10000 + 5 * kChunk, 8, save, 5s);
    CHECK(r.ok());
    written = true;
  });
  // The pool still holds chunks 0 and 1: it cannot go yet.
  std::atomic<bool> given{false};
  std::thread waiter([&] {
    CHECK(hooks->wait_pool_back(5s).ok());
    given = true;
  });
  // The chunks in the pool. claim_next hands out the waiting write's chunk
  // 5 first where the writer got there first: held until both pool chunks
  // are out (unclaimed at once, it would come back first every time).
  std::vector<Claim> pooled, held;
  for (int i = 0; i < 2000 && pooled.size() < 2; i++)
    if (auto c = s.claim_next())
      (c->pool_slot ? pooled : held).push_back(*c);
    else
      std::this_thread::sleep_for(1ms);
  for (auto& c : held) s.unclaim(c);
  REQUIRE(pooled.size() == 2);
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(given.load());
  CHECK(s.pool_in_use());  // claimed, still being copied out of their slots
  for (auto& c : pooled) s.copied(c);
  CHECK_FALSE(s.pool_in_use());
  s.pool_given_back();  // the engine unmapped its pools
  waiter.join();
  CHECK(given.load());
  CHECK(hooks->pool_back() == PoolBack::kGiven);
  // The waiting write's chunk came through the urgent list, not the pool.
  std::optional<Claim> c;
  for (int i = 0; i < 2000 && !c; i++) {
    c = s.claim_urgent();
    if (!c) std::this_thread::sleep_for(1ms);
  }
  REQUIRE(c);
  CHECK(c->chunk == 5);
  CHECK_FALSE(c->pool_slot);
  s.copied(*c);
  writer.join();
  CHECK(written.load());
  CHECK(slots.size() == 2);  // no save after the ask
}

TEST_CASE("copy state: a table without a pool has none to give back; the wait ends at its deadline",
          "[copy_state][pool_back]") {
  CopyState none = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 0);
  CHECK(none.ask_pool_back() == PoolBack::kGiven);
  CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x10000, 2 * kChunk}}, 2);
  CHECK(s.ask_pool_back() == PoolBack::kAsked);
  CHECK(s.ask_pool_back() == PoolBack::kAsked);  // asked twice: the same
  auto late = s.wait_pool_back(30ms);
  REQUIRE_FALSE(late.ok());
  CHECK(late.error().code == ETIMEDOUT);
  CHECK(late.error().message.find("did not give the copy-on-write pool back") != std::string::npos);
}

TEST_CASE("copy state: writers racing an ask keep no slot once the engine found the pool empty",
          "[copy_state][pool_back]") {
  // Dekker's pair (take_slot against ask_pool_back): no engine runs here, so
  // a slot taken is never freed; if the engine's look after the ask found
  // none, no writer may hold one afterwards (it would save into memory the
  // engine let go).
  int empty_seen = 0;
  for (int round = 0; round < 200; round++) {
    CopyState s = make(CopyProtocol::kSoftCopyOnWrite, {{1, 0x100000, 64 * kChunk}}, 64);
    std::atomic<bool> go{false};
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; w++)
      writers.emplace_back([&, w] {
        while (!go) std::this_thread::yield();
        auto save = [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; };
        for (int k = 0; k < 16; k++) (void)s.before_write(0x100000 + uint64_t(w * 16 + k) * kChunk, 8, save, 0ms);
      });
    go = true;
    s.ask_pool_back();
    const bool in_use = s.pool_in_use();
    for (auto& t : writers) t.join();
    if (!in_use) {
      empty_seen++;
      CHECK_FALSE(s.pool_in_use());
    }
  }
  INFO("rounds where the engine found the pool empty: " << empty_seen);
  CHECK(empty_seen > 0);
}
