// phos-sigdb: writes the kernel signature database (signature_db.h) of CUDA
// sources. Each input is parsed by Clang as device code only (the kernels'
// names are the device-side ones nvcc puts in the cubin); every __global__
// function defined there, template instantiations included, becomes one line:
// its mangled name and, for each parameter, whether it is a scalar, a pointer
// (to const or not) or a by-value aggregate with the offsets of the pointers
// inside, at the offset clang lays it out at in the argument buffer.
//
//   phos-sigdb [options] FILE.cu... [-- extra clang arguments]
//
// Clang 14 and the CUDA 12/13 headers need a few workarounds, which the tool
// adds itself (see clang_arguments below); -v prints the command line.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <clang/AST/ASTConsumer.h>
#include <clang/AST/ASTContext.h>
#include <clang/AST/Attr.h>
#include <clang/AST/GlobalDecl.h>
#include <clang/AST/Mangle.h>
#include <clang/AST/RecordLayout.h>
#include <clang/AST/RecursiveASTVisitor.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/FrontendAction.h>
#include <clang/Tooling/CompilationDatabase.h>
#include <clang/Tooling/Tooling.h>
#include <llvm/Support/raw_ostream.h>

#include "phos/speculation/signature_db.h"

namespace ps = phos::speculation;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kPointerSize = 8;

// ---------------------------------------------------------------------------
// Parameter layouts from clang's types.
//
// Clang lays out every type as nvcc does but one: the closure of an extended
// __host__ __device__ lambda (one written in host code and passed to a
// kernel, nvcc --extended-lambda) that captures anything carries, on the
// device side, a void* after its captures (nvcc's __nv_hdl_wrapper_t keeps
// the host-side lambda there). Records holding such a closure, directly or
// in a member, are laid out here by the C rules with that pointer added;
// everything else keeps clang's record layout.

// Whether a pointer to `pointee` only reads: the pointee (or an array's
// element) is const, or it is code. `float* const*` counts: the kernel cannot
// write the array of pointers it points to.
bool read_only_pointee(const clang::ASTContext& ctx, clang::QualType pointee) {
  return ctx.getBaseElementType(pointee).isConstQualified() || pointee->isFunctionType();
}

bool is_plain_scalar(clang::QualType c) {
  return c->isArithmeticType() || c->isEnumeralType() || c->isVectorType() ||
         c->isMemberPointerType() || c->isNullPtrType();
}

template <typename A>
bool explicit_attr(const clang::Decl* d) {
  const A* a = d->getAttr<A>();
  return a && !a->isImplicit();
}

// The closure type of an nvcc extended __host__ __device__ lambda with
// captures: declared both __host__ and __device__, in a host or
// host-device function.
bool is_extended_hd_closure(const clang::RecordDecl* rd) {
  const auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(rd);
  if (!cxx || !cxx->isLambda() || cxx->field_empty()) return false;
  const clang::CXXMethodDecl* call = cxx->getLambdaCallOperator();
  if (!call || !explicit_attr<clang::CUDAHostAttr>(call) || !explicit_attr<clang::CUDADeviceAttr>(call))
    return false;
  const auto* enclosing = llvm::dyn_cast<clang::FunctionDecl>(cxx->getDeclContext());
  if (!enclosing || enclosing->hasAttr<clang::CUDAGlobalAttr>()) return false;
  if (const auto* outer = llvm::dyn_cast<clang::CXXMethodDecl>(enclosing); outer && outer->getParent()->isLambda())
    return false;  // nested in another lambda: not an extended lambda
  return !enclosing->hasAttr<clang::CUDADeviceAttr>() || enclosing->hasAttr<clang::CUDAHostAttr>();
}

struct Layout {
  uint64_t size = 0;
  uint64_t align = 1;
  bool fields_known = true;  // false: any word may be a pointer
  std::vector<ps::PointerField> fields;
};

uint64_t align_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

