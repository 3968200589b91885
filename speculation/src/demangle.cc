#include "phos/speculation/demangle.h"

#include <cxxabi.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "type_text.h"

namespace phos::speculation {
namespace {

using type_text::trim;

bool ends_with_word(std::string_view s, std::string_view word) {
  if (s.size() < word.size() || s.substr(s.size() - word.size()) != word) return false;
  return s.size() == word.size() || s[s.size() - word.size() - 1] == ' ';
}

bool starts_with_word(std::string_view s, std::string_view word) {
  return s.size() > word.size() && s.substr(0, word.size()) == word && s[word.size()] == ' ';
}

// Drops qualifiers that apply to the parameter itself, not to what it
// points to ("float* __restrict__", "int* const").
std::string_view drop_top_qualifiers(std::string_view t) {
  for (bool again = true; again;) {
    again = false;
    for (std::string_view q : {"const", "volatile", "__restrict__", "__restrict", "restrict"}) {
      if (ends_with_word(t, q)) {
        t = trim(t.substr(0, t.size() - q.size()));
        again = true;
      }
    }
  }
  return t;
}

bool is_const_type(std::string_view t) {
  return ends_with_word(t, "const") || starts_with_word(t, "const");
}

bool is_arithmetic(std::string_view t) {
  static constexpr std::array<std::string_view, 26> kScalars = {
      "bool", "char", "signed char", "unsigned char", "wchar_t", "char8_t", "char16_t", "char32_t",
      "short", "unsigned short", "int", "unsigned int", "long", "unsigned long", "long long",
      "unsigned long long", "__int128", "unsigned __int128", "float", "double", "long double",
      "_Float16", "__bf16", "decltype(nullptr)", "std::nullptr_t", "__float128"};
  for (std::string_view s : kScalars)
    if (t == s) return true;
  return false;
}

// The parameter list of a demangled function signature: the text inside the
// last top-level parentheses (a template's return type and arguments come
// before it).
std::optional<std::string_view> parameter_list(std::string_view sig) {
  sig = trim(sig);
  if (sig.empty() || sig.back() != ')') return std::nullopt;
  int depth = 0;
  for (size_t i = sig.size(); i-- > 0;) {
    char c = sig[i];
    if (c == ')' || c == '>' || c == ']' || c == '}') depth++;
    if (c == '(' || c == '<' || c == '[' || c == '{') depth--;
    if (depth == 0) return sig.substr(i + 1, sig.size() - i - 2);
  }
  return std::nullopt;
}

}  // namespace

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

ParamKind classify_type(std::string_view type) {
  std::string_view t = drop_top_qualifiers(trim(type));
  if (t.empty()) return ParamKind::kUnknown;
  // A function pointer, "void (*)(int)": its target is code, not a buffer.
  if (t.back() == ')') return ParamKind::kAggregate;
  if (t.back() == '*' || t.back() == '&') {
    std::string_view pointee = t;
    while (!pointee.empty() && (pointee.back() == '&')) pointee.remove_suffix(1);
    if (!pointee.empty() && pointee.back() == '*' && t.back() == '*') pointee.remove_suffix(1);
    pointee = trim(pointee);
    return is_const_type(pointee) ? ParamKind::kConstPointer : ParamKind::kPointer;
  }
  if (is_arithmetic(t)) return ParamKind::kScalar;
  return ParamKind::kAggregate;
}

std::optional<std::vector<std::string>> param_types_from_signature(std::string_view demangled) {
  std::optional<std::string_view> list = parameter_list(demangled);
  if (!list) return std::nullopt;
  std::vector<std::string> types;
  std::string_view rest = trim(*list);
  if (rest.empty() || rest == "void") return types;
  for (std::string_view t : type_text::split_top_level(rest)) types.emplace_back(t);
  return types;
}

std::vector<ParamKind> param_kinds_of(const std::vector<std::string>& types) {
  std::vector<ParamKind> kinds;
  for (const std::string& t : types) kinds.push_back(classify_type(t));
  return kinds;
}

std::optional<std::vector<ParamKind>> param_kinds_from_signature(std::string_view demangled) {
  auto types = param_types_from_signature(demangled);
  if (!types) return std::nullopt;
  return param_kinds_of(*types);
}

namespace {
std::optional<std::string> demangled_name(const char* mangled) {
  if (!mangled || mangled[0] != '_' || mangled[1] != 'Z') return std::nullopt;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  if (status != 0 || !out) return std::nullopt;
  return std::string(out.get());
}
}  // namespace

std::optional<std::vector<ParamKind>> param_kinds_from_name(const char* mangled) {
  auto d = demangled_name(mangled);
  if (!d) return std::nullopt;
  return param_kinds_from_signature(*d);
}

std::optional<std::vector<std::string>> param_types_from_name(const char* mangled) {
  auto d = demangled_name(mangled);
  if (!d) return std::nullopt;
  return param_types_from_signature(*d);
}

}  // namespace phos::speculation
