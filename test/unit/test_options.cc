#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "phos/plugin/options.h"

using phos::image::Compression;
using phos::image::DirectIo;
using phos::plugin::PluginOptions;

namespace {

struct Parsed {
  PluginOptions options;
  std::vector<std::string> warnings;
};

Parsed parse(std::string_view text, std::map<std::string, std::string> env = {}) {
  Parsed p;
  p.options = PluginOptions::parse(
      text, "phos.conf",
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      p.warnings);
  return p;
}

}  // namespace

TEST_CASE("options: no file and no variables give the defaults", "[options]") {
  auto p = parse("");
  CHECK(p.warnings.empty());
  CHECK(p.options.agent_timeout_ms == 10000);
  CHECK(p.options.quiesce_timeout_ms == 10000);
  CHECK(p.options.engine_workers == 0);
  CHECK(p.options.direct_io == DirectIo::kAuto);
  CHECK(p.options.compression == Compression::kNone);
  CHECK(p.options.zstd_level == 1);
  CHECK(p.options.chunk_mib == 4);
  CHECK(p.options.chunk_size() == 4u << 20);
}

TEST_CASE("options: every key is read from the file", "[options]") {
  auto p = parse(
      "agent_timeout_ms = 2500\n"
      "quiesce_timeout_ms = 700\n"
      "engine_workers = 6\n"
      "direct_io = off\n"
      "compression = zstd\n"
      "zstd_level = 3\n"
      "chunk_mib = 16\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.agent_timeout_ms == 2500);
  CHECK(p.options.quiesce_timeout_ms == 700);
  CHECK(p.options.engine_workers == 6);
  CHECK(p.options.direct_io == DirectIo::kOff);
  CHECK(p.options.compression == Compression::kZstd);
  CHECK(p.options.zstd_level == 3);
  CHECK(p.options.chunk_size() == 16u << 20);
}

TEST_CASE("options: comments, blank lines and spaces are ignored", "[options]") {
  auto p = parse("# phos settings\n\n   \t\nengine_workers=3   # three threads\n  chunk_mib\t=  8\r\n#chunk_mib = 2\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.engine_workers == 3);
  CHECK(p.options.chunk_mib == 8);
}

TEST_CASE("options: a last line without a newline counts", "[options]") {
  auto p = parse("zstd_level = 5");
  CHECK(p.warnings.empty());
  CHECK(p.options.zstd_level == 5);
}

TEST_CASE("options: the last of a repeated key wins", "[options]") {
  auto p = parse("chunk_mib = 2\nchunk_mib = 32\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.chunk_mib == 32);
}

TEST_CASE("options: unknown key is warned about with file and line, and ignored", "[options]") {
  auto p = parse("engine_workers = 2\nturbo = yes\n");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("phos.conf:2:") == 0);
  CHECK(p.warnings[0].find("unknown key 'turbo'") != std::string::npos);
  CHECK(p.options.engine_workers == 2);
}

TEST_CASE("options: line without '=' is warned about", "[options]") {
  auto p = parse("\n\ndirect_io off\n");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("phos.conf:3: expected key = value") == 0);
  CHECK(p.options.direct_io == DirectIo::kAuto);
}

TEST_CASE("options: bad values keep the default", "[options]") {
  for (const char* line : {"agent_timeout_ms = 0", "agent_timeout_ms = -5", "agent_timeout_ms = 10s",
                           "agent_timeout_ms = 99999999999999999999", "agent_timeout_ms =", "quiesce_timeout_ms = 3600001",
                           "engine_workers = 0", "engine_workers = 65", "engine_workers = many", "direct_io = on",
                           "direct_io = AUTO", "compression = lz4", "zstd_level = 0", "zstd_level = 20",
                           "chunk_mib = 0", "chunk_mib = 65", "chunk_mib = 4.5"}) {
    INFO(line);
    auto p = parse(line);
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("phos.conf:1: ") == 0);
    CHECK(p.warnings[0].find("ignored") != std::string::npos);
    CHECK(p.options.describe() == PluginOptions().describe());
  }
}

TEST_CASE("options: engine_workers = auto", "[options]") {
  auto p = parse("engine_workers = auto\n", {});
  CHECK(p.warnings.empty());
  CHECK(p.options.engine_workers == 0);
}

