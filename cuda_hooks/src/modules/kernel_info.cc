#include "modules/kernel_info.h"

#include "driver/driver.h"

namespace phos::hooks {

std::string kernel_name(CUfunction f) {
  const char* name = nullptr;
  if (PHOS_REAL(cuFuncGetName)(&name, f) == CUDA_SUCCESS ||
      PHOS_REAL(cuKernelGetName)(&name, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS)
    return name ? name : "";
  return "";
}

uint32_t current_device_arch() {
  CUdevice dev = 0;
  int major = 0, minor = 0;
  if (PHOS_REAL(cuCtxGetDevice)(&dev) != CUDA_SUCCESS ||
      PHOS_REAL(cuDeviceGetAttribute)(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
      PHOS_REAL(cuDeviceGetAttribute)(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS)
    return 0;
  return uint32_t(major * 10 + minor);
}

std::optional<std::vector<ParamSlot>> kernel_param_slots(CUfunction f) {
  // Parameter 0 tells which form the handle is: CUDA_ERROR_INVALID_VALUE
  // (index out of range) from a form that knows the handle means no
  // parameters; an error from both forms means no answer.
  auto kernel = reinterpret_cast<CUkernel>(f);
  size_t offset = 0, size = 0;
  CUresult r = PHOS_REAL(cuFuncGetParamInfo)(f, 0, &offset, &size);
  bool as_kernel = false;
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE) {
    r = PHOS_REAL(cuKernelGetParamInfo)(kernel, 0, &offset, &size);
    as_kernel = true;
  }
  if (r == CUDA_ERROR_INVALID_VALUE) return std::vector<ParamSlot>{};
  if (r != CUDA_SUCCESS) return std::nullopt;
  std::vector<ParamSlot> slots;
  for (size_t i = 0; r == CUDA_SUCCESS; i++) {
    if (i > 0)
      r = as_kernel ? PHOS_REAL(cuKernelGetParamInfo)(kernel, i, &offset, &size)
                    : PHOS_REAL(cuFuncGetParamInfo)(f, i, &offset, &size);
    if (r == CUDA_SUCCESS) slots.push_back({uint32_t(offset), uint32_t(size)});
  }
  return slots;
}

KernelDescription describe_kernel(const void* handle) {
  CUfunction f = static_cast<CUfunction>(const_cast<void*>(handle));
  return KernelDescription{kernel_name(f), kernel_param_slots(f)};
}

PackedArgs packed_args(void* const* extra) {
  PackedArgs args;
  if (!extra) return args;
  for (size_t i = 0; i < 2 * kMaxExtraPairs && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) args.data = static_cast<const std::byte*>(extra[i + 1]);
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) args.size = *static_cast<const size_t*>(extra[i + 1]);
  }
  if (!args.data) args.size = 0;
  return args;
}

}  // namespace phos::hooks
