#include "phos/ptx/reader.h"

#include <algorithm>
#include <limits>

namespace phos::ptx {

namespace {

bool ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$' || c == '%';
}
bool ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
}
bool digit(char c) { return c >= '0' && c <= '9'; }

// Directives that take the rest of their line and end without ';'.
bool line_directive(std::string_view s) {
  return s == ".version" || s == ".target" || s == ".address_size" || s == ".file" || s == ".loc";
}

Space space_of(std::string_view d) {
  if (d == ".global") return Space::kGlobal;
  if (d == ".const") return Space::kConst;
  if (d == ".shared" || d.starts_with(".shared::")) return Space::kShared;
  if (d == ".local") return Space::kLocal;
  if (d == ".param" || d.starts_with(".param::")) return Space::kParam;
  if (d == ".tex") return Space::kTex;
  return Space::kNone;
}

class Reader {
 public:
  explicit Reader(Module* m) : m_(*m) {}

  // False where the structure cannot be followed; error() says where.
  bool run();
  const std::string& error() const { return error_; }

 private:
  bool is(uint32_t t, std::string_view s) const { return t < m_.tokens.size() && m_.str(t) == s; }
  bool punct(uint32_t t, char c) const {
    return t < m_.tokens.size() && m_.tokens[t].kind == TokenKind::kPunct && m_.text[m_.tokens[t].begin] == c;
  }
  bool fail(uint32_t t, const std::string& what) {
    uint32_t line = t < m_.tokens.size() ? m_.line_of(t) : static_cast<uint32_t>(m_.line_starts.size());
    error_ = "line " + std::to_string(line) + ": " + what;
    return false;
  }
  // The token after the group that opens at `open` ('(' '[' or '{'), or
  // kUnclosed when it does not close.
  uint32_t skip_group(uint32_t open) const;
  uint32_t end_of_line(uint32_t t) const {
    uint32_t e = t + 1;
    while (e < m_.tokens.size() && !m_.tokens[e].line_start) e++;
    return e;
  }
  bool top_directive(uint32_t first, uint32_t last);
  bool function(uint32_t first, uint32_t header_end, int64_t body_open, Item* item);
  bool body(Function* f);
  void variables(uint32_t first, uint32_t last, uint32_t item);

  static constexpr uint32_t kUnclosed = std::numeric_limits<uint32_t>::max();
  Module& m_;
  std::string error_;
};

uint32_t Reader::skip_group(uint32_t open) const {
  int depth = 0;
  for (uint32_t t = open; t < m_.tokens.size(); t++) {
    if (m_.tokens[t].kind != TokenKind::kPunct) continue;
    char c = m_.text[m_.tokens[t].begin];
    if (c == '(' || c == '[' || c == '{') depth++;
    if (c == ')' || c == ']' || c == '}') {
      if (--depth == 0) return t + 1;
    }
  }
  return kUnclosed;
}

bool Reader::top_directive(uint32_t first, uint32_t last) {
  std::string_view d = m_.str(first);
  if (d == ".version" && first + 1 < last) {
    std::string_view v = m_.str(first + 1);
    size_t dot = v.find('.');
    if (dot == std::string_view::npos) return fail(first, "bad .version " + std::string(v));
    m_.version_major = static_cast<uint32_t>(std::stoul(std::string(v.substr(0, dot))));
    m_.version_minor = static_cast<uint32_t>(std::stoul(std::string(v.substr(dot + 1))));
  } else if (d == ".target" && first + 1 < last) {
    m_.target = std::string(m_.span(first + 1, last));
  } else if (d == ".address_size" && first + 1 < last) {
    std::string_view v = m_.str(first + 1);
    if (v != "32" && v != "64") return fail(first, "bad .address_size " + std::string(v));
    m_.address_size = v == "64" ? 64 : 32;
  }
  return true;
}

void Reader::variables(uint32_t first, uint32_t last, uint32_t item) {
  Space space = Space::kNone;
  bool external = false;
  uint32_t t = first;
  for (; t < last && m_.tokens[t].kind == TokenKind::kDirective; t++) {
    std::string_view d = m_.str(t);
    if (d == ".extern") external = true;
    if (space == Space::kNone) space = space_of(d);
  }
  if (space == Space::kNone) return;
  // Names: identifiers outside brackets and braces, before any initializer.
  int depth = 0;
  for (; t < last; t++) {
    const Token& tok = m_.tokens[t];
    if (tok.kind == TokenKind::kPunct) {
      char c = m_.text[tok.begin];
      if (c == '[' || c == '{' || c == '(' || c == '<') depth++;
      if (c == ']' || c == '}' || c == ')' || c == '>') depth--;
      if (c == '=' && depth == 0) break;
    } else if (tok.kind == TokenKind::kIdentifier && depth == 0) {
      Variable v;
      v.name = std::string(m_.str(t));
      v.space = space;
      v.external = external;
      v.item = item;
      m_.variables.push_back(std::move(v));
    }
  }
}

