// phosctl's command lines (plugin/tools/phosctl_args.h): shared by phosctl
// job, periodic and supervise.
#include <catch2/catch.hpp>
#include <climits>

#include "phosctl_args.h"

using phosctl::parse_args;

TEST_CASE("phosctl args: options, flags, positionals and what follows --", "[phosctl]") {
  std::string error;
  auto a = parse_args({"123", "--dir", "d", "--incremental", "--criu-arg", "x", "--criu-arg", "y", "--criu", "a",
                       "--criu", "b", "--", "cmd", "--dir", "z"},
                      {"--incremental"}, 1, error);
  REQUIRE(a);
  CHECK(a->positional == std::vector<std::string>{"123"});
  CHECK(a->one("--dir") == "d");
  CHECK(a->flag("--incremental"));
  CHECK_FALSE(a->flag("--keep"));
  CHECK(a->one("--criu") == "b");  // the last one given
  auto [from, to] = a->values.equal_range("--criu-arg");
  std::vector<std::string> args;
  for (auto it = from; it != to; ++it) args.push_back(it->second);
  CHECK(args == std::vector<std::string>{"x", "y"});  // in order
  CHECK(a->rest == std::vector<std::string>{"cmd", "--dir", "z"});
}

TEST_CASE("phosctl args: too many positionals, or an option without its value, say so", "[phosctl]") {
  std::string error;
  CHECK_FALSE(parse_args({"1", "2"}, {}, 1, error));
  CHECK(error == "unexpected argument 2");
  CHECK_FALSE(parse_args({"--dir"}, {}, 0, error));
  CHECK(error == "--dir needs a value");
}

TEST_CASE("phosctl args: numbers whole and in range", "[phosctl]") {
  long n = 0;
  CHECK(phosctl::number("42", 1, 100, n));
  CHECK(n == 42);
  CHECK_FALSE(phosctl::number("0", 1, 100, n));
  CHECK_FALSE(phosctl::number("101", 1, 100, n));
  CHECK_FALSE(phosctl::number("4x", 1, 100, n));
  CHECK_FALSE(phosctl::number("", 1, 100, n));
  CHECK_FALSE(phosctl::number("99999999999999999999", 1, LONG_MAX, n));  // out of long's range
}

TEST_CASE("phosctl args: the first option not known is named", "[phosctl]") {
  std::string error;
  auto a = parse_args({"--dir", "d", "--to", "1", "--bogus", "x"}, {}, 0, error);
  REQUIRE(a);
  CHECK(a->unknown({"--dir", "--to", "--bogus"}).empty());
  CHECK(a->unknown({"--dir", "--to"}) == "bad option --bogus");
}
