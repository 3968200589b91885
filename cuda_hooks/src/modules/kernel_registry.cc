#include "phos/hooks/kernel_registry.h"

#include <algorithm>

namespace phos::hooks {

namespace {

constexpr unsigned kInitialBits = 6;

}  // namespace

KernelRegistry::KernelRegistry(ModuleRegistry& modules, DescribeKernel describe)
    : modules_(modules), describe_(describe) {
  tables_.push_back(std::make_unique<Table>(kInitialBits));
  table_.store(tables_.back().get(), std::memory_order_release);
}

size_t KernelRegistry::home(const Table& t, const void* handle) {
  // Fibonacci hashing: handles are aligned heap addresses, their low bits
  // alike; the product's high bits mix them all.
  return size_t((uint64_t(reinterpret_cast<uintptr_t>(handle)) * 0x9e3779b97f4a7c15ull) >> (64 - t.bits));
}

KernelRegistry::Slot& KernelRegistry::slot(const Table& t, const void* handle) {
  // At most half the slots hold a handle: the probe ends at an empty one.
  const size_t mask = t.capacity() - 1;
  for (size_t i = home(t, handle);; i = (i + 1) & mask) {
    const void* h = t.slots[i].handle.load(std::memory_order_acquire);
    if (h == handle || !h) return t.slots[i];
  }
}

Kernel* KernelRegistry::find(const void* handle) const {
  if (!handle) return null_handle_.load(std::memory_order_acquire);
  Slot& s = slot(*table_.load(std::memory_order_acquire), handle);
  // The probe may end at an empty slot that a writer fills for another
  // handle before the entry is read here (seen under ASan load: a lookup
  // got another kernel's entry): an entry for another handle is not found.
  Kernel* k = s.kernel.load(std::memory_order_acquire);
  return k && k->handle == handle ? k : nullptr;
}

Kernel& KernelRegistry::get(const void* handle) {
  if (Kernel* k = find(handle)) return *k;
  std::lock_guard<std::mutex> lock(mu_);
  if (Kernel* k = find(handle)) return *k;  // made by another thread meanwhile
  // Described under the lock: no unload of its module comes between what
  // the driver and the module registry say and the entry's publication.
  kernels_.push_back(std::make_unique<Kernel>(handle, describe_(handle), modules_.module_ref(handle)));
  Kernel* k = kernels_.back().get();
  publish_locked(k);
  return *k;
}

void KernelRegistry::publish_locked(Kernel* kernel) {
  if (!kernel->handle) {
    null_handle_.store(kernel, std::memory_order_release);
    return;
  }
  Slot* s = &slot(*tables_.back(), kernel->handle);
  if (s->handle.load(std::memory_order_relaxed) == kernel->handle) {
    // A handle seen before, its entry retired: the slot takes the new one.
    s->kernel.store(kernel, std::memory_order_release);
    return;
  }
  if ((used_ + 1) * 2 > tables_.back()->capacity()) {
    grow_locked();
    s = &slot(*tables_.back(), kernel->handle);
  }
  // The entry before the handle: a reader that sees the handle sees it.
  // Released too: a reader whose probe ended at this slot while it was
  // empty may load the entry without the handle, and find() reads its
  // handle through it.
  s->kernel.store(kernel, std::memory_order_release);
  s->handle.store(kernel->handle, std::memory_order_release);
  used_++;
}

// A table with room for twice the live entries (at least the initial size);
// the handles of retired entries are left behind.
void KernelRegistry::grow_locked() {
  const Table& old = *tables_.back();
  size_t live = 0;
  for (size_t i = 0; i < old.capacity(); i++) live += old.slots[i].kernel.load(std::memory_order_relaxed) != nullptr;
  unsigned bits = kInitialBits;
  while ((size_t(1) << bits) < 4 * (live + 1)) bits++;
  auto grown = std::make_unique<Table>(bits);
  for (size_t i = 0; i < old.capacity(); i++) {
    Kernel* k = old.slots[i].kernel.load(std::memory_order_relaxed);
    if (!k) continue;
    Slot& s = slot(*grown, k->handle);
    s.kernel.store(k, std::memory_order_relaxed);
    s.handle.store(k->handle, std::memory_order_relaxed);
  }
  used_ = live;
  tables_.push_back(std::move(grown));
  table_.store(tables_.back().get(), std::memory_order_release);
}

void KernelRegistry::retire_locked(Kernel* kernel) {
  kernel->retired_ = true;
  retired_.push_back(kernel);
  if (!kernel->handle) {
    null_handle_.store(nullptr, std::memory_order_release);
    return;
  }
  // In the tables outgrown too: a lookup that began in one before it was
  // replaced may still be reading it.
  for (const auto& t : tables_) {
    Slot& s = slot(*t, kernel->handle);
    Kernel* expected = kernel;
    s.kernel.compare_exchange_strong(expected, nullptr, std::memory_order_release, std::memory_order_relaxed);
  }
}

uint64_t KernelRegistry::module_unloaded(const void* module_handle) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = modules_.unloaded(module_handle);
  for (const auto& k : kernels_) {
    if (k->retired_) continue;
    const auto& with = k->unloaded_with_;
    if ((id && k->module.id == id) || std::find(with.begin(), with.end(), module_handle) != with.end())
      retire_locked(k.get());
  }
  return id;
}

void KernelRegistry::unloaded_with(Kernel& kernel, const void* module_handle) {
  if (!module_handle) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& with = kernel.unloaded_with_;
  if (std::find(with.begin(), with.end(), module_handle) == with.end()) with.push_back(module_handle);
}

KernelRegistry::Entries KernelRegistry::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  Entries out;
  out.retired = retired_;
  for (const auto& k : kernels_)
    if (!k->retired_) out.live.push_back(k.get());
  return out;
}

}  // namespace phos::hooks
