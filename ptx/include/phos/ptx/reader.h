// A reader for PTX text that understands only what the twin rewriter needs
// (twin.h) and leaves everything else as it found it: tokens keep their byte
// offsets, so a rewriter copies the text between them byte for byte
// (comments, white space, .loc lines, debug sections, directives it does not
// know).
//
// What it recognises:
//   - module directives that end at the end of their line (.version,
//     .target, .address_size, .file, .loc), and .section blocks (opaque);
//   - module-scope variables (their name and state space);
//   - .entry kernels and .func device functions: linkage, name, return and
//     input parameter lists, performance directives (skipped), the body;
//   - in a body: statements (instructions, labels, directives such as .reg
//     and .loc, the braces of nested scopes), and in an instruction its
//     guard predicate (@p, @!p), opcode, modifiers (.global, .v4, .f32...)
//     and comma-separated operands ([addresses], {vectors}, (lists)).
// It is not a PTX parser: it never checks that an instruction is valid.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "phos/support/result.h"

namespace phos::ptx {

enum class TokenKind : uint8_t {
  kIdentifier,  // names, registers (%r1), labels ($L__BB0_1), opcodes
  kDirective,   // a dot and a name: .global, .v4, .shared::cta, .L2::256B
  kNumber,      // 12, 0x1F, 0f3F800000, 1.5
  kString,      // "..."
  kPunct,       // one character: , ; : [ ] { } ( ) @ ! + - < > = | ...
};

struct Token {
  TokenKind kind = TokenKind::kPunct;
  bool line_start = false;  // the first token of its line
  uint32_t begin = 0;       // byte offsets in the text
  uint32_t end = 0;
};

// The text ends at its first NUL byte (PTX taken from a fatbin or handed to
// cuModuleLoadData is NUL-terminated). Comments (// and /* */) and white
// space make no tokens. An error (saying where) for an unterminated comment
// or string, or text of 4 GiB or more.
Result<std::vector<Token>> tokenize(std::string_view text);

enum class StatementKind : uint8_t {
  kInstruction,  // up to and including its ';' (guard included)
  kLabel,        // name ':'
  kDirective,    // .reg, .local, .shared, .param, .pragma ... ';', or .loc/.file (one line)
  kOpen,         // '{' of a nested scope
  kClose,        // '}' of a nested scope
};

struct Statement {
  StatementKind kind = StatementKind::kInstruction;
  uint32_t first = 0;  // tokens [first, last)
  uint32_t last = 0;
  uint32_t depth = 0;  // 1 in the function's top-level scope
};

enum class Space : uint8_t { kNone, kGlobal, kConst, kShared, kLocal, kParam, kTex, kOther };
const char* space_name(Space s);

struct Param {
  std::string name;
  bool reg = false;    // a .reg parameter (old-style .func)
  uint32_t first = 0;  // its tokens [first, last)
  uint32_t last = 0;
};

struct Function {
  bool entry = false;     // .entry (a kernel) rather than .func
  bool defined = false;   // has a body
  bool external = false;  // .extern
  std::string name;
  uint32_t item = 0;        // its Module::items index
  uint32_t name_token = 0;
  // Tokens of the '(' and ')' of the input parameter list; -1 where the
  // declaration has none.
  int64_t params_open = -1;
  int64_t params_close = -1;
  std::vector<Param> params;
  int64_t body_open = -1;  // tokens of the body's braces; -1 for a declaration
  int64_t body_close = -1;
  std::vector<Statement> statements;  // of the body, nested scopes included
};

enum class ItemKind : uint8_t {
  kDirective,  // .version, .target, .address_size, .file, .loc
  kVariable,   // a module-scope variable declaration
  kFunction,   // a .entry or .func, declared or defined
  kSection,    // .section name { ... }
  kOther,      // anything else, up to its ';' (.alias, .extern of unknown kind ...)
};

struct Item {
  ItemKind kind = ItemKind::kOther;
  uint32_t first = 0;  // tokens [first, last)
  uint32_t last = 0;
  int64_t function = -1;  // Module::functions index for kFunction
};

struct Variable {
  std::string name;
  Space space = Space::kNone;
  bool external = false;
  uint32_t item = 0;
};

struct Module {
  std::string_view text;  // not owned: the caller keeps it alive
  std::vector<Token> tokens;
  std::vector<Item> items;
  std::vector<Function> functions;
  std::vector<Variable> variables;  // module scope
  uint32_t version_major = 0;
  uint32_t version_minor = 0;
  std::string target;        // the .target line's operands, as written
  uint32_t address_size = 32;  // PTX's default when .address_size is absent
  std::vector<uint32_t> line_starts;  // byte offset of each line

  std::string_view str(uint32_t token) const {
    return text.substr(tokens[token].begin, tokens[token].end - tokens[token].begin);
  }
  // The text from the start of token first to the end of token last - 1.
  std::string_view span(uint32_t first, uint32_t last) const {
    return text.substr(tokens[first].begin, tokens[last - 1].end - tokens[first].begin);
  }
  // Line (1-based) of a token.
  uint32_t line_of(uint32_t token) const;
  // Index in functions of the one named `name` that has a body, else of a
  // declaration of it; -1 if none.
  int64_t find_function(std::string_view name) const;
  const Variable* find_variable(std::string_view name) const;
};

// The module, or an error saying what and on which line where its structure
// cannot be followed: unbalanced braces or parentheses, a function header
// without a name, a body that does not end. The module's views point into
// `text`, which the caller keeps alive.
Result<Module> read_module(std::string_view text);

struct Operand {
  uint32_t first = 0;  // tokens [first, last)
  uint32_t last = 0;
};

struct Instruction {
  int64_t guard = -1;  // token of the guard predicate; -1 if unguarded
  bool guard_negated = false;
  uint32_t opcode = 0;  // token
  uint32_t mods_first = 0;  // modifier tokens [mods_first, mods_last): .global .v4 .f32
  uint32_t mods_last = 0;
  std::vector<Operand> operands;  // split at top-level commas
};

// Splits an instruction statement; false if it does not look like one.
bool parse_instruction(const Module& m, const Statement& s, Instruction* out);

}  // namespace phos::ptx
