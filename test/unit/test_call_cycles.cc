#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "phos/hooks/call_cycles.h"
#include "phos/hooks/gate.h"

using phos::hooks::CallCycles;
using phos::hooks::CallKind;
using phos::hooks::CallScope;
using phos::hooks::Gate;
using phos::hooks::GatePass;
using phos::hooks::forwarded_call;
using namespace std::chrono_literals;

namespace {

std::map<CallKind, uint64_t> calls_by_kind(const CallCycles& c) {
  std::map<CallKind, uint64_t> out;
  for (const auto& k : c.totals()) out[k.kind] = k.calls;
  return out;
}

double ms_of(const CallCycles& c, CallKind kind) {
  for (const auto& k : c.totals())
    if (k.kind == kind) return double(k.cycles) * 1e3 / c.cycles_per_second();
  return 0;
}

// Runs on the CPU for `d` of wall time: phos's own work, as a hook does it.
void spin(std::chrono::microseconds d) {
  auto end = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < end) {
  }
}

// The counter of each test is the process's counting one while the test
// runs, and never after it.
struct Counting {
  explicit Counting(CallCycles& c) : c_(c) { c_.set_on(true); }
  ~Counting() { c_.set_on(false); }
  CallCycles& c_;
};

}  // namespace

TEST_CASE("call cycles: a known sequence of calls is counted by kind", "[call_cycles]") {
  CallCycles c(8);
  Counting on(c);
  Gate gate;
  for (int i = 0; i < 3; i++) {
    GatePass pass(gate, 1);
    // A library call's work coming back into phos, twice: its own kind.
    forwarded_call(1, [] {
      CallScope inner(5);
      return 0;
    });
    forwarded_call(1, [] {
      CallScope inner(5);
      return 0;
    });
  }
  { CallScope once([] { return CallKind(7); }); }
  { GatePass uncounted(gate); }  // a pass without a kind (the validator's builds)
  CHECK(calls_by_kind(c) == std::map<CallKind, uint64_t>{{1, 3}, {5, 6}, {7, 1}});
  CHECK(gate.inside() == 0);
}

TEST_CASE("call cycles: off, nothing is counted and no kind is asked for", "[call_cycles]") {
  CallCycles c(8);
  Gate gate;
  bool asked = false;
  {
    GatePass pass(gate, 2);
    CallScope scope([&] {
      asked = true;
      return CallKind(3);
    });
  }
  CHECK_FALSE(c.on());
  CHECK(phos::hooks::call_cycles_counting() == nullptr);
  CHECK(c.totals().empty());
  CHECK_FALSE(asked);

  // On, then off again: what was counted stays, nothing more is added.
  c.set_on(true);
  { GatePass pass(gate, 2); }
  c.set_on(false);
  { GatePass pass(gate, 2); }
  CHECK(calls_by_kind(c) == std::map<CallKind, uint64_t>{{2, 1}});
}

TEST_CASE("call cycles: the forwarded call is left out, phos's own calls and nested hooks are not",
          "[call_cycles]") {
  CallCycles c(8);
  Counting on(c);
  {
    CallScope outer(1);
    spin(2000us);  // phos's work before the forwarded call
    // A driver call of another function, made by phos for itself: its cost.
    forwarded_call(4, [] {
      std::this_thread::sleep_for(3ms);
      return 0;
    });
    forwarded_call(1, [] {
      {
        // The library's work calls back into phos (cuBLAS's launches).
        CallScope inner(2);
        spin(1000us);
        forwarded_call(2, [] {
          std::this_thread::sleep_for(20ms);  // the driver's work: not phos's
          return 0;
        });
      }
      std::this_thread::sleep_for(20ms);  // the library's own work: not phos's either
      return 0;
    });
    spin(1000us);
  }
  double outer_ms = ms_of(c, 1), inner_ms = ms_of(c, 2);
  INFO("outer " << outer_ms << " ms, inner " << inner_ms << " ms");
  // 2 + 3 + 1 ms; the scheduler may add to a spin, but not 20 ms sleeps.
  CHECK(outer_ms >= 5.9);
  CHECK(outer_ms < 6.0 + 15.0);
  CHECK(inner_ms >= 0.95);
  CHECK(inner_ms < 1.0 + 15.0);
}