class Layouter {
 public:
  explicit Layouter(const clang::ASTContext& ctx) : ctx_(ctx) {}

  // nullopt when the type cannot be laid out as nvcc would (*why says why).
  std::optional<Layout> layout(clang::QualType t, std::string* why) {
    clang::QualType c = ctx_.getCanonicalType(t);
    if (c->isDependentType() || c->isIncompleteType()) {
      *why = "a dependent or incomplete type";
      return std::nullopt;
    }
    Layout l;
    if (c->isPointerType() || c->isReferenceType()) {  // a reference is passed as a pointer
      l.size = l.align = kPointerSize;
      l.fields.push_back({0, read_only_pointee(ctx_, c->getPointeeType())});
      return l;
    }
    if (!needs_own_layout(c)) {
      l.size = static_cast<uint64_t>(ctx_.getTypeSizeInChars(c).getQuantity());
      l.align = static_cast<uint64_t>(ctx_.getTypeAlignInChars(c).getQuantity());
      if (l.align == 0) l.align = 1;
      l.fields_known = pointers_by_clang(c, 0, &l.fields);
      return l;
    }
    if (const auto* array = ctx_.getAsConstantArrayType(c)) {
      std::optional<Layout> e = layout(array->getElementType(), why);
      if (!e) return std::nullopt;
      uint64_t n = array->getSize().getZExtValue();
      l.size = e->size * n;
      l.align = e->align;
      l.fields_known = e->fields_known;
      for (uint64_t i = 0; i < n && l.fields_known; i++)
        for (const ps::PointerField& f : e->fields)
          l.fields.push_back({static_cast<uint32_t>(i * e->size + f.offset), f.const_pointee});
      return l;
    }
    return own_record_layout(c->getAsRecordDecl()->getDefinition(), why);
  }

 private:
  // Whether a value of type c holds an extended host-device closure.
  bool needs_own_layout(clang::QualType c) {
    c = ctx_.getCanonicalType(ctx_.getBaseElementType(c));
    const clang::RecordDecl* rd = c->getAsRecordDecl();
    if (!rd || !(rd = rd->getDefinition())) return false;
    auto [it, inserted] = own_.try_emplace(rd, false);
    if (!inserted) return it->second;
    bool own = is_extended_hd_closure(rd);
    if (const auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(rd))
      for (const clang::CXXBaseSpecifier& b : cxx->bases()) own = own || needs_own_layout(b.getType());
    for (const clang::FieldDecl* f : rd->fields()) own = own || needs_own_layout(f->getType());
    own_[rd] = own;
    return own;
  }

