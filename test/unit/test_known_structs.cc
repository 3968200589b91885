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
  auto fields = known_struct_fields(kCatMeta, kCatMetaSize);
  REQUIRE(fields);
  REQUIRE(fields->size() == 128);
  for (uint32_t i = 0; i < 128; i++) {
    CHECK((*fields)[i].offset == 8 * i);
    CHECK((*fields)[i].const_pointee);
  }
}

TEST_CASE("known structs: a size that is not the rule's means another layout: not used", "[known_structs]") {
  CHECK_FALSE(known_struct_fields(kCatMeta, kCatMetaSize + 16));
  CHECK_FALSE(known_struct_fields(kCatMeta, kCatMetaSize - 8));
}

TEST_CASE("known structs: the cat metadata's layout follows its index type, count and strides", "[known_structs]") {
  // unsigned long indices, 64 inputs, 4 strides: 512 + 3 x 512 + 64, then 4 x 64.
  auto wide = known_struct_fields("CatArrInputTensorMetadata<c10::Half, unsigned long, 64, 4>", 512 + 1536 + 64 + 256);
  REQUIRE(wide);
  CHECK(wide->size() == 64);
  // A bool count that leaves the strides to align: 3 inputs of int index.
  // 24 + 36 + 3 = 63 -> 64, + 32 = 96.
  CHECK(known_struct_fields("ns::CatArrInputTensorMetadata<float, int, 3, 1>", 96));
  CHECK_FALSE(known_struct_fields("ns::CatArrInputTensorMetadata<float, short, 3, 1>", 96));  // an index type it does not size
}

TEST_CASE("known structs: other structs and other names are not known", "[known_structs]") {
  CHECK_FALSE(known_struct_fields("at::native::ReduceOp<float, at::native::MaxOps<float>, unsigned int, float, 4, 4>", 512));
  CHECK_FALSE(known_struct_fields("CatArrInputTensorMetadata", kCatMetaSize));
  CHECK_FALSE(known_struct_fields("MyCatArrInputTensorMetadataLike<float, int, 3, 1>", 96));
  CHECK_FALSE(known_struct_fields("CatArrInputTensorMetadata<float, int, 3>", 96));  // not its arguments
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
  CHECK_FALSE(layout.params[2].fields_known);  // TensorSizeStride: no rule; scanned, holds no pointer

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
