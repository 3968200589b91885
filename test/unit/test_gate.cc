#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "phos/hooks/gate.h"

using phos::hooks::Gate;
using phos::hooks::GatePass;
using namespace std::chrono_literals;

TEST_CASE("gate: open gate admits calls", "[gate]") {
  Gate g;
  CHECK(g.is_open());
  {
    GatePass p(g);
    CHECK(g.inside() == 1);
  }
  CHECK(g.inside() == 0);
}

TEST_CASE("gate: close waits for the call inside", "[gate]") {
  Gate g;
  std::atomic<bool> left{false};
  g.enter();
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    left = true;
    g.leave();
  });
  CHECK(g.close(2000ms));
  CHECK(left.load());
  CHECK_FALSE(g.is_open());
  t.join();
  g.open();
}

TEST_CASE("gate: close times out and reopens when a call never leaves", "[gate]") {
  Gate g;
  g.enter();
  CHECK_FALSE(g.close(30ms));
  CHECK(g.is_open());
  g.leave();
}

TEST_CASE("gate: inside() sums the calls of every thread", "[gate]") {
  Gate g;
  g.enter();
  std::atomic<int> entered{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; i++)
    threads.emplace_back([&] {
      GatePass p(g);
      entered++;
      while (!release) std::this_thread::sleep_for(1ms);
    });
  while (entered < 3) std::this_thread::sleep_for(1ms);
  CHECK(g.inside() == 4);
  release = true;
  for (auto& t : threads) t.join();
  CHECK(g.inside() == 1);
  g.leave();
  CHECK(g.inside() == 0);
}

TEST_CASE("gate: calls wait while closed and proceed when opened", "[gate]") {
  Gate g;
  REQUIRE(g.close(100ms));
  std::atomic<bool> passed{false};
  std::thread t([&] {
    GatePass p(g);
    passed = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(passed.load());
  g.open();
  t.join();
  CHECK(passed.load());
}

TEST_CASE("gate: no call is inside while closed, under contention", "[gate][stress]") {
  // 4 threads on stripes of their own; more threads than stripes share them.
  size_t thread_count = GENERATE(size_t(4), phos::hooks::kThreadStripes + 8);
  Gate g;
  std::atomic<bool> stop{false}, closed_now{false};
  std::atomic<int> violations{0};
  std::atomic<uint64_t> calls{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < thread_count; i++)
    threads.emplace_back([&] {
      while (!stop) {
        GatePass p(g);
        if (closed_now) violations++;
        calls++;
      }
    });
  // Fewer rounds with many threads: on a machine of 2 cores each close waits
  // for threads that are inside but not running.
  int rounds = thread_count > 8 ? 20 : 200;
  for (int round = 0; round < rounds; round++) {
    REQUIRE(g.close(2000ms));
    closed_now = true;
    std::this_thread::sleep_for(100us);
    closed_now = false;
    g.open();
  }
  stop = true;
  for (auto& t : threads) t.join();
  CHECK(violations == 0);
  CHECK(calls > 0);
}