  // Appends to `out` the pointers inside a value of type `t` lying at `base`
  // bytes from the parameter's start, by clang's layout. false when they
  // cannot be known: a union holding a pointer, a virtual base or table.
  bool pointers_by_clang(clang::QualType t, uint64_t base, std::vector<ps::PointerField>* out) {
    clang::QualType c = ctx_.getCanonicalType(t);
    if (c->isPointerType() || c->isReferenceType()) {
      out->push_back({static_cast<uint32_t>(base), read_only_pointee(ctx_, c->getPointeeType())});
      return true;
    }
    if (is_plain_scalar(c)) return true;
    if (const auto* array = ctx_.getAsConstantArrayType(c)) {
      clang::QualType element = array->getElementType();
      std::vector<ps::PointerField> first;
      if (!pointers_by_clang(element, 0, &first)) return false;
      if (first.empty()) return true;  // no pointer in any element
      uint64_t stride = static_cast<uint64_t>(ctx_.getTypeSizeInChars(element).getQuantity());
      uint64_t n = array->getSize().getZExtValue();
      for (uint64_t i = 0; i < n; i++)
        for (const ps::PointerField& f : first)
          out->push_back({static_cast<uint32_t>(base + i * stride + f.offset), f.const_pointee});
      return true;
    }
    if (c->isIncompleteArrayType()) return true;  // a flexible array member: not passed
    const clang::RecordDecl* rd = c->getAsRecordDecl();
    if (!rd || !(rd = rd->getDefinition()) || rd->isInvalidDecl()) return false;
    if (rd->isUnion()) {
      // A union's members overlap: one holding a pointer makes its words
      // pointers or not depending on which member is live.
      for (const clang::FieldDecl* f : rd->fields()) {
        std::vector<ps::PointerField> inside;
        if (!pointers_by_clang(f->getType(), 0, &inside) || !inside.empty()) return false;
      }
      return true;
    }
    const clang::ASTRecordLayout& rl = ctx_.getASTRecordLayout(rd);
    if (const auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(rd)) {
      if (cxx->getNumVBases() > 0 || cxx->isDynamicClass()) return false;
      for (const clang::CXXBaseSpecifier& b : cxx->bases()) {
        const clang::CXXRecordDecl* bd = b.getType()->getAsCXXRecordDecl();
        if (!bd) return false;
        uint64_t off = static_cast<uint64_t>(rl.getBaseClassOffset(bd).getQuantity());
        if (!pointers_by_clang(b.getType(), base + off, out)) return false;
      }
    }
    for (const clang::FieldDecl* f : rd->fields()) {
      if (f->isBitField()) continue;  // integral
      uint64_t off = static_cast<uint64_t>(
          ctx_.toCharUnitsFromBits(static_cast<int64_t>(rl.getFieldOffset(f->getFieldIndex()))).getQuantity());
      if (!pointers_by_clang(f->getType(), base + off, out)) return false;
    }
    return true;
  }

  // A record holding an extended host-device closure, by the C rules: bases
  // then fields, each at its alignment, the closure's void* after its
  // captures. Unions, bit-fields, virtual or empty bases and packing are
  // not attempted.
  std::optional<Layout> own_record_layout(const clang::RecordDecl* rd, std::string* why) {
    Layout l;
    uint64_t end = 0;
    auto place = [&](const Layout& m) {
      uint64_t off = align_to(end, m.align);
      l.align = std::max(l.align, m.align);
      l.fields_known = l.fields_known && m.fields_known;
      for (const ps::PointerField& f : m.fields) l.fields.push_back({static_cast<uint32_t>(off + f.offset), f.const_pointee});
      end = off + m.size;
    };
    std::string name = rd->getQualifiedNameAsString();
    if (rd->isUnion() || rd->hasAttr<clang::PackedAttr>() || rd->hasAttr<clang::MaxFieldAlignmentAttr>()) {
      *why = "a union or packed record holding a host-device lambda: " + name;
      return std::nullopt;
    }
    if (const auto* cxx = llvm::dyn_cast<clang::CXXRecordDecl>(rd)) {
      if (cxx->getNumVBases() > 0 || cxx->isDynamicClass()) {
        *why = "a polymorphic record holding a host-device lambda: " + name;
        return std::nullopt;
      }
      for (const clang::CXXBaseSpecifier& b : cxx->bases()) {
        const clang::CXXRecordDecl* bd = b.getType()->getAsCXXRecordDecl();
        if (!bd || bd->isEmpty()) {
          *why = "an empty base in a record holding a host-device lambda: " + name;
          return std::nullopt;
        }
        std::optional<Layout> m = layout(b.getType(), why);
        if (!m) return std::nullopt;
        place(*m);
      }
    }
    for (const clang::FieldDecl* f : rd->fields()) {
      if (f->isBitField() || f->hasAttr<clang::NoUniqueAddressAttr>() || f->hasAttr<clang::AlignedAttr>()) {
        *why = "a bit-field or attribute in a record holding a host-device lambda: " + name;
        return std::nullopt;
      }
      std::optional<Layout> m = layout(f->getType(), why);
      if (!m) return std::nullopt;
      place(*m);
    }
    if (is_extended_hd_closure(rd)) {
      Layout host_lambda;  // a host pointer: not one the kernel can follow
      host_lambda.size = host_lambda.align = kPointerSize;
      place(host_lambda);
    }
    l.align = std::max<uint64_t>(l.align, ctx_.getTypeAlignInChars(rd->getTypeForDecl()).getQuantity());
    l.size = align_to(std::max<uint64_t>(end, 1), l.align);
    return l;
  }

