#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "phos/hooks/nccl_communicators.h"

using phos::hooks::NcclCommunicator;
using phos::hooks::NcclCommunicators;

TEST_CASE("nccl communicators: created ones are listed in order, destroyed ones go", "[nccl]") {
  NcclCommunicators c;
  c.created({0x1000, 0, 2, 0, 0, 0, 0});
  c.created({0x2000, 1, 1, 0, 0, 0, 0});
  c.created({0x3000, 0, 2, 0, 0x1000, 7, 3});  // split from 0x1000
  auto l = c.list();
  REQUIRE(l.size() == 3);
  CHECK(l[0].handle == 0x1000);
  CHECK(l[2].parent == 0x1000);
  CHECK(l[2].color == 7);
  CHECK(l[2].key == 3);
  CHECK(c.spanning_processes() == 2);  // the single-rank one does not count
  c.created({0x4000, 0, 2, 0, 0, 0, 0, true});  // ncclCommInitAll: both ranks here
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
  c.created({0x1000, 0, 4, 0, 0, 0, 0});
  c.created({0x1000, 3, 8, 1, 0, 0, 0});  // destroyed behind phos's back, the address reused
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
        c.created({h, t, 4, t, 0, 0, 0});
        if (i % 2) c.destroyed(h);
      }
    });
  for (auto& th : threads) th.join();
  CHECK(c.list().size() == 4 * 500);
  CHECK(c.spanning_processes() == 4 * 500);
}

TEST_CASE("nccl communicators: calls are counted on their communicator; the job id names it on every rank", "[nccl]") {
  NcclCommunicators c;
  unsigned char id[128] = {1, 2, 3};
  uint64_t job = phos::hooks::nccl_job_id(id, sizeof(id));
  c.created({0x1000, 0, 2, 0, 0, 0, 0, false, job, 0});
  c.count_call(0x1000);
  c.count_call(0x1000);
  c.count_call(0x2000);  // not created through the hooks: not counted anywhere
  CHECK(c.find(0x1000)->calls == 2);
  CHECK(phos::hooks::nccl_job_id(id, sizeof(id)) == job);  // what another rank computes from the same id
  id[127] = 1;
  CHECK(phos::hooks::nccl_job_id(id, sizeof(id)) != job);
  CHECK(phos::hooks::nccl_split_job_id(job, 0) != phos::hooks::nccl_split_job_id(job, 1));
  CHECK(phos::hooks::nccl_split_job_id(job, 0) == phos::hooks::nccl_split_job_id(job, 0));
}
