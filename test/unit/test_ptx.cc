#include <catch2/catch.hpp>

#include <string>

#include "phos/ptx/range_table.h"
#include "phos/ptx/reader.h"
#include "phos/ptx/twin.h"

using namespace phos::ptx;

namespace {

const char* kHeader =
    ".version 8.0\n"
    ".target sm_90\n"
    ".address_size 64\n\n";

// A module of one kernel `k` whose body is `body`, with parameters a and b.
std::string kernel(const std::string& body, const std::string& extra = "") {
  return std::string(kHeader) + extra +
         ".visible .entry k(\n"
         "\t.param .u64 k_param_0,\n"
         "\t.param .u32 k_param_1\n"
         ")\n"
         "{\n"
         "\t.reg .pred %p<3>;\n"
         "\t.reg .b32 %r<9>;\n"
         "\t.reg .f32 %f<9>;\n"
         "\t.reg .b64 %rd<9>;\n"
         "\tld.param.u64 %rd1, [k_param_0];\n" +
         body + "\tret;\n}\n";
}

TwinResult twins(const std::string& ptx, TwinOptions options = TwinOptions()) {
  INFO(ptx);
  phos::Result<TwinResult> r = make_twins(ptx, options);
  INFO((r ? std::string() : r.error().message));
  REQUIRE(r.ok());
  return std::move(r).value();
}

// The module read from `text` (which must outlive it); REQUIREs success.
Module module_of(std::string_view text) {
  phos::Result<Module> m = read_module(text);
  INFO((m ? std::string() : m.error().message));
  REQUIRE(m.ok());
  return std::move(m).value();
}

TwinOptions loads_only() {
  TwinOptions o;
  o.stores = false;
  o.loads = true;
  return o;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) n++;
  return n;
}

// The text of the check inserted before the statement containing `stmt`.
std::string check_before(const std::string& ptx, const std::string& stmt) {
  size_t at = ptx.find(stmt);
  REQUIRE(at != std::string::npos);
  size_t begin = ptx.rfind("// phos check", at);
  REQUIRE(begin != std::string::npos);
  return ptx.substr(begin, at - begin);
}

}  // namespace

TEST_CASE("ptx: tokens keep their bytes, comments and white space make none") {
  std::string text = ".version 9.0 // c\n/* a\nb */ st.global.v4.shared::cta.L2::256B [%rd1+-4], {%r1, _};\n"
                     "cp.async.bulk.tensor.1d x; mov.f32 %f1, 0f3F800000; \"s\\\"t\"";
  text.push_back('\0');
  text += "ignored after NUL";
  phos::Result<std::vector<Token>> tokenized = tokenize(text);
  REQUIRE(tokenized.ok());
  const std::vector<Token>& toks = *tokenized;
  std::vector<std::string> s;
  for (const Token& t : toks) s.push_back(text.substr(t.begin, t.end - t.begin));
  std::vector<std::string> want = {".version", "9.0", "st", ".global", ".v4", ".shared::cta", ".L2::256B", "[", "%rd1",
                                   "+", "-", "4", "]", ",", "{", "%r1", ",", "_", "}", ";", "cp", ".async", ".bulk",
                                   ".tensor", ".1d", "x", ";", "mov", ".f32", "%f1", ",", "0f3F800000", ";",
                                   "\"s\\\"t\""};
  CHECK(s == want);
  CHECK(toks[0].line_start);
  CHECK(toks[2].line_start);  // after the block comment's newline
  CHECK_FALSE(toks[3].line_start);
  CHECK(toks[2].kind == TokenKind::kIdentifier);
  CHECK(toks[5].kind == TokenKind::kDirective);
  CHECK(toks[1].kind == TokenKind::kNumber);

  phos::Result<std::vector<Token>> open_comment = tokenize("/* open");
  REQUIRE_FALSE(open_comment.ok());
  CHECK(open_comment.error().message == "line 1: unterminated comment");
  phos::Result<std::vector<Token>> open_string = tokenize("\n\"open");
  REQUIRE_FALSE(open_string.ok());
  CHECK(open_string.error().message == "line 2: unterminated string");
}

