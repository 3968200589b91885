// The pointer fields of by-value structs that well-known libraries' kernels
// take, where no signature database (phos-sigdb, made from the library's
// sources) is at hand. A struct of unknown layout is scanned word by word,
// and a stale word in a field that is not a pointer, one that happens to
// fall inside a large buffer, takes all of that buffer into the launch's
// write set: on the 8B server, slot 26 of the unused nElements entries of
// PyTorch's cat metadata pointed into a 64 GiB KV pool, and its launch
// saved 52 GiB into the copy-on-write pool and waited for 11 GiB more.
//
// A rule names the struct's template, works out its layout from the
// template arguments as the library defines it, and is used only where the
// size it works out is the parameter's size (a layout of another version
// differs, and the struct is then scanned as before). Each rule says where
// its definition comes from.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "phos/speculation/layout.h"

namespace phos::speculation {

// What a rule knows of a struct: its pointer fields, and the checks a
// launch's bytes must pass for them to be believed.
struct KnownStruct {
  std::vector<PointerField> fields;
  std::vector<FieldCheck> checks;
};

// The layout of a by-value parameter of type `type` (as the demangler
// spells it) and `size` bytes, where a rule knows the struct and its size
// agrees; nullopt otherwise.
std::optional<KnownStruct> known_struct(std::string_view type, uint32_t size);

}  // namespace phos::speculation
