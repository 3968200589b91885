// The kernel registry (phos/hooks/kernel_registry.h), with fake kernel
// handles: each points at a FakeKernel whose name and layout the describer
// reads, as the fake libcuda's handles carry theirs.
#include <catch2/catch.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "phos/hooks/kernel_registry.h"
#include "phos/hooks/module_registry.h"

using namespace phos::hooks;

namespace {

struct FakeKernel {
  std::string name;
  std::optional<std::vector<ParamSlot>> params;
  std::atomic<int> described{0};
};

KernelDescription describe_fake(const void* handle) {
  auto* k = static_cast<FakeKernel*>(const_cast<void*>(handle));
  k->described++;
  return {k->name, k->params};
}

// What a feature keeps per kernel.
struct Counted final : KernelState {
  uint64_t launches = 0;
};

uint64_t load(ModuleRegistry& modules, const void* handle) { return modules.loaded(handle, ModuleImage{}, "test"); }

}  // namespace

TEST_CASE("kernel registry: a new kernel is described once, a known one found", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  int module_handle = 0;
  uint64_t id = load(modules, &module_handle);
  FakeKernel saxpy{"saxpy", std::vector<ParamSlot>{{0, 8}, {8, 8}}};
  modules.function(&module_handle, &saxpy, "saxpy");

  CHECK(registry.find(&saxpy) == nullptr);
  Kernel& k = registry.get(&saxpy);
  CHECK(k.handle == &saxpy);
  CHECK(k.name == "saxpy");
  CHECK(k.module.id == id);
  REQUIRE(k.params);
  CHECK(k.params->size() == 2);
  CHECK((*k.params)[1].offset == 8);
  CHECK(&registry.get(&saxpy) == &k);
  CHECK(registry.find(&saxpy) == &k);
  CHECK(saxpy.described == 1);

  FakeKernel noinfo{"noinfo", std::nullopt};
  Kernel& n = registry.get(&noinfo);
  CHECK(&n != &k);
  CHECK(!n.params);
  CHECK(n.module.id == 0);  // the module registry never heard of it
  auto entries = registry.entries();
  CHECK(entries.retired.empty());
  REQUIRE(entries.live.size() == 2);
  CHECK(entries.live[0] == &k);  // in the order they were made
  CHECK(entries.live[1] == &n);
}

TEST_CASE("kernel registry: a CUkernel's function is its own entry of the same module", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  int library = 0;
  uint64_t id = load(modules, &library);
  FakeKernel kernel{"k", std::vector<ParamSlot>{}}, function{"k", std::vector<ParamSlot>{}};
  modules.function(&library, &kernel, "k");
  modules.same_module(&kernel, &function);  // cuKernelGetFunction
  Kernel& a = registry.get(&kernel);
  Kernel& b = registry.get(&function);
  CHECK(&a != &b);
  CHECK(a.module.id == id);
  CHECK(b.module.id == id);
  CHECK(registry.module_unloaded(&library) == id);
  CHECK(registry.find(&kernel) == nullptr);
  CHECK(registry.find(&function) == nullptr);
}

TEST_CASE("kernel registry: an unload retires its module's kernels, keeping their state", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  int m1 = 0, m2 = 0;
  uint64_t id1 = load(modules, &m1);
  load(modules, &m2);
  FakeKernel a{"a", std::vector<ParamSlot>{}}, b{"b", std::vector<ParamSlot>{}};
  modules.function(&m1, &a, "a");
  modules.function(&m2, &b, "b");
  Kernel& ka = registry.get(&a);
  Kernel& kb = registry.get(&b);
  ka.attach(KernelFeature::kLaunchLog, std::make_unique<Counted>()).launches = 3;

  CHECK(registry.module_unloaded(&m1) == id1);
  CHECK(registry.find(&a) == nullptr);
  CHECK(registry.find(&b) == &kb);
  auto entries = registry.entries();
  REQUIRE(entries.retired.size() == 1);
  CHECK(entries.retired[0] == &ka);
  REQUIRE(entries.live.size() == 1);
  CHECK(entries.live[0] == &kb);
  const Counted* counted = entries.retired[0]->state<Counted>(KernelFeature::kLaunchLog);
  REQUIRE(counted);
  CHECK(counted->launches == 3);
  CHECK(entries.retired[0]->name == "a");
  CHECK(entries.retired[0]->state<Counted>(KernelFeature::kSpeculation) == nullptr);

  // A module the registry does not know retires nothing.
  int unknown = 0;
  CHECK(registry.module_unloaded(&unknown) == 0);
  CHECK(registry.entries().retired.size() == 1);
}

