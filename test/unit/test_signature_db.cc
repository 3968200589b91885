#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "fixtures.h"
#include "phos/speculation/signature_db.h"

using namespace phos::speculation;

namespace {

// Parses `text` into a fresh database; REQUIREs success.
SignatureDb parsed(std::string_view text) {
  SignatureDb db;
  INFO(text);
  phos::Result<void> ok = db.parse(text);
  INFO((ok ? std::string() : ok.error().message));
  REQUIRE(ok.ok());
  return db;
}

// The error for `text`, which must fail.
std::string error_of(std::string_view text) {
  SignatureDb db;
  INFO(text);
  phos::Result<void> failed = db.parse(text);
  REQUIRE_FALSE(failed.ok());
  CHECK(db.size() == 0);
  return failed.error().message;
}

ParamLayout param(ParamKind kind, uint32_t offset, uint32_t size, bool fields_known = false,
                  std::vector<PointerField> fields = {}) {
  ParamLayout p;
  p.kind = kind;
  p.offset = offset;
  p.size = size;
  p.fields_known = fields_known;
  p.pointer_fields = std::move(fields);
  return p;
}

}  // namespace

TEST_CASE("signature db: each parameter kind", "[sigdb]") {
  SignatureDb db = parsed(
      "phos-sigdb 1\n"
      "_Z1kPfPKfi ptr:8@0 const_ptr:8@8 scalar:4@16\n"
      "_Z1s6Buffers struct:24@0{0:const_ptr,8:ptr}\n"
      "_Z1u8MaybePtr opaque:8@0\n"
      "_Z1p5Plain struct:16@0{}\n");
  REQUIRE(db.size() == 4);

  const KernelSignature* k = db.find("_Z1kPfPKfi");
  REQUIRE(k);
  REQUIRE(k->params.size() == 3);
  CHECK(k->params[0] == param(ParamKind::kPointer, 0, 8));
  CHECK(k->params[1] == param(ParamKind::kConstPointer, 8, 8));
  CHECK(k->params[2] == param(ParamKind::kScalar, 16, 4));

  const KernelSignature* s = db.find("_Z1s6Buffers");
  REQUIRE(s);
  REQUIRE(s->params.size() == 1);
  CHECK(s->params[0] == param(ParamKind::kAggregate, 0, 24, true, {{0, true}, {8, false}}));

  const KernelSignature* u = db.find("_Z1u8MaybePtr");
  REQUIRE(u);
  CHECK(u->params[0] == param(ParamKind::kAggregate, 0, 8, false));

  const KernelSignature* p = db.find("_Z1p5Plain");
  REQUIRE(p);
  CHECK(p->params[0] == param(ParamKind::kAggregate, 0, 16, true));

  CHECK(db.find("_Z1k") == nullptr);
  CHECK(db.find("") == nullptr);
}

TEST_CASE("signature db: a kernel without parameters, extern C names", "[sigdb]") {
  SignatureDb db = parsed("phos-sigdb 1\n_Z9no_paramsv\nc_kernel const_ptr:8@0 ptr:8@8 scalar:4@16\n");
  const KernelSignature* k = db.find("_Z9no_paramsv");
  REQUIRE(k);
  CHECK(k->params.empty());
  const KernelSignature* c = db.find(std::string("c_kernel"));
  REQUIRE(c);
  CHECK(c->params.size() == 3);
}

TEST_CASE("signature db: offsets left out follow the previous parameter", "[sigdb]") {
  SignatureDb db = parsed("phos-sigdb 1\nk scalar:1 scalar:2 ptr:8 scalar:4 scalar:16 scalar:12 struct:24@64{}\n");
  const KernelSignature* k = db.find("k");
  REQUIRE(k);
  REQUIRE(k->params.size() == 7);
  CHECK(k->params[0].offset == 0);
  CHECK(k->params[1].offset == 2);
  CHECK(k->params[2].offset == 8);
  CHECK(k->params[3].offset == 16);
  CHECK(k->params[4].offset == 32);
  CHECK(k->params[5].offset == 48);  // 12: aligned to 4
  CHECK(k->params[6].offset == 64);
}

TEST_CASE("signature db: comments, blank lines, repeated headers", "[sigdb]") {
  SignatureDb db = parsed(
      "# written by hand\n"
      "\n"
      "phos-sigdb 1   # version\n"
      "  a ptr:8@0   # trailing comment\n"
      "\t\n"
      "b\tscalar:4@0\t scalar:8@8\r\n"
      "phos-sigdb 1\n"  // a second file concatenated
      "# from the other file\n"
      "c opaque:32@0");  // no final newline
  CHECK(db.size() == 3);
  REQUIRE(db.find("b"));
  CHECK(db.find("b")->params.size() == 2);
  REQUIRE(db.find("c"));
  CHECK(db.find("c")->params[0].size == 32);
}