bool Reader::function(uint32_t first, uint32_t header_end, int64_t body_open, Item* item) {
  Function f;
  f.item = static_cast<uint32_t>(m_.items.size());
  uint32_t t = first;
  while (t < header_end && !is(t, ".entry") && !is(t, ".func")) {
    if (is(t, ".extern")) f.external = true;
    t++;
  }
  if (t == header_end) return fail(first, "no .entry or .func in a function header");
  f.entry = is(t, ".entry");
  t++;
  if (is(t, ".attribute")) {
    t++;
    if (punct(t, '(')) t = skip_group(t);
  }
  if (!f.entry && t < header_end && punct(t, '(')) t = skip_group(t);  // the return parameters
  if (t >= header_end || m_.tokens[t].kind != TokenKind::kIdentifier) return fail(t, "function without a name");
  f.name = std::string(m_.str(t));
  f.name_token = t;
  t++;
  if (t < header_end && punct(t, '(')) {
    uint32_t after = skip_group(t);
    if (after == kUnclosed || after > header_end) return fail(t, "unterminated parameter list of " + f.name);
    uint32_t close = after - 1;
    f.params_open = t;
    f.params_close = close;
    // One parameter per top-level comma: its name is its last identifier.
    uint32_t p = t + 1;
    while (p < close) {
      uint32_t e = p;
      int depth = 0;
      for (; e < close; e++) {
        if (punct(e, '[') || punct(e, '(')) depth++;
        if (punct(e, ']') || punct(e, ')')) depth--;
        if (depth == 0 && punct(e, ',')) break;
      }
      Param param;
      param.reg = is(p, ".reg");
      param.first = p;
      param.last = e;
      for (uint32_t k = p; k < e; k++) {
        if (m_.tokens[k].kind == TokenKind::kIdentifier) param.name = std::string(m_.str(k));
      }
      f.params.push_back(std::move(param));
      p = e + 1;
    }
  }
  if (body_open >= 0) {
    uint32_t after = skip_group(static_cast<uint32_t>(body_open));
    if (after == kUnclosed) return fail(static_cast<uint32_t>(body_open), "the body of " + f.name + " does not end");
    uint32_t close = after - 1;
    f.defined = true;
    f.body_open = body_open;
    f.body_close = close;
    item->last = close + 1;
    if (!body(&f)) return false;
  }
  item->function = static_cast<int64_t>(m_.functions.size());
  m_.functions.push_back(std::move(f));
  return true;
}

bool Reader::body(Function* f) {
  uint32_t t = static_cast<uint32_t>(f->body_open) + 1;
  uint32_t end = static_cast<uint32_t>(f->body_close);
  uint32_t depth = 1;
  while (t < end) {
    Statement s;
    s.first = t;
    s.depth = depth;
    const Token& tok = m_.tokens[t];
    if (punct(t, '{')) {
      s.kind = StatementKind::kOpen;
      s.last = t + 1;
      depth++;
    } else if (punct(t, '}')) {
      s.kind = StatementKind::kClose;
      s.last = t + 1;
      depth--;
      s.depth = depth;
    } else if ((tok.kind == TokenKind::kIdentifier || tok.kind == TokenKind::kNumber) && punct(t + 1, ':')) {
      s.kind = StatementKind::kLabel;
      s.last = t + 2;
    } else if (tok.kind == TokenKind::kDirective && line_directive(m_.str(t))) {
      s.kind = StatementKind::kDirective;
      s.last = std::min(end_of_line(t), end);
    } else {
      s.kind = tok.kind == TokenKind::kDirective ? StatementKind::kDirective : StatementKind::kInstruction;
      uint32_t e = t;
      while (e < end && !punct(e, ';')) e++;
      if (e == end) return fail(t, "statement without ';' in " + f->name);
      s.last = e + 1;
    }
    t = s.last;
    f->statements.push_back(s);
  }
  if (depth != 1) return fail(end, "unbalanced braces in " + f->name);
  return true;
}

