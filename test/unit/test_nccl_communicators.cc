#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "phos/hooks/nccl_communicators.h"

using phos::hooks::NcclCommunicator;
using phos::hooks::NcclCommunicators;

namespace {
NcclCommunicator comm(uint64_t handle, int rank, int nranks, int device = 0, uint64_t parent = 0, int color = 0,
                      int key = 0, bool single_process = false, uint64_t job_id = 0) {
  NcclCommunicator c;
  c.handle = handle;
  c.rank = rank;
  c.nranks = nranks;
  c.device = device;
  c.parent = parent;
  c.color = color;
  c.key = key;
  c.single_process = single_process;
  c.job_id = job_id;
  return c;
}
}  // namespace

TEST_CASE("nccl communicators: created ones are listed in order, destroyed ones go", "[nccl]") {
  NcclCommunicators c;
  c.created(comm(0x1000, 0, 2, 0, 0, 0, 0));
  c.created(comm(0x2000, 1, 1, 0, 0, 0, 0));
  c.created(comm(0x3000, 0, 2, 0, 0x1000, 7, 3));  // split from 0x1000
  auto l = c.list();
  REQUIRE(l.size() == 3);
  CHECK(l[0].handle == 0x1000);
  CHECK(l[2].parent == 0x1000);
  CHECK(l[2].color == 7);
  CHECK(l[2].key == 3);
  CHECK(c.spanning_processes() == 2);  // the single-rank one does not count
  c.created(comm(0x4000, 0, 2, 0, 0, 0, 0, true));  // ncclCommInitAll: both ranks here
  CHECK(c.spanning_processes() == 2);
  c.destroyed(0x4000);
  c.destroyed(0x1000);
  CHECK_FALSE(c.find(0x1000).has_value());
  CHECK(c.find(0x3000)->rank == 0);
  CHECK(c.spanning_processes() == 1);
  c.destroyed(0x9999);  // not ours: nothing happens
  CHECK(c.list().size() == 2);
}

TEST_CASE("nccl communicators: a handle created again replaces the old entry", "[nccl]") {
  NcclCommunicators c;
  c.created(comm(0x1000, 0, 4, 0, 0, 0, 0));
  c.created(comm(0x1000, 3, 8, 1, 0, 0, 0));  // destroyed behind phos's back, the address reused
  REQUIRE(c.list().size() == 1);
  CHECK(c.find(0x1000)->nranks == 8);
  CHECK(c.find(0x1000)->device == 1);
}

