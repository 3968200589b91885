// The events of this process that another process may record or wait on:
// those created with CU_EVENT_INTERPROCESS (the exporter's), those whose
// IPC handle was taken, and the stand-ins cuIpcOpenEventHandle returns
// (the opener's). phos serves event IPC itself (hooks/ipc.cc): a record of
// one of these completes before it returns, so these are the events whose
// records wait. Forgotten at cuEventDestroy, before the driver may hand the
// handle out again; all of them at a context's destroy or reset (which
// destroys its events: a needless wait later is harmless, a plain event
// taken for an interprocess one, refused in a capture, is not).
//
// contains() is on the path of every cuEventRecord of every program: while
// the process has no interprocess event (most programs, always), it is one
// load of a count; otherwise a shared lock and a lookup.
#pragma once

#include <atomic>
#include <cstddef>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

namespace phos::hooks {

class InterprocessEvents {
 public:
  void add(const void* event) {
    std::unique_lock lock(mu_);
    if (events_.insert(event).second) count_.fetch_add(1, std::memory_order_release);
  }
  void forget(const void* event) {
    if (count_.load(std::memory_order_acquire) == 0) return;
    std::unique_lock lock(mu_);
    if (events_.erase(event)) count_.fetch_sub(1, std::memory_order_release);
  }
  void clear() {
    std::unique_lock lock(mu_);
    events_.clear();
    count_.store(0, std::memory_order_release);
  }
  bool contains(const void* event) const {
    if (__builtin_expect(count_.load(std::memory_order_acquire) == 0, 1)) return false;
    std::shared_lock lock(mu_);
    return events_.count(event) != 0;
  }
  size_t size() const { return count_.load(std::memory_order_acquire); }

 private:
  std::atomic<size_t> count_{0};
  mutable std::shared_mutex mu_;
  std::unordered_set<const void*> events_;
};

}  // namespace phos::hooks
