#include "launch/launch_log.h"

#include <cstring>

#include "driver/driver.h"
#include "modules/kernel_info.h"

namespace phos::hooks {
namespace {

// Initial-exec: libphos.so is preloaded, its TLS is static; no
// __tls_get_addr on the way.
__attribute__((tls_model("initial-exec"))) thread_local uint64_t t_library_call = 0;

}  // namespace

const char* record_kind_name(RecordKind k) {
  switch (k) {
    case RecordKind::kKernel: return "kernel";
    case RecordKind::kCopy: return "copy";
    case RecordKind::kSet: return "set";
    case RecordKind::kLibrary: return "library";
  }
  return "?";
}

LibraryCallScope::LibraryCallScope(uint64_t sequence) : outer_(t_library_call) { t_library_call = sequence + 1; }
LibraryCallScope::~LibraryCallScope() { t_library_call = outer_; }
uint64_t LibraryCallScope::current() { return t_library_call; }

void LaunchLog::enable(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (on && !ring_) ring_ = std::make_unique<LaunchRecord[]>(kRingSize);
  enabled_.store(on, std::memory_order_release);
}

LaunchRecord& LaunchLog::next_locked() {
  uint64_t seq = next_.fetch_add(1);
  LaunchRecord& r = ring_[seq % kRingSize];
  r.sequence = seq;
  r.within = LibraryCallScope::current();
  r.call = nullptr;
  r.ranges.count = 0;
  r.function = nullptr;
  r.kernel = nullptr;
  r.module = 0;
  r.stream = nullptr;
  r.arg_bytes = 0;
  r.truncated = false;
  return r;
}

uint64_t LaunchLog::record_call(RecordKind kind, const char* call, CUstream stream, const ranges::RangeList& ranges) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_) return 0;
  LaunchRecord& r = next_locked();
  r.kind = kind;
  r.call = call;
  r.stream = stream;
  r.ranges = ranges;
  return r.sequence;
}

void LaunchLog::record(Kernel& k, const uint32_t grid[3], const uint32_t block[3], uint32_t shared_bytes,
                       CUstream stream, void** params, void** extra, const LaunchSet* set) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ring_) return;
  Recorded* recorded = k.state<Recorded>(KernelFeature::kLaunchLog);
  if (!recorded) recorded = &k.attach(KernelFeature::kLaunchLog, std::make_unique<Recorded>());
  recorded->launches++;
  LaunchRecord& r = next_locked();
  r.kind = RecordKind::kKernel;
  r.function = function_of(k);
  r.kernel = &k;
  r.module = k.module.id;
  std::memcpy(r.grid, grid, sizeof(r.grid));
  std::memcpy(r.block, block, sizeof(r.block));
  r.shared_bytes = shared_bytes;
  r.stream = stream;
  r.set.present = false;
  if (set) r.set = *set;
  if (params) {
    const size_t n = k.params ? k.params->size() : 0;  // no layout: no arguments kept
    for (size_t i = 0; i < n; i++) {
      const ParamSlot& p = (*k.params)[i];
      if (p.offset + p.size > LaunchRecord::kMaxArgBytes) {
        r.truncated = true;
        continue;
      }
      std::memcpy(r.args + p.offset, params[i], p.size);
      r.arg_bytes = std::max(r.arg_bytes, p.offset + p.size);
    }
  } else if (extra) {
    PackedArgs packed = packed_args(extra);
    if (packed.data) {
      r.truncated = packed.size > LaunchRecord::kMaxArgBytes;
      r.arg_bytes = uint32_t(std::min(packed.size, LaunchRecord::kMaxArgBytes));
      std::memcpy(r.args, packed.data, r.arg_bytes);
    }
  }
}

std::vector<LaunchRecord> LaunchLog::recent() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LaunchRecord> out;
  uint64_t end = next_.load();
  if (!ring_) return out;
  for (uint64_t seq = end > kRingSize ? end - kRingSize : 0; seq < end; seq++) out.push_back(ring_[seq % kRingSize]);
  return out;
}

std::vector<KernelSummary> LaunchLog::kernels() {
  KernelRegistry::Entries entries = kernels_.entries();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<KernelSummary> out;
  auto add = [&out](const std::vector<Kernel*>& kernels) {
    for (const Kernel* k : kernels)
      if (const Recorded* recorded = k->state<Recorded>(KernelFeature::kLaunchLog))
        out.push_back({function_of(*k), k->module.id, k->name, recorded->launches,
                       k->params.value_or(std::vector<ParamSlot>{})});
  };
  add(entries.retired);
  add(entries.live);
  return out;
}

}  // namespace phos::hooks
