// A stripe number for the calling thread, for state that every thread
// updates on every CUDA call (the gate's count of calls inside, the hooks'
// counters): each thread updates its own stripe's cache line, so threads
// that call CUDA at once do not pass one line back and forth. Threads get
// stripes in turn; past kThreadStripes threads, stripes are shared.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace phos::hooks {

inline constexpr size_t kThreadStripes = 32;

namespace detail {
// 1 + the stripe, 0 until the thread first asks. Constant-initialised and
// initial-exec: a read is one load from the thread pointer (libphos.so is
// preloaded, so its TLS is static).
extern thread_local uint32_t t_stripe_plus_one __attribute__((tls_model("initial-exec")));
uint32_t assign_thread_stripe();
}  // namespace detail

inline uint32_t thread_stripe() {
  uint32_t s = detail::t_stripe_plus_one;
  return __builtin_expect(s != 0, 1) ? s - 1 : detail::assign_thread_stripe();
}

}  // namespace phos::hooks
