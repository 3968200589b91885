#include "memory/driver_limits.h"

#include "driver/driver.h"
#include "process/env_switch.h"

namespace phos::hooks {
namespace {

struct Limit {
  CUlimit limit;
  const char* name;
};
constexpr Limit kLimits[] = {{CU_LIMIT_STACK_SIZE, "stack"},
                             {CU_LIMIT_PRINTF_FIFO_SIZE, "printf FIFO"},
                             {CU_LIMIT_MALLOC_HEAP_SIZE, "malloc heap"}};

}  // namespace

// On by default: the stack's local memory is most of what the driver's
// checkpoint moves (264 of a context's 457 MiB on an H200, 1249 MiB once a
// kernel grew it to 4 KiB), and the driver grows the stack again at any
// launch that needs it, the limit set back before the gate opens besides.
bool DriverLimits::wanted() {
  static const bool on = on_unless_switched_off("PHOS_SHRINK_DRIVER_STATE");
  return on;
}

Result<std::string> DriverLimits::lower(const std::vector<CUcontext>& contexts) {
  std::lock_guard<std::mutex> lock(mu_);
  auto get = PHOS_REAL(cuCtxGetLimit);
  auto set = PHOS_REAL(cuCtxSetLimit);
  if (!get || !set) return make_error("the driver has no cuCtxGetLimit/cuCtxSetLimit", ENOTSUP);
  // Lowered already and not set back: lowering again would save the lowered
  // values as the program's.
  if (!saved_.empty()) return std::string();
  std::string line;
  for (CUcontext ctx : contexts) {
    PHOS_TRY(in_context(ctx, [&]() -> Result<void> {
      for (const Limit& l : kLimits) {
        size_t was = 0, now = 0;
        if (get(&was, l.limit) != CUDA_SUCCESS || was == 0) continue;
        line += line.empty() ? "" : ", ";
        // 0: the least the driver takes (it rounds up to what it can).
        if (CUresult r = set(l.limit, 0); r != CUDA_SUCCESS) {
          line += std::string(l.name) + " " + std::to_string(was) + " kept (" + cu_name(r) + ")";
          continue;
        }
        get(&now, l.limit);
        saved_.push_back({ctx, l.limit, was});
        line += std::string(l.name) + " " + std::to_string(was) + " -> " + std::to_string(now);
      }
      return {};
    }));
  }
  return line;
}

Result<std::string> DriverLimits::restore() {
  std::lock_guard<std::mutex> lock(mu_);
  if (saved_.empty()) return std::string();
  auto set = PHOS_REAL(cuCtxSetLimit);
  std::string line, failed;
  std::vector<Saved> saved;
  saved.swap(saved_);
  for (const Saved& s : saved) {
    const char* name = "limit";
    for (const Limit& l : kLimits)
      if (l.limit == s.limit) name = l.name;
    // One context that cannot be made current must not leave the others' limits lowered.
    auto set_back = in_context(s.ctx, [&]() -> Result<void> {
      if (CUresult r = set(s.limit, s.value); r != CUDA_SUCCESS) return make_error(cu_name(r), EIO);
      return {};
    });
    if (!set_back) {
      failed += std::string(failed.empty() ? "" : ", ") + name + " " + std::to_string(s.value) + ": " + set_back.error().message;
      continue;
    }
    line += std::string(line.empty() ? "" : ", ") + name + " " + std::to_string(s.value);
  }
  if (!failed.empty()) return make_error("limits not set back: " + failed, EIO);
  return line;
}

}  // namespace phos::hooks
