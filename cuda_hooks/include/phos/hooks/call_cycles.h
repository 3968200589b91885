// The opt-in count of the CPU time phos spends in each kind of call
// (PHOS_CALL_CYCLES=on): how many calls of each kind the program made and
// how many TSC cycles of them ran phos's own code, the real driver or
// library call the program asked for left out. Step times on the GPU hosts
// vary by +-20% from run to run, so a cost near 1% can only be counted
// inside the process, not compared between runs.
//
// A hook enters a scope of its kind (CallScope, or GatePass with a kind) and
// leaves it; around the call it forwards (the program's own driver or
// library call) it pauses the clock. Driver calls phos makes for itself in
// between (VMM calls behind a cudaMalloc, a capture query) are phos's cost
// and stay counted. A forwarded call that comes back into phos (cuBLAS's
// launches) opens a scope of its own: each cycle is counted once, for the
// innermost scope.
//
// Off (the default), a hook pays one load of a pointer that is null and a
// branch on it; the scope's end and a forwarded call test again. On, each
// thread counts in a block of its own (no atomic read-modify-write, no
// shared line); a reader sums the blocks.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

namespace phos::hooks {

using CallKind = uint32_t;
// No kind (yet): a call site's kind not looked up.
inline constexpr CallKind kNoCallKind = UINT32_MAX;
// For pause(): the innermost scope, whatever its kind (a library hook's
// forwarded call).
inline constexpr CallKind kInnermostScope = UINT32_MAX - 1;

class CallCycles;

namespace detail {
// The instance counting now; null while the counter is off.
extern std::atomic<CallCycles*> g_counting;
}  // namespace detail

// The counter now, or null: the one test every hook makes.
inline CallCycles* call_cycles_counting() { return detail::g_counting.load(std::memory_order_relaxed); }

class CallCycles {
 public:
  // Kinds 0..kinds-1; the caller names them.
  explicit CallCycles(uint32_t kinds);
  ~CallCycles();
  CallCycles(const CallCycles&) = delete;
  CallCycles& operator=(const CallCycles&) = delete;

  // On: this instance counts from now (the process has one; a test may
  // make its own). Off: nothing more is counted; the totals stay.
  void set_on(bool on);
  bool on() const { return call_cycles_counting() == this; }
  uint32_t kinds() const { return kinds_; }

  // The hook path (the calling thread's own block).
  // A call of `kind` begins: counted, and phos's clock runs for it.
  void enter(CallKind kind);
  // The innermost call ends.
  void leave();
  // Before a driver or library call: when it is the forwarded call of the
  // innermost scope (`kind` is that scope's, or kInnermostScope), the clock
  // stops and true is returned; resume() restarts it after the call.
  bool pause(CallKind kind);
  void resume();

  struct Kind {
    CallKind kind = 0;
    uint64_t calls = 0;
    uint64_t cycles = 0;  // spent inside phos
  };
  // The kinds with calls, merged over every thread that counted.
  std::vector<Kind> totals() const;
  // The clock's rate (TSC cycles per second), measured against
  // CLOCK_MONOTONIC_RAW since set_on(true).
  double cycles_per_second() const;

  // What the counter counts for a call that spends nothing inside phos:
  // its own bookkeeping between its clock reads, in cycles. Measured once,
  // on a thread of its own; a reader may take it off each call's figure.
  static double floor_cycles_per_call();

  // The clock (rdtsc on x86-64: ~7 ns, no system call; elsewhere
  // CLOCK_MONOTONIC_RAW in ns).
  static uint64_t now();

  // The slow-call trace (PHOS_TRACE_SLOW_CALLS_MS, runtime.cc): from
  // arm_trace() on, the next `calls` outermost calls (a hook's whole call:
  // its gate, phos's work and the forwarded call, in wall-clock ns), each
  // one that took `threshold_ns` or more (and the first) handed to `sink`;
  // the last one too, with last = true: the trace's summary; a call after
  // a gap of `threshold_ns` or more too. The counter counts meanwhile
  // (turned on for it if it was off, and off again after).
  struct TracedCall {
    CallKind kind = 0;
    uint64_t ns = 0;         // the call's own time
    uint64_t index = 0;      // 1 for the first call after arm_trace
    uint64_t at_ns = 0;      // its end, after arm_trace
    uint64_t inside_ns = 0;  // the traced calls' time so far, this one's included
    uint64_t slow_calls = 0, slow_ns = 0;  // those of threshold_ns or more so far, this one's included
    // From the end of the last traced call that ended before it (of any
    // thread; for the first: from arm_trace) to its start: the program's own
    // time between its calls, or its idle time.
    uint64_t gap_ns = 0;
  };
  using TraceSink = void (*)(const TracedCall&, bool last, uint64_t threshold_ns);
  void arm_trace(uint64_t threshold_ns, uint64_t calls, TraceSink sink);
  bool tracing() const { return trace_.armed.load(std::memory_order_relaxed); }

  struct Block;  // a thread's counts (call_cycles.cc)

 private:
  Block* block_for_thread();  // made (or reused) at the thread's first call
  Block* thread_block() const;  // null where the thread has not counted
  static void thread_exit(void* block);

  void traced(CallKind kind, uint64_t ns, uint64_t end_raw);

  struct Trace {
    std::atomic<bool> armed{false};
    std::atomic<uint64_t> index{0}, inside_ns{0}, slow_calls{0}, slow_ns{0}, last_end_ns{0};
    uint64_t threshold_ns = 0, calls = 0, armed_ns = 0;
    TraceSink sink = nullptr;
    bool counter_was_on = false;
  };
  Trace trace_;
  const uint32_t kinds_;
  const uint64_t id_;  // tells this instance's thread cache from another's
  std::atomic<Block*> blocks_{nullptr};  // every block made, a list only ever pushed to
  uint64_t start_cycles_ = 0, start_ns_ = 0;
  mutable std::mutex calibration_mu_;
  mutable double calibrated_ = 0;  // cycles per second, where measured by a spin
};

// A hook's count, for hooks that pass no gate (GatePass makes one).
class CallScope {
 public:
  CallScope() = default;
  explicit CallScope(CallKind kind) : counting_(call_cycles_counting()) {
    if (__builtin_expect(counting_ != nullptr, 0)) counting_->enter(kind);
  }
  // `kind_of()` is asked only while counting (a library call's kind is
  // looked up by name).
  template <class KindOf, class = std::enable_if_t<std::is_invocable_r_v<CallKind, KindOf>>>
  explicit CallScope(KindOf&& kind_of) : counting_(call_cycles_counting()) {
    if (__builtin_expect(counting_ != nullptr, 0)) counting_->enter(kind_of());
  }
  ~CallScope() {
    if (__builtin_expect(counting_ != nullptr, 0)) counting_->leave();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  CallCycles* counting_ = nullptr;
};

// `call()`, the forwarded call of a scope of `kind`, with phos's clock
// stopped while it runs.
template <class Call>
inline decltype(auto) forwarded_call(CallKind kind, Call&& call) {
  CallCycles* c = call_cycles_counting();
  if (__builtin_expect(c == nullptr, 1)) return call();
  struct Resume {
    CallCycles* c;
    bool paused;
    ~Resume() {
      if (paused) c->resume();
    }
  } resume{c, c->pause(kind)};
  return call();
}

}  // namespace phos::hooks
