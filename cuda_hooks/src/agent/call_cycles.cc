#include "phos/hooks/call_cycles.h"

#include <pthread.h>
#include <time.h>

#include <thread>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace phos::hooks {

namespace detail {
std::atomic<CallCycles*> g_counting{nullptr};
}  // namespace detail

namespace {

uint64_t monotonic_raw_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC_RAW, &t);
  return uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
}

std::atomic<uint64_t> g_next_id{1};

// Cycles from `since` to `t`; none where the clock seems to have gone back
// (a thread moved to a core whose TSC lags: not on hosts with an invariant,
// synchronised TSC, but a wrapped difference would swamp every total).
inline uint64_t elapsed(uint64_t t, uint64_t since) { return int64_t(t - since) > 0 ? t - since : 0; }

// The calling thread's block of the instance it last counted for.
// Constant-initialised, initial-exec: one load from the thread pointer.
thread_local uint64_t t_instance __attribute__((tls_model("initial-exec"))) = 0;
thread_local CallCycles::Block* t_block __attribute__((tls_model("initial-exec"))) = nullptr;

// Frees a thread's block for the next thread at its exit (its counts stay).
pthread_key_t g_exit_key;
pthread_once_t g_exit_key_once = PTHREAD_ONCE_INIT;

}  // namespace

struct CallCycles::Block {
  struct Count {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> cycles{0};
  };
  struct Frame {
    CallKind kind;
    bool paused;  // in its forwarded call: the clock is not running for it
  };
  // Deeper nesting than any hook makes (a library call's launch is 2); past
  // it, scopes are not counted.
  static constexpr uint32_t kMaxDepth = 16;

  explicit Block(uint32_t kinds) : counts(new Count[kinds]) {}

  // Only the owning thread writes; readers load: no read-modify-write.
  void add(uint32_t kinds, CallKind kind, uint64_t calls_, uint64_t cycles_) {
    if (kind >= kinds) return;
    Count& c = counts[kind];
    if (calls_) c.calls.store(c.calls.load(std::memory_order_relaxed) + calls_, std::memory_order_relaxed);
    c.cycles.store(c.cycles.load(std::memory_order_relaxed) + cycles_, std::memory_order_relaxed);
  }

  std::unique_ptr<Count[]> counts;
  std::atomic<bool> free{false};  // its thread has exited: the next new thread takes it
  Block* next = nullptr;
  // The scope stack, the owning thread's alone.
  uint64_t since = 0;  // when the clock last started for the innermost scope
  uint32_t depth = 0;
  uint32_t overflow = 0;  // scopes past kMaxDepth, not counted
  uint64_t outer_ns = 0;  // while tracing: when the outermost scope began (0: not traced)
  Frame frames[kMaxDepth]{};
};

uint64_t CallCycles::now() {
#if defined(__x86_64__)
  // Not serialising (rdtscp, lfence would be): the few instructions it may
  // be reordered with are noise against what is summed.
  return __rdtsc();
#else
  return monotonic_raw_ns();
#endif
}

CallCycles::CallCycles(uint32_t kinds) : kinds_(kinds), id_(g_next_id.fetch_add(1)) {
  pthread_once(&g_exit_key_once, [] { pthread_key_create(&g_exit_key, &CallCycles::thread_exit); });
}

CallCycles::~CallCycles() {
  set_on(false);
  if (t_instance == id_) {
    t_instance = 0;
    t_block = nullptr;
    pthread_setspecific(g_exit_key, nullptr);
  }
  for (Block* b = blocks_.load(); b;) {
    Block* next = b->next;
    delete b;
    b = next;
  }
}

void CallCycles::set_on(bool on) {
  if (on) {
    start_ns_ = monotonic_raw_ns();
    start_cycles_ = now();
    detail::g_counting.store(this, std::memory_order_release);
  } else {
    CallCycles* self = this;
    detail::g_counting.compare_exchange_strong(self, nullptr);
  }
}

