// Text helpers shared by the readers of demangled type names (demangle.cc,
// known_structs.cc); internal to the library.
#pragma once

#include <string_view>
#include <vector>

namespace phos::speculation::type_text {

// `s` without its leading and trailing spaces.
inline std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

// `list` cut at its commas outside any brackets ((), <>, [], {}), each
// piece trimmed: a parameter list's types, a template's arguments.
inline std::vector<std::string_view> split_top_level(std::string_view list) {
  std::vector<std::string_view> out;
  int depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i <= list.size(); i++) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '(' || c == '<' || c == '[' || c == '{') depth++;
    if (c == ')' || c == '>' || c == ']' || c == '}') depth--;
    if (c == ',' && depth == 0) {
      out.push_back(trim(list.substr(begin, i - begin)));
      begin = i + 1;
    }
  }
  return out;
}

}  // namespace phos::speculation::type_text
