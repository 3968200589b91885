#include "phos/hooks/window_account.h"

#include <algorithm>

namespace phos::hooks {
namespace {

// Most launched first, cut to kMaxWindowKernels; how many there were.
WindowAccount::Kernels most_launched(std::vector<agent::KernelLaunches> all) {
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.launches > b.launches; });
  const uint64_t count = all.size();
  if (all.size() > agent::kMaxWindowKernels) all.resize(agent::kMaxWindowKernels);
  return {std::move(all), count};
}

// Keeps the kMaxLongestWaits largest of `key`, largest first.
template <class Key>
void keep_top(std::vector<agent::CallWait>& top, const agent::CallWait& w, Key key) {
  auto at = std::find_if(top.begin(), top.end(), [&](const auto& o) { return key(o) < key(w); });
  if (at == top.end() && top.size() >= agent::kMaxLongestWaits) return;
  top.insert(at, w);
  if (top.size() > agent::kMaxLongestWaits) top.pop_back();
}

}  // namespace

void WindowAccount::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  kernels_.clear();
  ranges_ = 0;
  dropped_ = 0;
  longest_.clear();
  most_saved_.clear();
}

void WindowAccount::pointed_locked(Kernel& k, uint64_t start, uint64_t end) {
  auto it = std::lower_bound(k.pointed.begin(), k.pointed.end(), std::pair(start, end),
                             [](const Pointed& p, const auto& key) { return std::pair(p.start, p.end) < key; });
  if (it == k.pointed.end() || it->start != start || it->end != end) {
    if (ranges_ >= kMaxRanges) {
      dropped_++;
      return;
    }
    it = k.pointed.insert(it, Pointed{start, end, 0});
    ranges_++;
  }
  it->launches++;
}

void WindowAccount::launch(const void* kernel, const std::string& name, Ranges reads, Ranges writes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = kernels_.try_emplace(kernel);
  Kernel& k = it->second;
  if (added) k.name = name;
  k.launches++;
  for (const auto& [start, end] : reads) {
    // A buffer it writes is saved before the launch: the launch cannot be
    // the write the copy missed there.
    if (std::find(writes.begin(), writes.end(), std::pair(start, end)) != writes.end()) continue;
    pointed_locked(k, start, end);
  }
}

void WindowAccount::cost(const agent::CallWait& w) {
  std::lock_guard<std::mutex> lock(mu_);
  if (w.wait_ns) keep_top(longest_, w, [](const agent::CallWait& c) { return c.wait_ns; });
  if (w.chunks_saved) keep_top(most_saved_, w, [](const agent::CallWait& c) { return c.chunks_saved; });
}

WindowAccount::Kernels WindowAccount::kernels() const {
  std::vector<agent::KernelLaunches> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [kernel, k] : kernels_) all.push_back({k.name, k.launches});
  }
  return most_launched(std::move(all));
}

WindowAccount::Kernels WindowAccount::suspects(const std::vector<agent::AddressRange>& missed) const {
  std::vector<agent::KernelLaunches> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [kernel, k] : kernels_) {
      uint64_t launches = 0;
      for (const Pointed& p : k.pointed)
        if (std::any_of(missed.begin(), missed.end(), [&](const agent::AddressRange& m) {
              return m.address < p.end && p.start < m.address + m.bytes;
            }))
          launches += p.launches;
      if (launches) all.push_back({k.name, launches});
    }
  }
  return most_launched(std::move(all));
}

std::vector<agent::CallWait> WindowAccount::longest_waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return longest_;
}

std::vector<agent::CallWait> WindowAccount::most_saved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return most_saved_;
}

uint64_t WindowAccount::ranges_dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace phos::hooks
