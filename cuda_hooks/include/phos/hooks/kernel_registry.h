// The kernels a process launched while a feature needed them (the launch
// log, the speculation, the validation): one entry per kernel handle, with
// the kernel's name, module and parameter layout, asked once, and the state
// each feature keeps for it. A launch looks its kernel up once and hands the
// entry to every feature that is on; with none on it looks nothing up.
//
// Handles are the driver's CUfunction or CUkernel (cudart launches the
// latter through cuLaunchKernel), opaque here: what the driver says about
// one comes from the describer the registry is given (kernel_info.h's
// describe_kernel in libphos.so), its module from the module registry.
//
// A module unloaded retires its kernels: their entries, with the features'
// state, stay for the reports and are never found again, since the driver
// may hand a later kernel the same handle with another name and layout; that
// kernel gets a fresh entry.
//
// A known kernel is found without a lock: the entries are in an open
// addressing table of (handle, entry) pairs, read with acquire loads and
// written under the registry's mutex. A table outgrown is replaced and kept,
// as a reader may still be in it; entries are never freed. The mutex may be
// taken under a feature's lock, never the other way round; the module
// registry's is taken under it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "phos/hooks/module_registry.h"
#include "phos/speculation/kernel_layout.h"

namespace phos::hooks {

using ParamSlot = speculation::ParamSlot;

// What the driver says about a kernel handle.
struct KernelDescription {
  std::string name;
  // Every parameter's offset and size; nullopt where the driver did not say.
  std::optional<std::vector<ParamSlot>> params;
};
using DescribeKernel = KernelDescription (*)(const void* handle);

// The features that keep state per kernel, each in its own slot.
enum class KernelFeature : uint8_t { kLaunchLog, kSpeculation, kValidation };
inline constexpr size_t kKernelFeatures = 3;

// A feature's state of one kernel (each feature derives its own). Read and
// written only under that feature's own lock.
class KernelState {
 public:
  virtual ~KernelState() = default;
};

class Kernel {
 public:
  Kernel(const void* handle, KernelDescription description, ModuleRef module)
      : handle(handle), name(std::move(description.name)), module(module), params(std::move(description.params)) {}
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const void* const handle;
  const std::string name;
  const ModuleRef module;  // id 0: not known
  const std::optional<std::vector<ParamSlot>> params;

  // `feature`'s state, or null before it attached one; the caller holds the
  // feature's lock.
  template <class State>
  State* state(KernelFeature feature) {
    return static_cast<State*>(states_[size_t(feature)].get());
  }
  template <class State>
  const State* state(KernelFeature feature) const {
    return static_cast<const State*>(states_[size_t(feature)].get());
  }
  template <class State>
  State& attach(KernelFeature feature, std::unique_ptr<State> state) {
    State& s = *state;
    states_[size_t(feature)] = std::move(state);
    return s;
  }

 private:
  friend class KernelRegistry;
  std::unique_ptr<KernelState> states_[kKernelFeatures];
  // Under the registry's mutex.
  bool retired_ = false;
  std::vector<const void*> unloaded_with_;  // module handles besides its module's whose unload retires it
};

class KernelRegistry {
 public:
  KernelRegistry(ModuleRegistry& modules, DescribeKernel describe);
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // The live entry of `handle`, or null; takes no lock.
  Kernel* find(const void* handle) const;
  // The live entry of `handle`, made (the kernel described) at its first
  // lookup.
  Kernel& get(const void* handle);
  // The module or library loaded under `module_handle` was unloaded: the
  // module registry forgets it and its kernels are retired. Its module id
  // (0 where the module registry did not know it).
  uint64_t module_unloaded(const void* module_handle);
  // An unload of `module_handle` retires `kernel` too (a handle the driver
  // named for it that the module registry may not know).
  void unloaded_with(Kernel& kernel, const void* module_handle);

  // Every entry, retired ones in the order they were retired, live ones in
  // the order they were made. Entries live for ever: the pointers stay valid.
  struct Entries {
    std::vector<Kernel*> retired, live;
  };
  Entries entries() const;

 private:
  struct Slot {
    std::atomic<const void*> handle{nullptr};  // null: empty; kept when the entry is retired
    std::atomic<Kernel*> kernel{nullptr};      // null: none live under this handle
  };
  struct Table {
    explicit Table(unsigned bits) : bits(bits), slots(new Slot[size_t(1) << bits]) {}
    size_t capacity() const { return size_t(1) << bits; }
    const unsigned bits;
    std::unique_ptr<Slot[]> slots;
  };
  static size_t home(const Table& t, const void* handle);
  // The slot holding `handle` in `t`, or the empty one where it would go.
  static Slot& slot(const Table& t, const void* handle);
  void publish_locked(Kernel* kernel);
  void grow_locked();
  void retire_locked(Kernel* kernel);

  ModuleRegistry& modules_;
  const DescribeKernel describe_;
  std::atomic<Table*> table_;
  // The null handle has no slot (null marks an empty one).
  std::atomic<Kernel*> null_handle_{nullptr};
  mutable std::mutex mu_;
  size_t used_ = 0;  // slots of the current table holding a handle
  std::vector<std::unique_ptr<Table>> tables_;  // the current one last
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<Kernel*> retired_;
};

}  // namespace phos::hooks