bool Reader::run() {
  const uint32_t n = static_cast<uint32_t>(m_.tokens.size());
  uint32_t t = 0;
  while (t < n) {
    Item item;
    item.first = t;
    std::string_view s = m_.str(t);
    if (m_.tokens[t].kind == TokenKind::kDirective && line_directive(s)) {
      item.kind = ItemKind::kDirective;
      item.last = end_of_line(t);
      if (!top_directive(item.first, item.last)) return false;
    } else if (s == ".section") {
      uint32_t open = t;
      while (open < n && !punct(open, '{') && !punct(open, ';')) open++;
      if (open == n) return fail(t, "unterminated .section");
      item.kind = ItemKind::kSection;
      item.last = punct(open, '{') ? skip_group(open) : open + 1;
      if (item.last == kUnclosed) return fail(t, "unterminated .section");
    } else {
      int paren = 0;
      int brace = 0;
      bool fn = false;
      bool assigned = false;
      int64_t body_open = -1;
      uint32_t e = t;
      for (; e < n; e++) {
        if (paren == 0 && brace == 0 && (is(e, ".entry") || is(e, ".func"))) fn = true;
        if (m_.tokens[e].kind != TokenKind::kPunct) continue;
        char c = m_.text[m_.tokens[e].begin];
        if (c == '(') paren++;
        if (c == ')') paren--;
        if (c == '=' && paren == 0 && brace == 0) assigned = true;
        if (c == '{') {
          if (paren == 0 && brace == 0 && fn && !assigned) {
            body_open = e;
            break;
          }
          brace++;
        }
        if (c == '}') brace--;
        if (c == ';' && paren == 0 && brace == 0) break;
        if (paren < 0 || brace < 0) return fail(e, "unbalanced parentheses or braces");
      }
      if (e == n) return fail(t, "declaration without ';' or body");
      item.last = e + 1;
      if (fn) {
        item.kind = ItemKind::kFunction;
        if (!function(t, e, body_open, &item)) return false;
      } else {
        item.kind = ItemKind::kOther;
        size_t before = m_.variables.size();
        variables(t, e, static_cast<uint32_t>(m_.items.size()));
        if (m_.variables.size() != before) item.kind = ItemKind::kVariable;
      }
    }
    t = item.last;
    m_.items.push_back(item);
  }
  return true;
}

}  // namespace

const char* space_name(Space s) {
  switch (s) {
    case Space::kNone: return "generic";
    case Space::kGlobal: return "global";
    case Space::kConst: return "const";
    case Space::kShared: return "shared";
    case Space::kLocal: return "local";
    case Space::kParam: return "param";
    case Space::kTex: return "tex";
    case Space::kOther: return "other";
  }
  return "invalid";
}

Result<std::vector<Token>> tokenize(std::string_view text) {
  size_t nul = text.find('\0');
  if (nul != std::string_view::npos) text = text.substr(0, nul);
  if (text.size() >= std::numeric_limits<uint32_t>::max()) return make_error("PTX text of 4 GiB or more");
  std::vector<Token> tokens;
  const size_t n = text.size();
  size_t i = 0;
  uint32_t line = 1;
  bool line_start = true;
  auto fail = [&](const char* what) { return make_error("line " + std::to_string(line) + ": " + what); };
  while (i < n) {
    char c = text[i];
    if (c == '\n') {
      line_start = true;
      line++;
      i++;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      i++;
      continue;
    }
    if (c == '/' && i + 1 < n && text[i + 1] == '/') {
      while (i < n && text[i] != '\n') i++;
      continue;
    }
    if (c == '/' && i + 1 < n && text[i + 1] == '*') {
      size_t close = text.find("*/", i + 2);
      if (close == std::string_view::npos) return fail("unterminated comment");
      for (size_t k = i; k < close; k++) {
        if (text[k] == '\n') {
          line_start = true;
          line++;
        }
      }
      i = close + 2;
      continue;
    }
    Token tok;
    tok.begin = static_cast<uint32_t>(i);
    tok.line_start = line_start;
    line_start = false;
    if (c == '"') {
      tok.kind = TokenKind::kString;
      i++;
      while (i < n && text[i] != '"') {
        if (text[i] == '\\' && i + 1 < n) i++;
        if (text[i] == '\n') return fail("unterminated string");
        i++;
      }
      if (i == n) return fail("unterminated string");
      i++;
    } else if (ident_start(c)) {
      tok.kind = TokenKind::kIdentifier;
      i++;
      while (i < n && ident_char(text[i])) i++;
    } else if (c == '.' && i + 1 < n && ident_char(text[i + 1])) {
      // .global, .v4, .shared::cta, and .1d (cp.async.bulk.tensor.1d).
      tok.kind = TokenKind::kDirective;
      i++;
      while (i < n) {
        if (ident_char(text[i])) {
          i++;
        } else if (text[i] == ':' && i + 2 < n && text[i + 1] == ':' && ident_char(text[i + 2])) {
          i += 2;
        } else {
          break;
        }
      }
    } else if (digit(c)) {
      tok.kind = TokenKind::kNumber;
      bool decimal = !(c == '0' && i + 1 < n && std::string_view("xXfFdD").find(text[i + 1]) != std::string_view::npos);
      i++;
      while (i < n) {
        char d = text[i];
        if (ident_char(d) || d == '.') {
          i++;
        } else if (decimal && (d == '+' || d == '-') && (text[i - 1] == 'e' || text[i - 1] == 'E')) {
          i++;
        } else {
          break;
        }
      }
    } else {
      tok.kind = TokenKind::kPunct;
      i++;
    }
    tok.end = static_cast<uint32_t>(i);
    tokens.push_back(tok);
  }
  return tokens;
}