  const clang::ASTContext& ctx_;
  std::unordered_map<const clang::RecordDecl*, bool> own_;
};

// One parameter's layout, offset aside; *align: its alignment.
std::optional<ps::ParamLayout> classify(Layouter& layouter, const clang::ASTContext& ctx, clang::QualType t,
                                        uint32_t* align, std::string* why) {
  std::optional<Layout> l = layouter.layout(t, why);
  if (!l) return std::nullopt;
  if (l->size > UINT32_MAX) {
    *why = "a parameter of 4 GiB or more";
    return std::nullopt;
  }
  clang::QualType c = ctx.getCanonicalType(t);
  ps::ParamLayout p;
  p.size = static_cast<uint32_t>(l->size);
  *align = static_cast<uint32_t>(l->align);
  if (c->isPointerType() || c->isReferenceType()) {
    p.kind = l->fields[0].const_pointee ? ps::ParamKind::kConstPointer : ps::ParamKind::kPointer;
  } else if (is_plain_scalar(c)) {
    p.kind = ps::ParamKind::kScalar;
  } else {
    // An aggregate (struct, class, closure, union) or something unforeseen:
    // opaque unless every pointer inside is known.
    p.kind = ps::ParamKind::kAggregate;
    std::vector<ps::PointerField> fields = std::move(l->fields);
    std::sort(fields.begin(), fields.end(),
              [](const ps::PointerField& a, const ps::PointerField& b) { return a.offset < b.offset; });
    bool fits = l->fields_known;  // packed structs may overlap their words; the file cannot say that
    for (size_t i = 0; i < fields.size(); i++)
      fits = fits && fields[i].offset + kPointerSize <= p.size &&
             (i == 0 || fields[i].offset >= fields[i - 1].offset + kPointerSize);
    if (fits) {
      p.fields_known = true;
      p.pointer_fields = std::move(fields);
    }
  }
  return p;
}

// ---------------------------------------------------------------------------
// The kernels of one translation unit.

struct Kernel {
  std::string name;
  ps::KernelSignature sig;
};

// The name nvcc gives the kernel in the cubin: Itanium's, as clang mangles
// it, but for internal linkage (static), which nvcc does not mark with the
// 'L' clang puts before the function's own name.
std::string device_name(clang::MangleContext& mangler, const clang::FunctionDecl* fd) {
  if (const auto* label = fd->getAttr<clang::AsmLabelAttr>()) return label->getLabel().str();
  if (!mangler.shouldMangleDeclName(fd)) return fd->getName().str();  // extern "C"
  std::string name;
  llvm::raw_string_ostream os(name);
  mangler.mangleName(clang::GlobalDecl(fd), os);
  os.flush();
  if (fd->getFormalLinkage() == clang::InternalLinkage) {
    std::string prefix;  // _Z, or _ZN and the enclosing namespaces
    for (const clang::DeclContext* dc = fd->getDeclContext(); !dc->isTranslationUnit(); dc = dc->getParent()) {
      if (dc->isTransparentContext() || llvm::isa<clang::LinkageSpecDecl>(dc)) continue;
      const auto* ns = llvm::dyn_cast<clang::NamespaceDecl>(dc);
      if (!ns || ns->isAnonymousNamespace()) return name;
      prefix.insert(0, std::to_string(ns->getName().size()) + ns->getName().str());
    }
    prefix.insert(0, prefix.empty() ? "_Z" : "_ZN");
    if (name.compare(0, prefix.size(), prefix) == 0 && name.compare(prefix.size(), 1, "L") == 0)
      name.erase(prefix.size(), 1);
  }
  return name;
}

