// What phos knows about a kernel's parameters: where each one lies in the
// argument buffer, how big it is, and whether it can hold a pointer to device
// memory the kernel reads or writes. The sources (each fills what it knows):
//   - the driver (cuFuncGetParamInfo): offsets and sizes, no types;
//   - the cubin's .nv.info (EIATTR_KPARAM_INFO): offsets, sizes, and on
//     recent toolkits whether a parameter is a pointer (fatbin.h);
//   - the demangled kernel name: the C++ types, hence pointer-to-const
//     (demangle.h); nothing for extern "C" kernels;
//   - the signature database written by phos-sigdb from CUDA sources: types,
//     and the pointer fields inside by-value structs (signature_db.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace phos::speculation {

enum class ParamKind : uint8_t {
  kUnknown,       // nothing known: every aligned 8-byte word may point to a buffer read and written
  kScalar,        // an arithmetic or enum value: never a pointer
  kPointer,       // a pointer to mutable memory: its buffer is read and may be written
  kConstPointer,  // a pointer to const: its buffer is read only
  kAggregate,     // a struct, class, union, array or closure passed by value
};
const char* param_kind_name(ParamKind k);

// A pointer inside a by-value aggregate, at `offset` from the parameter's start.
struct PointerField {
  uint32_t offset = 0;
  bool const_pointee = false;
  bool operator==(const PointerField&) const = default;
};

// A check of a launch's argument bytes before a layout rule's fields are
// believed (known_structs.h): the little-endian unsigned value of `size`
// (1, 2, 4 or 8) bytes at `offset` from the parameter's start must lie in
// [min, max]; where one fails, the struct is scanned as one of unknown
// fields (a layout of another version, or tail padding where the rule
// assumed none).
struct FieldCheck {
  uint32_t offset = 0;
  uint8_t size = 4;
  uint64_t min = 0, max = 0;
  bool operator==(const FieldCheck&) const = default;
};

struct ParamLayout {
  uint32_t offset = 0;  // in the argument buffer
  uint32_t size = 0;
  ParamKind kind = ParamKind::kUnknown;
  // For aggregates: true when pointer_fields lists every pointer inside (the
  // signature database knows the struct); false: any aligned 8-byte word of
  // it may be a pointer to a written buffer (PyTorch's closures).
  bool fields_known = false;
  std::vector<PointerField> pointer_fields;
  std::vector<FieldCheck> checks;  // a layout rule's, on each launch
  bool operator==(const ParamLayout&) const = default;
};

}  // namespace phos::speculation