TEST_CASE("kernel registry: a handle reused after its module's unload gets a fresh entry", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  int m1 = 0, m2 = 0;
  load(modules, &m1);
  FakeKernel handle{"saxpy", std::vector<ParamSlot>{{0, 8}, {8, 8}, {16, 4}, {20, 4}}};
  modules.function(&m1, &handle, "saxpy");
  Kernel& old = registry.get(&handle);
  old.attach(KernelFeature::kSpeculation, std::make_unique<Counted>()).launches = 2;
  registry.module_unloaded(&m1);

  // The driver hands a new kernel of a new module the same handle.
  handle.name = "closure_kernel";
  handle.params = std::vector<ParamSlot>{{0, 4}, {8, 24}};
  uint64_t id2 = load(modules, &m2);
  modules.function(&m2, &handle, "closure_kernel");
  Kernel& fresh = registry.get(&handle);
  CHECK(&fresh != &old);
  CHECK(fresh.name == "closure_kernel");
  CHECK(fresh.module.id == id2);
  REQUIRE(fresh.params);
  CHECK(fresh.params->size() == 2);
  CHECK(fresh.state<Counted>(KernelFeature::kSpeculation) == nullptr);
  CHECK(handle.described == 2);
  CHECK(registry.find(&handle) == &fresh);

  // The old one is still reported, under its own name, with its state.
  auto entries = registry.entries();
  REQUIRE(entries.retired.size() == 1);
  CHECK(entries.retired[0]->name == "saxpy");
  CHECK(entries.retired[0]->params->size() == 4);
  CHECK(entries.retired[0]->state<Counted>(KernelFeature::kSpeculation)->launches == 2);
  REQUIRE(entries.live.size() == 1);
  CHECK(entries.live[0] == &fresh);
}

TEST_CASE("kernel registry: a kernel is retired with a handle the driver named for it", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  FakeKernel orphan{"orphan", std::nullopt};
  int driver_module = 0, other = 0;
  Kernel& k = registry.get(&orphan);
  CHECK(k.module.id == 0);
  registry.unloaded_with(k, &driver_module);
  registry.unloaded_with(k, nullptr);  // no library: ignored
  CHECK(registry.module_unloaded(&other) == 0);
  CHECK(registry.find(&orphan) == &k);
  CHECK(registry.module_unloaded(&driver_module) == 0);
  CHECK(registry.find(&orphan) == nullptr);
  CHECK(registry.entries().retired.size() == 1);
}

TEST_CASE("kernel registry: the null handle is a kernel like any other", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, [](const void*) { return KernelDescription{"", std::nullopt}; });
  CHECK(registry.find(nullptr) == nullptr);
  Kernel& k = registry.get(nullptr);
  CHECK(registry.find(nullptr) == &k);
  CHECK(&registry.get(nullptr) == &k);
  registry.unloaded_with(k, &k);
  registry.module_unloaded(&k);
  CHECK(registry.find(nullptr) == nullptr);
  CHECK(&registry.get(nullptr) != &k);
}

