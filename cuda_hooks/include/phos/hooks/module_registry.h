// The code a process has loaded: every module and library the driver loaded
// for it (cuModuleLoad*, cuLibraryLoad*, cudart's fatbin registrations), each
// with a content hash, size and kind (identify_image in the speculation
// library's reader, phos/speculation/fatbin.h), and the functions,
// kernels and globals the program took from it. Launch records name the
// module of their kernel. Handles are the driver's (CUmodule, CUlibrary,
// CUfunction, CUkernel) or cudart's (fatbin handles, host functions), all
// distinct objects of the one process, so one map serves all.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "phos/speculation/fatbin.h"

namespace phos::hooks {

// What a loaded module is comes from the one reader of module images.
using speculation::identify_file;
using speculation::identify_image;
using speculation::module_kind_name;
using speculation::ModuleImage;
using speculation::ModuleKind;

struct ModuleInfo {
  uint64_t id = 0;
  ModuleImage image;
  std::string source;  // the file, or how it came (e.g. "cudart registration")
  std::vector<std::string> functions;
  std::vector<std::string> globals;
  // The image's bytes where they stay valid for the module's life (cudart
  // registrations: static data of the loaded binary); null otherwise.
  const void* image_data = nullptr;
};

// What the speculation needs of a kernel's module.
struct ModuleRef {
  uint64_t id = 0;
  uint64_t hash = 0;
  const void* image_data = nullptr;
};

class ModuleRegistry {
 public:
  // A module loaded under `handle` (after the driver's success); its id.
  uint64_t loaded(const void* handle, const ModuleImage& image, std::string source, const void* image_data = nullptr);
  // The module under `handle` is gone; its id (0 where none was known).
  uint64_t unloaded(const void* handle);
  // `function` (a CUfunction, CUkernel or cudart host function) named `name`
  // came from the module loaded under `module`.
  void function(const void* module, const void* function, const char* name);
  void global(const void* module, const char* name);
  // `derived` (cuKernelGetFunction's CUfunction) is `function`'s.
  void same_module(const void* function, const void* derived);
  // The id of the module `function` came from; 0 where not known.
  uint64_t module_of(const void* function) const;
  // The module `function` came from; id 0 where not known.
  ModuleRef module_ref(const void* function) const;
  std::vector<ModuleInfo> modules() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, ModuleInfo> modules_;  // by handle
  std::unordered_map<const void*, uint64_t> function_module_;
  std::unordered_map<uint64_t, const void*> handle_of_;  // module id -> handle
  uint64_t next_id_ = 1;
};

}  // namespace phos::hooks
