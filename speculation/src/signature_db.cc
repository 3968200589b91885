#include "phos/speculation/signature_db.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace phos::speculation {

namespace {

constexpr uint32_t kPointerSize = 8;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }
bool is_word(char c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// A line without its comment and surrounding blanks.
std::string_view strip(std::string_view line) {
  if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
  while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
  while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
  return line;
}

// Reads one parameter from the front of `s`, consuming it; an error says what is wrong with it.
class ParamParser {
 public:
  explicit ParamParser(std::string_view s) : s_(s) {}

  Result<void> parse(ParamLayout* p, bool* has_offset) {
    std::string_view kind = take_while(is_word);
    if (kind.empty()) return make_error("expected a parameter kind, found '" + rest_word() + "'");
    bool is_struct = false;
    if (kind == "scalar") {
      p->kind = ParamKind::kScalar;
    } else if (kind == "ptr") {
      p->kind = ParamKind::kPointer;
    } else if (kind == "const_ptr") {
      p->kind = ParamKind::kConstPointer;
    } else if (kind == "struct") {
      p->kind = ParamKind::kAggregate;
      p->fields_known = true;
      is_struct = true;
    } else if (kind == "opaque") {
      p->kind = ParamKind::kAggregate;
    } else {
      return make_error("unknown parameter kind '" + std::string(kind) + "'");
    }
    if (!eat(':')) return make_error("expected ':SIZE' after '" + std::string(kind) + "'");
    PHOS_TRY(number(&p->size, "size"));
    if (p->size == 0) return make_error("size 0");
    if ((p->kind == ParamKind::kPointer || p->kind == ParamKind::kConstPointer) &&
        p->size != kPointerSize)
      return make_error("pointer size " + std::to_string(p->size) + " (pointers are 8 bytes)");
    *has_offset = eat('@');
    if (*has_offset) PHOS_TRY(number(&p->offset, "offset"));
    if (!is_struct) {
      if (!s_.empty() && s_.front() == '{')
        return make_error("a field list '{' after " + std::string(kind) + " (only struct has one)");
      return {};
    }
    if (!eat('{')) return make_error("struct without its field list '{...}'");
    if (eat('}')) return {};
    for (;;) {
      if (s_.empty() || is_space(s_.front())) return make_error("unterminated '{'");
      PointerField f;
      PHOS_TRY(number(&f.offset, "field offset"));
      if (!eat(':')) return make_error("expected ':ptr' or ':const_ptr' after field offset");
      std::string_view fk = take_while(is_word);
      if (fk == "const_ptr") {
        f.const_pointee = true;
      } else if (fk != "ptr") {
        return make_error("unknown field kind '" + std::string(fk) + "'");
      }
      if (f.offset > p->size || p->size - f.offset < kPointerSize)
        return make_error("field at " + std::to_string(f.offset) + " does not fit in " +
                             std::to_string(p->size) + " bytes");
      if (!p->pointer_fields.empty() && f.offset < p->pointer_fields.back().offset + kPointerSize)
        return make_error("field at " + std::to_string(f.offset) +
                             " overlaps the previous one (fields are in increasing order)");
      p->pointer_fields.push_back(f);
      if (eat('}')) return {};
      if (s_.empty() || is_space(s_.front())) return make_error("unterminated '{'");
      if (!eat(',')) return make_error("expected ',' or '}' in the field list, found '" + rest_word() + "'");
    }
  }

  std::string_view rest() const { return s_; }

 private:
  template <typename Pred>
  std::string_view take_while(Pred pred) {
    size_t n = 0;
    while (n < s_.size() && pred(s_[n])) n++;
    std::string_view out = s_.substr(0, n);
    s_.remove_prefix(n);
    return out;
  }
  bool eat(char c) {
    if (s_.empty() || s_.front() != c) return false;
    s_.remove_prefix(1);
    return true;
  }
  // What is left of the current parameter, for messages.
  std::string rest_word() const {
    size_t n = 0;
    while (n < s_.size() && !is_space(s_[n])) n++;
    return std::string(s_.substr(0, n));
  }
  Result<void> number(uint32_t* out, const char* what) {
    std::string_view digits = take_while([](char c) { return c >= '0' && c <= '9'; });
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *out);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
      return make_error(std::string("bad ") + what + " '" + std::string(digits) + rest_word() + "'");
    return {};
  }
  std::string_view s_;
};

// The alignment a parameter without @OFF is placed at.
uint32_t default_alignment(uint32_t size) {
  uint32_t a = size & -size;  // the largest power of two dividing size
  return a > 16 ? 16 : a;
}

struct KernelLine {
  std::string name;
  KernelSignature sig;
};

