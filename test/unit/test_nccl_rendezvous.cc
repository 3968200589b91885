#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "phos/hooks/nccl_rendezvous.h"
#include "phos/hooks/shm_rendezvous.h"
#include "phos/hooks/store_rendezvous.h"
#include "phos/support/tcp_store_client.h"
#include "phos/support/tcp_store_server.h"

using phos::hooks::NcclMeeting;
using phos::hooks::ShmRendezvous;
using phos::hooks::StoreRendezvous;
using namespace std::chrono_literals;

namespace {
std::string temp_dir() {
  char pattern[] = "/tmp/phos-rdv-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  return pattern;
}
}  // namespace

TEST_CASE("nccl rendezvous, /dev/shm: rank 0's id reaches a rank that waits for it", "[nccl]") {
  std::string dir = temp_dir() + "/meet";
  auto meet = ShmRendezvous::open(dir);
  REQUIRE(meet.ok());
  struct stat st {};
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  std::vector<uint8_t> id(128);
  for (size_t i = 0; i < id.size(); i++) id[i] = uint8_t(i * 7);
  std::thread rank0([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    REQUIRE(meet->leave(NcclMeeting{0xabc, 0x123, 0}, id).ok());
  });
  auto got = meet->wait(NcclMeeting{0xabc, 0x123, 0}, id.size(), std::chrono::seconds(5));
  rank0.join();
  REQUIRE(got.ok());
  CHECK(*got == id);
  // Another nonce (another criu run) is another meeting.
  auto other = meet->wait(NcclMeeting{0xabc, 0x124, 0}, id.size(), std::chrono::milliseconds(20));
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().message.find("no unique id from rank 0") != std::string::npos);
  // A file of the wrong size is no id.
  REQUIRE(meet->leave(NcclMeeting{0xdef, 1, 0}, std::vector<uint8_t>(5)).ok());
  CHECK_FALSE(meet->wait(NcclMeeting{0xdef, 1, 0}, 128, std::chrono::milliseconds(20)).ok());
}

TEST_CASE("nccl rendezvous, /dev/shm: ids older than the age go, newer ones stay", "[nccl]") {
  auto meet = ShmRendezvous::open(temp_dir() + "/meet");
  REQUIRE(meet.ok());
  REQUIRE(meet->leave(NcclMeeting{1, 1, 0}, std::vector<uint8_t>(8)).ok());
  CHECK(meet->prune(std::chrono::seconds(3600)) == 0);
  CHECK(meet->prune(std::chrono::seconds(-10)) == 1);  // everything is older than the future
  CHECK_FALSE(meet->wait(NcclMeeting{1, 1, 0}, 8, std::chrono::milliseconds(10)).ok());
}

TEST_CASE("nccl rendezvous, /dev/shm: a directory open to others is refused", "[nccl]") {
  std::string dir = temp_dir();
  REQUIRE(::chmod(dir.c_str(), 0755) == 0);
  auto meet = ShmRendezvous::open(dir);
  REQUIRE_FALSE(meet.ok());
  CHECK(meet.error().message.find("open to other users") != std::string::npos);
  std::string file = dir + "/f";
  FILE* f = std::fopen(file.c_str(), "w");
  REQUIRE(f);
  std::fclose(f);
  CHECK_FALSE(ShmRendezvous::open(file).ok());  // not a directory
}

