// PHOS_TRACE_SLOW_CALLS_MS=N[:K] (opt-in; issue 30): what a restored
// program waits on in its first work. From each gate opening that ends a
// quiesce (a restore, a give-back, a copy window's start), the next K CUDA
// calls (default
// 100000) are timed whole (gate, phos, the driver or library call); each
// of N ms or more, and the first, is logged on stderr:
//   phos: slow call: NAME T ms, call I after the gate opened, ending at +E ms
//     (C ms inside the I calls so far; wall W)
// as is each gap of N ms or more between calls (the program's own time, or
// its idle time; before the first call: from the gate's opening):
//   phos: slow gap: G ms without a CUDA call before call I (NAME), ending
//     at +E ms (wall W)
// (W: the wall clock, time.time(), at the call's or the gap's end), and
// once the K-th call ends, a summary:
//   phos: slow-call trace: K calls in the first E ms after the gate opened,
//     C ms inside them; S calls of N ms or more took M ms
// (E - C: the program's own time between its calls, and its idle time).
// The call counter (call_cycles.h) does the timing; it counts meanwhile.
#pragma once

#include <cstdint>
#include <optional>

namespace phos::hooks {

struct SlowCallTrace {
  uint64_t threshold_ns = 0;
  uint64_t calls = 0;
};

// The setting, parsed once; nothing where unset or malformed (said once).
std::optional<SlowCallTrace> slow_call_trace();

// Armed on the process's call counter.
void arm_slow_call_trace();

}  // namespace phos::hooks
