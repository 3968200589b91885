#include <catch2/catch.hpp>

#include "phos/speculation/demangle.h"

using namespace phos::speculation;
using K = ParamKind;

TEST_CASE("demangle: pointer-to-const is read only, other pointers may be written") {
  // void saxpy(float const*, float*, float, int)
  auto kinds = param_kinds_from_name("_Z5saxpyPKfPffi");
  REQUIRE(kinds);
  CHECK(*kinds == std::vector<K>{K::kConstPointer, K::kPointer, K::kScalar, K::kScalar});
}

TEST_CASE("demangle: pointers to pointers") {
  // k(float const* const*, float**, float* const*)
  auto kinds = param_kinds_from_name("_Z1kPKPKfPPfPKPf");
  REQUIRE(kinds);
  CHECK(*kinds == std::vector<K>{K::kConstPointer, K::kPointer, K::kConstPointer});
}

TEST_CASE("demangle: template kernels, structs and closures are aggregates") {
  // void vec<float, 4>(Params<float>, float*, unsigned long)
  auto kinds = param_kinds_from_signature("void vec<float, 4>(Params<float>, float*, unsigned long)");
  REQUIRE(kinds);
  CHECK(*kinds == std::vector<K>{K::kAggregate, K::kPointer, K::kScalar});
  // PyTorch's style: a functor and an array of pointers by value.
  auto torch = param_kinds_from_signature(
      "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
      "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)");
  REQUIRE(torch);
  CHECK(*torch == std::vector<K>{K::kScalar, K::kAggregate, K::kAggregate});
}

TEST_CASE("demangle: a real mangled template instance") {
  // void k3<double>(double*)
  auto kinds = param_kinds_from_name("_Z2k3IdEvPT_");
  REQUIRE(kinds);
  CHECK(*kinds == std::vector<K>{K::kPointer});
  CHECK(demangle("_Z2k3IdEvPT_") == "void k3<double>(double*)");
}

TEST_CASE("demangle: extern C names and garbage carry no types") {
  CHECK_FALSE(param_kinds_from_name("vec_add"));
  CHECK_FALSE(param_kinds_from_name("_Znot a name"));
  CHECK(demangle("vec_add") == "vec_add");
}

TEST_CASE("demangle: no parameters") {
  auto kinds = param_kinds_from_name("_Z4tickv");
  REQUIRE(kinds);
  CHECK(kinds->empty());
}

TEST_CASE("demangle: one type at a time") {
  CHECK(classify_type("float const*") == K::kConstPointer);
  CHECK(classify_type("const float*") == K::kConstPointer);
  CHECK(classify_type("float* __restrict__") == K::kPointer);
  CHECK(classify_type("float const* __restrict__") == K::kConstPointer);
  CHECK(classify_type("int&") == K::kPointer);
  CHECK(classify_type("int const&") == K::kConstPointer);
  CHECK(classify_type("unsigned long long") == K::kScalar);
  CHECK(classify_type("__half") == K::kAggregate);
  CHECK(classify_type("void (*)(int)") == K::kAggregate);
  CHECK(classify_type("(anonymous namespace)::Args") == K::kAggregate);
  CHECK(classify_type("") == K::kUnknown);
}

TEST_CASE("demangle: lambda closures and nested parentheses") {
  auto kinds = param_kinds_from_signature(
      "void launch<main::{lambda(int)#1}>(main::{lambda(int)#1}, int, float (*)(float))");
  REQUIRE(kinds);
  CHECK(*kinds == std::vector<K>{K::kAggregate, K::kScalar, K::kAggregate});
}