TEST_CASE("signature db: a kernel seen twice keeps its first signature", "[sigdb]") {
  SignatureDb db = parsed("phos-sigdb 1\nk ptr:8@0\nk const_ptr:8@0\n");
  REQUIRE(db.size() == 1);
  CHECK(db.find("k")->params[0].kind == ParamKind::kPointer);

  REQUIRE(db.parse("phos-sigdb 1\nk scalar:4@0\nj scalar:4@0\n").ok());
  CHECK(db.size() == 2);
  CHECK(db.find("k")->params[0].kind == ParamKind::kPointer);
  CHECK(db.find("j")->params[0].kind == ParamKind::kScalar);
}

TEST_CASE("signature db: nothing from a malformed text is added", "[sigdb]") {
  SignatureDb db = parsed("phos-sigdb 1\nk ptr:8@0\n");
  phos::Result<void> failed = db.parse("phos-sigdb 1\nj ptr:8@0\nk2 pointer:8@0\n");
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message == "line 3: parameter 1: unknown parameter kind 'pointer'");
  CHECK(db.size() == 1);
  CHECK(db.find("j") == nullptr);
  CHECK_FALSE(db.parse("garbage").ok());
  CHECK(db.size() == 1);
}

TEST_CASE("signature db: a bad or missing header", "[sigdb]") {
  CHECK(error_of("") == "line 1: no header 'phos-sigdb 1'");
  CHECK(error_of("# only a comment\n\n") == "line 2: no header 'phos-sigdb 1'");
  CHECK(error_of("k ptr:8@0\n") == "line 1: expected the header 'phos-sigdb 1' before 'k ptr:8@0'");
  CHECK(error_of("# c\nphos-sigdb 2\nk ptr:8@0\n") ==
        "line 2: unsupported header 'phos-sigdb 2' (expected 'phos-sigdb 1')");
  CHECK(error_of("phos-sigdb\n") == "line 1: unsupported header 'phos-sigdb' (expected 'phos-sigdb 1')");
  CHECK(error_of("phos-sigdb 1 x\n") ==
        "line 1: unsupported header 'phos-sigdb 1 x' (expected 'phos-sigdb 1')");
  CHECK(error_of("phos-sigdb 1\nk ptr:8@0\nphos-sigdb 3\n") ==
        "line 3: unsupported header 'phos-sigdb 3' (expected 'phos-sigdb 1')");
}

TEST_CASE("signature db: unknown kinds", "[sigdb]") {
  CHECK(error_of("phos-sigdb 1\nk ptr:8@0 int:4@8\n") == "line 2: parameter 2: unknown parameter kind 'int'");
  CHECK(error_of("phos-sigdb 1\nk :4\n") == "line 2: parameter 1: expected a parameter kind, found ':4'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:pointer}\n") ==
        "line 2: parameter 1: unknown field kind 'pointer'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:scalar}\n") ==
        "line 2: parameter 1: unknown field kind 'scalar'");
  CHECK(error_of("phos-sigdb 1\nk:8 ptr:8@0\n") == "line 2: expected a kernel name first, found 'k:8'");
}

TEST_CASE("signature db: bad numbers", "[sigdb]") {
  CHECK(error_of("phos-sigdb 1\nk scalar:x\n") == "line 2: parameter 1: bad size 'x'");
  CHECK(error_of("phos-sigdb 1\nk scalar:-4\n") == "line 2: parameter 1: bad size '-4'");
  CHECK(error_of("phos-sigdb 1\nk scalar:\n") == "line 2: parameter 1: bad size ''");
  CHECK(error_of("phos-sigdb 1\nk scalar:99999999999\n") == "line 2: parameter 1: bad size '99999999999'");
  CHECK(error_of("phos-sigdb 1\nk scalar:4@\n") == "line 2: parameter 1: bad offset ''");
  CHECK(error_of("phos-sigdb 1\nk scalar:4@0x10\n") == "line 2: parameter 1: trailing 'x10'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{a:ptr}\n") == "line 2: parameter 1: bad field offset 'a:ptr}'");
  CHECK(error_of("phos-sigdb 1\nk scalar\n") == "line 2: parameter 1: expected ':SIZE' after 'scalar'");
  CHECK(error_of("phos-sigdb 1\nk scalar:0\n") == "line 2: parameter 1: size 0");
  CHECK(error_of("phos-sigdb 1\nk ptr:4@0\n") == "line 2: parameter 1: pointer size 4 (pointers are 8 bytes)");
}

