// PhOS §5's traffic control for the engine's concurrent copies: the
// program's own transfers between host and device come first. The hooks
// tell the copy table of each (copy_state.h: an estimated end of those
// queued); before each chunk it
// claims, an engine worker looks, and while the program has transfers in
// queued it sleeps, so the PCIe link and the copy engines are the
// program's. Bounded: at most `max_pause` per claim (a program that
// transfers all the time still lets the copy move), never past the caller's
// deadline (recopy's first pass), and not while a call of the program waits
// for a chunk (copy-on-write's urgent list: the program would wait on the
// pause). The DMA a worker has already queued (its staging ring) goes on.
//
// Used by the first pass of soft recopy and by the copy-on-write copy,
// where the program runs; not by the stopped copy, nor by an on-demand
// restore's fill, whose calls wait for the fill itself.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "phos/images/copy_state.h"

namespace phos::plugin {

struct TrafficPolicy {
  // The longest one claim waits. About what a 256 MiB transfer takes at
  // 20 GB/s plus its kernel: the program's usual transfer fits in a pause.
  std::chrono::nanoseconds max_pause = std::chrono::milliseconds(50);
  // The longest one sleep lasts: a call of the program that starts waiting
  // for a chunk meanwhile ends the pause within it.
  std::chrono::nanoseconds poll = std::chrono::microseconds(200);
};

class TrafficControl {
 public:
  // `enabled` false: before_claim() never pauses (traffic=off or order).
  TrafficControl(const copystate::CopyState& table, bool enabled, TrafficPolicy policy = {});

  // Before an engine worker claims its next chunk (not one a call waits
  // for): sleeps while the program has transfers queued, at
  // most the policy's max_pause and never past `deadline_ns`
  // (CLOCK_MONOTONIC). Returns the nanoseconds it slept. Thread-safe.
  uint64_t before_claim(uint64_t deadline_ns);

  // Claims that waited, and their waits summed over the workers.
  uint64_t pauses() const { return pauses_.load(std::memory_order_relaxed); }
  uint64_t paused_ns() const { return paused_ns_.load(std::memory_order_relaxed); }

 private:
  // How long to sleep at `now` of a pause that ends at `pause_end`: 0 when
  // the program has nothing queued, or nothing is left of it.
  uint64_t sleep_ns(uint64_t now, uint64_t pause_end) const;

  const copystate::CopyState& table_;
  const bool enabled_;
  const TrafficPolicy policy_;
  std::atomic<uint64_t> pauses_{0}, paused_ns_{0};
};

}  // namespace phos::plugin