class KernelVisitor : public clang::RecursiveASTVisitor<KernelVisitor> {
 public:
  KernelVisitor(clang::ASTContext& ctx, std::vector<Kernel>* out)
      : ctx_(ctx), layouter_(ctx), mangler_(ctx.createMangleContext()), out_(out) {}

  bool shouldVisitTemplateInstantiations() const { return true; }

  bool VisitFunctionDecl(clang::FunctionDecl* fd) {
    if (!fd->hasAttr<clang::CUDAGlobalAttr>() || fd->isDependentContext() || fd->isInvalidDecl())
      return true;
    // Only kernels this file defines (or instantiates): a declaration alone
    // is some other file's kernel, and an uninstantiated template is none.
    const clang::FunctionDecl* def = nullptr;
    if (!fd->isDefined(def) || def != fd) return true;
    std::string name = device_name(*mangler_, fd);
    if (!seen_.insert(name).second) return true;
    if (name.find("_GLOBAL__N_") != std::string::npos) {
      // nvcc names what is in an anonymous namespace after a hash of the
      // file, which the cubin alone knows.
      std::fprintf(stderr, "phos-sigdb: warning: %s left out: nvcc names anonymous namespaces per file\n",
                   name.c_str());
      return true;
    }
    Kernel k{std::move(name), {}};
    uint64_t end = 0;
    for (const clang::ParmVarDecl* parm : fd->parameters()) {
      uint32_t align = 1;
      std::string why;
      std::optional<ps::ParamLayout> p = classify(layouter_, ctx_, parm->getType(), &align, &why);
      if (!p) {
        // Better no line than a wrong one: phos then relies on the driver.
        std::fprintf(stderr, "phos-sigdb: warning: %s left out: parameter %u is %s\n", k.name.c_str(),
                     parm->getFunctionScopeIndex() + 1, why.c_str());
        return true;
      }
      end = align_to(end, align);
      p->offset = static_cast<uint32_t>(end);
      end += p->size;
      k.sig.params.push_back(std::move(*p));
    }
    out_->push_back(std::move(k));
    return true;
  }

 private:
  clang::ASTContext& ctx_;
  Layouter layouter_;
  std::unique_ptr<clang::MangleContext> mangler_;
  std::vector<Kernel>* out_;
  std::set<std::string> seen_;
};

class KernelConsumer : public clang::ASTConsumer {
 public:
  explicit KernelConsumer(std::vector<Kernel>* out) : out_(out) {}
  void HandleTranslationUnit(clang::ASTContext& ctx) override {
    if (ctx.getDiagnostics().hasErrorOccurred()) return;  // the run fails anyway
    KernelVisitor(ctx, out_).TraverseDecl(ctx.getTranslationUnitDecl());
  }

 private:
  std::vector<Kernel>* out_;
};

class KernelAction : public clang::ASTFrontendAction {
 public:
  explicit KernelAction(std::vector<Kernel>* out) : out_(out) {}
  std::unique_ptr<clang::ASTConsumer> CreateASTConsumer(clang::CompilerInstance&, llvm::StringRef) override {
    return std::make_unique<KernelConsumer>(out_);
  }

 private:
  std::vector<Kernel>* out_;
};

class KernelActionFactory : public clang::tooling::FrontendActionFactory {
 public:
  explicit KernelActionFactory(std::vector<Kernel>* out) : out_(out) {}
  std::unique_ptr<clang::FrontendAction> create() override { return std::make_unique<KernelAction>(out_); }

 private:
  std::vector<Kernel>* out_;
};

// ---------------------------------------------------------------------------
// The command line.