TEST_CASE("ptx: a module's directives, variables, functions and sections") {
  std::string text = std::string(kHeader) +
                     ".global .align 4 .u32 counter;\n"
                     ".const .align 4 .b8 table[16] = {1, 2, 3, 4};\n"
                     ".extern .shared .align 16 .b8 dyn[];\n"
                     ".extern .func (.param .b32 r) vprintf (.param .b64 f, .param .b64 a);\n"
                     ".func (.param .b32 r) helper(.param .b64 p) .noreturn;\n"
                     ".visible .entry k(.param .align 8 .b8 s[16], .param .u64 .ptr .global .align 4 p)\n"
                     ".maxntid 128, 1, 1\n"
                     "{\n\t.reg .b32 %r<2>;\n$L0:\n\t{ .reg .pred q;\n\t@q bra $L0; }\n\t.loc 1 2 3\n\tret;\n}\n"
                     ".section .debug_info { .b8 1, 2\n .b64 $L0 }\n";
  Module m = module_of(text);
  CHECK(m.version_major == 8);
  CHECK(m.version_minor == 0);
  CHECK(m.target == "sm_90");
  CHECK(m.address_size == 64);
  REQUIRE(m.variables.size() == 3);
  CHECK(m.variables[0].name == "counter");
  CHECK(m.variables[0].space == Space::kGlobal);
  CHECK(m.variables[1].name == "table");
  CHECK(m.variables[1].space == Space::kConst);
  CHECK(m.variables[2].space == Space::kShared);
  CHECK(m.variables[2].external);
  REQUIRE(m.functions.size() == 3);
  CHECK(m.functions[0].name == "vprintf");
  CHECK(m.functions[0].external);
  CHECK_FALSE(m.functions[0].defined);
  CHECK(m.functions[1].name == "helper");
  CHECK(m.functions[1].params.size() == 1);
  const Function& k = m.functions[2];
  CHECK(k.entry);
  CHECK(k.defined);
  REQUIRE(k.params.size() == 2);
  CHECK(k.params[0].name == "s");
  CHECK(k.params[1].name == "p");
  std::vector<StatementKind> kinds;
  for (const Statement& s : k.statements) kinds.push_back(s.kind);
  using S = StatementKind;
  CHECK(kinds == std::vector<S>{S::kDirective, S::kLabel, S::kOpen, S::kDirective, S::kInstruction, S::kClose,
                                S::kDirective, S::kInstruction});
  CHECK(k.statements[4].depth == 2);
  CHECK(m.items.back().kind == ItemKind::kSection);
  CHECK(m.find_function("k") == 2);
  CHECK(m.find_variable("table") == &m.variables[1]);

  std::string unended = std::string(kHeader) + ".visible .entry k() {\n ret;\n";
  phos::Result<Module> broken = read_module(unended);
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.error().message.find("the body of k does not end") != std::string::npos);
  std::string no_semicolon = std::string(kHeader) + ".visible .entry k() {\n ret\n}\n";
  broken = read_module(no_semicolon);
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.error().message.find("statement without ';' in k") != std::string::npos);
}

TEST_CASE("ptx: an instruction's guard, opcode, modifiers and operands") {
  std::string text = kernel("\t@!%p1 st.global.v4.f32 [%rd1+16], {%f1, %f2, %f3, %f4};\n"
                            "\tcall.uni (retval0), f, (param0, param1);\n");
  Module m = module_of(text);
  const Function& f = m.functions[0];
  Instruction in;
  REQUIRE(parse_instruction(m, f.statements[5], &in));
  CHECK(in.guard >= 0);
  CHECK(m.str(static_cast<uint32_t>(in.guard)) == "%p1");
  CHECK(in.guard_negated);
  CHECK(m.str(in.opcode) == "st");
  CHECK(m.span(in.mods_first, in.mods_last) == ".global.v4.f32");
  REQUIRE(in.operands.size() == 2);
  CHECK(m.span(in.operands[0].first, in.operands[0].last) == "[%rd1+16]");
  CHECK(m.span(in.operands[1].first, in.operands[1].last) == "{%f1, %f2, %f3, %f4}");
  REQUIRE(parse_instruction(m, f.statements[6], &in));
  CHECK(in.guard < 0);
  REQUIRE(in.operands.size() == 3);
  CHECK(m.span(in.operands[2].first, in.operands[2].last) == "(param0, param1)");
}