TEST_CASE("nccl communicators: creations and destructions from several threads", "[nccl]") {
  NcclCommunicators c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&c, t] {
      for (uint64_t i = 0; i < 1000; i++) {
        uint64_t h = (uint64_t(t) << 32) | (i + 1);
        c.created(comm(h, t, 4, t, 0, 0, 0));
        if (i % 2) c.destroyed(h);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(c.list().size() == 4 * 500);
  CHECK(c.spanning_processes() == 4 * 500);
}

TEST_CASE("nccl communicators: calls are counted on their communicator; the job id names it on every rank", "[nccl]") {
  NcclCommunicators c;
  const uint64_t h = c.new_handle();  // calls are counted on phos's handles
  unsigned char id[128] = {1, 2, 3};
  uint64_t job = phos::hooks::nccl_job_id(id, sizeof(id));
  c.created(comm(h, 0, 2, 0, 0, 0, 0, false, job));
  c.count_call(h);
  c.count_call(h);
  c.count_call(0x2000);  // not created through the hooks: not counted anywhere
  CHECK(c.find(h)->calls == 2);
  CHECK(phos::hooks::nccl_job_id(id, sizeof(id)) == job);  // what another rank computes from the same id
  id[127] = 1;
  CHECK(phos::hooks::nccl_job_id(id, sizeof(id)) != job);
  CHECK(phos::hooks::nccl_split_job_id(job, 0, 0) != phos::hooks::nccl_split_job_id(job, 1, 0));
  CHECK(phos::hooks::nccl_split_job_id(job, 0, 0) == phos::hooks::nccl_split_job_id(job, 0, 0));
  CHECK(phos::hooks::nccl_split_job_id(job, 0, 0) != phos::hooks::nccl_split_job_id(job, 0, 1));
}

TEST_CASE("nccl communicators: a stop holds the call it is armed at until disarmed", "[nccl]") {
  NcclCommunicators c;
  const uint64_t h = c.new_handle();  // calls are counted on phos's handles
  c.created(comm(h, 0, 2, 0, 0, 0, 0, false, 0xabc));
  REQUIRE(c.arm_stop(0xabc, 5));
  CHECK_FALSE(c.arm_stop(0xdef, 5));  // no communicator of that job here
  std::atomic<int> issued{0};
  std::thread program([&] {
    for (int i = 0; i < 10; i++) {
      c.count_call(h);
      issued++;
    }
  });
  for (int i = 0; i < 2000 && !c.find(h)->held; i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(c.find(h)->held);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(issued == 5);  // calls 0..4 went through; call 5 waits before it is issued
  CHECK(c.find(h)->calls == 5);
  CHECK_FALSE(c.arm_stop(0xabc, 3));  // already issued
  c.disarm(0xabc);
  program.join();
  CHECK(issued == 10);
  CHECK(c.find(h)->calls == 10);
  CHECK_FALSE(c.find(h)->held);
}

TEST_CASE("nccl communicators: a stop armed while calls race on never lets its call through", "[nccl]") {
  NcclCommunicators c;
  const uint64_t h = c.new_handle();
  c.created(comm(h, 0, 2, 0, 0, 0, 0, false, 0xabc));
  std::atomic<bool> done{false};
  std::thread program([&] {
    while (!done) c.count_call(h);
  });
  int armed = 0;
  for (int round = 0; round < 3000; round++) {
    // At the count just read: the program is issuing that very call.
    const uint64_t at = c.find(h)->calls;
    if (c.arm_stop(0xabc, at)) {
      armed++;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!c.find(h)->held && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      REQUIRE(c.find(h)->held);
      REQUIRE(c.find(h)->calls == at);  // held before call `at`, never after it
    }
    c.disarm(0xabc);
  }
  done = true;
  program.join();
  INFO("stops armed: " << armed);
  CHECK(armed > 0);
}

TEST_CASE("nccl communicators: a held call is let go when its communicator is destroyed", "[nccl]") {
  NcclCommunicators c;
  const uint64_t h = c.new_handle();  // calls are counted on phos's handles
  c.created(comm(h, 0, 2, 0, 0, 0, 0, false, 0xabc));
  REQUIRE(c.arm_stop(0xabc, 0));
  std::thread program([&] { c.count_call(h); });
  for (int i = 0; i < 2000 && !c.find(h)->held; i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(c.find(h)->held);
  c.destroyed(h);  // another thread of the program aborts it
  program.join();
  CHECK(c.list().empty());
}

TEST_CASE("nccl communicators: stable handles translate to NCCL's communicator of now", "[nccl]") {
  NcclCommunicators c;
  uint64_t h = c.new_handle();
  REQUIRE(h != 0);
  CHECK(c.owns(h));
  CHECK_FALSE(c.owns(0x1000));
  CHECK(c.real_of(0x1000) == 0x1000);  // not ours: passed through
  NcclCommunicator made = comm(h, 0, 1);
  made.real = 0xabc0;
  c.created(made);
  CHECK(c.real_of(h) == 0xabc0);
  c.set_real(h, 0);  // released
  CHECK(c.real_of(h) == 0);
  CHECK(c.find(h)->released());
  c.set_real(h, 0xdef0);  // made again
  CHECK(c.real_of(h) == 0xdef0);
  CHECK_FALSE(c.find(h)->released());
  CHECK(c.find(h)->rebuilds == 1);
  c.destroyed(h);
  CHECK(c.real_of(h) == 0);
  CHECK(c.new_handle() == h);  // free again
}

TEST_CASE("nccl communicators: handles run out, then come back", "[nccl]") {
  NcclCommunicators c;
  std::vector<uint64_t> all;
  for (size_t i = 0; i < NcclCommunicators::kMaxHandles; i++) all.push_back(c.new_handle());
  CHECK(std::find(all.begin(), all.end(), 0u) == all.end());
  CHECK(c.new_handle() == 0);
  c.created(comm(all[7], 0, 1));
  c.destroyed(all[7]);
  CHECK(c.new_handle() == all[7]);
}

TEST_CASE("nccl communicators: a release waits for the tickets held, new ones wait for it", "[nccl]") {
  NcclCommunicators c;
  REQUIRE(c.enter());
  CHECK_FALSE(c.begin_release(std::chrono::milliseconds(20)));  // one still held: given up
  CHECK_FALSE(c.release_pending());
  std::thread leaver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    c.leave();
  });
  CHECK(c.begin_release(std::chrono::milliseconds(5000)));
  leaver.join();
  CHECK(c.release_pending());
  CHECK_FALSE(c.enter(false));  // a query does not wait
  std::atomic<bool> entered{false};
  std::thread caller([&] {
    c.enter();
    entered = true;
    c.leave();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK_FALSE(entered.load());
  c.end_release();
  caller.join();
  CHECK(entered.load());
}

TEST_CASE("nccl communicators: which ones can be made again", "[nccl]") {
  NcclCommunicator alone = comm(0x1000, 0, 1);
  CHECK_FALSE(phos::hooks::nccl_why_not_recreatable(alone));
  NcclCommunicator set = comm(0x2000, 1, 2, 1, 0, 0, 0, true);
  set.origin = phos::hooks::NcclOrigin::kInitAll;
  CHECK_FALSE(phos::hooks::nccl_why_not_recreatable(set));
  NcclCommunicator split_of_set = comm(0x3000, 0, 2, 0, 0x2000, 1, 0, true);
  split_of_set.origin = phos::hooks::NcclOrigin::kSplit;
  CHECK(phos::hooks::nccl_why_not_recreatable(split_of_set));
  alone.extras = 1;  // a buffer registration
  CHECK(phos::hooks::nccl_why_not_recreatable(alone)->find("registration") != std::string::npos);
  NcclCommunicators c;
  c.created(alone);
  c.created(set);
  auto why = c.not_recreatable();
  REQUIRE(why.size() == 1);
  CHECK(why[0].find("rank 0 of 1") != std::string::npos);
  c.count_extra(0x1000, -1);
  CHECK(c.not_recreatable().empty());
}

TEST_CASE("nccl communicators: splits of one parent are numbered in order", "[nccl]") {
  NcclCommunicators c;
  CHECK(c.next_split(0x1000) == 0);
  CHECK(c.next_split(0x1000) == 1);
  CHECK(c.next_split(0x2000) == 0);
  c.created(comm(0x1000, 0, 2));
  c.destroyed(0x1000);  // a new communicator at that address starts again
  CHECK(c.next_split(0x1000) == 0);
}

TEST_CASE("nccl communicators: a call that may not be held passes a stop, the next one holds", "[nccl]") {
  NcclCommunicators c;
  const uint64_t h = c.new_handle();  // calls are counted on phos's handles
  c.created(comm(h, 0, 2, 0, 0, 0, 0, false, 77));
  REQUIRE(c.arm_stop(77, 1));
  c.count_call(h);         // call 0
  c.count_call(h, false);  // call 1, inside a group: passes the stop
  CHECK(c.find(h)->calls == 2);
  std::atomic<bool> through{false};
  std::thread t([&] {
    c.count_call(h);  // call 2: held (past the stop)
    through = true;
  });
  for (int i = 0; i < 200 && !c.find(h)->held; i++) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(c.find(h)->held);
  CHECK_FALSE(through.load());
  c.disarm(77);
  t.join();
  CHECK(through.load());
  CHECK(c.find(h)->calls == 3);
}
