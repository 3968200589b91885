#include "driver/library_next.h"
#include "phos/hooks/stderr_line.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "driver/driver.h"

namespace phos::hooks {

std::string loaded_library(const char* prefix) {
  struct Search {
    const char* prefix;
    std::string path;
  } search{prefix, {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const char* slash = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
        const char* file = slash ? slash + 1 : info->dlpi_name;
        if (!file || std::strncmp(file, s->prefix, std::strlen(s->prefix)) != 0) return 0;
        s->path = info->dlpi_name;
        return 1;
      },
      &search);
  return search.path;
}

void* library_next(const char* name, const char* library, std::atomic<void*>& cache) {
  void* p = cache.load(std::memory_order_acquire);
  if (__builtin_expect(p != nullptr, 1)) return p;
  // glibc's dlsym called from here: RTLD_NEXT means after libphos.so.
  p = driver::real_dlsym(RTLD_NEXT, name);
  if (!p) {
    std::string path = loaded_library(library);
    void* handle = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (handle) {
      p = driver::real_dlsym(handle, name);
      dlclose(handle);  // NOLOAD took a reference; the program holds its own
    }
  }
  if (!p) stderr_line("phos: %s: no loaded %s defines it\n", name, library);
  cache.store(p, std::memory_order_release);
  return p;
}

}  // namespace phos::hooks
