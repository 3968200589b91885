// A migration's kept memory between phos-keeper and a restore
// (phos/plugin/kept_memory.h): served over its abstract socket, taken with
// its fds, let go once restored, kept when not, refused for what it does
// not hold. memfds stand in for the driver's exported fds (the keeper never
// looks at them).
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "phos/images/keeper_protocol.h"
#include "phos/plugin/kept_memory.h"

using namespace phos;
using namespace phos::plugin;

namespace {

// A name no other test process uses.
std::string migration_name() {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%08x%08x", unsigned(::getpid()), unsigned(std::rand()));
  return buf;
}

KeptProcess kept_process(const std::string& migration, int32_t vpid, size_t allocations) {
  KeptProcess p{1000 + vpid, vpid, migration, 30, {}, {}, true};
  for (size_t i = 0; i < allocations; i++) {
    p.allocations.push_back({i + 1, 0, 0x7f0000000000ull + (i << 21), 2u << 20, 0});
    int fd = ::memfd_create("kept", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t(4096 * (i + 1))) == 0);
    p.fds.emplace_back(fd);
  }
  return p;
}

// The server thread may not listen yet: take() waits for it.
Result<KeptMemoryLink> take_when_served(const std::string& migration, int32_t vpid) {
  return KeptMemoryLink::take(migration, vpid, 2000);
}

off_t size_of(const UniqueFd& fd) {
  struct stat st {};
  REQUIRE(::fstat(fd.get(), &st) == 0);
  return st.st_size;
}

}  // namespace

TEST_CASE("kept memory: a restore takes it with its fds, and the keeper lets go once restored", "[kept][migrate]") {
  const std::string migration = migration_name();
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration, 1, 300));  // more fds than one frame holds
  std::thread keeper([&] { serve_kept_memory(kept, AT_FDCWD); });
  auto link = take_when_served(migration, 1);
  REQUIRE(link.ok());
  REQUIRE(link->allocations.size() == 300);
  REQUIRE(link->fds.size() == 300);
  CHECK(link->allocations[299].id == 300);
  CHECK(size_of(link->fds[0]) == 4096);  // the very memfds, in order
  CHECK(size_of(link->fds[299]) == 4096 * 300);
  REQUIRE(link->taken(true).ok());
  keeper.join();  // nothing left: it returns
  CHECK(kept.empty());
}

TEST_CASE("kept memory: a restore that did not restore leaves it kept for the next", "[kept][migrate]") {
  const std::string migration = migration_name();
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration, 7, 2));
  std::thread keeper([&] { serve_kept_memory(kept, AT_FDCWD); });
  {
    auto first = take_when_served(migration, 7);
    REQUIRE(first.ok());
    REQUIRE(first->taken(false).ok());
  }
  {
    auto dropped = take_when_served(migration, 7);  // a criu that dies: the link closes without Taken
    REQUIRE(dropped.ok());
  }
  auto next = take_when_served(migration, 7);
  REQUIRE(next.ok());
  CHECK(next->fds.size() == 2);
  REQUIRE(next->taken(true).ok());
  keeper.join();
}

TEST_CASE("kept memory: what the keeper does not hold is refused, naming it", "[kept][migrate]") {
  const std::string migration = migration_name();
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration, 3, 1));
  std::thread keeper([&] { serve_kept_memory(kept, AT_FDCWD); });
  auto other = take_when_served(migration, 4);
  REQUIRE_FALSE(other.ok());
  CHECK_THAT(other.error().message, Catch::Contains("no memory kept for process 4 of migration " + migration));
  auto mine = take_when_served(migration, 3);
  REQUIRE(mine.ok());
  REQUIRE(mine->taken(true).ok());
  keeper.join();
}

TEST_CASE("kept memory: no keeper serves a migration: refused after 3 s, saying so", "[kept][migrate]") {
  const auto t0 = std::chrono::steady_clock::now();
  auto link = KeptMemoryLink::take(migration_name(), 1, 1000);
  REQUIRE_FALSE(link.ok());
  CHECK_THAT(link.error().message, Catch::Contains("no phos-keeper serves migration"));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(2900));
}

// phos-keeper serves once the dump's criu has gone: a restore started the
// moment that criu exited (phosctl migrate) comes first, and waits.
TEST_CASE("kept memory: a restore that comes before the keeper serves waits for it", "[kept][migrate]") {
  const std::string migration = migration_name();
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration, 1, 2));
  std::thread keeper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    serve_kept_memory(kept, AT_FDCWD);
  });
  auto link = KeptMemoryLink::take(migration, 1, 2000);  // at once: nothing listens yet
  REQUIRE(link.ok());
  CHECK(link->fds.size() == 2);
  REQUIRE(link->taken(true).ok());
  keeper.join();
}

TEST_CASE("kept memory: what the dump did not commit is let go at once", "[kept][migrate]") {
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration_name(), 1, 1));
  kept.back().committed = false;
  serve_kept_memory(kept, AT_FDCWD);  // returns: nothing to serve
  CHECK(kept.empty());
}

TEST_CASE("kept memory: several restores at once, each process's memory to one of them", "[kept][migrate]") {
  const std::string migration = migration_name();
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration, 1, 2));
  kept.push_back(kept_process(migration, 2, 3));
  std::thread keeper([&] { serve_kept_memory(kept, AT_FDCWD); });
  // One restore holds process 1's memory while another takes process 2's.
  auto first = take_when_served(migration, 1);
  REQUIRE(first.ok());
  auto second = take_when_served(migration, 2);
  REQUIRE(second.ok());
  CHECK(second->fds.size() == 3);
  // Process 1's is lent: no second restore gets it meanwhile.
  auto twice = take_when_served(migration, 1);
  REQUIRE_FALSE(twice.ok());
  CHECK_THAT(twice.error().message, Catch::Contains("process 1 is being restored by another restore"));
  REQUIRE(second->taken(true).ok());
  REQUIRE(first->taken(true).ok());
  keeper.join();
  CHECK(kept.empty());
}

TEST_CASE("kept memory: a restore that may have run on it spoils it: let go", "[kept][migrate]") {
  const std::string migration = migration_name();
  std::vector<KeptProcess> kept;
  kept.push_back(kept_process(migration, 5, 1));
  std::thread keeper([&] { serve_kept_memory(kept, AT_FDCWD); });
  auto link = take_when_served(migration, 5);
  REQUIRE(link.ok());
  REQUIRE(link->taken(false, /*spoilt=*/true).ok());
  keeper.join();  // nothing kept any more: it returns
  CHECK(kept.empty());
}
