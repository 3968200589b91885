#include "phos/speculation/known_structs.h"

#include <algorithm>
#include <charconv>
#include <string>

#include "type_text.h"

namespace phos::speculation {
namespace {

using type_text::trim;

// "ns::Name<A, B<C, D>, 4>" -> "ns::Name" and {"A", "B<C, D>", "4"}; nullopt
// where it is not a template-id.
struct TemplateId {
  std::string_view name;
  std::vector<std::string_view> args;
};
std::optional<TemplateId> template_id(std::string_view t) {
  t = trim(t);
  if (t.empty() || t.back() != '>') return std::nullopt;
  const size_t open = t.find('<');
  if (open == std::string_view::npos) return std::nullopt;
  return TemplateId{t.substr(0, open), type_text::split_top_level(t.substr(open + 1, t.size() - open - 2))};
}

// The last component of a qualified name: "at::native::(anonymous
// namespace)::Meta" -> "Meta".
std::string_view unqualified(std::string_view name) {
  const size_t at = name.rfind("::");
  return at == std::string_view::npos ? name : name.substr(at + 2);
}

// An integer template argument ("128", "128u").
std::optional<uint64_t> integer(std::string_view a) {
  while (!a.empty() && (a.back() == 'u' || a.back() == 'l' || a.back() == 'U' || a.back() == 'L')) a.remove_suffix(1);
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(a.data(), a.data() + a.size(), v);
  if (ec != std::errc() || end != a.data() + a.size()) return std::nullopt;
  return v;
}

// The size of an integer type as the demangler spells it (x86-64, LP64).
std::optional<uint32_t> integer_size(std::string_view t) {
  if (t == "int" || t == "unsigned int") return 4;
  if (t == "long" || t == "unsigned long" || t == "long long" || t == "unsigned long long") return 8;
  return std::nullopt;
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// PyTorch's cat (aten/src/ATen/native/cuda/Shape.cu, 2.x; the same in its
// SYCL port), passed by value to CatArrayBatchedCopy and its _contig,
// _aligned16_contig and _alignedK_contig variants:
//   template <typename T, typename IndexType, int n, int stride_size>
//   struct CatArrInputTensorMetadata {
//     const T* input[n];       // `T* input[n]` before 2.3: read all the same
//     IndexType offset[n];
//     IndexType dimSize[n];
//     IndexType nElements[n];
//     bool isContiguous[n];
//     TensorSizeStride<IndexType, CAT_ARRAY_MAX_INPUT_DIMS (4)> tensorStride[stride_size];
//   };
//   struct TensorSizeStride { IndexType tensorSize[4]; IndexType tensorStride[4]; };
// The kernels only read through input[] (they write through their first
// parameter, `T* output`); the slots past the call's inputs hold whatever
// the host's stack held.
std::optional<KnownStruct> cat_metadata(const TemplateId& id, uint32_t size) {
  if (id.args.size() != 4) return std::nullopt;
  const auto index_size = integer_size(id.args[1]);
  const auto n = integer(id.args[2]), stride_size = integer(id.args[3]);
  if (!index_size || !n || !stride_size || *n == 0 || *n > 4096 || *stride_size > 4096) return std::nullopt;
  uint64_t end = 8 * *n;               // input
  end += 3 * *n * *index_size;         // offset, dimSize, nElements
  end += *n;                           // isContiguous
  end = align_up(end, *index_size);    // tensorStride
  end += *stride_size * 8 * *index_size;
  if (align_up(end, 8) != size) return std::nullopt;  // another layout
  KnownStruct s;
  for (uint64_t i = 0; i < *n; i++) s.fields.push_back(PointerField{uint32_t(8 * i), true});
  return s;
}

// PyTorch's reductions (aten/src/ATen/native/cuda/Reduce.cuh, 2.x), passed
// by value to reduce_kernel:
//   template <typename scalar_t, typename ops_t, typename index_t,
//             typename out_scalar_t = scalar_t, int vt0 = 4, int input_vec_size = vt0>
//   struct ReduceOp {
//     ops_t ops; arg_t ident; ReduceConfig config;
//     OffsetCalculator<1, index_t> input_calc; OffsetCalculator<2, index_t> output_calc;
//     const void* src;
//     const char* dst[2];  // written: the kernel casts the const away
//     void* acc_buf; void* cta_buf; int* semaphores;
//     int64_t base_idx; bool accumulate; bool final_output; int noutputs;
//   };
// The fields before src hold no pointer (ops and ident are values, the
// config and calculators integers), but their sizes depend on ops_t and
// arg_t: the pointers are found from the end, 64 bytes of fixed fields.
// The offset calculators' IntDivider (divisor, m1, shift) words read as
// addresses: on the 8B server argmax's (m1, shift) = (0x059eea08, 17) fell
// inside a 64 GiB KV pool. A 16-byte aligned arg_t (c10::complex<double>)
// may pad the end: not taken; each launch checks that the end holds two
// bools and a noutputs of 1 or 2, else the struct is scanned.
std::optional<KnownStruct> reduce_op(std::string_view type, const TemplateId& id, uint32_t size) {
  if (id.args.size() != 6 || type.find("complex<double>") != std::string_view::npos) return std::nullopt;
  // Two offset calculators of 25 dimensions (4 + 25 x 12 + 25 x 4 x NARGS
  // bytes with 4-byte indices) come before the tail at least.
  constexpr uint32_t kTail = 64, kAtLeast = kTail + 404 + 504;
  if (size % 8 != 0 || size < kAtLeast) return std::nullopt;
  const uint32_t src = size - kTail;
  KnownStruct s;
  s.fields = {{src, true}, {src + 8, false}, {src + 16, false}, {src + 24, false}, {src + 32, false}, {src + 40, false}};
  s.checks = {{size - 8, 1, 0, 1}, {size - 7, 1, 0, 1}, {size - 4, 4, 1, 2}};
  return s;
}

// PyTorch's offset calculators (aten/src/ATen/cuda/detail/OffsetCalculator.cuh),
// passed by value to elementwise and reduction kernels: integers only.
//   template <int NARGS, typename index_t = uint32_t, bool signed_strides = false>
//   struct OffsetCalculator {
//     int dims;
//     IntDivider<index_t> sizes_[MAX_DIMS];   // {divisor, m1, shift} for 32-bit, {divisor} else
//     stride_t strides_[MAX_DIMS][std::max<int>(NARGS, 1)];  // index_t, or its signed type
//   };
// MAX_DIMS is 25 (16 before PyTorch 1.10). Its (m1, shift) words read as
// addresses: (0x059eea08, 17) fell inside the 8B server's KV pool.
std::optional<KnownStruct> offset_calculator(const TemplateId& id, uint32_t size) {
  if (id.args.empty() || id.args.size() > 3) return std::nullopt;
  const auto nargs = integer(id.args[0]);
  const auto index_size = id.args.size() > 1 ? integer_size(id.args[1]) : std::optional<uint32_t>(4);
  if (!nargs || *nargs > 64 || !index_size) return std::nullopt;
  const uint64_t divider = *index_size == 4 ? 12 : *index_size;
  const uint64_t columns = std::max<uint64_t>(*nargs, 1);
  for (uint64_t max_dims : {25, 16}) {
    uint64_t end = align_up(4, *index_size);  // dims
    end += max_dims * divider;
    end = align_up(end, *index_size);
    end += max_dims * columns * *index_size;
    if (align_up(end, *index_size) == size) return KnownStruct{};
  }
  return std::nullopt;
}

// cat's output sizes and strides (Shape.cu): TensorSizeStride<IndexType,
// MaxDims> {IndexType tensorSize[MaxDims]; IndexType tensorStride[MaxDims];}.
std::optional<KnownStruct> tensor_size_stride(const TemplateId& id, uint32_t size) {
  if (id.args.size() != 2) return std::nullopt;
  const auto index_size = integer_size(id.args[0]);
  const auto dims = integer(id.args[1]);
  if (!index_size || !dims || *dims > 64 || 2 * *dims * *index_size != size) return std::nullopt;
  return KnownStruct{};
}

}  // namespace

std::optional<KnownStruct> known_struct(std::string_view type, uint32_t size) {
  const auto id = template_id(type);
  if (!id) return std::nullopt;
  const std::string_view name = unqualified(id->name);
  if (name == "CatArrInputTensorMetadata") return cat_metadata(*id, size);
  if (name == "ReduceOp") return reduce_op(type, *id, size);
  if (name == "OffsetCalculator") return offset_calculator(*id, size);
  if (name == "TensorSizeStride") return tensor_size_stride(*id, size);
  return std::nullopt;
}

}  // namespace phos::speculation
