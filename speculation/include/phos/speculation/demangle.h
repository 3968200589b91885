// Parameter kinds from a kernel's mangled (Itanium C++ ABI) name: the
// demangler (libstdc++'s abi::__cxa_demangle) spells out the parameter
// types, and those say which pointers point to const. By-value classes,
// structs and closures come out as kAggregate without fields (their
// contents are not in the name); enums look like classes and come out the
// same (harmless: a 4-byte parameter holds no aligned 8-byte word).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "phos/speculation/layout.h"

namespace phos::speculation {

// The demangled name, or the name itself where it is not a mangled name.
std::string demangle(const char* name);

// The kind of each parameter, in order; nullopt for a name that carries no
// parameter types (extern "C" kernels, names the demangler refuses).
std::optional<std::vector<ParamKind>> param_kinds_from_name(const char* mangled);

// The kinds of the parameters of a demangled signature such as
// "void k<float>(float const*, float*, Params)" (exposed for tests).
std::optional<std::vector<ParamKind>> param_kinds_from_signature(std::string_view demangled);

// One parameter type as the demangler spells it ("float const*").
ParamKind classify_type(std::string_view type);

// Each parameter's type as the demangler spells it, in order; nullopt as
// for param_kinds_from_name (the structs' names, for known_structs.h).
std::optional<std::vector<std::string>> param_types_from_name(const char* mangled);
std::optional<std::vector<std::string>> param_types_from_signature(std::string_view demangled);
// The kinds of those types (classify_type, each).
std::vector<ParamKind> param_kinds_of(const std::vector<std::string>& types);

}  // namespace phos::speculation
