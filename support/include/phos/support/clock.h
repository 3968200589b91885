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

// Nanoseconds on the wall clock: the one clock two processes in different
// time namespaces (a container, a process criu restored into one) read
// alike, for a time one process writes and another compares with its own.
inline uint64_t realtime_ns() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace phos
