// Nanoseconds on the monotonic clock: what phos's statistics and timeouts
// measure in.
#pragma once

#include <time.h>

#include <cstdint>

namespace phos {

inline uint64_t monotonic_ns() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace phos