TEST_CASE("kernel registry: thousands of kernels, half retired and their handles reused", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  constexpr size_t kKernels = 5000;
  std::deque<FakeKernel> kernels;  // stable addresses
  int m1 = 0, m2 = 0, m3 = 0;
  load(modules, &m1);
  load(modules, &m2);
  std::vector<Kernel*> first(kKernels);
  for (size_t i = 0; i < kKernels; i++) {
    kernels.emplace_back();
    kernels.back().name = "k" + std::to_string(i);
    modules.function(i % 2 ? &m2 : &m1, &kernels.back(), kernels.back().name.c_str());
    first[i] = &registry.get(&kernels.back());
  }
  for (size_t i = 0; i < kKernels; i++) REQUIRE(registry.find(&kernels[i]) == first[i]);
  registry.module_unloaded(&m1);
  load(modules, &m3);
  for (size_t i = 0; i < kKernels; i += 2) {
    REQUIRE(registry.find(&kernels[i]) == nullptr);
    kernels[i].name += "'";
    modules.function(&m3, &kernels[i], kernels[i].name.c_str());
  }
  for (size_t i = 0; i < kKernels; i++) {
    Kernel& k = registry.get(&kernels[i]);
    if (i % 2) {
      REQUIRE(&k == first[i]);
    } else {
      REQUIRE(&k != first[i]);
      REQUIRE(k.name == "k" + std::to_string(i) + "'");
    }
  }
  auto entries = registry.entries();
  CHECK(entries.retired.size() == kKernels / 2);
  CHECK(entries.live.size() == kKernels);
}

TEST_CASE("kernel registry: concurrent lookups find one entry per kernel", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  int module_handle = 0;
  load(modules, &module_handle);
  // More kernels than the first table holds: lookups run while it is replaced.
  constexpr size_t kKernels = 600, kThreads = 4, kRounds = 20;
  std::deque<FakeKernel> kernels(kKernels);
  for (size_t i = 0; i < kKernels; i++) {
    kernels[i].name = "k" + std::to_string(i);
    modules.function(&module_handle, &kernels[i], kernels[i].name.c_str());
  }
  std::vector<std::vector<Kernel*>> seen(kThreads, std::vector<Kernel*>(kKernels));
  std::atomic<bool> wrong{false};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      for (size_t round = 0; round < kRounds; round++) {
        for (size_t n = 0; n < kKernels; n++) {
          size_t i = (n * 7 + t * 131) % kKernels;  // each thread in its own order
          Kernel& k = registry.get(&kernels[i]);
          if (k.handle != &kernels[i] || k.name != kernels[i].name) wrong = true;
          if (round == 0) seen[t][i] = &k;
          else if (seen[t][i] != &k) wrong = true;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(!wrong);
  for (size_t i = 0; i < kKernels; i++) {
    CHECK(kernels[i].described == 1);
    for (size_t t = 1; t < kThreads; t++) REQUIRE(seen[t][i] == seen[0][i]);
  }
  CHECK(registry.entries().live.size() == kKernels);
}

TEST_CASE("kernel registry: lookups while another module is loaded and unloaded", "[kernel_registry]") {
  ModuleRegistry modules;
  KernelRegistry registry(modules, describe_fake);
  int stable_module = 0;
  load(modules, &stable_module);
  constexpr size_t kStable = 64;
  std::deque<FakeKernel> stable(kStable);
  for (size_t i = 0; i < kStable; i++) {
    stable[i].name = "s" + std::to_string(i);
    modules.function(&stable_module, &stable[i], stable[i].name.c_str());
  }
  std::vector<Kernel*> expected;
  for (auto& k : stable) expected.push_back(&registry.get(&k));
  std::atomic<bool> done{false}, wrong{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; t++) {
    readers.emplace_back([&] {
      while (!done) {
        for (size_t i = 0; i < kStable; i++)
          if (registry.find(&stable[i]) != expected[i]) wrong = true;
      }
    });
  }
  // The churning module's kernels come and go, the same handles reused.
  std::deque<FakeKernel> churn(32);
  int churn_module = 0;
  for (int round = 0; round < 200; round++) {
    load(modules, &churn_module);
    for (auto& k : churn) {
      k.name = "c" + std::to_string(round);
      modules.function(&churn_module, &k, k.name.c_str());
      if (registry.get(&k).name != k.name) wrong = true;
    }
    registry.module_unloaded(&churn_module);
    for (auto& k : churn)
      if (registry.find(&k)) wrong = true;
  }
  done = true;
  for (auto& th : readers) th.join();
  CHECK(!wrong);
  CHECK(registry.entries().retired.size() == 200 * churn.size());
}