TEST_CASE("signature db: field lists", "[sigdb]") {
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:ptr\n") == "line 2: parameter 1: unterminated '{'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{\n") == "line 2: parameter 1: unterminated '{'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:ptr, 8:ptr}\n") == "line 2: parameter 1: unterminated '{'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:ptr,}\n") == "line 2: parameter 1: bad field offset '}'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:ptr;8:ptr}\n") ==
        "line 2: parameter 1: expected ',' or '}' in the field list, found ';8:ptr}'");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0\n") == "line 2: parameter 1: struct without its field list '{...}'");
  CHECK(error_of("phos-sigdb 1\nk opaque:16@0{}\n") ==
        "line 2: parameter 1: a field list '{' after opaque (only struct has one)");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{12:ptr}\n") ==
        "line 2: parameter 1: field at 12 does not fit in 16 bytes");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{8:ptr,0:ptr}\n") ==
        "line 2: parameter 1: field at 0 overlaps the previous one (fields are in increasing order)");
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{0:ptr,4:ptr}\n") ==
        "line 2: parameter 1: field at 4 overlaps the previous one (fields are in increasing order)");
}

TEST_CASE("signature db: trailing junk and overlapping parameters", "[sigdb]") {
  CHECK(error_of("phos-sigdb 1\nk struct:16@0{}x\n") == "line 2: parameter 1: trailing 'x'");
  CHECK(error_of("phos-sigdb 1\nk ptr:8@0,const_ptr:8@8\n") == "line 2: parameter 1: trailing ',const_ptr:8@8'");
  CHECK(error_of("phos-sigdb 1\nk scalar:4@0 ptr:8@0\n") ==
        "line 2: parameter 2 at offset 0 overlaps the previous one (which ends at 4)");
  CHECK(error_of("phos-sigdb 1\n\n\nk ptr:8@8 ptr:8@0\n") ==
        "line 4: parameter 2 at offset 0 overlaps the previous one (which ends at 16)");
}

TEST_CASE("signature db: format_param and parse round trip", "[sigdb]") {
  KernelSignature sig;
  sig.params = {
      param(ParamKind::kScalar, 0, 1),
      param(ParamKind::kScalar, 8, 8),
      param(ParamKind::kPointer, 16, 8),
      param(ParamKind::kConstPointer, 24, 8),
      param(ParamKind::kAggregate, 32, 48, true, {{0, false}, {16, true}, {40, false}}),
      param(ParamKind::kAggregate, 80, 4, true),
      param(ParamKind::kAggregate, 96, 32, false),
  };
  CHECK(format_param(sig.params[0]) == "scalar:1@0");
  CHECK(format_param(sig.params[2]) == "ptr:8@16");
  CHECK(format_param(sig.params[3]) == "const_ptr:8@24");
  CHECK(format_param(sig.params[4]) == "struct:48@32{0:ptr,16:const_ptr,40:ptr}");
  CHECK(format_param(sig.params[5]) == "struct:4@80{}");
  CHECK(format_param(sig.params[6]) == "opaque:32@96");
  CHECK(format_param(param(ParamKind::kUnknown, 8, 16)) == "opaque:16@8");

  std::string line = format_kernel("_Z6kernelv", sig);
  SignatureDb db = parsed(std::string(kSignatureDbHeader) + "\n" + line + "\n");
  const KernelSignature* back = db.find("_Z6kernelv");
  REQUIRE(back);
  CHECK(*back == sig);
  CHECK(format_kernel("_Z6kernelv", *back) == line);
  CHECK(format_kernel("empty", KernelSignature{}) == "empty");
}

TEST_CASE("signature db: load", "[sigdb]") {
  phos::test::TempDir dir;
  std::string path = dir.file("kernels.sigdb");
  std::ofstream(path) << "phos-sigdb 1\nk ptr:8@0\n";
  SignatureDb db;
  REQUIRE(db.load(path).ok());
  CHECK(db.find("k"));

  std::ofstream(dir.file("bad.sigdb")) << "phos-sigdb 1\nk ptr:8@0 bogus\n";
  phos::Result<void> bad = db.load(dir.file("bad.sigdb"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == dir.file("bad.sigdb") + ": line 2: parameter 2: unknown parameter kind 'bogus'");
  phos::Result<void> missing = db.load(dir.file("missing.sigdb"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message == dir.file("missing.sigdb") + ": No such file or directory");
  CHECK(missing.error().code == ENOENT);
}

TEST_CASE("param_kind_name", "[sigdb]") {
  CHECK(std::string(param_kind_name(ParamKind::kUnknown)) == "unknown");
  CHECK(std::string(param_kind_name(ParamKind::kScalar)) == "scalar");
  CHECK(std::string(param_kind_name(ParamKind::kPointer)) == "pointer");
  CHECK(std::string(param_kind_name(ParamKind::kConstPointer)) == "const_pointer");
  CHECK(std::string(param_kind_name(ParamKind::kAggregate)) == "aggregate");
}
