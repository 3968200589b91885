#include "phos/speculation/layout.h"

namespace phos::speculation {

const char* param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::kUnknown: return "unknown";
    case ParamKind::kScalar: return "scalar";
    case ParamKind::kPointer: return "pointer";
    case ParamKind::kConstPointer: return "const_pointer";
    case ParamKind::kAggregate: return "aggregate";
  }
  return "invalid";
}

}  // namespace phos::speculation
