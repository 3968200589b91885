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
  Gate g;
  std::atomic<bool> stop{false}, closed_now{false};
  std::atomic<int> violations{0};
  std::atomic<uint64_t> calls{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; i++)
    threads.emplace_back([&] {
      while (!stop) {
        GatePass p(g);
        if (closed_now) violations++;
        calls++;
      }
    });
  for (int round = 0; round < 200; round++) {
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
