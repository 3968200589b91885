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
//   scalar:SIZE                  arithmetic, enum: never a pointer
//   ptr:SIZE                     pointer to mutable memory (SIZE 8)
//   const_ptr:SIZE               pointer to const memory
//   struct:SIZE{OFF:ptr,OFF:const_ptr,...}
//                                by-value aggregate whose every pointer field
//                                is listed (offsets from the struct's start;
//                                nested structs and arrays flattened); {} when
//                                it holds none
//   opaque:SIZE                  by-value aggregate whose contents are not
//                                known (unions with pointers, dependent
//                                types): every aligned 8-byte word may be a
//                                pointer to a written buffer
// A kernel without parameters has the name alone.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "phos/speculation/layout.h"

namespace phos::speculation {

struct KernelSignature {
  // offset: the parameter's offset in the argument buffer, by the ABI's
  // alignment rules from the sizes and alignments the tool saw (the driver's
  // offsets are preferred where both exist).
  std::vector<ParamLayout> params;
};

class SignatureDb {
 public:
  // Adds the kernels of `text` (a database file's contents); a kernel seen
  // twice keeps its first signature. false with *error naming the line on
  // anything malformed (nothing from that text is added then).
  bool parse(std::string_view text, std::string* error);
  // Reads and parses a file.
  bool load(const std::string& path, std::string* error);
  const KernelSignature* find(std::string_view mangled_name) const;
  size_t size() const { return kernels_.size(); }

 private:
  std::unordered_map<std::string, KernelSignature> kernels_;
};

// One parameter in the file's notation (for the tool and for tests).
std::string format_param(const ParamLayout& p);

}  // namespace phos::speculation
