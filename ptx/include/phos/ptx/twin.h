// Twin kernels: copies of a module's kernels that check, before each memory
// access of theirs that may touch a device buffer, that the bytes it touches
// lie inside the ranges the runtime allows for this launch (the speculated
// read or write set), and report the accesses that do not. The access itself still happens, unchanged: a twin
// reports, it never changes what the program computes.
//
// Pure text processing (no CUDA call): PTX in, PTX out. The runtime loads
// the result with cuModuleLoadData as a module of its own and launches a
// twin with the original kernel's arguments plus one: the range table.
//
// The output module. By default it is the input module with each .entry and
// each defined .func replaced by its twin (named original + suffix);
// everything else (directives, module-scope variables, extern declarations,
// comments, debug sections) is copied byte for byte, so it is
// self-contained and its kernels' names do not clash with the original's.
// Functions whose address the code takes (function pointers, .alias,
// initializers) are kept as they are too, with what they call, since the
// code that takes their address needs them. With include_original the
// original text is kept whole and every twin follows its original.
//
// Device functions. A kernel's twin calls twins of the functions it calls;
// each twin function takes the table pointer as one more (last) parameter,
// so concurrent launches with different tables never share it (a .global
// variable holding it would be shared by every launch in flight).
//
// What is checked (TwinOptions::stores):
//   st (.global or generic, scalar and .v2/.v4/.v8 vectors, st.bulk),
//   atom and red (.global or generic; vector forms), cp.async.bulk and
//   cp.reduce.async.bulk whose destination is .global, discard.global,
//   tensormap.replace and tensormap.cp_fenceproxy to global memory.
// TwinOptions::loads (the restore side):
//   ld and ldu (.global, .global.nc, generic; vectors), atom, red,
//   cp.reduce.async.bulk to global (they read too), cp.async (non-bulk) and
//   cp.async.bulk whose source is .global.
// A generic address is checked only where isspacep.global says it is
// global: shared, local and other windows pass. Zero-length accesses (a
// cp.async with src-size 0, an ignore-src predicate that is true) pass. An
// access guarded by @p is checked only when p holds.
// Not checked, and so never counted: .shared, .local, .param, .const
// accesses; st.async and red.async (shared::cluster); prefetches.
//
// A twin is incomplete (TwinKernel::complete false, reason says why) where
// the kernel or a function it calls may access memory the twin cannot
// check: an indirect call (call through a register), a call to an external
// function other than vprintf, __assertfail, malloc and free, an
// instruction the rewriter does not know, tensor (tensormap-addressed) bulk
// copies, surface stores and texture or surface loads, multimem accesses,
// wmma.load/wmma.store to global or generic memory, an address it cannot
// read (an unknown symbol), an access whose width it cannot tell. The
// runtime treats the launch of an incomplete twin as unknown.
//
// Module-scope variables. A twin loaded as a module of its own has its own
// copies of the module's .global and .const variables; TwinKernel lists
// those its code names, so the runtime can keep them in step (or load the
// module with include_original in place of the program's and use its
// variables) or treat the launch as unknown.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "phos/ptx/range_table.h"
#include "phos/ptx/reader.h"

namespace phos::ptx {

struct TwinOptions {
  bool stores = true;
  bool loads = false;
  bool include_original = false;
  std::string suffix = "__phos_twin";
};

enum class AccessKind : uint8_t {
  kStore,
  kLoad,
  kAtomic,  // reads and writes: atom, red, cp.reduce.async.bulk
};
const char* access_kind_name(AccessKind k);

// One checked instruction. Its ordinal is what a violation records in the
// table's first_instruction word: the instruction's position among all the
// checked instructions of the output module, counted in text order of the
// input (kernels and functions alike, from 0). It depends only on the input
// text and the options, so the same module always numbers the same way.
struct CheckSite {
  uint32_t ordinal = 0;
  std::string function;     // the original name of the .entry or .func it is in
  uint32_t line = 0;        // in the input text
  std::string instruction;  // as written, white space collapsed
  AccessKind kind = AccessKind::kStore;
  Space space = Space::kGlobal;  // kGlobal, or kNone for a generic address
  uint32_t width = 0;            // bytes; 0 where a register gives it at run time
};

struct TwinKernel {
  std::string name;       // the original kernel
  std::string twin_name;  // name + suffix
  uint32_t params = 0;    // the original's parameter count: the table pointer is parameter `params`
  // Byte offset of the table pointer in the twin's parameter buffer (for
  // launches that pass a packed argument buffer): the original's parameter
  // bytes rounded up to 8.
  uint32_t table_offset = 0;
  uint32_t checks = 0;  // checked instructions in the kernel and the functions it calls (each once)
  bool complete = true;
  std::string reason;  // why not complete: the first cause found
  std::vector<std::string> functions;         // functions it calls, transitively (original names)
  std::vector<std::string> module_variables;  // module-scope .global/.const variables its code names
};

struct TwinResult {
  std::string ptx;  // the output module
  // The name of the twins' appended parameter (a .param .u64 in kernels,
  // .param .b64 in functions): __phos_range_table unless the module already
  // uses names that start like it (the "phos" prefix then takes a number).
  std::string table_param;
  std::vector<TwinKernel> kernels;  // in the order of the input
  std::vector<CheckSite> sites;     // by ordinal
};

// An error saying why where the input cannot be read (read_module), uses
// 32-bit addresses (.address_size 32), or already has a symbol named like a
// twin. A module without kernels gives an output without kernels.
Result<TwinResult> make_twins(std::string_view ptx, const TwinOptions& options);

}  // namespace phos::ptx
