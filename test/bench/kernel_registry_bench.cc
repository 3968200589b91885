// phos-kernel-registry-bench: what a launch pays to find its kernel's entry
// in the kernel registry (phos/hooks/kernel_registry.h) on this CPU (a
// measurement to read, not a test). Every kernel is known already (the
// launches after each kernel's first); each thread looks up a working set
// of 64 kernels (a training step's) or 4096 in its own random order, with 1,
// 2 and 4 threads (more threads than cores time-share them: the ns per
// lookup then grow with the share). For comparison, the same lookups in what each feature kept
// before: an unordered_map under a std::mutex, and under a
// std::shared_mutex taken shared.
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "phos/hooks/kernel_registry.h"
#include "phos/hooks/module_registry.h"

namespace {

using namespace phos::hooks;
using Clock = std::chrono::steady_clock;

struct FakeKernel {
  std::string name;
};

KernelDescription describe(const void* handle) {
  return {static_cast<const FakeKernel*>(handle)->name, std::vector<ParamSlot>{}};
}

constexpr size_t kLookupsPerThread = 20000000;

// ns per lookup, as each thread sees it (the mean over threads), for
// `threads` threads each running `lookups(order, n)`.
double per_lookup_ns(size_t threads, const std::vector<const void*>& handles,
                     const std::function<uint64_t(const std::vector<const void*>&, size_t)>& lookups) {
  std::vector<double> seconds(threads);
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; t++) {
    pool.emplace_back([&, t] {
      std::vector<const void*> order;
      std::mt19937_64 rng(t + 1);
      for (size_t i = 0; i < 1 << 16; i++) order.push_back(handles[rng() % handles.size()]);
      auto t0 = Clock::now();
      uint64_t found = lookups(order, kLookupsPerThread);
      seconds[t] = std::chrono::duration<double>(Clock::now() - t0).count();
      asm volatile("" : : "r"(found));
    });
  }
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double s : seconds) sum += s;
  return sum / double(threads) / double(kLookupsPerThread) * 1e9;
}

void bench(size_t kernels) {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe);
  int module_handle = 0;
  modules.loaded(&module_handle, ModuleImage{}, "bench");
  std::deque<FakeKernel> fakes(kernels);
  std::vector<const void*> handles;
  std::unordered_map<const void*, Kernel*> map;
  for (size_t i = 0; i < kernels; i++) {
    fakes[i].name = "kernel_" + std::to_string(i);
    modules.function(&module_handle, &fakes[i], fakes[i].name.c_str());
    handles.push_back(&fakes[i]);
    map[&fakes[i]] = &registry.get(&fakes[i]);
  }
  std::mutex mu;
  std::shared_mutex shared_mu;
  auto registry_get = [&](const std::vector<const void*>& order, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) sum += reinterpret_cast<uintptr_t>(&registry.get(order[i & 0xffff]));
    return sum;
  };
  auto mutex_map = [&](const std::vector<const void*>& order, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
      std::lock_guard<std::mutex> lock(mu);
      sum += reinterpret_cast<uintptr_t>(map.find(order[i & 0xffff])->second);
    }
    return sum;
  };
  auto shared_map = [&](const std::vector<const void*>& order, size_t n) {
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
      std::shared_lock<std::shared_mutex> lock(shared_mu);
      sum += reinterpret_cast<uintptr_t>(map.find(order[i & 0xffff])->second);
    }
    return sum;
  };
  for (size_t threads : {1, 2, 4}) {
    std::printf("%5zu kernels, %zu thread%s: registry %6.1f ns/lookup, mutex+map %6.1f, shared_mutex+map %6.1f\n",
                kernels, threads, threads == 1 ? " " : "s", per_lookup_ns(threads, handles, registry_get),
                per_lookup_ns(threads, handles, mutex_map), per_lookup_ns(threads, handles, shared_map));
  }
}

}  // namespace

int main() {
  std::printf("hardware threads: %u\n", std::thread::hardware_concurrency());
  bench(64);
  bench(4096);
  return 0;
}