uint32_t Module::line_of(uint32_t token) const {
  uint32_t offset = tokens[token].begin;
  auto it = std::upper_bound(line_starts.begin(), line_starts.end(), offset);
  return static_cast<uint32_t>(it - line_starts.begin());
}

int64_t Module::find_function(std::string_view name) const {
  int64_t found = -1;
  for (size_t i = 0; i < functions.size(); i++) {
    if (functions[i].name != name) continue;
    if (functions[i].defined) return static_cast<int64_t>(i);
    if (found < 0) found = static_cast<int64_t>(i);
  }
  return found;
}

const Variable* Module::find_variable(std::string_view name) const {
  for (const Variable& v : variables) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

Result<Module> read_module(std::string_view text) {
  size_t nul = text.find('\0');
  if (nul != std::string_view::npos) text = text.substr(0, nul);
  Module m;
  m.text = text;
  Result<std::vector<Token>> tokens = tokenize(text);
  if (!tokens) return tokens.error();
  m.tokens = std::move(*tokens);
  m.line_starts.push_back(0);
  for (size_t i = 0; i < text.size(); i++) {
    if (text[i] == '\n') m.line_starts.push_back(static_cast<uint32_t>(i + 1));
  }
  Reader r(&m);
  if (!r.run()) return make_error(r.error());
  return m;
}

bool parse_instruction(const Module& m, const Statement& s, Instruction* out) {
  *out = Instruction();
  if (s.kind != StatementKind::kInstruction || s.last <= s.first) return false;
  auto punct = [&](uint32_t t, char c) {
    return m.tokens[t].kind == TokenKind::kPunct && m.text[m.tokens[t].begin] == c;
  };
  uint32_t t = s.first;
  const uint32_t end = s.last - 1;  // the ';'
  if (!punct(end, ';')) return false;
  if (punct(t, '@')) {
    t++;
    if (t < end && punct(t, '!')) {
      out->guard_negated = true;
      t++;
    }
    if (t >= end || m.tokens[t].kind != TokenKind::kIdentifier) return false;
    out->guard = t;
    t++;
  }
  if (t >= end || m.tokens[t].kind != TokenKind::kIdentifier) return false;
  out->opcode = t;
  t++;
  out->mods_first = t;
  // Modifiers are the directive tokens glued to the opcode: st.global.v4.f32.
  while (t < end && m.tokens[t].kind == TokenKind::kDirective && m.tokens[t].begin == m.tokens[t - 1].end) t++;
  out->mods_last = t;
  if (t == end) return true;
  uint32_t start = t;
  int depth = 0;
  for (; t <= end; t++) {
    bool last = t == end;
    if (!last && m.tokens[t].kind == TokenKind::kPunct) {
      char c = m.text[m.tokens[t].begin];
      if (c == '(' || c == '[' || c == '{') depth++;
      if (c == ')' || c == ']' || c == '}') depth--;
    }
    if (last || (depth == 0 && punct(t, ','))) {
      Operand op;
      op.first = start;
      op.last = t;
      if (op.last > op.first) out->operands.push_back(op);
      start = t + 1;
    }
  }
  return true;
}

}  // namespace phos::ptx