// One kernel line: the name and its parameters.
Result<KernelLine> parse_kernel(std::string_view line) {
  KernelLine k;
  size_t n = 0;
  while (n < line.size() && !is_space(line[n])) n++;
  k.name = std::string(line.substr(0, n));
  if (k.name.find_first_of(":{}@,") != std::string::npos)
    return make_error("expected a kernel name first, found '" + k.name + "'");
  line.remove_prefix(n);
  uint64_t end = 0;  // of the previous parameter
  for (size_t index = 1;; index++) {
    size_t blanks = 0;
    while (blanks < line.size() && is_space(line[blanks])) blanks++;
    line.remove_prefix(blanks);
    if (line.empty()) return k;
    std::string where = "parameter " + std::to_string(index);
    ParamParser pp(line);
    ParamLayout p;
    bool has_offset = false;
    Result<void> parsed = pp.parse(&p, &has_offset);
    if (!parsed) return make_error(where + ": " + parsed.error().message);
    std::string_view rest = pp.rest();
    if (!rest.empty() && !is_space(rest.front())) {
      size_t m = 0;
      while (m < rest.size() && !is_space(rest[m])) m++;
      return make_error(where + ": trailing '" + std::string(rest.substr(0, m)) + "'");
    }
    if (!has_offset) {
      uint64_t a = default_alignment(p.size);
      end = (end + a - 1) / a * a;
      if (end > UINT32_MAX) return make_error(where + ": offset beyond 4 GiB");
      p.offset = static_cast<uint32_t>(end);
    } else if (p.offset < end) {
      return make_error(where + " at offset " + std::to_string(p.offset) +
                        " overlaps the previous one (which ends at " + std::to_string(end) + ")");
    }
    end = uint64_t(p.offset) + p.size;
    k.sig.params.push_back(std::move(p));
    line = rest;
  }
}

}  // namespace

Result<void> SignatureDb::parse(std::string_view text) {
  std::vector<std::pair<std::string, KernelSignature>> found;
  bool header_seen = false;
  size_t line_no = 0;
  while (!text.empty() || line_no == 0) {
    line_no++;
    size_t nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    std::string_view line = strip(raw);
    auto fail = [&](const std::string& why) { return make_error("line " + std::to_string(line_no) + ": " + why); };
    if (line.empty()) {
      if (text.empty() && !header_seen) return fail("no header '" + std::string(kSignatureDbHeader) + "'");
      continue;
    }
    constexpr std::string_view kMagic = "phos-sigdb";
    if (line.substr(0, kMagic.size()) == kMagic &&
        (line.size() == kMagic.size() || is_space(line[kMagic.size()]))) {
      std::string_view version = strip(line.substr(kMagic.size()));
      if (version != kSignatureDbHeader.substr(kMagic.size() + 1))
        return fail("unsupported header '" + std::string(line) + "' (expected '" +
                    std::string(kSignatureDbHeader) + "')");
      header_seen = true;
      continue;
    }
    if (!header_seen)
      return fail("expected the header '" + std::string(kSignatureDbHeader) + "' before '" +
                  std::string(line.substr(0, 40)) + "'");
    Result<KernelLine> kernel = parse_kernel(line);
    if (!kernel) return fail(kernel.error().message);
    found.emplace_back(std::move(kernel->name), std::move(kernel->sig));
  }
  for (auto& [name, sig] : found) kernels_.try_emplace(std::move(name), std::move(sig));
  return {};
}

Result<void> SignatureDb::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_error(path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(path + ": read error", EIO);
  Result<void> parsed = parse(text.str());
  if (!parsed) return make_error(path + ": " + parsed.error().message);
  return {};
}

const KernelSignature* SignatureDb::find(std::string_view mangled_name) const {
  auto it = kernels_.find(mangled_name);
  return it == kernels_.end() ? nullptr : &it->second;
}

std::string format_param(const ParamLayout& p) {
  std::string out;
  switch (p.kind) {
    case ParamKind::kScalar: out = "scalar"; break;
    case ParamKind::kPointer: out = "ptr"; break;
    case ParamKind::kConstPointer: out = "const_ptr"; break;
    case ParamKind::kAggregate: out = p.fields_known ? "struct" : "opaque"; break;
    case ParamKind::kUnknown: out = "opaque"; break;
  }
  out += ':' + std::to_string(p.size) + '@' + std::to_string(p.offset);
  if (p.kind == ParamKind::kAggregate && p.fields_known) {
    out += '{';
    for (size_t i = 0; i < p.pointer_fields.size(); i++) {
      if (i) out += ',';
      out += std::to_string(p.pointer_fields[i].offset);
      out += p.pointer_fields[i].const_pointee ? ":const_ptr" : ":ptr";
    }
    out += '}';
  }
  return out;
}

std::string format_kernel(std::string_view mangled_name, const KernelSignature& sig) {
  std::string out(mangled_name);
  for (const ParamLayout& p : sig.params) out += ' ' + format_param(p);
  return out;
}

}  // namespace phos::speculation
