// The probe's injection library: the driver loads it at cuInit
// (CUDA_INJECTION64_PATH) and calls InitializeInjection, which subscribes to
// the Sanitizer API with no domain enabled, the way compute-sanitizer's tools
// start; the probe then patches late.
#include <dlfcn.h>
#include <sanitizer.h>

#include <cstdio>
#include <cstdlib>

static void ignore(void*, Sanitizer_CallbackDomain, Sanitizer_CallbackId, const void*) {}

extern "C" int InitializeInjection() {
  void* lib = dlopen(getenv("PROBE_SANITIZER_LIB"), RTLD_NOW | RTLD_GLOBAL);
  if (!lib) { fprintf(stderr, "inject: dlopen: %s\n", dlerror()); return 0; }
  auto subscribe = reinterpret_cast<decltype(&sanitizerSubscribe)>(dlsym(lib, "sanitizerSubscribe"));
  Sanitizer_SubscriberHandle h{};
  SanitizerResult r = subscribe(&h, ignore, nullptr);
  fprintf(stderr, "inject: InitializeInjection subscribed -> %d\n", int(r));
  return 1;
}
