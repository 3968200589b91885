#include "launch/launch_speculation.h"
#include "phos/hooks/stderr_line.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <random>
#include <sstream>

#include "driver/driver.h"
#include "modules/kernel_info.h"
#include "phos/speculation/demangle.h"
#include "phos/support/clock.h"

namespace phos::hooks {
namespace {

namespace spec = phos::speculation;

// The innermost known library call under way on this thread, null where
// none is (initial-exec TLS: libphos.so is preloaded).
__attribute__((tls_model("initial-exec"))) thread_local LaunchSpeculation::ExactScope* t_exact_scope = nullptr;

spec::CallRange to_call_range(const ranges::BufferRange& r) {
  spec::CallRange c;
  c.address = r.address;
  c.bytes = r.bytes;
  c.access = uint8_t((r.access & ranges::kRead ? spec::kRead : 0) | (r.access & ranges::kWrite ? spec::kWrite : 0));
  c.extent_unknown = r.access & ranges::kExtentUnknown;
  c.pointer_array = r.access & ranges::kPointerArray;
  return c;
}

// The kernel arguments as the launch passes them: kernelParams, or the
// packed buffer of `extra`.
spec::LaunchArgs launch_args(void** params, void** extra) {
  spec::LaunchArgs args;
  if (params) {
    args.params = params;
  } else if (extra) {
    PackedArgs packed = packed_args(extra);
    args.packed = packed.data;
    args.packed_size = packed.size;
  }
  return args;
}


}  // namespace

// The last library call this thread made, and its launches speculated since:
// a wide guess says them (a kernel a library launched outside the calls phos
// interposes shows as a library's kernel right after one of them).
__attribute__((tls_model("initial-exec"))) thread_local const char* t_last_exact_call = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local uint64_t t_speculated_since_exact = 0;

LaunchSpeculation::ExactScope::ExactScope(const ranges::RangeList* set, const char* call, uint64_t checked_window)
    : set(set), call(call), checked_window(checked_window), outer_(t_exact_scope) {
  t_exact_scope = this;
}
LaunchSpeculation::ExactScope::~ExactScope() {
  t_exact_scope = outer_;
  t_last_exact_call = call;
  t_speculated_since_exact = 0;
}
LaunchSpeculation::ExactScope* LaunchSpeculation::ExactScope::current() { return t_exact_scope; }

// A word of a struct read as a pointer into a buffer of 1 GiB or more puts
// all of it in the kernel's set: under copy-on-write, the launch saves or
// waits for all of it. Said once a kernel, so that a set that only looks
// wide (two integers that read as an address) can be found.
void LaunchSpeculation::say_wide_guess(KernelEntry& e, const Kernel& k, const spec::GuessedWord& w) {
  constexpr uint64_t kWide = uint64_t(1) << 30;
  if (e.wide_guess_said || w.buffer_end - w.buffer_start < kWide) return;
  e.wide_guess_said = true;
  stderr_line(
      "phos: speculation: %s: the word at +%u of parameter %u (0x%" PRIx64 ") read as a pointer into a "
      "buffer of %.1f MiB at 0x%" PRIx64 ": all of it in the launch's set (its fields are not known); "
      "outside any library call (this thread's last: %s, %" PRIu64 " launches before this one)\n",
      k.name.c_str(), w.offset, w.param, w.value, double(w.buffer_end - w.buffer_start) / (1 << 20),
      w.buffer_start, t_last_exact_call ? t_last_exact_call : "none", t_speculated_since_exact);
}

void LaunchSpeculation::set_active(bool on) {
  // Serialised: an "off" clearing the index after a concurrent "on" refilled
  // it would leave speculation on over an empty index.
  std::lock_guard<std::mutex> switching(switch_mu_);
  if (on == active()) return;
  if (!on) {
    active_.store(false, std::memory_order_relaxed);
    memory_.observe(nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    return;
  }
  memory_.observe(this);  // fills the index under the memory lock
  active_.store(true, std::memory_order_release);
}

Result<void> LaunchSpeculation::load_signatures(const std::string& paths) {
  std::stringstream list(paths);
  std::string path;
  std::lock_guard<std::mutex> lock(mu_);
  while (std::getline(list, path, ':')) {
    if (path.empty()) continue;
    Result<void> loaded = signatures_.load(path);
    if (!loaded) return make_error("signature database " + loaded.error().message);
  }
  return {};
}

void LaunchSpeculation::buffer_added(uint64_t start, uint64_t size, uint64_t unit) {
  std::lock_guard<std::mutex> lock(mu_);
  // An overlap would mean two live buffers at one address: counted (it
  // should never happen), the buffer left out of the index.
  if (!index_.insert(start, size, unit)) totals_.index_refused++;
}

void LaunchSpeculation::buffer_removed(uint64_t start) {
  std::lock_guard<std::mutex> lock(mu_);
  index_.erase(start);
}

void LaunchSpeculation::module_loaded(uint64_t hash, const void* image) {
  if (!hash || !image) return;
  uint32_t arch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (metadata_.count(hash)) return;
    if (!arch_) arch_ = current_device_arch();
    arch = arch_;
  }
  ModuleMetadata m;
  bool unreadable = false;
  read_metadata(m, image, arch, &unreadable);
  std::lock_guard<std::mutex> lock(mu_);
  totals_.cubin_unreadable += unreadable;
  metadata_.try_emplace(hash, std::move(m));
}

void LaunchSpeculation::read_metadata(ModuleMetadata& m, const void* image, uint32_t arch, bool* unreadable) {
  m.read = true;
  auto kernels = spec::module_kernels(image, arch);
  if (kernels) {
    m.kernels = std::move(*kernels);
    return;
  }
  // PTX text, or an image without a cubin for this GPU, has no records to
  // read; a fatbin or cubin that fails to parse is what counts.
  switch (kernels.error().fault) {
    case spec::ImageFault::kUnrecognized:
    case spec::ImageFault::kNoEntryForArch:
    case spec::ImageFault::kPtxOnly: break;
    default: *unreadable = true;
  }
}

const spec::CubinKernel* LaunchSpeculation::cubin_kernel_locked(const ModuleRef& module, const std::string& name) {
  if (!module.hash) return nullptr;
  auto found = metadata_.find(module.hash);
  if (found == metadata_.end()) {
    // Only images that stay valid (cudart registrations) are read this late.
    if (!module.image_data) return nullptr;
    found = metadata_.try_emplace(module.hash).first;
    if (!arch_) arch_ = current_device_arch();
    bool unreadable = false;
    read_metadata(found->second, module.image_data, arch_, &unreadable);
    totals_.cubin_unreadable += unreadable;
  }
  ModuleMetadata& m = found->second;
  for (const spec::CubinKernel& k : m.kernels)
    if (k.name == name) return &k;
  return nullptr;
}

std::shared_ptr<const spec::KernelLayout> LaunchSpeculation::analyse(const Kernel& k, AnalysisTimes& times) {
  const std::string& name = k.name;
  const ModuleRef& module = k.module;
  spec::LayoutSources sources;
  sources.driver = k.params;
  // One demangling: the types, and their kinds from them.
  sources.name_types = spec::param_types_from_name(name.c_str());
  if (sources.name_types) sources.name_kinds = spec::param_kinds_of(*sources.name_types);
  uint64_t t0 = monotonic_ns();
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t t1 = monotonic_ns();
  times.lock_ns = t1 - t0;
  auto key = std::make_pair(module.hash, name);
  if (module.hash) {
    auto cached = layouts_.find(key);
    if (cached != layouts_.end()) return cached->second;
  }
  sources.cubin = cubin_kernel_locked(module, name);
  uint64_t t2 = monotonic_ns();
  times.metadata_ns = t2 - t1;
  sources.signature = signatures_.find(name);
  auto layout = std::make_shared<const spec::KernelLayout>(spec::build_layout(sources));
  times.layout_ns = monotonic_ns() - t2;
  if (module.hash) layouts_.emplace(key, layout);
  return layout;
}

void LaunchSpeculation::on_kernel(Kernel& k, void** params, void** extra, LaunchSet* out, WriteRanges* writes) {
  speculate(k, launch_args(params, extra), out, writes);
}

void LaunchSpeculation::on_packed_kernel(Kernel& k, const std::byte* args, size_t size) {
  spec::LaunchArgs a;
  a.packed = args;
  a.packed_size = size;
  speculate(k, a, nullptr, nullptr);
}

LaunchSpeculation::KernelEntry& LaunchSpeculation::entry(Kernel& k, std::unique_lock<std::mutex>& lock) {
  if (KernelEntry* e = k.state<KernelEntry>(KernelFeature::kSpeculation)) return *e;
  // First launch of this kernel: its layout put together without the lock
  // held for the name's demangling (the module's metadata is read under it,
  // once).
  lock.unlock();
  uint64_t started = monotonic_ns();
  auto fresh = std::make_unique<KernelEntry>();
  AnalysisTimes times;
  fresh->layout = analyse(k, times);
  uint64_t ns = monotonic_ns() - started;
  lock.lock();
  if (KernelEntry* e = k.state<KernelEntry>(KernelFeature::kSpeculation)) return *e;  // another launch's
  totals_.kernels++;
  totals_.analysis_ns += ns;
  if (ns > totals_.analysis_max_ns) {
    totals_.analysis_max_ns = ns;
    totals_.worst_lock_ns = times.lock_ns;
    totals_.worst_metadata_ns = times.metadata_ns;
    totals_.worst_layout_ns = times.layout_ns;
  }
  totals_.cubin_checked += fresh->layout->cubin_checked;
  return k.attach(KernelFeature::kSpeculation, std::move(fresh));
}

void LaunchSpeculation::speculate(Kernel& k, const spec::LaunchArgs& args, LaunchSet* out, WriteRanges* writes) {
  std::unique_lock<std::mutex> lock(mu_);
  KernelEntry* e = &entry(k, lock);
  e->launches++;
  totals_.launches++;
  if (t_exact_scope) {
    e->exact++;
    totals_.exact++;
    if (out) {
      out->present = true;
      out->kind = uint8_t(spec::SetKind::kExact);  // the enclosing call's
    }
    if (writes) {
      writes->known = false;
      writes->covered = true;
    }
    return;
  }
  spec::AccessSet set;
  spec::speculate_kernel(*e->layout, args, index_, &set);
  totals_.lookups += set.lookups;
  totals_.integer_words += set.integer_words;
  say_wide_guess(*e, k, set.widest_guess);
  t_speculated_since_exact++;
  if (out) {
    out->present = true;
    out->kind = uint8_t(set.kind);
    out->total = set.count;
    out->count = uint8_t(std::min<uint32_t>(set.count, LaunchSet::kMax));
    for (uint8_t i = 0; i < out->count; i++)
      out->items[i] = LaunchSet::Item{set.items[i].id, set.items[i].start, set.items[i].access};
  }
  if (writes) {
    writes->known = set.kind != spec::SetKind::kUnknown;
    writes->exact = set.kind == spec::SetKind::kExact;
    writes->ranges.clear();
    writes->reads.clear();
    for (uint32_t i = 0; writes->known && i < set.count; i++) {
      if (set.items[i].access & spec::kWrite) writes->ranges.emplace_back(set.items[i].start, set.items[i].end);
      if (set.items[i].access & spec::kRead) writes->reads.emplace_back(set.items[i].start, set.items[i].end);
    }
  }
  if (set.kind == spec::SetKind::kUnknown) {
    e->unknown++;
    totals_.unknown++;
    return;
  }
  e->speculated++;
  totals_.speculated++;
  e->buffers += set.count;
  e->reads += set.reads();
  e->writes += set.writes();
  totals_.buffers += set.count;
}

void LaunchSpeculation::on_call(const ranges::RangeList& ranges) {
  spec::CallRange calls[ranges::RangeList::kMax];
  for (uint8_t i = 0; i < ranges.count; i++) calls[i] = to_call_range(ranges.items[i]);
  std::lock_guard<std::mutex> lock(mu_);
  spec::AccessSet set;
  spec::exact_call(std::span<const spec::CallRange>(calls, ranges.count), index_, &set);
  totals_.calls++;
  totals_.lookups += set.lookups;
  if (set.kind == spec::SetKind::kUnknown) {
    totals_.calls_unknown++;
    return;
  }
  totals_.calls_exact++;
  totals_.buffers += set.count;
}

LaunchSpeculation::Totals LaunchSpeculation::totals() {
  std::lock_guard<std::mutex> lock(mu_);
  Totals t = totals_;
  t.indexed = index_.size();
  return t;
}

std::vector<agent::KernelSpeculation> LaunchSpeculation::kernels() {
  KernelRegistry::Entries entries = kernels_.entries();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<agent::KernelSpeculation> out;
  auto add = [&out](const Kernel& kernel, const KernelEntry& e) {
    agent::KernelSpeculation k;
    k.name = kernel.name;
    k.module = kernel.module.id;
    k.launches = e.launches;
    k.exact = e.exact;
    k.speculated = e.speculated;
    k.unknown = e.unknown;
    k.buffers = e.buffers;
    k.reads = e.reads;
    k.writes = e.writes;
    k.types = spec::type_source_name(e.layout->types);
    k.note = e.layout->note;
    out.push_back(std::move(k));
  };
  for (const auto* list : {&entries.retired, &entries.live})
    for (const Kernel* kernel : *list)
      if (const KernelEntry* e = kernel->state<KernelEntry>(KernelFeature::kSpeculation)) add(*kernel, *e);
  return out;
}

double LaunchSpeculation::measure_lookup_rate(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<spec::Buffer> buffers = index_.buffers();
  if (buffers.empty() || n == 0) return 0;
  // Addresses inside buffers and in the gaps after them, in random order.
  std::mt19937_64 rng(1);
  std::vector<uint64_t> probes(4096);
  for (uint64_t& p : probes) {
    const spec::Buffer& b = buffers[rng() % buffers.size()];
    p = rng() % 4 ? b.start + rng() % (b.end - b.start) : b.end + rng() % 4096;
  }
  uint64_t found = 0;
  auto start = std::chrono::steady_clock::now();
  spec::Buffer out;
  for (size_t i = 0; i < n; i++) found += index_.find(probes[i % probes.size()], &out);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  asm volatile("" : : "r"(found));
  return seconds > 0 ? double(n) / seconds : 0;
}

}  // namespace phos::hooks