TEST_CASE("ptx twin: a global store gets a check, the table is the last parameter") {
  TwinResult r = twins(kernel("\tst.global.f32 [%rd1], %f1;\n"));
  REQUIRE(r.kernels.size() == 1);
  const TwinKernel& k = r.kernels[0];
  CHECK(k.name == "k");
  CHECK(k.twin_name == "k__phos_twin");
  CHECK(k.params == 2);
  CHECK(k.table_offset == 16);
  CHECK(k.checks == 1);
  CHECK(k.complete);
  CHECK(r.ptx.find(".visible .entry k__phos_twin(") != std::string::npos);
  CHECK(r.ptx.find(".visible .entry k(") == std::string::npos);  // twins only
  CHECK(r.ptx.find("\t.param .u32 k_param_1,\n\t.param .u64 __phos_range_table\n)") != std::string::npos);
  CHECK(r.ptx.find("ld.param.u64 %phos_t, [__phos_range_table];") != std::string::npos);
  std::string check = check_before(r.ptx, "st.global.f32 [%rd1], %f1;");
  CHECK(check.find("mov.b64 %phos_a, %rd1;") != std::string::npos);
  CHECK(check.find("cvta.global.u64 %phos_a, %phos_a;") != std::string::npos);
  CHECK(check.find("isspacep") == std::string::npos);
  CHECK(check.find("add.u64 %phos_e, %phos_a, 4;") != std::string::npos);
  CHECK(check.find("atom.global.add.u64 %phos_s, [%phos_t+8], 1;") != std::string::npos);
  CHECK(check.find("st.global.u64 [%phos_t+24], 0;") != std::string::npos);
  REQUIRE(r.sites.size() == 1);
  CHECK(r.sites[0].ordinal == 0);
  CHECK(r.sites[0].function == "k");
  CHECK(r.sites[0].line == 15);
  CHECK(r.sites[0].instruction == "st.global.f32 [%rd1], %f1;");
  CHECK(r.sites[0].kind == AccessKind::kStore);
  CHECK(r.sites[0].space == Space::kGlobal);
  CHECK(r.sites[0].width == 4);

  // The parameter is checked by reading the output back.
  Module m = module_of(r.ptx);
  REQUIRE(m.functions.size() == 1);
  REQUIRE(m.functions[0].params.size() == 3);
  CHECK(m.functions[0].params[2].name == "__phos_range_table");

  TwinOptions with;
  with.include_original = true;
  TwinResult both = twins(kernel("\tst.global.f32 [%rd1], %f1;\n"), with);
  CHECK(both.ptx.find(".visible .entry k(") < both.ptx.find(".visible .entry k__phos_twin("));
  CHECK(both.ptx.find(".visible .entry k(") != std::string::npos);
  CHECK(count(both.ptx, "st.global.f32 [%rd1], %f1;") == 2);
}

TEST_CASE("ptx twin: a predicated access is checked only when its predicate holds") {
  TwinResult r = twins(kernel("\t@%p1 st.global.f32 [%rd1], %f1;\n\t@!%p2 st.global.f32 [%rd1+4], %f2;\n"));
  std::string first = check_before(r.ptx, "@%p1 st.global.f32");
  CHECK(first.find("@!%p1 bra $phos_0_ok;") == first.find("\n") + 2);
  std::string second = check_before(r.ptx, "@!%p2 st.global.f32");
  CHECK(second.find("@%p2 bra $phos_1_ok;") != std::string::npos);
  CHECK(second.find("add.s64 %phos_a, %phos_a, 4;") != std::string::npos);
  // The access itself is unchanged, right after the check's last label.
  CHECK(r.ptx.find("$phos_0_ok:\n\t@%p1 st.global.f32 [%rd1], %f1;") != std::string::npos);
}

TEST_CASE("ptx twin: the width of vector and sized accesses") {
  TwinResult r = twins(kernel("\tst.global.v2.f32 [%rd1], {%f1, %f2};\n"
                              "\tst.global.v4.f32 [%rd1+-16], {%f1, %f2, %f3, %f4};\n"
                              "\tst.global.v2.u64 [%rd1], {%rd2, %rd3};\n"
                              "\tst.global.u8 [%rd1], %r1;\n"
                              "\tst.global.b128 [%rd1], %rd4;\n"
                              "\tst.global.L1::no_allocate.v8.f32 [%rd1], {%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8};\n"));
  REQUIRE(r.sites.size() == 6);
  CHECK(r.sites[0].width == 8);
  CHECK(r.sites[1].width == 16);
  CHECK(r.sites[2].width == 16);
  CHECK(r.sites[3].width == 1);
  CHECK(r.sites[4].width == 16);
  CHECK(r.sites[5].width == 32);
  CHECK(check_before(r.ptx, "st.global.v4.f32").find("add.s64 %phos_a, %phos_a, -16;") != std::string::npos);
  CHECK(check_before(r.ptx, "st.global.v4.f32").find("add.u64 %phos_e, %phos_a, 16;") != std::string::npos);
}