struct Options {
  std::string output;  // empty: stdout
  std::string cuda_path = PHOS_SIGDB_CUDA_PATH;
  std::string arch = "sm_70";
  std::string resource_dir = PHOS_SIGDB_RESOURCE_DIR;
  std::string include_dir;  // the compatibility headers; empty: found next to the tool
  bool verbose = false;
  std::vector<std::string> files;
  std::vector<std::string> extra;  // after --
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: phos-sigdb [options] FILE.cu... [-- extra clang arguments]\n"
               "Writes the kernel signature database of CUDA sources (one line a __global__\n"
               "function: its device-side mangled name and its parameters' layouts).\n"
               "  -o FILE               write to FILE instead of stdout\n"
               "  --cuda-path=DIR       the CUDA toolkit (default %s)\n"
               "  --arch=sm_XX          the GPU arch the device code is parsed for (default sm_70;\n"
               "                        clang 14 knows up to sm_86; it only picks #if __CUDA_ARCH__ branches)\n"
               "  --resource-dir=DIR    clang's resource directory (default %s)\n"
               "  --include-dir=DIR     the compatibility headers (default: installed with the tool)\n"
               "  -v                    print the clang command line\n"
               "  -h, --help            this text\n"
               "  --version             the version\n",
               PHOS_SIGDB_CUDA_PATH, PHOS_SIGDB_RESOURCE_DIR);
}

std::optional<std::string> value_of(const std::string& arg, const char* name) {
  std::string prefix = std::string(name) + "=";
  if (arg.compare(0, prefix.size(), prefix) == 0) return arg.substr(prefix.size());
  return std::nullopt;
}

// 0: parsed; otherwise the exit status.
int parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--") {
      o->extra.assign(argv + i + 1, argv + argc);
      break;
    }
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return -1;
    }
    if (a == "--version") {
      std::printf("phos-sigdb %s (%s)\n", PHOS_VERSION, std::string(ps::kSignatureDbHeader).c_str());
      return -1;
    }
    if (a == "-v") {
      o->verbose = true;
    } else if (a == "-o") {
      if (++i == argc) {
        std::fprintf(stderr, "phos-sigdb: -o needs a file\n");
        return 2;
      }
      o->output = argv[i];
    } else if (auto v = value_of(a, "--cuda-path")) {
      o->cuda_path = *v;
    } else if (auto v = value_of(a, "--arch")) {
      o->arch = *v;
    } else if (auto v = value_of(a, "--resource-dir")) {
      o->resource_dir = *v;
    } else if (auto v = value_of(a, "--include-dir")) {
      o->include_dir = *v;
    } else if (a.size() > 1 && a[0] == '-') {
      std::fprintf(stderr, "phos-sigdb: unknown option %s (clang's go after --)\n", a.c_str());
      return 2;
    } else {
      o->files.push_back(a);
    }
  }
  if (o->files.empty()) {
    usage(stderr);
    return 2;
  }
  return 0;
}

// The compatibility headers: next to the tool in the build tree, under the
// data directory once installed.
std::string find_include_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  for (const fs::path& dir : {exe.parent_path() / "sigdb-include",
                              exe.parent_path() / PHOS_SIGDB_INCLUDE_FROM_BINDIR}) {
    if (fs::exists(dir / "texture_fetch_functions.h", ec)) return dir.lexically_normal().string();
  }
  return {};
}

