// One kernel's parameter layout, put together from every source there is
// (layout.h): offsets and sizes from the driver (or the cubin), kinds from
// the signature database, else from the mangled name, else from the cubin's
// pointer bits. The sources are cross-checked; a disagreement is noted and
// the less trusted source dropped, never guessed around.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phos/speculation/fatbin.h"
#include "phos/speculation/layout.h"
#include "phos/speculation/signature_db.h"

namespace phos::speculation {

enum class TypeSource : uint8_t {
  kNone,         // no types: every parameter is scanned as kUnknown
  kSignatureDb,  // phos-sigdb
  kName,         // the demangled name
  kCubin,        // the cubin's pointer bits
};
const char* type_source_name(TypeSource s);

struct KernelLayout {
  std::vector<ParamLayout> params;
  TypeSource types = TypeSource::kNone;
  bool slots_known = false;  // offsets and sizes known (from the driver or the cubin)
  bool cubin_checked = false;  // the driver's slots were compared with the cubin's
  std::string note;          // what disagreed, for statistics; empty when all agreed
};

struct ParamSlot {
  uint32_t offset = 0;
  uint32_t size = 0;
};

struct LayoutSources {
  std::optional<std::vector<ParamSlot>> driver;    // cuFuncGetParamInfo
  const CubinKernel* cubin = nullptr;              // .nv.info
  const KernelSignature* signature = nullptr;      // phos-sigdb
  std::optional<std::vector<ParamKind>> name_kinds;  // demangled name
  // The same name's parameter types: structs known_structs.h knows get
  // their pointer fields.
  std::optional<std::vector<std::string>> name_types;
};

KernelLayout build_layout(const LayoutSources& sources);

}  // namespace phos::speculation