TEST_CASE("ptx twin: atomics and reductions") {
  std::string body =
      "\tatom.global.add.f32 %f1, [%rd1], %f2;\n"
      "\tatom.cas.b64 %rd2, [%rd1], %rd3, %rd4;\n"
      "\tred.global.add.u64 [%rd1+8], %rd2;\n"
      "\tatom.shared.add.u32 %r1, [%r2], 1;\n"
      "\tred.relaxed.gpu.global.add.noftz.v2.f16x2 [%rd1], {%r1, %r2};\n"
      "\tred.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.add.u32 [%r1], 1, [%r2];\n";
  TwinResult r = twins(kernel(body));
  REQUIRE(r.sites.size() == 4);
  CHECK(r.sites[0].kind == AccessKind::kAtomic);
  CHECK(r.sites[0].width == 4);
  CHECK(r.sites[1].space == Space::kNone);  // generic
  CHECK(r.sites[1].width == 8);
  CHECK(r.sites[2].width == 8);
  CHECK(r.sites[3].width == 8);
  CHECK(check_before(r.ptx, "atom.cas.b64").find("isspacep.global %phos_p, %phos_a;") != std::string::npos);
  // Atomics read too: a loads twin checks them as well.
  TwinResult l = twins(kernel(body), loads_only());
  CHECK(l.sites.size() == 4);
}

TEST_CASE("ptx twin: generic accesses pass unless isspacep.global; other spaces are not checked") {
  TwinResult r = twins(kernel("\tst.f32 [%rd1], %f1;\n"
                              "\tst.shared.f32 [%r1], %f1;\n"
                              "\tst.local.f32 [%rd2], %f1;\n"
                              "\tst.param.b32 [k_param_1], %r1;\n"
                              "\tst.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%r1], %r2, [%r3];\n"));
  REQUIRE(r.sites.size() == 1);
  CHECK(r.sites[0].space == Space::kNone);
  std::string check = check_before(r.ptx, "st.f32 [%rd1]");
  CHECK(check.find("isspacep.global %phos_p, %phos_a;\n\t@!%phos_p bra $phos_0_ok;") != std::string::npos);
  CHECK(check.find("cvta.global") == std::string::npos);
}

TEST_CASE("ptx twin: loads mode checks loads, not stores") {
  std::string body =
      "\tld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];\n"
      "\tld.f32 %f5, [%rd2+4];\n"
      "\tld.param.u32 %r1, [k_param_1];\n"
      "\tld.shared.f32 %f6, [%r2];\n"
      "\tldu.global.u32 %r3, [%rd1];\n"
      "\tst.global.f32 [%rd1], %f1;\n";
  TwinResult l = twins(kernel(body), loads_only());
  REQUIRE(l.sites.size() == 3);
  CHECK(l.sites[0].kind == AccessKind::kLoad);
  CHECK(l.sites[0].width == 16);
  CHECK(l.sites[1].space == Space::kNone);
  CHECK(l.sites[2].width == 4);
  CHECK(l.ptx.find("// phos check", l.ptx.find("ldu.global")) == std::string::npos);  // the store is not
  TwinResult s = twins(kernel(body));
  REQUIRE(s.sites.size() == 1);
  CHECK(s.sites[0].kind == AccessKind::kStore);
  TwinOptions both;
  both.loads = true;
  CHECK(twins(kernel(body), both).sites.size() == 4);
}