TEST_CASE("call cycles: threads count apart and are summed; an exited thread's block serves the next",
          "[call_cycles]") {
  CallCycles c(4);
  Counting on(c);
  auto calls = [](int n) {
    for (int i = 0; i < n; i++) {
      CallScope scope(3);
      forwarded_call(3, [] { return 0; });
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) threads.emplace_back(calls, 1000);
  for (auto& t : threads) t.join();
  CHECK(calls_by_kind(c) == std::map<CallKind, uint64_t>{{3, 4000}});
  std::thread later(calls, 500);
  later.join();
  CHECK(calls_by_kind(c) == std::map<CallKind, uint64_t>{{3, 4500}});
}

TEST_CASE("call cycles: scopes nested past the stack's depth are not counted and leave it whole",
          "[call_cycles]") {
  CallCycles c(4);
  Counting on(c);
  {
    std::vector<std::unique_ptr<CallScope>> scopes;
    for (int i = 0; i < 40; i++) scopes.push_back(std::make_unique<CallScope>(CallKind(1)));
    while (!scopes.empty()) scopes.pop_back();
  }
  auto before = calls_by_kind(c)[1];
  CHECK(before >= 1);
  CHECK(before < 40);
  { CallScope after(2); }
  CHECK(calls_by_kind(c) == std::map<CallKind, uint64_t>{{1, before}, {2, 1}});
  // A kind out of range counts nowhere, and breaks nothing.
  { CallScope outside(99); }
  CHECK(calls_by_kind(c) == std::map<CallKind, uint64_t>{{1, before}, {2, 1}});
}

TEST_CASE("call cycles: the clock's rate turns cycles into wall time", "[call_cycles]") {
  CallCycles c(2);
  Counting on(c);
  double rate = c.cycles_per_second();
  CHECK(rate > 1e8);
  CHECK(rate < 1e11);
  {
    CallScope scope(0);
    spin(10000us);
  }
  double ms = ms_of(c, 0);
  CHECK(ms >= 9.0);
  CHECK(ms < 10.0 + 15.0);
}

TEST_CASE("call cycles: the counter's own floor is measured, small and the same each time", "[call_cycles]") {
  double floor = CallCycles::floor_cycles_per_call();
  CHECK(floor > 0);
  CHECK(floor < 2000);  // cycles: well under a microsecond
  CHECK(CallCycles::floor_cycles_per_call() == floor);
  // Measured apart: no counter is left counting, none of its calls show.
  CHECK(phos::hooks::call_cycles_counting() == nullptr);
}

namespace {
struct Traced {
  CallCycles::TracedCall call;
  bool last;
};
std::vector<Traced> g_traced;
void keep_traced(const CallCycles::TracedCall& c, bool last, uint64_t) { g_traced.push_back({c, last}); }
}  // namespace

TEST_CASE("call cycles: the slow-call trace times the outermost calls after it is armed", "[call_cycles]") {
  CallCycles c(8);
  g_traced.clear();
  Gate gate;
  { GatePass before(gate, 1); }  // before the trace: not counted
  c.arm_trace(std::chrono::nanoseconds(20ms).count(), 4, keep_traced);
  REQUIRE(c.on());  // the trace turns the counter on
  { GatePass first(gate, 1); }
  std::this_thread::sleep_for(30ms);  // a gap in the program
  {
    GatePass slow(gate, 2);
    forwarded_call(2, [] {
      CallScope inner(5);  // nested: part of the outer call, not traced alone
      std::this_thread::sleep_for(25ms);
      return 0;
    });
  }
  { GatePass fast(gate, 3); }
  { GatePass last(gate, 3); }
  { GatePass after(gate, 4); }  // past the trace
  REQUIRE_FALSE(c.on());  // off again, as it was before
  REQUIRE_FALSE(c.tracing());
  // The first call, the slow one (after a gap), the last with the summary.
  REQUIRE(g_traced.size() == 3);
  CHECK(g_traced[0].call.index == 1);
  CHECK(g_traced[0].call.kind == 1);
  CHECK_FALSE(g_traced[0].last);
  CHECK(g_traced[1].call.index == 2);
  CHECK(g_traced[1].call.kind == 2);
  CHECK(g_traced[1].call.ns >= uint64_t(std::chrono::nanoseconds(25ms).count()));
  CHECK(g_traced[1].call.gap_ns >= uint64_t(std::chrono::nanoseconds(30ms).count()));
  CHECK(g_traced[1].call.slow_calls == 1);
  CHECK(g_traced[2].call.index == 4);
  CHECK(g_traced[2].last);
  CHECK(g_traced[2].call.slow_calls == 1);
  CHECK(g_traced[2].call.inside_ns >= g_traced[1].call.ns);
  CHECK(g_traced[2].call.at_ns >= g_traced[1].call.at_ns);
  auto calls = calls_by_kind(c);
  CHECK(calls[1] == 1);
  CHECK(calls[2] == 1);
  CHECK(calls[5] == 1);
  CHECK(calls[3] == 2);
  CHECK(calls.count(4) == 0);
}
