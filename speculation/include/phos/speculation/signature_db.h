// The kernel signature database: what phos-sigdb (a Clang libTooling tool,
// speculation/tools/) writes from CUDA sources, and its reader. It covers
// what the mangled name cannot say: extern "C" kernels (no types in the
// name), and the pointer fields inside by-value structs.
//
// The file is text, one kernel per line, so that several databases can be
// concatenated and a person can read them:
//
//   phos-sigdb 1
//   # anything after '#' is a comment
//   <device-side mangled name> <param> <param> ...
//
// with each <param> one of
//   scalar:SIZE@OFF              arithmetic, enum: never a pointer
//   ptr:SIZE@OFF                 pointer to mutable memory (SIZE 8)
//   const_ptr:SIZE@OFF           pointer to const memory (SIZE 8)
//   struct:SIZE@OFF{FOFF:ptr,FOFF:const_ptr,...}
//                                by-value aggregate whose every pointer field
//                                is listed (FOFF from the struct's start,
//                                increasing; nested structs and arrays
//                                flattened); {} when it holds none
//   opaque:SIZE@OFF              by-value aggregate whose contents are not
//                                known (unions with pointers, dependent
//                                types): every aligned 8-byte word may be a
//                                pointer to a written buffer
// A kernel without parameters has the name alone.
//
// @OFF is the parameter's offset in the argument buffer: the tool writes the
// offsets clang lays the parameters out at (each aligned to its type's
// alignment, which the SIZE alone does not tell for aggregates). A
// hand-written file may leave @OFF out: the parameter then follows the
// previous one, aligned to the largest power of two dividing SIZE, at most
// 16 -- right for scalars and pointers; aggregates should say @OFF.
// Parameters do not overlap, and a parameter has no spaces inside.
//
// The header line may appear again further on (concatenated files), and
// must come before the first kernel. Numbers are decimal.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "phos/speculation/layout.h"
#include "phos/support/result.h"

namespace phos::speculation {

// The first line of every database file.
inline constexpr std::string_view kSignatureDbHeader = "phos-sigdb 1";

struct KernelSignature {
  // offset: the parameter's offset in the argument buffer, as the file says
  // (@OFF: the tool writes clang's layout, by the ABI's alignment rules; the
  // driver's offsets are preferred where both exist).
  std::vector<ParamLayout> params;
  bool operator==(const KernelSignature&) const = default;
};

class SignatureDb {
 public:
  // Adds the kernels of `text` (a database file's contents); a kernel seen
  // twice keeps its first signature. An error naming the line on anything
  // malformed ("line 3: ..."; nothing from that text is added then).
  Result<void> parse(std::string_view text);
  // Reads and parses a file; errors are prefixed with the path.
  Result<void> load(const std::string& path);
  // nullptr when the kernel is not in the database.
  const KernelSignature* find(std::string_view mangled_name) const;
  size_t size() const { return kernels_.size(); }

 private:
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, KernelSignature, NameHash, std::equal_to<>> kernels_;
};

// One parameter in the file's notation, @OFF included (for the tool and for
// tests). kUnknown is written as opaque, an aggregate without known fields
// too; pointer_fields are written in their order.
std::string format_param(const ParamLayout& p);
// A kernel's line, without the newline: the name, then its parameters.
std::string format_kernel(std::string_view mangled_name, const KernelSignature& sig);

}  // namespace phos::speculation
