#include "phos/hooks/sass_validation.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <vector>

#include "driver/driver.h"
#include "phos/support/clock.h"

namespace phos::hooks {

namespace {

thread_local bool t_in_sanitizer = false;

// Marks this thread as inside the Sanitizer API for a scope.
struct SanitizerCall {
  SanitizerCall() { t_in_sanitizer = true; }
  ~SanitizerCall() { t_in_sanitizer = false; }
};

void ignore_callback(void*, int, uint32_t, const void*) {}

std::vector<std::string> library_candidates() {
  std::vector<std::string> out;
  if (const char* lib = std::getenv("PHOS_SANITIZER_LIB"); lib && *lib) return {lib};
  const char* home = std::getenv("CUDA_HOME");
  std::string toolkit = home && *home ? home : "/usr/local/cuda";
  out.push_back(toolkit + "/compute-sanitizer/libsanitizer-public.so");
  if (toolkit != "/usr/local/cuda") out.push_back("/usr/local/cuda/compute-sanitizer/libsanitizer-public.so");
  out.push_back("libsanitizer-public.so");
  return out;
}


}  // namespace

bool in_sanitizer_call() { return t_in_sanitizer; }

std::string SassPatcher::message(sanitizer::Result r) const {
  const char* text = nullptr;
  if (get_result_string_) get_result_string_(r, &text);
  return "sanitizer error " + std::to_string(r) + (text ? std::string(" (") + text + ")" : std::string());
}

Result<void> SassPatcher::attach() {
  if (attached_) return {};
  if (kSassPatchImageSize == 0) return make_error("libphos.so was built without nvcc: it carries no SASS patch");
  std::string tried;
  for (const std::string& path : library_candidates()) {
    library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library_) break;
    tried += (tried.empty() ? "" : "; ") + std::string(dlerror());
  }
  if (!library_) return make_error("cannot load the Sanitizer API (set PHOS_SANITIZER_LIB): " + tried);
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library_, name));
    return fn != nullptr;
  };
  sanitizer::Subscribe subscribe = nullptr;
  if (!sym(get_result_string_, "sanitizerGetResultString") || !sym(subscribe, "sanitizerSubscribe") ||
      !sym(add_patches_, "sanitizerAddPatches") || !sym(patch_instructions_, "sanitizerPatchInstructions") ||
      !sym(patch_module_, "sanitizerPatchModule") || !sym(unpatch_module_, "sanitizerUnpatchModule") ||
      !sym(set_callback_data_, "sanitizerSetCallbackData"))
    return make_error("the Sanitizer API library lacks a function phos uses: " + std::string(dlerror()));
  SanitizerCall call;
  if (sanitizer::Result r = subscribe(&subscriber_, ignore_callback, nullptr); r != sanitizer::kSuccess)
    return make_error("sanitizerSubscribe: " + message(r));
  attached_ = true;
  return {};
}

Result<SassPatcher::Patched> SassPatcher::resolve(CUfunction f) const {
  if (!attached_) return make_error("the Sanitizer API is not attached");
  // A CUfunction names its module. A CUkernel does not (driver 580 answers
  // cuFuncGetModule with an error for one, measured): its function in this
  // context does, and its library is what an unload will name.
  Patched p;
  p.function = f;
  if (PHOS_REAL(cuFuncGetModule)(&p.module, f) != CUDA_SUCCESS || !p.module) {
    auto kernel = reinterpret_cast<CUkernel>(f);
    if (PHOS_REAL(cuKernelGetFunction)(&p.function, kernel) != CUDA_SUCCESS ||
        PHOS_REAL(cuFuncGetModule)(&p.module, p.function) != CUDA_SUCCESS || !p.module)
      return make_error("the driver names no module for this function");
    if (PHOS_REAL(cuKernelGetLibrary)(&p.library, kernel) != CUDA_SUCCESS) p.library = nullptr;
  }
  return p;
}

Result<void> SassPatcher::ensure_patched(const Patched& handles) {
  CUmodule module = handles.module;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = modules_.find(module); it != modules_.end()) {
    if (!it->second.why_not.empty()) return make_error(it->second.why_not);
    return {};
  }
  uint64_t started = monotonic_ns();
  SanitizerCall call;
  CUcontext ctx = nullptr;
  PHOS_REAL(cuCtxGetCurrent)(&ctx);
  ModuleState& state = modules_[module];
  state.library = handles.library;
  // The first failure is kept for the module: later calls answer with it.
  auto fail = [&](std::string why) {
    state.why_not = why;
    return make_error(std::move(why));
  };
  if (!contexts_.count(ctx)) {
    if (sanitizer::Result r = add_patches_(kSassPatchImage, ctx); r != sanitizer::kSuccess)
      return fail("sanitizerAddPatches: " + message(r));
    contexts_.insert(ctx);
    totals_.contexts++;
  }
  const std::pair<int, const char*> patches[] = {
      {sanitizer::kGlobalMemoryAccess, "phos_sass_global_access"},
      {sanitizer::kBulkCopySharedToGlobal, "phos_sass_bulk_to_global"},
      {sanitizer::kBulkReductionSharedToGlobal, "phos_sass_bulk_to_global"},
  };
  for (const auto& [instruction, callback] : patches)
    if (sanitizer::Result r = patch_instructions_(instruction, module, callback); r != sanitizer::kSuccess)
      return fail("sanitizerPatchInstructions(" + std::to_string(instruction) + "): " + message(r));
  if (sanitizer::Result r = patch_module_(module); r != sanitizer::kSuccess)
    return fail("sanitizerPatchModule: " + message(r));
  uint64_t ns = monotonic_ns() - started;
  totals_.modules++;
  totals_.patch_ns += ns;
  totals_.patch_max_ns = std::max(totals_.patch_max_ns, ns);
  return {};
}

bool SassPatcher::set_table(CUfunction f, uint64_t table) {
  SanitizerCall call;
  return set_callback_data_(f, reinterpret_cast<const void*>(table)) == sanitizer::kSuccess;
}

void SassPatcher::unpatch_all() {
  if (!attached_) return;
  std::lock_guard<std::mutex> lock(mu_);
  SanitizerCall call;
  for (const auto& [module, state] : modules_)
    if (state.why_not.empty()) unpatch_module_(module);
  modules_.clear();
}

void SassPatcher::unloaded(const void* handle) {
  if (!attached_) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(modules_, [&](const auto& m) {
    return static_cast<const void*>(m.first) == handle || static_cast<const void*>(m.second.library) == handle;
  });
}

SassPatcher::Totals SassPatcher::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

}  // namespace phos::hooks