void CallCycles::thread_exit(void* block) {
  auto* b = static_cast<Block*>(block);
  b->depth = 0;
  b->overflow = 0;
  b->free.store(true, std::memory_order_release);
}

CallCycles::Block* CallCycles::thread_block() const {
  return t_instance == id_ ? t_block : nullptr;
}

CallCycles::Block* CallCycles::block_for_thread() {
  Block* b = nullptr;
  for (Block* o = blocks_.load(std::memory_order_acquire); o && !b; o = o->next) {
    bool was_free = true;
    if (o->free.load(std::memory_order_relaxed) && o->free.compare_exchange_strong(was_free, false)) b = o;
  }
  if (!b) {
    b = new Block(kinds_);
    b->next = blocks_.load(std::memory_order_relaxed);
    while (!blocks_.compare_exchange_weak(b->next, b, std::memory_order_release, std::memory_order_relaxed)) {
    }
  }
  t_instance = id_;
  t_block = b;
  pthread_setspecific(g_exit_key, b);
  return b;
}

void CallCycles::enter(CallKind kind) {
  uint64_t t = now();
  Block* b = thread_block();
  if (__builtin_expect(b == nullptr, 0)) b = block_for_thread();
  if (b->depth == Block::kMaxDepth || b->overflow) {
    b->overflow++;
    return;
  }
  // phos's own code called a hook: what ran so far is the outer scope's.
  if (b->depth && !b->frames[b->depth - 1].paused)
    b->add(kinds_, b->frames[b->depth - 1].kind, 0, elapsed(t, b->since));
  if (b->depth == 0) b->outer_ns = tracing() ? monotonic_raw_ns() : 0;
  b->frames[b->depth++] = {kind, false};
  b->add(kinds_, kind, 1, 0);
  b->since = t;
}

void CallCycles::leave() {
  uint64_t t = now();
  Block* b = thread_block();
  if (!b) return;
  if (b->overflow) {
    b->overflow--;
    return;
  }
  if (!b->depth) return;  // entered before this instance counted
  const Block::Frame& f = b->frames[--b->depth];
  if (!f.paused) b->add(kinds_, f.kind, 0, elapsed(t, b->since));
  // An outer scope still running (not in its forwarded call) runs on from here.
  b->since = t;
  if (b->depth == 0 && b->outer_ns) {
    const uint64_t end = monotonic_raw_ns();
    const uint64_t ns = end - b->outer_ns;
    b->outer_ns = 0;
    traced(f.kind, ns, end);
  }
}

// Armed again before the last trace ended (another checkpoint): it starts over.
void CallCycles::arm_trace(uint64_t threshold_ns, uint64_t calls, TraceSink sink) {
  if (!calls || !sink) return;
  const bool again = tracing();
  trace_.armed.store(false, std::memory_order_release);
  trace_.threshold_ns = threshold_ns;
  trace_.calls = calls;
  trace_.sink = sink;
  trace_.index.store(0);
  trace_.inside_ns.store(0);
  trace_.slow_calls.store(0);
  trace_.slow_ns.store(0);
  trace_.last_end_ns.store(0);
  if (!again) trace_.counter_was_on = on();
  trace_.armed_ns = monotonic_raw_ns();
  trace_.armed.store(true, std::memory_order_release);
  if (!trace_.counter_was_on) set_on(true);
}

