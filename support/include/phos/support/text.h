// Small text helpers. Lists are built by append, not `"sep" + item`: GCC 12
// at -O3 warns, wrongly, about a const char* added to a temporary string
// (-Wrestrict, GCC bug 105329), which -Werror turns into a failed release
// build.
#pragma once

#include <string>
#include <string_view>

namespace phos {

// `item` appended to `list`, after `sep` where the list is not empty.
inline void append_item(std::string& list, std::string_view sep, std::string_view item) {
  if (!list.empty()) list.append(sep);
  list.append(item);
}

}  // namespace phos
