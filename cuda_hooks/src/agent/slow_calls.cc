#include "agent/slow_calls.h"
#include "phos/hooks/stderr_line.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <time.h>

#include "runtime.h"

namespace phos::hooks {
namespace {

// What the trace uses: the call counter.
struct TraceDeps : RuntimeView {
  using RuntimeView::call_cycles;
};

double ms(uint64_t ns) { return double(ns) / 1e6; }

// The wall clock (as Python's time.time()), for a reader that places the
// lines among its own events.
double wall_s() {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return double(t.tv_sec) + double(t.tv_nsec) / 1e9;
}

void log_call(const CallCycles::TracedCall& c, bool last, uint64_t threshold_ns) {
  const std::string name = call_kind_name(c.kind);
  const double wall = wall_s();
  if (c.gap_ns >= threshold_ns || c.index == 1)
    stderr_line(
        "phos: slow gap: %.3f ms without a CUDA call before call %" PRIu64 " (%s), ending at +%.3f ms "
        "(wall %.6f)\n",
        ms(c.gap_ns), c.index, name.c_str(), ms(c.at_ns > c.ns ? c.at_ns - c.ns : 0), wall - double(c.ns) / 1e9);
  if (c.ns >= threshold_ns || c.index == 1)
    stderr_line(
        "phos: slow call: %s %.3f ms, call %" PRIu64 " after the gate opened, ending at +%.3f ms "
        "(%.3f ms inside the %" PRIu64 " calls so far; wall %.6f)\n",
        name.c_str(), ms(c.ns), c.index, ms(c.at_ns), ms(c.inside_ns), c.index, wall);
  if (last)
    stderr_line(
        "phos: slow-call trace: %" PRIu64 " calls in the first %.3f ms after the gate opened, %.3f ms "
        "inside them; %" PRIu64 " calls of %.3f ms or more took %.3f ms\n",
        c.index, ms(c.at_ns), ms(c.inside_ns), c.slow_calls, ms(threshold_ns), ms(c.slow_ns));
}

}  // namespace

std::optional<SlowCallTrace> slow_call_trace() {
  static const std::optional<SlowCallTrace> setting = []() -> std::optional<SlowCallTrace> {
    const char* v = std::getenv("PHOS_TRACE_SLOW_CALLS_MS");
    if (!v || !*v) return std::nullopt;
    char* end = nullptr;
    const double threshold_ms = std::strtod(v, &end);
    uint64_t calls = 100000;
    if (end && *end == ':') calls = std::strtoull(end + 1, &end, 10);
    if (end == v || (end && *end) || threshold_ms < 0 || calls == 0) {
      stderr_line("phos: PHOS_TRACE_SLOW_CALLS_MS=%s is not MS[:CALLS]; no slow-call trace\n", v);
      return std::nullopt;
    }
    return SlowCallTrace{.threshold_ns = uint64_t(threshold_ms * 1e6), .calls = calls};
  }();
  return setting;
}

void arm_slow_call_trace() {
  if (auto t = slow_call_trace()) TraceDeps().call_cycles().arm_trace(t->threshold_ns, t->calls, log_call);
}

}  // namespace phos::hooks