TEST_CASE("ptx twin: what it does not instrument it copies byte for byte") {
  std::string body =
      "\t.loc 1 7 3 // a comment\n"
      "\tmul.wide.s32   %rd2, %r1,  4; /* odd   spacing */\n"
      "$L__BB0_1:\n"
      "\t{ .reg .b32 inner; mov.b32 inner, 1; }\n"
      "\tbar.sync 0;\n"
      "\tshfl.sync.bfly.b32 %r2, %r1, 1, 31, -1;\n";
  std::string in = kernel(body);
  TwinResult r = twins(in);
  CHECK(r.kernels[0].checks == 0);
  CHECK(r.kernels[0].complete);
  size_t from = in.find("\t.loc 1 7 3");
  std::string tail = in.substr(from);
  CHECK(r.ptx.find(tail) != std::string::npos);
  CHECK(r.ptx.substr(0, in.find(".visible")) == in.substr(0, in.find(".visible")));

  // An opcode it does not know is copied too, but makes the twin incomplete.
  TwinResult u = twins(kernel("\tfrobnicate.global.b32 [%rd1], %r1;\n"));
  CHECK_FALSE(u.kernels[0].complete);
  CHECK(u.kernels[0].reason == "unknown instruction frobnicate");
  CHECK(u.ptx.find("\tfrobnicate.global.b32 [%rd1], %r1;\n") != std::string::npos);
}

TEST_CASE("ptx twin: new names never clash with the module's") {
  std::string body = "\t.reg .b64 %phos_a;\n\tmov.b64 %phos_a, %rd1;\n\tst.global.f32 [%phos_a], %f1;\n";
  TwinResult r = twins(kernel(body));
  CHECK(r.ptx.find("%phos1_t") != std::string::npos);
  CHECK(r.ptx.find("$phos1_0_ok:") != std::string::npos);
  CHECK(r.ptx.find("__phos1_range_table") != std::string::npos);
  CHECK(check_before(r.ptx, "st.global.f32 [%phos_a]").find("mov.b64 %phos1_a, %phos_a;") != std::string::npos);

  // A symbol already named like a twin is refused.
  std::string clash = kernel("", ".global .u32 k__phos_twin;\n");
  phos::Result<TwinResult> refused = make_twins(clash, TwinOptions());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "the module already has a symbol named k__phos_twin");
  TwinOptions other;
  other.suffix = "_v";
  CHECK(twins(clash, other).kernels[0].twin_name == "k_v");
}

TEST_CASE("ptx twin: kernels without parameters and the table's offset") {
  std::string text = std::string(kHeader) +
                     ".visible .entry none()\n{\n\tret;\n}\n"
                     ".visible .entry bare\n{\n\tret;\n}\n"
                     ".visible .entry mixed(.param .u32 a, .param .align 8 .b8 s[12], .param .u16 c)\n{\n\tret;\n}\n";
  TwinResult r = twins(text);
  REQUIRE(r.kernels.size() == 3);
  CHECK(r.ptx.find(".entry none__phos_twin(.param .u64 __phos_range_table)") != std::string::npos);
  CHECK(r.ptx.find(".entry bare__phos_twin(.param .u64 __phos_range_table)") != std::string::npos);
  CHECK(r.kernels[0].params == 0);
  CHECK(r.kernels[0].table_offset == 0);
  CHECK(r.kernels[2].params == 3);
  CHECK(r.kernels[2].table_offset == 24);  // 4, pad to 8, 12 -> 20, 2 -> 22, round to 8
}

