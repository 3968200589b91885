#include "runtime.h"

#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "driver/driver.h"

namespace phos::hooks {

std::atomic<Runtime*> g_runtime{nullptr};

Runtime::Runtime() {
  memory_.on_unit_dropped([this](uint64_t address) { copy_window_.unit_dropped(address); });
  memory_.on_out_of_memory(
      [this](const char* call, uint64_t bytes) { return copy_window_.give_pool_back(call, bytes); });
  const char* cycles = std::getenv("PHOS_CALL_CYCLES");
  if (cycles && (std::strcmp(cycles, "on") == 0 || std::strcmp(cycles, "1") == 0)) call_cycles_.set_on(true);
}

namespace {
// The library calls' kinds, in the order they first counted.
struct LibraryKinds {
  std::mutex mu;
  std::unordered_map<std::string, CallKind> by_name;
  std::vector<std::string> names;
};
LibraryKinds& library_kinds() {
  static auto* kinds = new LibraryKinds();  // never destroyed: hooks may count at exit
  return *kinds;
}
}  // namespace

CallKind library_call_kind(const char* name, std::atomic<CallKind>& site) {
  CallKind k = site.load(std::memory_order_acquire);
  if (k != kNoCallKind) return k;
  LibraryKinds& kinds = library_kinds();
  std::lock_guard<std::mutex> lock(kinds.mu);
  auto [at, added] = kinds.by_name.try_emplace(name, CallKind(driver::kFunctionCount + kinds.names.size()));
  if (added) {
    if (kinds.names.size() + 1 < kLibraryCallKinds) {
      kinds.names.push_back(name);
    } else {
      // The last kind stands for this name and every further one.
      at->second = kCallKinds - 1;
      if (kinds.names.size() < kLibraryCallKinds) kinds.names.push_back("other_library_calls");
    }
  }
  site.store(at->second, std::memory_order_release);
  return at->second;
}

std::string call_kind_name(CallKind kind) {
  if (kind < driver::kFunctionCount) return driver::name_of(driver::Fn(kind));
  LibraryKinds& kinds = library_kinds();
  std::lock_guard<std::mutex> lock(kinds.mu);
  size_t i = kind - driver::kFunctionCount;
  return i < kinds.names.size() ? kinds.names[i] : "library_call_" + std::to_string(i);
}

Runtime& make_runtime() {
  static Runtime* r = [] {
    auto* made = new Runtime();
    g_runtime.store(made, std::memory_order_release);
    return made;
  }();
  return *r;
}

std::vector<std::pair<std::string, uint64_t>> Counters::list() const {
  static const char* const kNames[] = {"launches", "allocations", "async_allocations", "frees", "foreign_frees",
                                       "user_vmm_creates", "graph_launches", "graph_kernels",
                                       "captured_launches"};
  static_assert(std::size(kNames) == size_t(Counter::kCount));
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 0; i < size_t(Counter::kCount); i++) {
    uint64_t sum = 0;
    for (const Stripe& s : stripes_) sum += s.values[i].load(std::memory_order_relaxed);
    out.emplace_back(kNames[i], sum);
  }
  return out;
}

bool Captures::driver_capturing(CUstream stream, bool per_thread_stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = per_thread_stream ? PHOS_REAL(cuStreamIsCapturing_ptsz)(stream, &status)
                                 : PHOS_REAL(cuStreamIsCapturing)(stream, &status);
  return r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void UnsupportedCalls::note(const char* call) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.insert(call);
}

std::vector<std::string> UnsupportedCalls::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {calls_.begin(), calls_.end()};
}

}  // namespace phos::hooks