// What clang needs to parse CUDA sources as nvcc would, device side only:
//  - --cuda-device-only with one arch: one compilation, the device-side
//    names; the arch only picks #if __CUDA_ARCH__ branches, and clang 14
//    knows none past sm_86;
//  - --no-cuda-version-check, -Wno-unknown-cuda-version: clang 14 knows
//    CUDA up to 11.5;
//  - not -nocudalib, although nothing is linked: without libdevice the
//    driver does not tell the front end the CUDA version either, which then
//    expects the launch API of CUDA < 9.2 (cudaConfigureCall) for <<<>>>;
//  - -std=c++17: nvcc's default, and what CCCL (libcu++) requires;
//  - -isystem CUDA/include/cccl: where CUDA 13 moved thrust, cub and
//    libcu++ (nvcc adds it itself);
//  - -D__CLANG_CUDA_TEXTURE_INTRINSICS_H__: clang's texture header uses the
//    texture<> template CUDA 12 removed;
//  - -idirafter INCLUDE_DIR: empty stand-ins for headers clang's CUDA
//    wrapper includes and CUDA 13 no longer has (texture_fetch_functions.h);
//    searched last, so a toolkit that has them wins;
//  - -Xclang -fcuda-allow-variadic-functions: libcu++ declares variadic
//    host-device functions for SFINAE, which clang otherwise rejects;
//  - -resource-dir: clang's own headers, which it would look for next to
//    this tool;
//  - -w: the sources' warnings are not ours to report.
std::vector<std::string> clang_arguments(const Options& o, const std::string& include_dir) {
  std::vector<std::string> args = {
      "-x", "cuda", "-std=c++17", "--cuda-device-only", "--cuda-gpu-arch=" + o.arch,
      "--cuda-path=" + o.cuda_path, "--no-cuda-version-check", "-Wno-unknown-cuda-version",
      "-w", "-resource-dir", o.resource_dir, "-D__CLANG_CUDA_TEXTURE_INTRINSICS_H__",
  };
  std::error_code ec;
  if (fs::is_directory(fs::path(o.cuda_path) / "include" / "cccl", ec)) {
    args.push_back("-isystem");
    args.push_back((fs::path(o.cuda_path) / "include" / "cccl").string());
  }
  if (!include_dir.empty()) {
    args.push_back("-idirafter");
    args.push_back(include_dir);
  }
  args.insert(args.end(), {"-Xclang", "-fcuda-allow-variadic-functions"});
  args.insert(args.end(), o.extra.begin(), o.extra.end());
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse_options(argc, argv, &o)) return rc < 0 ? 0 : rc;
  std::string include_dir = o.include_dir.empty() ? find_include_dir() : o.include_dir;
  if (include_dir.empty())
    std::fprintf(stderr, "phos-sigdb: warning: compatibility headers not found (--include-dir)\n");
  std::vector<std::string> args = clang_arguments(o, include_dir);
  if (o.verbose) {
    std::string line = "clang";
    for (const std::string& a : args) line += " " + a;
    std::fprintf(stderr, "phos-sigdb: %s FILE\n", line.c_str());
  }
  clang::tooling::FixedCompilationDatabase db(".", args);

  // One tool run a file, in the order given, so that the output follows it.
  std::string text = std::string(ps::kSignatureDbHeader) + "\n";
  std::unordered_map<std::string, std::pair<std::string, ps::KernelSignature>> first_seen;
  bool failed = false;
  for (const std::string& file : o.files) {
    std::vector<Kernel> kernels;
    clang::tooling::ClangTool tool(db, {file});
    KernelActionFactory factory(&kernels);
    if (tool.run(&factory) != 0) {
      std::fprintf(stderr, "phos-sigdb: %s: could not be parsed\n", file.c_str());
      failed = true;
      continue;
    }
    text += "# " + file + "\n";
    for (const Kernel& k : kernels) {
      auto [it, inserted] = first_seen.try_emplace(k.name, file, k.sig);
      if (!inserted) {
        // A template instantiated in several files, or an inline kernel.
        if (it->second.second != k.sig)
          std::fprintf(stderr, "phos-sigdb: warning: %s: its parameters in %s differ from %s; keeping the first\n",
                       k.name.c_str(), file.c_str(), it->second.first.c_str());
        continue;
      }
      text += ps::format_kernel(k.name, k.sig) + "\n";
    }
  }
  if (failed) return 1;

  // What we write must read back.
  ps::SignatureDb check;
  if (phos::Result<void> parsed = check.parse(text); !parsed) {
    std::fprintf(stderr, "phos-sigdb: internal error: the output does not parse: %s\n", parsed.error().message.c_str());
    return 1;
  }

  if (o.output.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  }
  std::ofstream out(o.output, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "phos-sigdb: %s: %s\n", o.output.c_str(), std::strerror(errno));
    return 1;
  }
  return 0;
}
