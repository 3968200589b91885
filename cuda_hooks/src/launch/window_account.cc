#include "phos/hooks/window_account.h"

#include <algorithm>

namespace phos::hooks {

void WindowAccount::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  pointed_.clear();
  dropped_ = 0;
  longest_.clear();
  most_saved_.clear();
}

void WindowAccount::launch(const void* kernel, const std::string& name, Ranges reads, Ranges writes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [start, end] : reads) {
    // A buffer it writes is saved before the launch: the launch cannot be
    // the write the copy missed there.
    if (std::find(writes.begin(), writes.end(), std::pair(start, end)) != writes.end()) continue;
    auto key = std::tuple(kernel, start, end);
    auto it = pointed_.find(key);
    if (it == pointed_.end()) {
      if (pointed_.size() >= kMaxRanges) {
        dropped_++;
        continue;
      }
      it = pointed_.emplace(key, Pointed{name, 0}).first;
    }
    it->second.launches++;
  }
}

namespace {
// Keeps the kMaxLongestWaits largest of `key`, largest first.
template <class Key>
void keep_top(std::vector<agent::CallWait>& top, const agent::CallWait& w, Key key) {
  auto at = std::find_if(top.begin(), top.end(), [&](const auto& o) { return key(o) < key(w); });
  if (at == top.end() && top.size() >= agent::kMaxLongestWaits) return;
  top.insert(at, w);
  if (top.size() > agent::kMaxLongestWaits) top.pop_back();
}
}  // namespace

void WindowAccount::cost(const agent::CallWait& w) {
  std::lock_guard<std::mutex> lock(mu_);
  if (w.wait_ns) keep_top(longest_, w, [](const agent::CallWait& c) { return c.wait_ns; });
  if (w.chunks_saved) keep_top(most_saved_, w, [](const agent::CallWait& c) { return c.chunks_saved; });
}

std::pair<std::vector<agent::KernelLaunches>, uint64_t> WindowAccount::suspects(
    const std::vector<agent::AddressRange>& missed) const {
  std::map<const void*, agent::KernelLaunches> by_kernel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, p] : pointed_) {
      const auto& [kernel, start, end] = key;
      const bool into = std::any_of(missed.begin(), missed.end(), [&, s = start, e = end](const agent::AddressRange& m) {
        return m.address < e && s < m.address + m.bytes;
      });
      if (!into) continue;
      agent::KernelLaunches& k = by_kernel[kernel];
      k.name = p.name;
      k.launches += p.launches;
    }
  }
  std::vector<agent::KernelLaunches> all;
  for (auto& [kernel, k] : by_kernel) all.push_back(std::move(k));
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.launches > b.launches; });
  const uint64_t count = all.size();
  if (all.size() > agent::kMaxWindowKernels) all.resize(agent::kMaxWindowKernels);
  return {std::move(all), count};
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
