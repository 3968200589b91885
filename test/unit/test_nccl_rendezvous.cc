#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "phos/hooks/nccl_rendezvous.h"

using phos::hooks::NcclRendezvous;

namespace {
std::string temp_dir() {
  char pattern[] = "/tmp/phos-rdv-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  return pattern;
}
}  // namespace

TEST_CASE("nccl rendezvous: rank 0's id reaches a rank that waits for it", "[nccl]") {
  std::string dir = temp_dir() + "/meet";
  auto meet = NcclRendezvous::open(dir);
  REQUIRE(meet.ok());
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); i++) id[i] = uint8_t(i * 7);
  std::thread rank0([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    REQUIRE(meet->leave(0xabc, 0x123, id).ok());
  });
  auto got = meet->wait(0xabc, 0x123, id.size(), std::chrono::seconds(5));
  rank0.join();
  REQUIRE(got.ok());
  CHECK(*got == id);
  // Another nonce (another criu run) is another meeting.
  auto other = meet->wait(0xabc, 0x124, id.size(), std::chrono::milliseconds(20));
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().message.find("no unique id from rank 0") != std::string::npos);
  // A file of the wrong size is no id.
  REQUIRE(meet->leave(0xdef, 1, std::vector<uint8_t>(5)).ok());
  CHECK_FALSE(meet->wait(0xdef, 1, 128, std::chrono::milliseconds(20)).ok());
}

TEST_CASE("nccl rendezvous: ids older than the age go, newer ones stay", "[nccl]") {
  auto meet = NcclRendezvous::open(temp_dir() + "/meet");
  REQUIRE(meet.ok());
  REQUIRE(meet->leave(1, 1, std::vector<uint8_t>(8)).ok());
  CHECK(meet->prune(std::chrono::seconds(3600)) == 0);
  CHECK(meet->prune(std::chrono::seconds(-10)) == 1);  // everything is older than the future
  CHECK_FALSE(meet->wait(1, 1, 8, std::chrono::milliseconds(10)).ok());
}

TEST_CASE("nccl rendezvous: a directory open to others is refused", "[nccl]") {
  std::string dir = temp_dir();
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  auto meet = NcclRendezvous::open(dir);
  REQUIRE_FALSE(meet.ok());
  CHECK(meet.error().message.find("open to other users") != std::string::npos);
  std::string file = dir + "/f";
  FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f);
  std::fclose(f);
  CHECK_FALSE(NcclRendezvous::open(file).ok());  // not a directory
}
