// The real definition of a library function libphos.so stands in for
// (cuBLAS, NCCL, cudart's registration): the next one after libphos.so in
// the global scope (dlsym RTLD_NEXT), or, for a library the program opened
// with RTLD_LOCAL (which RTLD_NEXT does not search), the one in the loaded
// library whose file name starts with `library`. libphos.so never loads a
// library itself; resolved on first use and cached in `cache`.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

namespace phos::hooks {

void* library_next(const char* name, const char* library, std::atomic<void*>& cache);

// The path of a loaded object whose file name starts with `prefix`; "" if none.
std::string loaded_library(const char* prefix);

template <class F>
F library_next_as(const char* name, const char* library, std::atomic<void*>& cache) {
  return reinterpret_cast<F>(library_next(name, library, cache));
}

// One cache per function name, whichever call site asks: a lookup made once
// on a program thread serves the agent's thread too, which must not call
// dlsym (it waits for glibc's loader lock, which a program thread frozen
// inside dlopen() holds while a checkpoint keeps it stopped).
template <size_t N>
struct FunctionName {
  char text[N];
  constexpr FunctionName(const char (&s)[N]) {
    for (size_t i = 0; i < N; i++) text[i] = s[i];
  }
};
template <FunctionName name>
std::atomic<void*>& next_cache() {
  static std::atomic<void*> cache{nullptr};
  return cache;
}

}  // namespace phos::hooks

// The real `name`, typed as `type` (a function pointer type), or as our own
// definition of it where the name is not overloaded; null where no loaded
// library defines it.
#define PHOS_NEXT_AS(name, library, type) \
  ::phos::hooks::library_next_as<type>(#name, library, ::phos::hooks::next_cache<::phos::hooks::FunctionName(#name)>())
#define PHOS_NEXT(name, library) PHOS_NEXT_AS(name, library, decltype(&::name))