TEST_CASE("ptx twin: a kernel calling device functions calls their twins with the table") {
  std::string text = std::string(kHeader) +
                     ".func (.param .b32 r) put(.param .b64 p, .param .b32 v);\n"
                     ".func tick()\n{\n\t.reg .b64 %rd<2>;\n\tmov.u64 %rd1, counter;\n"
                     "\tred.global.add.u32 [%rd1], 1;\n\tret;\n}\n"
                     ".global .align 4 .u32 counter;\n"
                     ".visible .entry k(.param .u64 k_p)\n{\n\t.reg .b64 %rd<3>;\n\t.reg .b32 %r<3>;\n"
                     "\tld.param.u64 %rd1, [k_p];\n"
                     "\t{\n\t.param .b64 param0;\n\tst.param.b64 [param0], %rd1;\n\t.param .b32 param1;\n"
                     "\tst.param.b32 [param1], %r1;\n\t.param .b32 retval0;\n"
                     "\tcall.uni (retval0), \n\tput, \n\t(\n\tparam0, \n\tparam1\n\t);\n"
                     "\tld.param.b32 %r2, [retval0];\n\t}\n"
                     "\tcall.uni tick, ();\n"
                     "\tcall.uni tick;\n"
                     "\tret;\n}\n"
                     ".func (.param .b32 r) put(.param .b64 p, .param .b32 v)\n{\n\t.reg .b64 %rd<3>;\n"
                     "\t.reg .b32 %r<3>;\n\tld.param.u64 %rd1, [p];\n\tld.param.b32 %r1, [v];\n"
                     "\tst.b32 [%rd1], %r1;\n\tst.param.b32 [r], %r1;\n\tret;\n}\n";
  TwinResult r = twins(text);
  REQUIRE(r.kernels.size() == 1);
  const TwinKernel& k = r.kernels[0];
  CHECK(k.complete);
  CHECK(k.checks == 2);  // tick's red, put's st
  CHECK(k.functions == std::vector<std::string>{"put", "tick"});
  CHECK(k.module_variables == std::vector<std::string>{"counter"});
  // Declaration and definition of the twin function, with the extra parameter.
  CHECK(count(r.ptx, ".func (.param .b32 r) put__phos_twin(.param .b64 p, .param .b32 v,\n\t.param .b64 __phos_range_table)") ==
        2);
  CHECK(r.ptx.find(".func tick__phos_twin(.param .b64 __phos_range_table)") != std::string::npos);
  CHECK(r.ptx.find("ld.param.b64 %phos_t, [__phos_range_table];") != std::string::npos);
  // The call sites pass the table.
  CHECK(r.ptx.find(".param .b64 __phos_arg0;\n\tst.param.b64 [__phos_arg0], %phos_t;\n\tcall.uni (retval0), \n\t"
                   "put__phos_twin, \n\t(\n\tparam0, \n\tparam1, __phos_arg0\n\t);") != std::string::npos);
  CHECK(r.ptx.find("call.uni tick__phos_twin, (__phos_arg1);") != std::string::npos);
  CHECK(r.ptx.find("call.uni tick__phos_twin, (__phos_arg2);") != std::string::npos);
  // No original left in a twins-only module.
  CHECK(r.ptx.find(" put(") == std::string::npos);
  CHECK(r.ptx.find("tick()") == std::string::npos);
  // Sites are numbered in text order across functions.
  REQUIRE(r.sites.size() == 2);
  CHECK(r.sites[0].function == "tick");
  CHECK(r.sites[1].function == "put");
  CHECK(r.sites[1].ordinal == 1);
}

TEST_CASE("ptx twin: calls the twin cannot follow make it incomplete") {
  std::string decls = ".extern .func (.param .b32 r) vprintf(.param .b64 f, .param .b64 a);\n"
                      ".extern .func other(.param .b64 p);\n"
                      ".func target(.param .b64 p)\n{\n\tret;\n}\n";
  TwinResult ok = twins(kernel("\t{\n\t.param .b64 param0;\n\t.param .b64 param1;\n\t.param .b32 retval0;\n"
                               "\tcall.uni (retval0), vprintf, (param0, param1);\n\t}\n",
                               decls));
  CHECK(ok.kernels[0].complete);
  TwinResult ext = twins(kernel("\t{\n\t.param .b64 param0;\n\tcall.uni other, (param0);\n\t}\n", decls));
  CHECK_FALSE(ext.kernels[0].complete);
  CHECK(ext.kernels[0].reason == "call to external function other");
  TwinResult ind = twins(kernel("\tmov.u64 %rd2, target;\n\t{\n\t.param .b64 param0;\n"
                                "\tprototype_0 : .callprototype ()_ (.param .b64 _);\n"
                                "\tcall %rd2, (param0), prototype_0;\n\t}\n",
                                decls));
  CHECK_FALSE(ind.kernels[0].complete);
  CHECK(ind.kernels[0].reason == "indirect call through %rd2");
  // The function whose address is taken stays, as it is, next to its twin.
  CHECK(ind.ptx.find(".func target(.param .b64 p)") != std::string::npos);
  CHECK(ind.ptx.find(".func target__phos_twin(.param .b64 p,") != std::string::npos);
  CHECK(ind.ptx.find("mov.u64 %rd2, target;") != std::string::npos);
}

TEST_CASE("ptx twin: a function's incompleteness reaches the kernels that call it") {
  std::string text = std::string(kHeader) +
                     ".func leaf(.param .b64 p)\n{\n\t.reg .b64 %rd<2>;\n\tld.param.u64 %rd1, [p];\n"
                     "\tsust.b.1d.b32.trap [%rd1, {0}], {0};\n\tret;\n}\n"
                     ".visible .entry k()\n{\n\t.param .b64 a;\n\tcall.uni leaf, (a);\n\tret;\n}\n";
  TwinResult r = twins(text);
  CHECK_FALSE(r.kernels[0].complete);
  CHECK(r.kernels[0].reason == "leaf: sust (surface store) is not checked");
  // A loads twin does not care about the surface store.
  CHECK(twins(text, loads_only()).kernels[0].complete);
}

