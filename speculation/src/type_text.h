// Text helpers shared by the readers of demangled type names (demangle.cc,
// known_structs.cc); internal to the library.
#pragma once

#include <string_view>

namespace phos::speculation::type_text {

// `s` without its leading and trailing spaces.
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace phos::speculation::type_text
