#include "runtime.h"

#include "driver/driver.h"

namespace phos::hooks {

std::atomic<Runtime*> g_runtime{nullptr};

Runtime::Runtime() {
  memory_.on_unit_dropped([this](uint64_t address) { copy_window_.unit_dropped(address); });
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