TEST_CASE("ptx twin: addresses of variables, and what a twin's code names") {
  std::string extra = ".global .align 8 .b8 gbuf[64];\n.shared .align 4 .b8 sbuf[64];\n"
                      ".const .align 4 .b8 cbuf[64];\n";
  TwinResult r = twins(kernel("\tst.global.u32 [gbuf+8], %r1;\n"
                              "\tst.u32 [sbuf], %r1;\n"
                              "\tld.const.u32 %r2, [cbuf];\n"
                              "\tst.global.u32 [missing], %r1;\n",
                              extra));
  REQUIRE(r.sites.size() == 1);
  std::string check = check_before(r.ptx, "st.global.u32 [gbuf+8]");
  CHECK(check.find("cvta.global.u64 %phos_a, gbuf;\n\tadd.s64 %phos_a, %phos_a, 8;") != std::string::npos);
  CHECK_FALSE(r.kernels[0].complete);
  CHECK(r.kernels[0].reason == "address of unknown symbol missing");
  CHECK(r.kernels[0].module_variables == std::vector<std::string>{"cbuf", "gbuf"});
}

TEST_CASE("ptx twin: asynchronous and bulk copies") {
  std::string body =
      "\tcp.async.ca.shared.global [%r1], [%rd1], 16;\n"
      "\tcp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\n"
      "\tcp.async.ca.shared.global [%r1], [%rd1+4], 4, %p1;\n"
      "\tcp.async.commit_group;\n"
      "\tcp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1], %r3, [%r4];\n"
      "\tcp.async.bulk.global.shared::cta.bulk_group [%rd2], [%r1], %r3;\n"
      "\tcp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%rd2], [%r1], 64;\n"
      "\tcp.async.bulk.prefetch.L2.global [%rd1], 256;\n";
  TwinResult l = twins(kernel(body), loads_only());
  REQUIRE(l.sites.size() == 5);
  CHECK(l.sites[0].width == 16);
  CHECK(l.sites[1].width == 0);  // src-size, a register
  CHECK(check_before(l.ptx, "cp.async.cg").find("cvt.u64.u32 %phos_w, %r2;\n\tsetp.eq.u64 %phos_p, %phos_w, 0;") !=
        std::string::npos);
  CHECK(check_before(l.ptx, "cp.async.ca.shared.global [%r1], [%rd1+4]").find("@%p1 bra $phos_2_ok;") !=
        std::string::npos);  // ignore-src
  CHECK(l.sites[3].kind == AccessKind::kLoad);
  CHECK(l.sites[4].kind == AccessKind::kAtomic);
  TwinResult s = twins(kernel(body));
  REQUIRE(s.sites.size() == 2);
  CHECK(s.sites[0].kind == AccessKind::kStore);
  CHECK(s.sites[0].width == 0);
  CHECK(s.sites[1].width == 64);
  CHECK(s.kernels[0].complete);

  TwinResult t = twins(kernel("\tcp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r1, %r2}], [%r3];\n"));
  CHECK_FALSE(t.kernels[0].complete);
  CHECK(t.kernels[0].reason == "cp.async.bulk.tensor to global memory is not checked");
  CHECK(twins(kernel("\tcp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd1, {%r1, %r2}], [%r3];\n"),
              loads_only())
            .kernels[0]
            .complete);
}

TEST_CASE("ptx twin: refusals") {
  phos::Result<TwinResult> refused = make_twins(".version 8.0\n.target sm_90\n.address_size 32\n", TwinOptions());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "only .address_size 64 is supported");
  refused = make_twins(".version 8.0\n.entry k( {\n", TwinOptions());
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message == "line 2: declaration without ';' or body");
  // No kernels: the module comes back as it was.
  std::string plain = std::string(kHeader) + ".global .u32 x;\n";
  TwinResult r = twins(plain);
  CHECK(r.kernels.empty());
  CHECK(r.ptx == plain);
  // A NUL ends the text, as cuModuleLoadData reads it.
  std::string with_nul = kernel("\tst.global.f32 [%rd1], %f1;\n");
  with_nul.push_back('\0');
  with_nul += "garbage {";
  r = twins(with_nul);
  CHECK(r.ptx.find("garbage") == std::string::npos);
  CHECK(r.sites.size() == 1);
}