// A traced call's end (at `end_raw`, the clock leave() read), on its own
// thread: the index decides which call is the last; a call past it (another
// thread's, racing) is not counted. Only a slow call adds to the slow sums.
void CallCycles::traced(CallKind kind, uint64_t ns, uint64_t end_raw) {
  if (!trace_.armed.load(std::memory_order_acquire)) return;
  const uint64_t index = trace_.index.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (index > trace_.calls) return;
  const bool slow = ns >= trace_.threshold_ns;
  const uint64_t end = end_raw > trace_.armed_ns ? end_raw - trace_.armed_ns : 0, start = end > ns ? end - ns : 0;
  uint64_t before = trace_.last_end_ns.load(std::memory_order_relaxed);
  while (before < end && !trace_.last_end_ns.compare_exchange_weak(before, end, std::memory_order_acq_rel)) {
  }
  TracedCall c{.kind = kind,
               .ns = ns,
               .index = index,
               .at_ns = end,
               .inside_ns = trace_.inside_ns.fetch_add(ns, std::memory_order_acq_rel) + ns,
               .slow_calls = slow ? trace_.slow_calls.fetch_add(1, std::memory_order_acq_rel) + 1
                                  : trace_.slow_calls.load(std::memory_order_relaxed),
               .slow_ns = slow ? trace_.slow_ns.fetch_add(ns, std::memory_order_acq_rel) + ns
                               : trace_.slow_ns.load(std::memory_order_relaxed),
               .gap_ns = start > before ? start - before : 0};
  const bool last = index == trace_.calls;
  if (slow || index == 1 || last || c.gap_ns >= trace_.threshold_ns) trace_.sink(c, last, trace_.threshold_ns);
  if (!last) return;
  trace_.armed.store(false, std::memory_order_release);
  if (!trace_.counter_was_on) set_on(false);
}

bool CallCycles::pause(CallKind kind) {
  Block* b = thread_block();
  if (!b || !b->depth || b->overflow) return false;
  Block::Frame& f = b->frames[b->depth - 1];
  // Another function: a call phos makes for itself, its cost.
  if ((kind != kInnermostScope && f.kind != kind) || f.paused) return false;
  uint64_t t = now();
  b->add(kinds_, f.kind, 0, elapsed(t, b->since));
  f.paused = true;
  return true;
}

void CallCycles::resume() {
  Block* b = thread_block();
  if (!b || !b->depth) return;
  b->frames[b->depth - 1].paused = false;
  b->since = now();
}

std::vector<CallCycles::Kind> CallCycles::totals() const {
  std::vector<Kind> sum(kinds_);
  for (const Block* b = blocks_.load(std::memory_order_acquire); b; b = b->next)
    for (uint32_t k = 0; k < kinds_; k++) {
      sum[k].calls += b->counts[k].calls.load(std::memory_order_relaxed);
      sum[k].cycles += b->counts[k].cycles.load(std::memory_order_relaxed);
    }
  std::vector<Kind> out;
  for (uint32_t k = 0; k < kinds_; k++)
    if (sum[k].calls) out.push_back({k, sum[k].calls, sum[k].cycles});
  return out;
}

double CallCycles::cycles_per_second() const {
#if defined(__x86_64__)
  // Since counting began where that is long enough to be exact to 0.1%;
  // else (a status asked for at once) a 20 ms spin, once.
  uint64_t ns = monotonic_raw_ns(), cycles = now();
  if (start_ns_ && ns - start_ns_ >= 20000000) return double(cycles - start_cycles_) * 1e9 / double(ns - start_ns_);
  std::lock_guard<std::mutex> lock(calibration_mu_);
  if (calibrated_ == 0) {
    uint64_t ns0 = monotonic_raw_ns(), c0 = now(), ns1 = ns0;
    while (ns1 - ns0 < 20000000) ns1 = monotonic_raw_ns();
    calibrated_ = double(now() - c0) * 1e9 / double(ns1 - ns0);
  }
  return calibrated_;
#else
  return 1e9;
#endif
}

double CallCycles::floor_cycles_per_call() {
  static std::once_flag once;
  static double floor = 0;
  std::call_once(once, [] {
    // A hook's whole path: enter, pause around its forwarded call, resume,
    // leave; with nothing in between, all that is counted is the counter.
    std::thread([] {
      constexpr uint64_t kCalls = 20000;
      CallCycles probe(1);
      for (uint64_t i = 0; i < kCalls; i++) {
        probe.enter(0);
        if (probe.pause(0)) probe.resume();
        probe.leave();
      }
      auto t = probe.totals();
      floor = t.empty() ? 0 : double(t[0].cycles) / double(kCalls);
    }).join();
  });
  return floor;
}

}  // namespace phos::hooks