TEST_CASE("options: bounds are accepted", "[options]") {
  auto p = parse("chunk_mib = 64\nzstd_level = 19\nengine_workers = 64\nagent_timeout_ms = 3600000\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.chunk_size() == 64u << 20);
  CHECK(p.options.zstd_level == 19);
  CHECK(p.options.engine_workers == 64);
  CHECK(p.options.agent_timeout_ms == 3600000);
}

TEST_CASE("options: environment variables override the file", "[options]") {
  auto p = parse("engine_workers = 2\ncompression = zstd\nchunk_mib = 8\n",
                 {{"PHOS_ENGINE_WORKERS", "5"}, {"PHOS_COMPRESSION", "none"}, {"PHOS_DIRECT_IO", "off"},
                  {"PHOS_ZSTD_LEVEL", "7"}, {"PHOS_AGENT_TIMEOUT_MS", "123"}, {"PHOS_QUIESCE_TIMEOUT_MS", "456"}});
  CHECK(p.warnings.empty());
  CHECK(p.options.engine_workers == 5);
  CHECK(p.options.compression == Compression::kNone);
  CHECK(p.options.direct_io == DirectIo::kOff);
  CHECK(p.options.zstd_level == 7);
  CHECK(p.options.agent_timeout_ms == 123);
  CHECK(p.options.quiesce_timeout_ms == 456);
  CHECK(p.options.chunk_mib == 8);  // from the file
}

TEST_CASE("options: a bad environment value is warned about and the file's value stays", "[options]") {
  auto p = parse("chunk_mib = 8\n", {{"PHOS_CHUNK_MIB", "huge"}});
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("PHOS_CHUNK_MIB=huge") == 0);
  CHECK(p.options.chunk_mib == 8);
}

TEST_CASE("options: an empty environment variable is as if unset", "[options]") {
  auto p = parse("zstd_level = 4\n", {{"PHOS_ZSTD_LEVEL", ""}});
  CHECK(p.warnings.empty());
  CHECK(p.options.zstd_level == 4);
}

TEST_CASE("options: every line of a bad file is reported, the good ones apply", "[options]") {
  auto p = parse("a = 1\nzstd_level = 2\nb\ncompression = gzip\n");
  REQUIRE(p.warnings.size() == 3);
  CHECK(p.warnings[0].find("phos.conf:1:") == 0);
  CHECK(p.warnings[1].find("phos.conf:3:") == 0);
  CHECK(p.warnings[2].find("phos.conf:4:") == 0);
  CHECK(p.options.zstd_level == 2);
}

TEST_CASE("options: describe names every setting", "[options]") {
  std::string d = parse("compression = zstd\n").options.describe();
  for (const char* key : {"agent_timeout_ms=10000", "quiesce_timeout_ms=10000", "engine_workers=auto", "direct_io=auto",
                          "compression=zstd", "zstd_level=1", "chunk_mib=4"})
    CHECK(d.find(key) != std::string::npos);
}

TEST_CASE("options: gpu_map from the file, the variable over it", "[options]") {
  auto p = parse("gpu_map = 0=1\n");
  CHECK(p.warnings.empty());
  REQUIRE(p.options.gpu_map.size() == 1);
  CHECK(p.options.gpu_map[0].to == "1");
  auto q = parse("gpu_map = 0=1\n", {{"PHOS_GPU_MAP", "0=0,1=1"}});
  CHECK(q.options.gpu_map.size() == 2);
  CHECK(q.options.describe().find("gpu_map=0=0,1=1") != std::string::npos);
}

TEST_CASE("options: a bad gpu_map is warned about and ignored", "[options]") {
  auto p = parse("gpu_map = 0:1\n");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].find("phos.conf:1: gpu_map = 0:1:") != std::string::npos);
  CHECK(p.options.gpu_map.empty());
}

TEST_CASE("options: write_behind is auto by default, off from the file or PHOS_WRITE_BEHIND", "[options]") {
  CHECK(parse("").options.write_behind);
  CHECK_FALSE(parse("write_behind = off\n").options.write_behind);
  CHECK_FALSE(parse("", {{"PHOS_WRITE_BEHIND", "off"}}).options.write_behind);
  CHECK(parse("write_behind = off\n", {{"PHOS_WRITE_BEHIND", "auto"}}).options.write_behind);
  auto bad = parse("write_behind = yes\n");
  CHECK(bad.options.write_behind);
  REQUIRE(bad.warnings.size() == 1);
  CHECK(bad.warnings[0] == "phos.conf:1: write_behind = yes: expected auto or off; ignored");
  CHECK(parse("write_behind = off\n").options.describe().find("write_behind=off") != std::string::npos);
}
