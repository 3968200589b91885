// Structs of well-known libraries whose layout phos knows without a
// signature database (speculation/known_structs.h): PyTorch's cat metadata,
// whose unused slots once took a 64 GiB KV pool into a launch's write set.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "phos/speculation/demangle.h"
#include "phos/speculation/kernel_layout.h"
#include "phos/speculation/known_structs.h"
#include "phos/speculation/speculate.h"

using namespace phos::speculation;

namespace {

// As the 8B server's cat launch names it (PyTorch 2.11).
constexpr const char* kCatMeta =
    "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous "
    "namespace)::OpaqueType<8u>, unsigned int, 128, 1>";
constexpr const char* kCatKernel =
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<at::native::(anonymous "
    "namespace)::OpaqueType<8u>, unsigned int, 2, 128, 1, 16>(at::native::(anonymous namespace)::OpaqueType<8u>*, "
    "at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::OpaqueType<8u>, "
    "unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)";
// 128 pointers, 3 x 128 unsigned ints, 128 bools, one TensorSizeStride<unsigned int, 4>.
constexpr uint32_t kCatMetaSize = 1024 + 1536 + 128 + 32;

}  // namespace

TEST_CASE("known structs: PyTorch's cat metadata has its input pointers as its only pointers, read", "[known_structs]") {
  auto known = known_struct(kCatMeta, kCatMetaSize);
  REQUIRE(known);
  const auto& fields = known->fields;
  REQUIRE(fields.size() == 128);
  for (uint32_t i = 0; i < 128; i++) {
    CHECK(fields[i].offset == 8 * i);
    CHECK(fields[i].const_pointee);
  }
  CHECK(known->checks.empty());
}

TEST_CASE("known structs: a size that is not the rule's means another layout: not used", "[known_structs]") {
  CHECK_FALSE(known_struct(kCatMeta, kCatMetaSize + 16));
  CHECK_FALSE(known_struct(kCatMeta, kCatMetaSize - 8));
}

TEST_CASE("known structs: the cat metadata's layout follows its index type, count and strides", "[known_structs]") {
  // unsigned long indices, 64 inputs, 4 strides: 512 + 3 x 512 + 64, then 4 x 64.
  auto wide = known_struct("CatArrInputTensorMetadata<c10::Half, unsigned long, 64, 4>", 512 + 1536 + 64 + 256);
  REQUIRE(wide);
  CHECK(wide->fields.size() == 64);
  // A bool count that leaves the strides to align: 3 inputs of int index.
  // 24 + 36 + 3 = 63 -> 64, + 32 = 96.
  CHECK(known_struct("ns::CatArrInputTensorMetadata<float, int, 3, 1>", 96));
  CHECK_FALSE(known_struct("ns::CatArrInputTensorMetadata<float, short, 3, 1>", 96));  // an index type it does not size
}

TEST_CASE("known structs: other structs and other names are not known", "[known_structs]") {
  CHECK_FALSE(known_struct("at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4, 4>", 512));  // too small for one
  CHECK_FALSE(known_struct("CatArrInputTensorMetadata", kCatMetaSize));
  CHECK_FALSE(known_struct("MyCatArrInputTensorMetadataLike<float, int, 3, 1>", 96));
  CHECK_FALSE(known_struct("CatArrInputTensorMetadata<float, int, 3>", 96));  // not its arguments
}

TEST_CASE("known structs: the cat kernel's layout from its name, and a stale word in nElements no pointer",
          "[known_structs]") {
  auto kinds = param_kinds_from_signature(kCatKernel);
  auto types = param_types_from_signature(kCatKernel);
  REQUIRE(kinds);
  REQUIRE(types);
  REQUIRE(types->size() == 5);
  LayoutSources sources;
  // output, inputs, os, concatDim, dimStride
  sources.driver = std::vector<ParamSlot>{{0, 8}, {8, kCatMetaSize}, {8 + kCatMetaSize, 32},
                                          {8 + kCatMetaSize + 32, 4}, {8 + kCatMetaSize + 36, 4}};
  sources.name_kinds = kinds;
  sources.name_types = types;
  KernelLayout layout = build_layout(sources);
  REQUIRE(layout.params.size() == 5);
  CHECK(layout.params[1].kind == ParamKind::kAggregate);
  CHECK(layout.params[1].fields_known);
  CHECK(layout.params[1].pointer_fields.size() == 128);
  CHECK(layout.params[2].kind == ParamKind::kAggregate);
  CHECK(layout.params[2].fields_known);  // TensorSizeStride<unsigned int, 4u>: integers only
  CHECK(layout.params[2].pointer_fields.empty());

  BufferIndex index;
  REQUIRE(index.insert(0x7f0000000000, 1 << 20, 1));  // the output
  REQUIRE(index.insert(0x7f0000100000, 1 << 20, 2));  // the two inputs
  REQUIRE(index.insert(0x11000000000, 64ull << 30, 3));  // a 64 GiB pool no launch here touches
  uint64_t output = 0x7f0000000000;
  std::vector<unsigned char> meta(kCatMetaSize, 0);
  const uint64_t in0 = 0x7f0000100000, in1 = 0x7f0000180000, stale = 0x11059eea08 + (0x11000000000 - 0x1000000000);
  std::memcpy(&meta[0], &in0, 8);
  std::memcpy(&meta[8], &in1, 8);
  std::memcpy(&meta[2152], &stale, 8);  // nElements[26..27]: what the host's stack left there
  unsigned char os[32] = {};
  int dim = 0;
  unsigned stride = 1;
  void* params[] = {&output, meta.data(), os, &dim, &stride};
  AccessSet set;
  speculate_kernel(layout, LaunchArgs{params}, index, &set);
  CHECK(set.find(1));
  CHECK((set.find(1)->access & kWrite));
  REQUIRE(set.find(2));
  CHECK(set.find(2)->access == kRead);  // the inputs: read only
  CHECK_FALSE(set.find(3));             // the stale word: no buffer

  // The control: without the struct's name the word takes the pool in.
  sources.name_types.reset();
  AccessSet scanned;
  speculate_kernel(build_layout(sources), LaunchArgs{params}, index, &scanned);
  REQUIRE(scanned.find(3));
  CHECK((scanned.find(3)->access & kWrite));
}

namespace {
// As argmax's launch on the 8B server names it (PyTorch 2.11).
constexpr const char* kArgMax = "at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4>";
constexpr uint32_t kReduceSize = 1024;  // any size past the calculators, a multiple of 8

// A ReduceOp's bytes: `stale` at +96 (an IntDivider's (m1, shift)), the
// six pointers from 64 bytes before the end, then base_idx, the two bools,
// noutputs.
std::vector<unsigned char> reduce_bytes(uint64_t stale, uint64_t src, uint64_t dst0, uint8_t accumulate,
                                        uint32_t noutputs) {
  std::vector<unsigned char> b(kReduceSize, 0);
  std::memcpy(&b[96], &stale, 8);
  std::memcpy(&b[kReduceSize - 64], &src, 8);
  std::memcpy(&b[kReduceSize - 56], &dst0, 8);
  b[kReduceSize - 8] = accumulate;
  b[kReduceSize - 7] = 1;  // final_output
  std::memcpy(&b[kReduceSize - 4], &noutputs, 4);
  return b;
}
}  // namespace

TEST_CASE("known structs: PyTorch's ReduceOp has its six pointers 64 bytes before its end", "[known_structs]") {
  auto known = known_struct(kArgMax, kReduceSize);
  REQUIRE(known);
  REQUIRE(known->fields.size() == 6);
  CHECK(known->fields[0] == PointerField{kReduceSize - 64, true});   // src
  CHECK(known->fields[1] == PointerField{kReduceSize - 56, false});  // dst[0], written
  CHECK(known->fields[5] == PointerField{kReduceSize - 24, false});  // semaphores
  CHECK(known->checks.size() == 3);
  CHECK_FALSE(known_struct(kArgMax, kReduceSize + 4));  // not a multiple of 8
  CHECK_FALSE(known_struct("at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long>", kReduceSize));  // an older one
  CHECK_FALSE(known_struct("at::native::ReduceOp<c10::complex<double>, at::native::func_wrapper_t<c10::complex<double>, "
                           "F>, unsigned int, c10::complex<double>, 4, 4>",
                           kReduceSize));  // may pad its end
}

TEST_CASE("known structs: argmax's IntDivider word is no pointer; the bytes its end must hold are checked each launch",
          "[known_structs]") {
  KernelLayout layout;
  layout.slots_known = true;
  ParamLayout p;
  p.offset = 0;
  p.size = kReduceSize;
  p.kind = ParamKind::kAggregate;
  auto known = known_struct(kArgMax, kReduceSize);
  REQUIRE(known);
  p.fields_known = true;
  p.pointer_fields = known->fields;
  p.checks = known->checks;
  layout.params = {p};
  BufferIndex index;
  REQUIRE(index.insert(0x7f0000000000, 1 << 20, 1));    // the input
  REQUIRE(index.insert(0x7f0000100000, 1 << 20, 2));    // the output
  REQUIRE(index.insert(0x1000000000, 64ull << 30, 3));  // the KV pool
  const uint64_t divider = (uint64_t(17) << 32) | 0x059eea08;  // inside the pool
  auto bytes = reduce_bytes(divider, 0x7f0000000000, 0x7f0000100000, 0, 1);
  void* params[] = {bytes.data()};
  AccessSet set;
  speculate_kernel(layout, LaunchArgs{params}, index, &set);
  REQUIRE(set.find(1));
  CHECK(set.find(1)->access == kRead);
  REQUIRE(set.find(2));
  CHECK((set.find(2)->access & kWrite));
  CHECK_FALSE(set.find(3));

  // An end that does not hold what the rule says (another layout, or
  // padding): scanned word by word, the divider's word taken as before.
  auto odd = reduce_bytes(divider, 0x7f0000000000, 0x7f0000100000, 0, 7);
  void* odd_params[] = {odd.data()};
  AccessSet scanned;
  speculate_kernel(layout, LaunchArgs{odd_params}, index, &scanned);
  CHECK(scanned.find(3));
  auto bad_bool = reduce_bytes(divider, 0x7f0000000000, 0x7f0000100000, 5, 1);
  void* bad_params[] = {bad_bool.data()};
  AccessSet scanned2;
  speculate_kernel(layout, LaunchArgs{bad_params}, index, &scanned2);
  CHECK(scanned2.find(3));
}

TEST_CASE("known structs: PyTorch's offset calculators and cat's sizes hold no pointer, where the size agrees",
          "[known_structs]") {
  // int dims; IntDivider<unsigned int> sizes_[25] (12 bytes each); unsigned strides_[25][NARGS].
  auto one = known_struct("at::native::OffsetCalculator<1, unsigned int, false>", 4 + 300 + 100);
  REQUIRE(one);
  CHECK(one->fields.empty());
  CHECK(known_struct("OffsetCalculator<2, unsigned int, false>", 4 + 300 + 200));
  CHECK(known_struct("OffsetCalculator<3, unsigned int, true>", 4 + 300 + 300));
  CHECK(known_struct("OffsetCalculator<0, unsigned int, false>", 4 + 300 + 100));  // one column at least
  // 64-bit indices: IntDivider holds the divisor alone; dims padded to 8.
  CHECK(known_struct("OffsetCalculator<2, unsigned long, false>", 8 + 200 + 400));
  // PyTorch before 1.10: 16 dimensions.
  CHECK(known_struct("OffsetCalculator<1, unsigned int, false>", 4 + 192 + 64));
  CHECK_FALSE(known_struct("OffsetCalculator<1, unsigned int, false>", 404 + 8));
  CHECK_FALSE(known_struct("OffsetCalculator<x, unsigned int, false>", 404));
  // cat's output sizes and strides.
  CHECK(known_struct("at::native::(anonymous namespace)::TensorSizeStride<unsigned int, 4u>", 32));
  CHECK(known_struct("TensorSizeStride<unsigned long, 4u>", 64));
  CHECK_FALSE(known_struct("TensorSizeStride<unsigned int, 4u>", 40));
}

TEST_CASE("known structs: an offset calculator's IntDivider word takes no buffer into the set", "[known_structs]") {
  KernelLayout layout;
  layout.slots_known = true;
  ParamLayout p;
  p.offset = 0;
  p.size = 404;
  p.kind = ParamKind::kAggregate;
  auto known = known_struct("OffsetCalculator<1, unsigned int, false>", 404);
  REQUIRE(known);
  p.fields_known = true;
  layout.params = {p};
  BufferIndex index;
  REQUIRE(index.insert(0x1000000000, 64ull << 30, 3));
  std::vector<unsigned char> calc(404, 0);
  const uint64_t divider = (uint64_t(17) << 32) | 0x059eea08;
  std::memcpy(&calc[8], &divider, 8);  // sizes_[0]'s (m1, shift)
  void* params[] = {calc.data()};
  AccessSet set;
  speculate_kernel(layout, LaunchArgs{params}, index, &set);
  CHECK(set.count == 0);
  layout.params[0].fields_known = false;  // the control: scanned, the word is taken
  AccessSet scanned;
  speculate_kernel(layout, LaunchArgs{params}, index, &scanned);
  CHECK(scanned.find(3));
}
