#include "phos/hooks/module_registry.h"

#include <algorithm>

namespace phos::hooks {

uint64_t ModuleRegistry::loaded(const void* handle, const ModuleImage& image, std::string source,
                                const void* image_data) {
  std::lock_guard<std::mutex> lock(mu_);
  ModuleInfo& m = modules_[handle];
  if (m.id) handle_of_.erase(m.id);
  m = ModuleInfo{next_id_++, image, std::move(source), {}, {}, image_data};
  handle_of_[m.id] = handle;
  return m.id;
}

uint64_t ModuleRegistry::unloaded(const void* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = modules_.find(handle);
  if (it == modules_.end()) return 0;
  uint64_t id = it->second.id;
  modules_.erase(it);
  handle_of_.erase(id);
  std::erase_if(function_module_, [&](const auto& f) { return f.second == id; });
  return id;
}

void ModuleRegistry::function(const void* module, const void* function, const char* name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = modules_.find(module);
  if (it == modules_.end()) return;
  // The same function asked for again (each cudart launch may look it up) is listed once.
  auto [f, inserted] = function_module_.try_emplace(function, it->second.id);
  if (!inserted && f->second == it->second.id) return;
  f->second = it->second.id;
  if (name) it->second.functions.emplace_back(name);
}

void ModuleRegistry::global(const void* module, const char* name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = modules_.find(module);
  if (it == modules_.end() || !name) return;
  auto& g = it->second.globals;
  if (std::find(g.begin(), g.end(), name) == g.end()) g.emplace_back(name);
}

void ModuleRegistry::same_module(const void* function, const void* derived) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = function_module_.find(function);
  if (it != function_module_.end()) function_module_[derived] = it->second;
}

uint64_t ModuleRegistry::module_of(const void* function) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = function_module_.find(function);
  return it == function_module_.end() ? 0 : it->second;
}

ModuleRef ModuleRegistry::module_ref(const void* function) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto f = function_module_.find(function);
  if (f == function_module_.end()) return {};
  auto h = handle_of_.find(f->second);
  if (h == handle_of_.end()) return {};
  const ModuleInfo& m = modules_.at(h->second);
  return ModuleRef{m.id, m.image.hash, m.image_data};
}

std::vector<ModuleInfo> ModuleRegistry::modules() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModuleInfo> out;
  for (const auto& [h, m] : modules_) out.push_back(m);
  std::sort(out.begin(), out.end(), [](const ModuleInfo& a, const ModuleInfo& b) { return a.id < b.id; });
  return out;
}

}  // namespace phos::hooks
