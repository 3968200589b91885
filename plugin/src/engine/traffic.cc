#include "phos/plugin/traffic.h"

#include <algorithm>
#include <thread>

#include "phos/support/clock.h"

namespace phos::plugin {

TrafficControl::TrafficControl(const copystate::CopyState& table, bool enabled, TrafficPolicy policy)
    : table_(table), enabled_(enabled), policy_(policy) {}

uint64_t TrafficControl::sleep_ns(uint64_t now, uint64_t pause_end) const {
  if (now >= pause_end || table_.urgent_waiting()) return 0;
  const copystate::Traffic t = table_.traffic();
  // The estimate is on the wall clock (the program may be in another time
  // namespace); the pause on this process's monotonic one.
  const uint64_t wall = realtime_ns();
  if (!t.busy(wall)) return 0;
  // Never longer than `poll` at once: a call of the program that starts
  // waiting for a chunk meanwhile ends the pause.
  const uint64_t left = t.busy_until_ns - wall;
  return std::min({left, uint64_t(policy_.poll.count()), pause_end - now});
}

uint64_t TrafficControl::before_claim(uint64_t deadline_ns) {
  if (!enabled_) return 0;
  const uint64_t start = monotonic_ns();
  const uint64_t pause_end = std::min(deadline_ns, start + uint64_t(policy_.max_pause.count()));
  uint64_t now = start;
  for (uint64_t ns; (ns = sleep_ns(now, pause_end)) > 0; now = monotonic_ns())
    std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  if (now == start) return 0;
  pauses_.fetch_add(1, std::memory_order_relaxed);
  paused_ns_.fetch_add(now - start, std::memory_order_relaxed);
  return now - start;
}

}  // namespace phos::plugin