namespace {

std::unique_ptr<phos::net::TcpStoreServer> store() {
  auto s = phos::net::TcpStoreServer::start("127.0.0.1", 0);
  REQUIRE(s.ok());
  return std::move(*s);
}
std::unique_ptr<StoreRendezvous> meet_at(const phos::net::TcpStoreServer& s) {
  auto m = StoreRendezvous::connect({"127.0.0.1", s.port()}, phos::net::deadline_in(5s));
  REQUIRE(m.ok());
  return std::move(*m);
}
phos::Result<phos::hooks::RendezvousChoice> choose(std::map<std::string, std::string> env) {
  return phos::hooks::choose_rendezvous([env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST_CASE("nccl rendezvous, store: three ranks meet on rank 0's id and the keys go after", "[nccl]") {
  auto server = store();
  const NcclMeeting m{0xabc, 0x77, 41};
  std::vector<uint8_t> id(128, 3);
  std::vector<std::vector<uint8_t>> got(3);
  std::vector<std::string> errors(3);  // Catch2's assertions stay on this thread
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; r++)
    ranks.emplace_back([&, r] {
      auto meet = StoreRendezvous::connect({"127.0.0.1", server->port()}, phos::net::deadline_in(5s));
      if (!meet) return void(errors[size_t(r)] = meet.error().message);
      phos::Result<void> step;
      if (r == 0) {
        std::this_thread::sleep_for(50ms);
        step = (*meet)->leave(m, id);
        got[0] = id;
      } else {
        auto g = (*meet)->wait(m, id.size(), 5s);
        if (g) got[size_t(r)] = *g;
        else step = g.error();
      }
      if (step) step = (*meet)->arrive(m, r, 3);
      if (step) step = (*meet)->wait_all(m, 3, 5s);
      if (!step) errors[size_t(r)] = step.error().message;
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) CHECK(e.empty());
  for (const auto& g : got) CHECK(g == id);
  auto probe = phos::net::TcpStoreClient::connect("127.0.0.1", server->port(), phos::net::deadline_in(5s));
  REQUIRE(probe.ok());
  CHECK(*probe->num_keys() == 0);  // the last to leave deleted them
}

TEST_CASE("nccl rendezvous, store: its keys name the job, the run and the held call", "[nccl]") {
  CHECK(StoreRendezvous::key(NcclMeeting{0xabc, 0x12, 7}, "id") == "phos/nccl/0000000000000abc/0000000000000012/7/id");
}

TEST_CASE("nccl rendezvous, store: ranks held at another call never meet", "[nccl]") {
  auto server = store();
  auto rank0 = meet_at(*server), rank1 = meet_at(*server);
  REQUIRE(rank0->leave(NcclMeeting{1, 2, 10}, std::vector<uint8_t>(8, 1)).ok());
  auto g = rank1->wait(NcclMeeting{1, 2, 11}, 8, 100ms);
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().code == ETIMEDOUT);
  CHECK(g.error().message.find("no unique id from rank 0 at TCPStore 127.0.0.1:") != std::string::npos);
}

TEST_CASE("nccl rendezvous, store: a rank that never comes fails the wait, saying how many", "[nccl]") {
  auto server = store();
  auto meet = meet_at(*server);
  const NcclMeeting m{5, 6, 0};
  REQUIRE(meet->arrive(m, 0, 2).ok());
  auto all = meet->wait_all(m, 2, 100ms);
  REQUIRE_FALSE(all.ok());
  CHECK(all.error().code == ETIMEDOUT);
  CHECK(all.error().message.find("not every one of 2 ranks came") != std::string::npos);
}

TEST_CASE("nccl rendezvous, store: an id of the wrong size is refused", "[nccl]") {
  auto server = store();
  auto meet = meet_at(*server);
  REQUIRE(meet->leave(NcclMeeting{1, 1, 1}, std::vector<uint8_t>(5)).ok());
  auto g = meet->wait(NcclMeeting{1, 1, 1}, 128, 1s);
  REQUIRE_FALSE(g.ok());
  CHECK(g.error().message.find("not a unique id of 128 bytes") != std::string::npos);
}

TEST_CASE("nccl rendezvous, choice: PHOS_NCCL_STORE first, then MASTER_ADDR:MASTER_PORT, then the directory", "[nccl]") {
  auto c = choose({{"PHOS_NCCL_STORE", "10.0.0.1:5"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "6"}});
  REQUIRE(c.ok());
  CHECK(c->store);
  CHECK(c->at.text() == "10.0.0.1:5");
  c = choose({{"MASTER_ADDR", "10.77.0.1"}, {"MASTER_PORT", "29500"}});
  REQUIRE(c.ok());
  CHECK(c->store);
  CHECK(c->at.text() == "10.77.0.1:29500");
  CHECK(c->why == "MASTER_ADDR and MASTER_PORT");
  c = choose({{"PHOS_NCCL_RENDEZVOUS_DIR", "/tmp/x"}});
  REQUIRE(c.ok());
  CHECK_FALSE(c->store);
  CHECK(c->dir == "/tmp/x");
}

TEST_CASE("nccl rendezvous, choice: PHOS_NCCL_STORE=off keeps a torch job on the directory", "[nccl]") {
  auto c = choose({{"PHOS_NCCL_STORE", "off"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "6"}});
  REQUIRE(c.ok());
  CHECK_FALSE(c->store);
  CHECK(c->why == "PHOS_NCCL_STORE=off");
}

TEST_CASE("nccl rendezvous, choice: a bad address is an error naming the variable", "[nccl]") {
  auto c = choose({{"PHOS_NCCL_STORE", "nohost"}});
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("PHOS_NCCL_STORE=nohost") != std::string::npos);
  c = choose({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "99999"}});
  REQUIRE_FALSE(c.ok());
  CHECK(c.error().message.find("MASTER_PORT=99999") != std::string::npos);
}

TEST_CASE("nccl rendezvous, store: nobody serving the store fails the opening by its deadline", "[nccl]") {
  uint16_t port = 0;
  {
    auto s = store();
    port = s->port();
  }
  auto choice = choose({{"PHOS_NCCL_STORE", "127.0.0.1:" + std::to_string(port)}});
  REQUIRE(choice.ok());
  auto meet = phos::hooks::open_rendezvous(*choice, phos::net::deadline_in(200ms));
  REQUIRE_FALSE(meet.ok());
  CHECK(meet.error().code == ECONNREFUSED);
  CHECK(meet.error().message.find("the rendezvous (PHOS_NCCL_STORE)") != std::string::npos);
}
