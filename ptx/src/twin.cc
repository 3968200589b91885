#include "phos/ptx/twin.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace phos::ptx {

namespace {

constexpr uint8_t kStores = 1;
constexpr uint8_t kLoads = 2;

// Every PTX opcode (ISA 9.0) the rewriter knows, sorted; an instruction
// whose opcode is not here may access memory in a way the twin cannot see.
constexpr std::string_view kKnownOpcodes[] = {
    "abs", "activemask", "add", "addc", "alloca", "and", "applypriority", "atom", "bar", "barrier", "bfe",
    "bfi", "bfind", "bmsk", "bra", "brev", "brkpt", "brx", "call", "clusterlaunchcontrol", "clz", "cnot",
    "copysign", "cos", "cp", "createpolicy", "cvt", "cvta", "discard", "div", "dp2a", "dp4a", "elect", "ex2",
    "exit", "fence", "fma", "fns", "getctarank", "griddepcontrol", "isspacep", "istypep", "ld", "ldmatrix",
    "ldu", "lg2", "lop3", "mad", "mad24", "madc", "mapa", "match", "max", "mbarrier", "membar", "min", "mma",
    "mov", "movmatrix", "mul", "mul24", "multimem", "nanosleep", "neg", "not", "or", "pmevent", "popc",
    "prefetch", "prefetchu", "prmt", "rcp", "red", "redux", "rem", "ret", "rsqrt", "sad", "selp", "set",
    "setmaxnreg", "setp", "shf", "shfl", "shl", "shr", "sin", "slct", "sqrt", "st", "stackrestore",
    "stacksave", "stmatrix", "sub", "subc", "suld", "suq", "sured", "sust", "szext", "tanh", "tcgen05",
    "tensormap", "testp", "tex", "tld4", "trap", "txq", "vabsdiff", "vabsdiff2", "vabsdiff4", "vadd", "vadd2",
    "vadd4", "vavrg2", "vavrg4", "vmad", "vmax", "vmax2", "vmax4", "vmin", "vmin2", "vmin4", "vote", "vset",
    "vset2", "vset4", "vshl", "vshr", "vsub", "vsub2", "vsub4", "wgmma", "wmma", "xor",
};

bool known_opcode(std::string_view op) {
  return std::binary_search(std::begin(kKnownOpcodes), std::end(kKnownOpcodes), op);
}

// External functions whose calls touch no buffer of the program.
bool harmless_extern(std::string_view name) {
  return name == "vprintf" || name == "__assertfail" || name == "malloc" || name == "free";
}

uint32_t type_bytes(std::string_view d) {
  // Never destroyed: libphos's twin builder thread may still rewrite a
  // module while the process exits, after the statics made after its exit
  // handler are gone (a crash seen in the hooks tests, 1 run in 5).
  static const auto& sizes = *new std::unordered_map<std::string_view, uint32_t>{
      {".b8", 1},     {".u8", 1},      {".s8", 1},      {".b16", 2},    {".u16", 2},    {".s16", 2},
      {".f16", 2},    {".bf16", 2},    {".e4m3x2", 2},  {".e5m2x2", 2}, {".b32", 4},    {".u32", 4},
      {".s32", 4},    {".f32", 4},     {".f16x2", 4},   {".bf16x2", 4}, {".tf32", 4},   {".b64", 8},
      {".u64", 8},    {".s64", 8},     {".f64", 8},     {".b128", 16},
  };
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

Space space_mod(std::string_view d) {
  if (d == ".global") return Space::kGlobal;
  if (d == ".const" || d.starts_with(".const[")) return Space::kConst;
  if (d == ".shared" || d.starts_with(".shared::")) return Space::kShared;
  if (d == ".local") return Space::kLocal;
  if (d == ".param" || d.starts_with(".param::")) return Space::kParam;
  return Space::kNone;
}

bool checkable(Space s) { return s == Space::kGlobal || s == Space::kNone; }

// What one instruction does to memory the twin checks.
struct Access {
  bool checked = false;       // a site: check it
  std::string unsupported;    // not empty: it may touch memory the twin cannot check
  uint8_t unsupported_modes = 0;
  AccessKind kind = AccessKind::kStore;
  uint8_t modes = 0;          // kStores / kLoads: in which twins it is checked
  Space space = Space::kGlobal;
  uint32_t address = 0;       // operand index
  uint32_t width = 0;         // bytes, when fixed
  int64_t width_operand = -1; // operand giving the width, when not
  int64_t skip_operand = -1;  // a predicate operand: no access when true (cp.async ignore-src)
};

class Mods {
 public:
  Mods(const Module& m, const Instruction& in) {
    for (uint32_t t = in.mods_first; t < in.mods_last; t++) mods_.push_back(m.str(t));
  }
  bool has(std::string_view d) const { return std::find(mods_.begin(), mods_.end(), d) != mods_.end(); }
  std::string_view at(size_t i) const { return i < mods_.size() ? mods_[i] : std::string_view(); }
  // The first state space named, kNone (generic) if none is.
  Space space() const {
    for (std::string_view d : mods_) {
      Space s = space_mod(d);
      if (s != Space::kNone) return s;
    }
    return Space::kNone;
  }
  // The state spaces named, in order (cp.async.bulk: destination, source).
  std::vector<Space> spaces() const {
    std::vector<Space> out;
    for (std::string_view d : mods_) {
      Space s = space_mod(d);
      if (s != Space::kNone) out.push_back(s);
    }
    return out;
  }
  // Bytes one access moves: the last type times the vector length.
  uint32_t width() const {
    uint32_t type = 0;
    uint32_t vec = 1;
    for (std::string_view d : mods_) {
      if (type_bytes(d) != 0) type = type_bytes(d);
      if (d == ".v2") vec = 2;
      if (d == ".v4") vec = 4;
      if (d == ".v8") vec = 8;
    }
    return type * vec;
  }

 private:
  std::vector<std::string_view> mods_;
};

Access unsupported(uint8_t modes, std::string why) {
  Access a;
  a.unsupported = std::move(why);
  a.unsupported_modes = modes;
  return a;
}

Access site(AccessKind kind, uint8_t modes, Space space, uint32_t address, uint32_t width) {
  Access a;
  a.checked = true;
  a.kind = kind;
  a.modes = modes;
  a.space = space;
  a.address = address;
  a.width = width;
  return a;
}

Access sized_site(const Mods& mods, std::string_view op, AccessKind kind, uint8_t modes, uint32_t address) {
  Space s = mods.space();
  if (!checkable(s)) return Access();
  uint32_t w = mods.width();
  if (w == 0) return unsupported(modes, "cannot tell the width of " + std::string(op));
  return site(kind, modes, s, address, w);
}

Access classify(const Module& m, const Instruction& in) {
  std::string_view op = m.str(in.opcode);
  Mods mods(m, in);
  const uint8_t both = kStores | kLoads;
  if (op == "ld" || op == "ldu") return sized_site(mods, op, AccessKind::kLoad, kLoads, 1);
  if (op == "st") {
    if (mods.has(".async")) return Access();  // st.async: shared::cluster only
    if (mods.has(".bulk")) {
      if (!checkable(mods.space())) return Access();
      Access a = site(AccessKind::kStore, kStores, mods.space(), 0, 0);
      a.width_operand = 1;
      return a;
    }
    return sized_site(mods, op, AccessKind::kStore, kStores, 0);
  }
  if (op == "atom") return sized_site(mods, op, AccessKind::kAtomic, both, 1);
  if (op == "red") {
    if (mods.has(".async")) return Access();  // red.async: shared::cluster only
    return sized_site(mods, op, AccessKind::kAtomic, both, 0);
  }
  if (op == "multimem") {
    if (mods.at(0) == ".ld_reduce") return unsupported(kLoads, "multimem.ld_reduce is not checked");
    if (mods.at(0) == ".st") return unsupported(kStores, "multimem.st is not checked");
    return unsupported(both, "multimem." + std::string(mods.at(0).substr(1)) + " is not checked");
  }
  if (op == "cp") {
    std::vector<Space> sp = mods.spaces();
    Space dst = sp.size() > 0 ? sp[0] : Space::kNone;
    Space src = sp.size() > 1 ? sp[1] : Space::kNone;
    if (mods.at(0) == ".async" && (mods.at(1) == ".ca" || mods.at(1) == ".cg")) {
      // cp.async.ca.shared.global [dst], [src], cp-size{, src-size | ignore-src}{, policy}
      if (src != Space::kGlobal) return Access();
      Access a = site(AccessKind::kLoad, kLoads, Space::kGlobal, 1, 0);
      a.width_operand = 2;
      return a;
    }
    if (mods.at(0) == ".async" && mods.at(1) == ".bulk") {
      if (mods.has(".prefetch") || mods.has(".commit_group") || mods.has(".wait_group")) return Access();
      if (mods.has(".tensor")) {
        if (dst == Space::kGlobal) return unsupported(kStores, "cp.async.bulk.tensor to global memory is not checked");
        if (src == Space::kGlobal) return unsupported(kLoads, "cp.async.bulk.tensor from global memory is not checked");
        return Access();
      }
      Access a;
      if (dst == Space::kGlobal) {
        a = site(AccessKind::kStore, kStores, Space::kGlobal, 0, 0);
      } else if (src == Space::kGlobal) {
        a = site(AccessKind::kLoad, kLoads, Space::kGlobal, 1, 0);
      } else {
        return Access();
      }
      a.width_operand = 2;
      return a;
    }
    if (mods.at(0) == ".async") return Access();  // commit_group, wait_group, wait_all, mbarrier.arrive
    if (mods.at(0) == ".reduce" && mods.at(1) == ".async" && mods.at(2) == ".bulk") {
      if (dst != Space::kGlobal) return Access();
      if (mods.has(".tensor")) return unsupported(both, "cp.reduce.async.bulk.tensor to global memory is not checked");
      Access a = site(AccessKind::kAtomic, both, Space::kGlobal, 0, 0);
      a.width_operand = 2;
      return a;
    }
    return unsupported(both, "unknown copy " + std::string(m.span(in.opcode, in.mods_last)));
  }
  if (op == "tensormap") {
    if (mods.at(0) == ".replace") {
      if (!checkable(mods.space())) return Access();
      return site(AccessKind::kStore, kStores, mods.space(), 0, 128);
    }
    if (mods.at(0) == ".cp_fenceproxy") {
      std::vector<Space> sp = mods.spaces();
      if (sp.empty() || sp[0] != Space::kGlobal) return Access();
      Access a = site(AccessKind::kStore, kStores, Space::kGlobal, 0, 0);
      a.width_operand = 2;
      return a;
    }
    return Access();
  }
  if (op == "discard") {
    if (!checkable(mods.space())) return Access();
    Access a = site(AccessKind::kStore, kStores, mods.space(), 0, 0);
    a.width_operand = 1;
    return a;
  }
  if (op == "sust" || op == "sured") return unsupported(kStores, std::string(op) + " (surface store) is not checked");
  if (op == "suld" || op == "tex" || op == "tld4") {
    return unsupported(kLoads, std::string(op) + " (texture or surface load) is not checked");
  }
  if (op == "wmma" && (mods.at(0) == ".store" || mods.at(0) == ".load")) {
    if (!checkable(mods.space())) return Access();
    return unsupported(mods.at(0) == ".store" ? kStores : kLoads,
                       "wmma" + std::string(mods.at(0)) + " to global or generic memory is not checked");
  }
  if (!known_opcode(op)) return unsupported(both, "unknown instruction " + std::string(op));
  return Access();
}

// Registers and symbols declared in one function.
struct Scope {
  std::unordered_map<std::string, std::string> regs;      // name -> type (.b64, .pred ...)
  std::unordered_map<std::string, std::string> prefixes;  // %r<9>: "%r" -> type
  std::unordered_map<std::string, Space> symbols;         // .local/.shared/.param declarations, parameters

  // The register's type, or empty if `name` is not a register.
  std::string reg_type(std::string_view name) const {
    auto it = regs.find(std::string(name));
    if (it != regs.end()) return it->second;
    size_t e = name.size();
    while (e > 0 && name[e - 1] >= '0' && name[e - 1] <= '9') e--;
    if (e == name.size() || e == 0) return std::string();
    auto p = prefixes.find(std::string(name.substr(0, e)));
    return p == prefixes.end() ? std::string() : p->second;
  }
};

bool is64(std::string_view type) {
  return type == ".b64" || type == ".u64" || type == ".s64" || type == ".f64";
}

void declare(const Module& m, const Statement& s, Scope* scope) {
  std::string_view d = m.str(s.first);
  bool reg = d == ".reg";
  Space space = space_mod(d);
  if (!reg && space == Space::kNone) return;
  std::string type;
  int depth = 0;
  for (uint32_t t = s.first + 1; t + 1 < s.last; t++) {
    const Token& tok = m.tokens[t];
    std::string_view v = m.str(t);
    if (tok.kind == TokenKind::kDirective && type_bytes(v) != 0) type = std::string(v);
    if (tok.kind == TokenKind::kDirective && v == ".pred") type = ".pred";
    if (tok.kind == TokenKind::kPunct) {
      if (v == "=") break;
      if (v == "[" || v == "<" || v == "{") depth++;
      if (v == "]" || v == ">" || v == "}") depth--;
      continue;
    }
    if (tok.kind != TokenKind::kIdentifier || depth != 0) continue;
    std::string name(v);
    if (!reg) {
      scope->symbols[name] = space;
    } else if (t + 1 < s.last && v.size() > 0 && m.str(t + 1) == "<") {
      scope->prefixes[name] = type;
    } else {
      scope->regs[name] = type;
    }
  }
}

struct Address {
  std::string base;
  bool symbol = false;  // base names a variable (its address), not a register
  bool reg32 = false;   // base is a 32-bit register
  int64_t offset = 0;
};

struct SitePlan {
  uint32_t statement = 0;
  uint32_t ordinal = 0;
  Access access;
  Address address;
  Instruction in;
};

struct CallPlan {
  uint32_t statement = 0;
  uint32_t target = 0;     // token
  int64_t args = -1;       // operand index of the argument list
  int64_t callee = -1;     // Module::functions index of the definition
};

struct Plan {
  std::vector<SitePlan> sites;
  std::vector<CallPlan> calls;
  std::vector<int64_t> callees;  // definitions, each once
  std::string reason;            // why the function's own code is not fully checked
  std::set<std::string> variables;
};

struct Names {
  std::string prefix;  // "phos" unless the module already uses names starting like ours
  std::string reg(std::string_view r) const { return "%" + prefix + "_" + std::string(r); }
  std::string label(uint32_t ordinal, std::string_view what) const {
    return "$" + prefix + "_" + std::to_string(ordinal) + "_" + std::string(what);
  }
  std::string table_param() const { return "__" + prefix + "_range_table"; }
  std::string arg(uint32_t n) const { return "__" + prefix + "_arg" + std::to_string(n); }
};

std::string collapse(std::string_view s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

bool parse_int(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  std::string str(s);
  if (!str.empty() && (str.back() == 'U' || str.back() == 'u')) str.pop_back();
  try {
    size_t used = 0;
    long long v = std::stoll(str, &used, 0);
    if (used != str.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

struct Edit {
  uint32_t at = 0;     // byte offset in the input
  uint32_t erase = 0;  // bytes replaced
  std::string text;
};

class Twins {
 public:
  Twins(const Module& m, const TwinOptions& o, TwinResult* out) : m_(m), o_(o), out_(*out) {}
  Result<void> run();

 private:
  Result<void> pick_names();
  void analyze(size_t f);
  // No address (nullopt) for an access that touches no global memory (a
  // variable of another space); an error saying why where the address
  // cannot be read.
  Result<std::optional<Address>> read_address(const Operand& op, const Scope& scope) const;
  std::string check_text(const SitePlan& s, const Scope& scope) const;
  std::string twin_text(size_t f);
  std::string header_edits(size_t f, std::vector<Edit>* edits) const;
  std::string apply(uint32_t begin, uint32_t end, std::vector<Edit> edits) const;
  void find_kept();
  void summarize();
  uint32_t table_offset(const Function& f) const;
  int64_t function(std::string_view name) const {
    auto it = functions_.find(name);
    return it == functions_.end() ? -1 : it->second;
  }
  const Variable* variable(std::string_view name) const {
    auto it = variables_.find(name);
    return it == variables_.end() ? nullptr : it->second;
  }
  void note(Plan* p, const std::string& why) {
    if (p->reason.empty()) p->reason = why;
  }

  const Module& m_;
  const TwinOptions& o_;
  TwinResult& out_;
  Names names_;
  uint8_t modes_ = 0;
  std::unordered_map<std::string_view, int64_t> functions_;  // name -> definition (else declaration)
  std::unordered_map<std::string_view, const Variable*> variables_;
  std::vector<Plan> plans_;    // by function
  std::vector<Scope> scopes_;  // by function
  std::unordered_set<uint32_t> call_targets_;  // tokens
  std::vector<bool> kept_;                     // originals the output keeps
  uint32_t ordinal_ = 0;
  uint32_t args_ = 0;
};

Result<void> Twins::pick_names() {
  std::unordered_set<std::string_view> idents;
  for (uint32_t t = 0; t < m_.tokens.size(); t++) {
    if (m_.tokens[t].kind == TokenKind::kIdentifier) idents.insert(m_.str(t));
  }
  for (const Function& f : m_.functions) {
    if (idents.count(f.name + o_.suffix))
      return make_error("the module already has a symbol named " + f.name + o_.suffix);
  }
  for (int n = 0;; n++) {
    names_.prefix = n == 0 ? "phos" : "phos" + std::to_string(n);
    std::string starts[] = {"%" + names_.prefix + "_", "$" + names_.prefix + "_", "__" + names_.prefix + "_"};
    bool clash = false;
    for (std::string_view id : idents) {
      for (const std::string& s : starts) clash = clash || id.starts_with(s);
    }
    if (!clash) return {};
  }
}

Result<std::optional<Address>> Twins::read_address(const Operand& op, const Scope& scope) const {
  auto text = [&](uint32_t t) { return m_.str(t); };
  if (op.last - op.first < 3 || text(op.first) != "[" || text(op.last - 1) != "]") {
    return make_error("cannot read the address " + std::string(m_.span(op.first, op.last)));
  }
  uint32_t t = op.first + 1;
  const uint32_t end = op.last - 1;
  const Token& base = m_.tokens[t];
  Address a;
  a.base = std::string(text(t));
  if (base.kind == TokenKind::kIdentifier) {
    std::string type = scope.reg_type(a.base);
    if (!type.empty()) {
      a.reg32 = !is64(type);
    } else {
      a.symbol = true;
    }
  } else if (base.kind != TokenKind::kNumber) {
    return make_error("cannot read the address " + std::string(m_.span(op.first, op.last)));
  }
  t++;
  if (t < end) {
    bool negative = false;
    if (text(t) == "+") t++;
    if (t < end && text(t) == "-") {
      negative = true;
      t++;
    }
    int64_t v = 0;
    if (t + 1 != end || !parse_int(text(t), &v)) {
      return make_error("cannot read the address " + std::string(m_.span(op.first, op.last)));
    }
    a.offset = negative ? -v : v;
  }
  if (a.symbol) {
    Space s = Space::kOther;
    auto it = scope.symbols.find(a.base);
    if (it != scope.symbols.end()) {
      s = it->second;
    } else if (const Variable* v = variable(a.base)) {
      s = v->space;
    } else {
      return make_error("address of unknown symbol " + a.base);
    }
    // A generic or global access to a variable of another space touches no
    // global memory.
    if (s != Space::kGlobal) return std::optional<Address>();
  }
  return std::optional<Address>(std::move(a));
}

void Twins::analyze(size_t fi) {
  const Function& f = m_.functions[fi];
  Plan& plan = plans_[fi];
  Scope& scope = scopes_[fi];
  for (const Param& p : f.params) {
    if (p.reg) {
      // .reg parameters are registers of the function.
      Statement s;
      s.first = p.first;
      s.last = p.last + 1;
      declare(m_, s, &scope);
    } else {
      scope.symbols[p.name] = Space::kParam;
    }
  }
  for (const Statement& s : f.statements) {
    if (s.kind == StatementKind::kDirective) declare(m_, s, &scope);
  }
  for (uint32_t si = 0; si < f.statements.size(); si++) {
    const Statement& s = f.statements[si];
    if (s.kind != StatementKind::kInstruction) continue;
    // Module variables named by the code.
    for (uint32_t t = s.first; t < s.last; t++) {
      if (m_.tokens[t].kind != TokenKind::kIdentifier) continue;
      std::string_view id = m_.str(t);
      if (scope.symbols.count(std::string(id)) || !scope.reg_type(id).empty()) continue;
      const Variable* v = variable(id);
      // nvcc's string constants (printf formats, assert messages) are the
      // same in every copy of the module.
      if (id.starts_with("$str") || id.starts_with("__unnamed_")) continue;
      if (v && (v->space == Space::kGlobal || v->space == Space::kConst)) plan.variables.insert(v->name);
    }
    Instruction in;
    if (!parse_instruction(m_, s, &in)) {
      note(&plan, "cannot read the instruction " + collapse(m_.span(s.first, s.last)));
      continue;
    }
    std::string_view op = m_.str(in.opcode);
    if (op == "call") {
      size_t k = 0;
      if (k < in.operands.size() && m_.str(in.operands[k].first) == "(") k++;  // return parameters
      if (k >= in.operands.size() || in.operands[k].last - in.operands[k].first != 1) {
        note(&plan, "cannot read the call " + collapse(m_.span(s.first, s.last)));
        continue;
      }
      uint32_t target = in.operands[k].first;
      std::string_view name = m_.str(target);
      int64_t callee = scope.reg_type(name).empty() ? function(name) : -1;
      if (callee < 0) {
        note(&plan, "indirect call through " + std::string(name));
        continue;
      }
      call_targets_.insert(target);
      if (!m_.functions[callee].defined) {
        if (!harmless_extern(name)) note(&plan, "call to external function " + std::string(name));
        continue;
      }
      CallPlan c;
      c.statement = si;
      c.target = target;
      c.callee = callee;
      if (k + 1 < in.operands.size() && m_.str(in.operands[k + 1].first) == "(") c.args = static_cast<int64_t>(k + 1);
      plan.calls.push_back(c);
      if (std::find(plan.callees.begin(), plan.callees.end(), callee) == plan.callees.end()) {
        plan.callees.push_back(callee);
      }
      continue;
    }
    Access a = classify(m_, in);
    if (!a.unsupported.empty()) {
      if (a.unsupported_modes & modes_) note(&plan, a.unsupported);
      continue;
    }
    if (!a.checked || !(a.modes & modes_)) continue;
    if (a.address >= in.operands.size() ||
        (a.width_operand >= 0 && static_cast<size_t>(a.width_operand) >= in.operands.size())) {
      note(&plan, "cannot read the operands of " + collapse(m_.span(s.first, s.last)));
      continue;
    }
    Result<std::optional<Address>> address = read_address(in.operands[a.address], scope);
    if (!address) {
      note(&plan, address.error().message);
      continue;
    }
    if (!*address) continue;
    SitePlan sp;
    sp.address = std::move(**address);
    Mods mods(m_, in);
    if (op == "cp" && mods.at(0) == ".async" && (mods.at(1) == ".ca" || mods.at(1) == ".cg")) {
      // cp.async: an operand after cp-size (and before a cache policy) is
      // src-size (the bytes read) or ignore-src (a predicate: none read).
      size_t n = in.operands.size() - (mods.has(".L2::cache_hint") ? 1 : 0);
      if (n == 4) {
        const Operand& x = in.operands[3];
        bool pred = x.last - x.first == 1 && scope.reg_type(m_.str(x.first)) == ".pred";
        (pred ? a.skip_operand : a.width_operand) = 3;
      }
    }
    if (a.width_operand >= 0) {
      // An immediate width is fixed; a register's is read at run time.
      const Operand& w = in.operands[a.width_operand];
      int64_t v = 0;
      if (w.last - w.first == 1 && parse_int(m_.str(w.first), &v)) {
        if (v <= 0) continue;  // nothing moves
        a.width = static_cast<uint32_t>(v);
        a.width_operand = -1;
      } else if (w.last - w.first != 1 || scope.reg_type(m_.str(w.first)).empty()) {
        note(&plan, "cannot read the width of " + collapse(m_.span(s.first, s.last)));
        continue;
      }
    }
    sp.statement = si;
    sp.ordinal = ordinal_++;
    sp.access = a;
    sp.in = in;
    CheckSite cs;
    cs.ordinal = sp.ordinal;
    cs.function = f.name;
    cs.line = m_.line_of(s.first);
    cs.instruction = collapse(m_.span(s.first, s.last));
    cs.kind = a.kind;
    cs.space = a.space;
    cs.width = a.width_operand >= 0 ? 0 : a.width;
    out_.sites.push_back(std::move(cs));
    plan.sites.push_back(std::move(sp));
  }
}

std::string Twins::check_text(const SitePlan& s, const Scope& scope) const {
  const Access& a = s.access;
  const Address& ad = s.address;
  const std::string A = names_.reg("a"), E = names_.reg("e"), W = names_.reg("w"), N = names_.reg("n");
  const std::string Q = names_.reg("q"), S = names_.reg("s"), Z = names_.reg("z"), T = names_.reg("t");
  const std::string P = names_.reg("p");
  const std::string ok = names_.label(s.ordinal, "ok"), loop = names_.label(s.ordinal, "loop");
  const std::string bad = names_.label(s.ordinal, "bad");
  // The first line follows the statement's own indentation; labels start
  // their lines; the text ends where the statement starts.
  std::string o;
  auto line = [&](const std::string& l) { o += l + "\n\t"; };
  auto label = [&](const std::string& l) {
    o.pop_back();
    o += l + ":\n\t";
  };
  line("// phos check " + std::to_string(s.ordinal));
  if (s.in.guard >= 0) {
    line(std::string("@") + (s.in.guard_negated ? "" : "!") + std::string(m_.str(static_cast<uint32_t>(s.in.guard))) +
         " bra " + ok + ";");
  }
  if (a.skip_operand >= 0) line("@" + std::string(m_.str(s.in.operands[a.skip_operand].first)) + " bra " + ok + ";");
  if (ad.symbol) {
    line("cvta.global.u64 " + A + ", " + ad.base + ";");
  } else if (ad.reg32) {
    line("cvt.u64.u32 " + A + ", " + ad.base + ";");
  } else {
    line("mov.b64 " + A + ", " + ad.base + ";");
  }
  if (ad.offset != 0) line("add.s64 " + A + ", " + A + ", " + std::to_string(ad.offset) + ";");
  if (!ad.symbol && a.space == Space::kGlobal) line("cvta.global.u64 " + A + ", " + A + ";");
  if (!ad.symbol && a.space == Space::kNone) {
    line("isspacep.global " + P + ", " + A + ";");
    line("@!" + P + " bra " + ok + ";");
  }
  if (a.width_operand >= 0) {
    std::string r(m_.str(s.in.operands[a.width_operand].first));
    line((is64(scope.reg_type(r)) ? "mov.b64 " : "cvt.u64.u32 ") + W + ", " + r + ";");
    line("setp.eq.u64 " + P + ", " + W + ", 0;");
    line("@" + P + " bra " + ok + ";");
    line("add.u64 " + E + ", " + A + ", " + W + ";");
  } else {
    line("add.u64 " + E + ", " + A + ", " + std::to_string(a.width) + ";");
  }
  line("ld.global.nc.u64 " + N + ", [" + T + "];");
  line("add.u64 " + Q + ", " + T + ", " + std::to_string(kTableHeaderWords * 8) + ";");
  label(loop);
  line("setp.eq.u64 " + P + ", " + N + ", 0;");
  line("@" + P + " bra " + bad + ";");
  line("ld.global.nc.v2.u64 {" + S + ", " + Z + "}, [" + Q + "];");
  line("add.u64 " + Q + ", " + Q + ", 16;");
  line("sub.u64 " + N + ", " + N + ", 1;");
  line("setp.ge.u64 " + P + ", " + A + ", " + S + ";");
  line("setp.le.and.u64 " + P + ", " + E + ", " + Z + ", " + P + ";");
  line("@!" + P + " bra " + loop + ";");
  line("bra " + ok + ";");
  label(bad);
  line("atom.global.add.u64 " + S + ", [" + T + "+" + std::to_string(kTableViolations * 8) + "], 1;");
  line("setp.ne.u64 " + P + ", " + S + ", 0;");
  line("@" + P + " bra " + ok + ";");
  line("st.global.u64 [" + T + "+" + std::to_string(kTableFirstAddress * 8) + "], " + A + ";");
  line("st.global.u64 [" + T + "+" + std::to_string(kTableFirstInstruction * 8) + "], " + std::to_string(s.ordinal) +
       ";");
  label(ok);
  return o;
}

// Renames the function and appends the table parameter; returns the text
// that loads the table pointer into its register (for the body's start).
std::string Twins::header_edits(size_t fi, std::vector<Edit>* edits) const {
  const Function& f = m_.functions[fi];
  const Token& name = m_.tokens[f.name_token];
  Edit rename;
  rename.at = name.begin;
  rename.erase = name.end - name.begin;
  rename.text = f.name + o_.suffix;
  edits->push_back(rename);
  bool reg_style = !f.params.empty() && f.params.back().reg;
  std::string param = f.entry ? ".param .u64 " + names_.table_param()
                      : reg_style ? ".reg .b64 " + names_.reg("tin")
                                  : ".param .b64 " + names_.table_param();
  Edit add;
  if (f.params_open < 0) {
    add.at = name.end;
    add.text = "(" + param + ")";
  } else if (f.params.empty()) {
    add.at = m_.tokens[f.params_open].end;
    add.text = param;
  } else {
    add.at = m_.tokens[f.params_close - 1].end;
    add.text = ",\n\t" + param;
  }
  edits->push_back(add);
  if (f.entry) {
    return "ld.param.u64 " + names_.reg("t") + ", [" + names_.table_param() + "];\n\tcvta.to.global.u64 " +
           names_.reg("t") + ", " + names_.reg("t") + ";";
  }
  if (reg_style) return "mov.b64 " + names_.reg("t") + ", " + names_.reg("tin") + ";";
  return "ld.param.b64 " + names_.reg("t") + ", [" + names_.table_param() + "];";
}

std::string Twins::apply(uint32_t begin, uint32_t end, std::vector<Edit> edits) const {
  std::stable_sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.at < b.at; });
  std::string o;
  uint32_t pos = begin;
  for (const Edit& e : edits) {
    o.append(m_.text.substr(pos, e.at - pos));
    o += e.text;
    pos = e.at + e.erase;
  }
  o.append(m_.text.substr(pos, end - pos));
  return o;
}

std::string Twins::twin_text(size_t fi) {
  const Function& f = m_.functions[fi];
  const Item& item = m_.items[f.item];
  std::vector<Edit> edits;
  std::string load = header_edits(fi, &edits);
  if (f.defined) {
    Edit decl;
    decl.at = m_.tokens[f.body_open].end;
    decl.text = "\n\t.reg .b64 " + names_.reg("t") + ", " + names_.reg("a") + ", " + names_.reg("e") + ", " +
                names_.reg("w") + ", " + names_.reg("n") + ", " + names_.reg("q") + ", " + names_.reg("s") + ", " +
                names_.reg("z") + ";\n\t.reg .pred " + names_.reg("p") + ";\n\t" + load;
    edits.push_back(decl);
    const Plan& plan = plans_[fi];
    for (const SitePlan& s : plan.sites) {
      Edit e;
      e.at = m_.tokens[f.statements[s.statement].first].begin;
      e.text = check_text(s, scopes_[fi]);
      edits.push_back(std::move(e));
    }
    for (const CallPlan& c : plan.calls) {
      const Function& callee = m_.functions[c.callee];
      bool reg_style = !callee.params.empty() && callee.params.back().reg;
      std::string arg = reg_style ? names_.reg("t") : names_.arg(args_++);
      if (!reg_style) {
        Edit e;
        e.at = m_.tokens[f.statements[c.statement].first].begin;
        e.text = ".param .b64 " + arg + ";\n\tst.param.b64 [" + arg + "], " + names_.reg("t") + ";\n\t";
        edits.push_back(std::move(e));
      }
      const Token& target = m_.tokens[c.target];
      Edit rename;
      rename.at = target.begin;
      rename.erase = target.end - target.begin;
      rename.text = callee.name + o_.suffix;
      Edit add;
      if (c.args < 0) {
        add.at = target.end;
        add.text = ", (" + arg + ")";
      } else {
        Instruction in;
        parse_instruction(m_, f.statements[c.statement], &in);
        const Operand& args = in.operands[c.args];
        if (args.last - args.first <= 2) {
          add.at = m_.tokens[args.first].end;
          add.text = arg;
        } else {
          add.at = m_.tokens[args.last - 2].end;
          add.text = ", " + arg;
        }
      }
      edits.push_back(std::move(rename));
      edits.push_back(std::move(add));
    }
  }
  return apply(m_.tokens[item.first].begin, m_.tokens[item.last - 1].end, std::move(edits));
}

uint32_t Twins::table_offset(const Function& f) const {
  uint64_t offset = 0;
  for (const Param& p : f.params) {
    uint64_t size = 0, align = 0, count = 1;
    for (uint32_t t = p.first; t < p.last; t++) {
      std::string_view v = m_.str(t);
      if (v == ".align" && t + 1 < p.last) {
        int64_t a = 0;
        if (parse_int(m_.str(t + 1), &a)) align = static_cast<uint64_t>(a);
      } else if (m_.tokens[t].kind == TokenKind::kDirective && type_bytes(v) != 0 && size == 0) {
        size = type_bytes(v);
      } else if (v == "[" && t + 1 < p.last) {
        int64_t n = 0;
        if (parse_int(m_.str(t + 1), &n)) count *= static_cast<uint64_t>(n);
      }
    }
    if (align == 0) align = size == 0 ? 1 : size;
    offset = (offset + align - 1) / align * align + size * count;
  }
  return static_cast<uint32_t>((offset + 7) / 8 * 8);
}

void Twins::find_kept() {
  // Functions named other than as a call's target or in their own header
  // (their address is taken) stay as they are, with what they call.
  std::unordered_set<uint32_t> headers;
  for (const Function& f : m_.functions) headers.insert(f.name_token);
  kept_.assign(m_.functions.size(), false);
  std::vector<int64_t> work;
  for (uint32_t t = 0; t < m_.tokens.size(); t++) {
    if (m_.tokens[t].kind != TokenKind::kIdentifier || headers.count(t) || call_targets_.count(t)) continue;
    int64_t fi = function(m_.str(t));
    if (fi >= 0 && m_.functions[fi].defined && !kept_[fi]) {
      kept_[fi] = true;
      work.push_back(fi);
    }
  }
  while (!work.empty()) {
    int64_t fi = work.back();
    work.pop_back();
    for (int64_t c : plans_[fi].callees) {
      if (!kept_[c]) {
        kept_[c] = true;
        work.push_back(c);
      }
    }
  }
}

void Twins::summarize() {
  for (size_t fi = 0; fi < m_.functions.size(); fi++) {
    const Function& f = m_.functions[fi];
    if (!f.entry || !f.defined) continue;
    TwinKernel k;
    k.name = f.name;
    k.twin_name = f.name + o_.suffix;
    k.params = static_cast<uint32_t>(f.params.size());
    k.table_offset = table_offset(f);
    std::set<std::string> vars;
    std::vector<bool> seen(m_.functions.size(), false);
    std::vector<int64_t> work = {static_cast<int64_t>(fi)};
    seen[fi] = true;
    while (!work.empty()) {
      int64_t g = work.front();
      work.erase(work.begin());
      const Plan& p = plans_[g];
      k.checks += static_cast<uint32_t>(p.sites.size());
      if (k.complete && !p.reason.empty()) {
        k.complete = false;
        k.reason = g == static_cast<int64_t>(fi) ? p.reason : m_.functions[g].name + ": " + p.reason;
      }
      vars.insert(p.variables.begin(), p.variables.end());
      if (g != static_cast<int64_t>(fi)) k.functions.push_back(m_.functions[g].name);
      for (int64_t c : p.callees) {
        if (!seen[c]) {
          seen[c] = true;
          work.push_back(c);
        }
      }
    }
    k.module_variables.assign(vars.begin(), vars.end());
    out_.kernels.push_back(std::move(k));
  }
}

Result<void> Twins::run() {
  if (m_.address_size != 64) return make_error("only .address_size 64 is supported");
  PHOS_TRY(pick_names());
  out_.table_param = names_.table_param();
  for (size_t fi = 0; fi < m_.functions.size(); fi++) {
    auto [it, added] = functions_.emplace(m_.functions[fi].name, static_cast<int64_t>(fi));
    if (!added && !m_.functions[it->second].defined) it->second = static_cast<int64_t>(fi);
  }
  for (const Variable& v : m_.variables) variables_.emplace(v.name, &v);
  modes_ = static_cast<uint8_t>((o_.stores ? kStores : 0) | (o_.loads ? kLoads : 0));
  plans_.assign(m_.functions.size(), Plan());
  scopes_.assign(m_.functions.size(), Scope());
  for (size_t fi = 0; fi < m_.functions.size(); fi++) {
    if (m_.functions[fi].defined) analyze(fi);
  }
  find_kept();
  summarize();
  std::string& o = out_.ptx;
  uint32_t pos = 0;
  for (const Item& item : m_.items) {
    uint32_t begin = m_.tokens[item.first].begin;
    uint32_t end = m_.tokens[item.last - 1].end;
    o.append(m_.text.substr(pos, begin - pos));
    pos = end;
    std::string_view original = m_.text.substr(begin, end - begin);
    if (item.kind != ItemKind::kFunction) {
      o.append(original);
      continue;
    }
    const Function& f = m_.functions[item.function];
    int64_t def = f.defined ? item.function : function(f.name);
    if (def < 0 || !m_.functions[def].defined) {
      o.append(original);  // an external function
      continue;
    }
    if (o_.include_original || kept_[def]) {
      o.append(original);
      o += "\n";
    }
    o += twin_text(static_cast<size_t>(item.function));
  }
  o.append(m_.text.substr(pos));
  if (!o.empty() && o.back() != '\n') o += '\n';
  return {};
}

}  // namespace

const char* access_kind_name(AccessKind k) {
  switch (k) {
    case AccessKind::kStore: return "store";
    case AccessKind::kLoad: return "load";
    case AccessKind::kAtomic: return "atomic";
  }
  return "invalid";
}

Result<TwinResult> make_twins(std::string_view ptx, const TwinOptions& options) {
  Result<Module> m = read_module(ptx);
  if (!m) return m.error();
  TwinResult out;
  Twins t(*m, options, &out);
  PHOS_TRY(t.run());
  return out;
}

}  // namespace phos::ptx
