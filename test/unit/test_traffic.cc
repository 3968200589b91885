// The engine's traffic control (phos/plugin/traffic.h): it gives way to the
// program's own transfers between host and device, within its bounds.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "phos/images/copy_state.h"
#include "phos/plugin/traffic.h"
#include "phos/support/clock.h"

using namespace phos;
using namespace phos::copystate;
using phos::plugin::TrafficControl;
using phos::plugin::TrafficPolicy;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMs = 1'000'000;

CopyState table(CopyProtocol p = CopyProtocol::kSoftRecopy) {
  auto s = CopyState::create(p, 4096, std::vector<Region>{{1, 0x100000, 16 * 4096}}, 0);
  REQUIRE(s.ok());
  return std::move(s.value());
}

TrafficPolicy policy(std::chrono::milliseconds max_pause) {
  TrafficPolicy p;
  p.max_pause = max_pause;
  return p;
}

// The program's link estimated busy for 5 s from now.
void busy_for_5s(CopyState& s) {
  s.set_transfer_rate(1'000'000'000);
  s.transfer_queued(5000 * kMs, realtime_ns());
}

// A write of the program to a chunk not yet copied, with no pool: it waits
// for the engine (the table's urgent list).
std::thread write_waiting_for_engine(CopyState& s) {
  return std::thread([&s] {
    CHECK(s.before_write(0x100000, 8, [](uint64_t, uint64_t, uint32_t) -> Result<void> { return {}; }, 5s).ok());
  });
}

// The engine copies the chunk the write waits for; the write goes on.
void copy_urgent(CopyState& s, std::thread& writer) {
  auto c = s.claim_urgent();
  REQUIRE(c);
  s.copied(*c);
  writer.join();
}

}  // namespace

TEST_CASE("traffic: no pause while the program moves nothing", "[traffic]") {
  CopyState s = table();
  TrafficControl t(s, true);
  CHECK(t.before_claim(UINT64_MAX) == 0);
  CHECK(t.pauses() == 0);
  CHECK(t.paused_ns() == 0);
}

TEST_CASE("traffic: off never pauses, whatever is queued", "[traffic]") {
  CopyState s = table();
  busy_for_5s(s);
  TrafficControl t(s, false, policy(1000ms));
  const uint64_t t0 = monotonic_ns();
  CHECK(t.before_claim(UINT64_MAX) == 0);
  CHECK(monotonic_ns() - t0 < 50 * kMs);
  CHECK(t.pauses() == 0);
}

TEST_CASE("traffic: a queued transfer holds the claim for its estimate", "[traffic]") {
  CopyState s = table();
  s.set_transfer_rate(1'000'000'000);
  s.transfer_queued(30 * kMs, realtime_ns());  // 30 ms at 1 byte per ns
  TrafficControl t(s, true, policy(5000ms));
  const uint64_t paused = t.before_claim(UINT64_MAX);
  CHECK(paused >= 25 * kMs);
  CHECK(paused < 1000 * kMs);
  CHECK(t.before_claim(UINT64_MAX) == 0);  // done by the estimate
  CHECK(t.pauses() == 1);
}

TEST_CASE("traffic: a pause lasts at most max_pause: the copy still moves", "[traffic]") {
  CopyState s = table();
  busy_for_5s(s);
  TrafficControl t(s, true, policy(30ms));
  for (int i = 0; i < 2; i++) {
    const uint64_t paused = t.before_claim(UINT64_MAX);
    CHECK(paused >= 30 * kMs);
    CHECK(paused < 500 * kMs);
  }
  CHECK(t.pauses() == 2);
}

TEST_CASE("traffic: a pause never runs past the deadline", "[traffic]") {
  CopyState s = table();
  busy_for_5s(s);
  TrafficControl t(s, true, policy(5000ms));
  SECTION("a deadline ahead") {
    const uint64_t deadline = monotonic_ns() + 20 * kMs;
    t.before_claim(deadline);
    // The last poll sleeps to the deadline, no further (the scheduler may
    // wake it a little late).
    CHECK(monotonic_ns() >= deadline);
    CHECK(monotonic_ns() < deadline + 100 * kMs);
    CHECK(t.pauses() == 1);
  }
  SECTION("a deadline passed") {
    CHECK(t.before_claim(monotonic_ns() - 1) == 0);
    CHECK(t.pauses() == 0);
  }
  SECTION("a queued estimate past the deadline, the bound further still") {
    const uint64_t deadline = monotonic_ns() + 20 * kMs;
    t.before_claim(deadline);
    CHECK(monotonic_ns() < deadline + 100 * kMs);
  }
}

TEST_CASE("traffic: no pause while a call of the program waits for a chunk", "[traffic]") {
  CopyState s = table(CopyProtocol::kSoftCopyOnWrite);  // no pool: a write waits for the engine
  busy_for_5s(s);
  std::thread writer = write_waiting_for_engine(s);
  for (int i = 0; i < 2000 && !s.urgent_waiting(); i++) std::this_thread::sleep_for(1ms);
  REQUIRE(s.urgent_waiting());
  TrafficControl t(s, true, policy(5000ms));
  const uint64_t t0 = monotonic_ns();
  t.before_claim(UINT64_MAX);
  CHECK(monotonic_ns() - t0 < 100 * kMs);
  copy_urgent(s, writer);
}

TEST_CASE("traffic: workers pausing at once count each pause, their time summed", "[traffic]") {
  CopyState s = table();
  busy_for_5s(s);
  TrafficControl t(s, true, policy(20ms));
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; i++) workers.emplace_back([&] { t.before_claim(UINT64_MAX); });
  for (auto& w : workers) w.join();
  CHECK(t.pauses() == 4);
  CHECK(t.paused_ns() >= 4 * 20 * kMs);
}

TEST_CASE("traffic: a pause for a queued transfer ends when a call starts waiting for a chunk", "[traffic]") {
  CopyState s = table(CopyProtocol::kSoftCopyOnWrite);  // no pool: a write waits for the engine
  busy_for_5s(s);
  TrafficControl t(s, true, policy(5000ms));
  std::atomic<uint64_t> paused{0};
  std::thread engine([&] { paused = t.before_claim(UINT64_MAX); });
  std::this_thread::sleep_for(30ms);
  std::thread writer = write_waiting_for_engine(s);
  engine.join();
  CHECK(paused >= 25 * kMs);
  CHECK(paused < 1000 * kMs);  // ended by the waiting call, not the 5 s estimate
  copy_urgent(s, writer);
}

TEST_CASE("traffic: a queued estimate on the wall clock ends the pause once it is done", "[traffic]") {
  CopyState s = table();
  s.set_transfer_rate(1'000'000'000);
  // Queued by a process whose monotonic clock is far ahead of ours: an
  // estimate in its monotonic time would hold every claim to the bound.
  s.transfer_queued(1 * kMs, realtime_ns());
  TrafficControl t(s, true, policy(5000ms));
  CHECK(t.before_claim(UINT64_MAX) < 500 * kMs);
  CHECK(s.traffic().busy(realtime_ns() + 10 * kMs) == false);
}
