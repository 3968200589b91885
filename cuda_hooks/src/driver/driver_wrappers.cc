// The generated wrappers: every driver function phos does not hook by hand
// passes the gate (counted as its own kind while the call counter is on)
// and calls libcuda; a query (query_functions.txt) only calls libcuda, for
// programs linked to the driver directly, and is not counted: libcuda's
// own function is what cuGetProcAddress hands out for it.
#include "driver/driver.h"
#include "runtime.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

namespace {
// What the generated wrappers use: the gate.
struct WrapperDeps : ::phos::hooks::RuntimeView {
  using RuntimeView::gate;
};
}  // namespace

#define PHOS_DRIVER_HOOKED(name, params, args)
#define PHOS_DRIVER_FN(name, params, args)                                            \
  extern "C" PHOS_EXPORT CUresult name params {                                       \
    ::phos::hooks::GatePass pass(WrapperDeps().gate(), PHOS_CALL_KIND(name));         \
    auto real = PHOS_REAL(name);                                                      \
    return real ? real args : CUDA_ERROR_NOT_FOUND;                                   \
  }
#define PHOS_DRIVER_QUERY(name, params, args)                                         \
  extern "C" PHOS_EXPORT CUresult name params {                                       \
    auto real = PHOS_REAL(name);                                                      \
    return real ? real args : CUDA_ERROR_NOT_FOUND;                                   \
  }
#include "driver_table.inc"
#undef PHOS_DRIVER_FN
#undef PHOS_DRIVER_HOOKED
#undef PHOS_DRIVER_QUERY