TEST_CASE("ptx range table: sorted, merged, built from a launch's access set") {
  std::vector<std::pair<uint64_t, uint64_t>> ranges = {{300, 400}, {100, 200}, {200, 250}, {50, 50}, {350, 380}};
  std::vector<uint64_t> words;
  build_range_table(ranges, &words);
  CHECK(words == std::vector<uint64_t>{2, 0, 0, 0, 100, 250, 300, 400});
  CHECK(range_table_bytes(2) == words.size() * 8);

  phos::speculation::BufferIndex index;
  REQUIRE(index.insert(0x1000, 0x100, 1));
  REQUIRE(index.insert(0x1100, 0x100, 2));
  REQUIRE(index.insert(0x3000, 0x100, 3));
  phos::speculation::AccessSet set;
  set.reset(phos::speculation::SetKind::kSpeculated);
  phos::speculation::Buffer b;
  REQUIRE(index.find(0x1000, &b));
  set.add(b, phos::speculation::kRead | phos::speculation::kWrite);
  REQUIRE(index.find(0x1100, &b));
  set.add(b, phos::speculation::kWrite);
  REQUIRE(index.find(0x3000, &b));
  set.add(b, phos::speculation::kRead);
  REQUIRE(build_range_table(set, index, phos::speculation::kWrite, &words));
  CHECK(words == std::vector<uint64_t>{1, 0, 0, 0, 0x1000, 0x1200});
  REQUIRE(build_range_table(set, index, phos::speculation::kRead, &words));
  CHECK(words == std::vector<uint64_t>{2, 0, 0, 0, 0x1000, 0x1100, 0x3000, 0x3100});
  set.reset(phos::speculation::SetKind::kUnknown);
  CHECK_FALSE(build_range_table(set, index, phos::speculation::kWrite, &words));

  std::vector<uint64_t> table = {1, 3, 0xdead, 7, 0, 1};
  Violations v = read_violations(table);
  CHECK(v.count == 3);
  CHECK(v.first_address == 0xdead);
  CHECK(v.first_instruction == 7);
  CHECK(read_violations(std::vector<uint64_t>{1, 2}).count == 0);
}

TEST_CASE("ptx twin: old-style .reg parameters, and the originals kept beside the twins") {
  std::string text = std::string(kHeader) +
                     ".func (.reg .b32 %out) twice (.reg .b64 %ptr, .reg .b32 %v)\n{\n\t.reg .b32 %t;\n"
                     "\tadd.s32 %t, %v, %v;\n\tst.u32 [%ptr], %t;\n\tmov.b32 %out, %t;\n\tret;\n}\n"
                     ".visible .entry k(.param .u64 p)\n{\n\t.reg .b64 %rd<2>;\n\t.reg .b32 %r<3>;\n"
                     "\tld.param.u64 %rd1, [p];\n\tcall.uni (%r2), twice, (%rd1, %r1);\n\tret;\n}\n";
  TwinResult r = twins(text);
  CHECK(r.kernels[0].complete);
  CHECK(r.kernels[0].checks == 1);
  CHECK(r.ptx.find("twice__phos_twin (.reg .b64 %ptr, .reg .b32 %v,\n\t.reg .b64 %phos_tin)") != std::string::npos);
  CHECK(r.ptx.find("mov.b64 %phos_t, %phos_tin;") != std::string::npos);
  CHECK(r.ptx.find("call.uni (%r2), twice__phos_twin, (%rd1, %r1, %phos_t);") != std::string::npos);
  CHECK(r.ptx.find("__phos_arg") == std::string::npos);

  TwinOptions with;
  with.include_original = true;
  TwinResult both = twins(text, with);
  size_t func = text.find(".func");
  std::string original = text.substr(func, text.find("}\n", func) + 2 - func);
  CHECK(both.ptx.find(original) == func);  // the original, untouched, first
  CHECK(both.ptx.find("call.uni (%r2), twice, (%rd1, %r1);") != std::string::npos);
  CHECK(count(both.ptx, ".func (.reg .b32 %out) twice") == 2);
  CHECK(both.sites.size() == 1);
}
