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

// --- copy-on-write ---

using phos::agent::CopyTrust;
using CopyOnWrite = PluginOptions::CopyOnWrite;

TEST_CASE("options: cow_zero settles by default, copies from the file or PHOS_COW_ZERO", "[options]") {
  CHECK(parse("").options.cow_zero_settle);
  CHECK_FALSE(parse("cow_zero = copy\n").options.cow_zero_settle);
  CHECK_FALSE(parse("", {{"PHOS_COW_ZERO", "copy"}}).options.cow_zero_settle);
  CHECK(parse("cow_zero = copy\n", {{"PHOS_COW_ZERO", "settle"}}).options.cow_zero_settle);
  auto bad = parse("cow_zero = on\n");
  CHECK(bad.options.cow_zero_settle);
  REQUIRE(bad.warnings.size() == 1);
  CHECK(bad.warnings[0] == "phos.conf:1: cow_zero = on: expected settle or copy; ignored");
  CHECK(parse("cow_zero = copy\n").options.describe().find("cow_zero=copy") != std::string::npos);
}

TEST_CASE("options: restore_overlap is on by default, off from the file or PHOS_RESTORE_OVERLAP", "[options]") {
  CHECK(parse("").options.restore_overlap);
  CHECK_FALSE(parse("restore_overlap = off\n").options.restore_overlap);
  CHECK_FALSE(parse("", {{"PHOS_RESTORE_OVERLAP", "off"}}).options.restore_overlap);
  CHECK(parse("restore_overlap = off\n", {{"PHOS_RESTORE_OVERLAP", "on"}}).options.restore_overlap);
  auto bad = parse("restore_overlap = later\n");
  CHECK(bad.options.restore_overlap);
  REQUIRE(bad.warnings.size() == 1);
  CHECK(bad.warnings[0] == "phos.conf:1: restore_overlap = later: expected on or off; ignored");
  CHECK(parse("restore_overlap = off\n").options.describe().find("restore_overlap=off") != std::string::npos);
}

TEST_CASE("options: copy-on-write defaults", "[options][cow]") {
  auto p = parse("");
  CHECK(p.options.copy_on_write == CopyOnWrite::kAuto);
  CHECK(p.options.cow_pool_mib == PluginOptions::kCowPoolAuto);
  CHECK(p.options.cow_trust == CopyTrust::kChecksum);
  CHECK(p.options.cow_timeout_ms == 60000);
}

TEST_CASE("options: copy_on_write from the file", "[options][cow]") {
  CHECK(parse("copy_on_write = always\n").options.copy_on_write == CopyOnWrite::kAlways);
  CHECK(parse("copy_on_write = off\n").options.copy_on_write == CopyOnWrite::kOff);
  CHECK(parse("copy_on_write = off\ncopy_on_write = auto\n").options.copy_on_write == CopyOnWrite::kAuto);
  CHECK(parse("copy_on_write = always\n").warnings.empty());
}

TEST_CASE("options: cow_pool_mib from the file, bounds included", "[options][cow]") {
  auto p = parse("cow_pool_mib = 512\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.cow_pool_mib == 512);
  CHECK(parse("cow_pool_mib = 0\n").options.cow_pool_mib == 0);
  auto top = parse("cow_pool_mib = 1048576\n");
  CHECK(top.warnings.empty());
  CHECK(top.options.cow_pool_mib == 1048576);
  // An explicit size goes back to auto by the word.
  auto back = parse("cow_pool_mib = 512\ncow_pool_mib = auto\n");
  CHECK(back.warnings.empty());
  CHECK(back.options.cow_pool_mib == PluginOptions::kCowPoolAuto);
  CHECK(back.options.describe().find("cow_pool_mib=auto") != std::string::npos);
}

TEST_CASE("options: cow_trust from the file", "[options][cow]") {
  CHECK(parse("cow_trust = exact\n").options.cow_trust == CopyTrust::kExact);
  CHECK(parse("cow_trust = speculated\n").options.cow_trust == CopyTrust::kSpeculated);
  CHECK(parse("cow_trust = exact\ncow_trust = validated\n").options.cow_trust == CopyTrust::kValidated);
  CHECK(parse("cow_trust = exact\ncow_trust = checksum\n").options.cow_trust == CopyTrust::kChecksum);
  CHECK(parse("cow_trust = speculated\n").warnings.empty());
  CHECK(parse("", {{"PHOS_COW_TRUST", "checksum"}}).options.cow_trust == CopyTrust::kChecksum);
}

TEST_CASE("options: cow_timeout_ms from the file, bounds included", "[options][cow]") {
  auto p = parse("cow_timeout_ms = 250\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.cow_timeout_ms == 250);
  CHECK(parse("cow_timeout_ms = 1\n").options.cow_timeout_ms == 1);
  CHECK(parse("cow_timeout_ms = 3600000\n").options.cow_timeout_ms == 3600000);
}

TEST_CASE("options: every copy-on-write key from the environment", "[options][cow]") {
  auto p = parse("", {{"PHOS_COPY_ON_WRITE", "always"},
                      {"PHOS_COW_POOL_MIB", "64"},
                      {"PHOS_COW_TRUST", "exact"},
                      {"PHOS_COW_TIMEOUT_MS", "1500"}});
  CHECK(p.warnings.empty());
  CHECK(p.options.copy_on_write == CopyOnWrite::kAlways);
  CHECK(p.options.cow_pool_mib == 64);
  CHECK(p.options.cow_trust == CopyTrust::kExact);
  CHECK(p.options.cow_timeout_ms == 1500);
}

TEST_CASE("options: copy-on-write variables override the file", "[options][cow]") {
  auto p = parse("copy_on_write = off\ncow_pool_mib = 100\ncow_trust = speculated\ncow_timeout_ms = 9\n",
                 {{"PHOS_COPY_ON_WRITE", "always"},
                  {"PHOS_COW_POOL_MIB", "0"},
                  {"PHOS_COW_TRUST", "validated"},
                  {"PHOS_COW_TIMEOUT_MS", "77"}});
  CHECK(p.warnings.empty());
  CHECK(p.options.copy_on_write == CopyOnWrite::kAlways);
  CHECK(p.options.cow_pool_mib == 0);
  CHECK(p.options.cow_trust == CopyTrust::kValidated);
  CHECK(p.options.cow_timeout_ms == 77);
}

TEST_CASE("options: copy-on-write keys the variables leave unset keep the file's value", "[options][cow]") {
  auto p = parse("cow_pool_mib = 100\ncow_trust = exact\n", {{"PHOS_COW_TIMEOUT_MS", "77"}});
  CHECK(p.warnings.empty());
  CHECK(p.options.cow_pool_mib == 100);
  CHECK(p.options.cow_trust == CopyTrust::kExact);
  CHECK(p.options.cow_timeout_ms == 77);
}

TEST_CASE("options: bad copy-on-write values in the file warn and keep the defaults", "[options][cow]") {
  for (const char* line : {"copy_on_write = on", "copy_on_write = ALWAYS", "copy_on_write =", "copy_on_write = 1",
                           "cow_pool_mib = -1", "cow_pool_mib = 1048577", "cow_pool_mib = 2g", "cow_pool_mib = 1.5",
                           "cow_pool_mib = 99999999999999999999", "cow_pool_mib = AUTO", "cow_pool_mib = 4294967295",
                           "cow_trust = none", "cow_trust = Exact",
                           "cow_trust = 3", "cow_trust =", "cow_timeout_ms = 0", "cow_timeout_ms = 3600001",
                           "cow_timeout_ms = -1", "cow_timeout_ms = 5s"}) {
    INFO(line);
    auto p = parse(line);
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("phos.conf:1: ") == 0);
    CHECK(p.warnings[0].find("ignored") != std::string::npos);
    CHECK(p.options.copy_on_write == CopyOnWrite::kAuto);
    CHECK(p.options.cow_pool_mib == PluginOptions::kCowPoolAuto);
    CHECK(p.options.cow_trust == CopyTrust::kChecksum);
    CHECK(p.options.cow_timeout_ms == 60000);
    CHECK(p.options.describe() == PluginOptions().describe());
  }
}

TEST_CASE("options: a bad copy_on_write says what it expects", "[options][cow]") {
  auto p = parse("copy_on_write = yes\n");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] == "phos.conf:1: copy_on_write = yes: expected auto, always or off; ignored");
}

TEST_CASE("options: a bad cow_trust says what it expects", "[options][cow]") {
  auto p = parse("cow_trust = blind\n");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] ==
        "phos.conf:1: cow_trust = blind: expected exact, speculated, validated or checksum; ignored");
}

TEST_CASE("options: a bad cow_pool_mib names its range", "[options][cow]") {
  auto p = parse("cow_pool_mib = lots\n");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] == "phos.conf:1: cow_pool_mib = lots: expected auto or a whole number in 0..1048576; ignored");
}

TEST_CASE("options: bad copy-on-write variables warn and keep the file's values", "[options][cow]") {
  auto p = parse("copy_on_write = off\ncow_pool_mib = 100\ncow_trust = exact\ncow_timeout_ms = 9\n",
                 {{"PHOS_COPY_ON_WRITE", "sometimes"},
                  {"PHOS_COW_POOL_MIB", "2000000"},
                  {"PHOS_COW_TRUST", "blind"},
                  {"PHOS_COW_TIMEOUT_MS", "0"}});
  REQUIRE(p.warnings.size() == 4);
  CHECK(p.warnings[0].find("PHOS_COPY_ON_WRITE=sometimes") == 0);
  CHECK(p.warnings[1].find("PHOS_COW_POOL_MIB=2000000") == 0);
  CHECK(p.warnings[2].find("PHOS_COW_TRUST=blind") == 0);
  CHECK(p.warnings[3].find("PHOS_COW_TIMEOUT_MS=0") == 0);
  for (const auto& w : p.warnings) CHECK(w.find("ignored") != std::string::npos);
  CHECK(p.options.copy_on_write == CopyOnWrite::kOff);
  CHECK(p.options.cow_pool_mib == 100);
  CHECK(p.options.cow_trust == CopyTrust::kExact);
  CHECK(p.options.cow_timeout_ms == 9);
}

TEST_CASE("options: describe lists the copy-on-write defaults", "[options][cow]") {
  std::string d = PluginOptions().describe();
  for (const char* key : {"copy_on_write=auto", "cow_pool_mib=auto", "cow_trust=checksum", "cow_timeout_ms=60000"}) {
    INFO(key);
    CHECK(d.find(key) != std::string::npos);
  }
}

TEST_CASE("options: describe lists the copy-on-write settings as set", "[options][cow]") {
  auto p = parse("copy_on_write = always\ncow_pool_mib = 0\ncow_trust = speculated\ncow_timeout_ms = 5\n");
  std::string d = p.options.describe();
  for (const char* key : {"copy_on_write=always", "cow_pool_mib=0", "cow_trust=speculated", "cow_timeout_ms=5"}) {
    INFO(key);
    CHECK(d.find(key) != std::string::npos);
  }
  std::string off = parse("copy_on_write = off\ncow_trust = exact\n").options.describe();
  CHECK(off.find("copy_on_write=off cow_pool_mib=auto cow_trust=exact cow_timeout_ms=60000") != std::string::npos);
}

TEST_CASE("options: recopy defaults to auto with the first pass bounded by criu's timer", "[options][recopy]") {
  PluginOptions o;
  CHECK(o.recopy);
  CHECK(o.recopy_pass_ms == 0);
  CHECK(o.recopy_min_mib == 1024);
  CHECK(o.describe().find("recopy=auto recopy_pass_ms=0 recopy_min_mib=1024") != std::string::npos);
}

TEST_CASE("options: recopy_min_mib from the file and the environment, 0 for every process", "[options][recopy]") {
  auto p = parse("recopy_min_mib = 0\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.recopy_min_mib == 0);
  auto q = parse("recopy_min_mib = 0\n", {{"PHOS_RECOPY_MIN_MIB", "4096"}});
  CHECK(q.warnings.empty());
  CHECK(q.options.recopy_min_mib == 4096);
}

TEST_CASE("options: recopy and its pass bound from the file and the environment", "[options][recopy]") {
  auto p = parse("recopy = off\nrecopy_pass_ms = 2500\n");
  CHECK(p.warnings.empty());
  CHECK_FALSE(p.options.recopy);
  CHECK(p.options.recopy_pass_ms == 2500);
  auto q = parse("recopy = off\n", {{"PHOS_RECOPY", "auto"}, {"PHOS_RECOPY_PASS_MS", "0"}});
  CHECK(q.warnings.empty());
  CHECK(q.options.recopy);
  CHECK(q.options.recopy_pass_ms == 0);
}

TEST_CASE("options: bad recopy values warn and keep the defaults", "[options][recopy]") {
  for (const char* line : {"recopy = on", "recopy = always", "recopy =", "recopy_pass_ms = -1",
                           "recopy_pass_ms = 3600001", "recopy_pass_ms = 2s",
                           "recopy_min_mib = -1", "recopy_min_mib = 1GiB"}) {
    INFO(line);
    auto p = parse(line);
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("ignored") != std::string::npos);
    CHECK(p.options.describe() == PluginOptions().describe());
  }
  CHECK(parse("recopy = yes\n").warnings.at(0) == "phos.conf:1: recopy = yes: expected auto or off; ignored");
}

TEST_CASE("options: sparse defaults to auto", "[options][sparse]") {
  PluginOptions o;
  CHECK(o.sparse == phos::image::Sparse::kAuto);
  CHECK(o.describe().find(" sparse=auto") != std::string::npos);
}

TEST_CASE("options: sparse from the file, PHOS_SPARSE over it", "[options][sparse]") {
  auto p = parse("sparse = off\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.sparse == phos::image::Sparse::kOff);
  CHECK(p.options.describe().find(" sparse=off") != std::string::npos);
  auto q = parse("sparse = off\n", {{"PHOS_SPARSE", "auto"}});
  CHECK(q.warnings.empty());
  CHECK(q.options.sparse == phos::image::Sparse::kAuto);
  auto r = parse("", {{"PHOS_SPARSE", "off"}});
  CHECK(r.options.sparse == phos::image::Sparse::kOff);
}

TEST_CASE("options: a bad sparse value warns and keeps the setting", "[options][sparse]") {
  CHECK(parse("sparse = on\n").warnings.at(0) == "phos.conf:1: sparse = on: expected auto or off; ignored");
  auto p = parse("sparse = off\n", {{"PHOS_SPARSE", "yes"}});
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] == "PHOS_SPARSE=yes: expected auto or off; ignored");
  CHECK(p.options.sparse == phos::image::Sparse::kOff);
}

TEST_CASE("options: lazy_restore defaults to auto, with a long wait bound", "[options][lazy]") {
  PluginOptions o;
  CHECK(o.lazy_restore == PluginOptions::LazyRestore::kAuto);
  CHECK(o.lazy_timeout_ms == 600000);
  CHECK(o.describe().find("lazy_restore=auto lazy_timeout_ms=600000") != std::string::npos);
}

TEST_CASE("options: lazy_restore from the file and the environment", "[options][lazy]") {
  auto p = parse("lazy_restore = on\nlazy_timeout_ms = 5000\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.lazy_restore == PluginOptions::LazyRestore::kOn);
  CHECK(p.options.lazy_timeout_ms == 5000);
  auto q = parse("lazy_restore = on\n", {{"PHOS_LAZY_RESTORE", "off"}, {"PHOS_LAZY_TIMEOUT_MS", "1"}});
  CHECK(q.warnings.empty());
  CHECK(q.options.lazy_restore == PluginOptions::LazyRestore::kOff);
  CHECK(q.options.lazy_timeout_ms == 1);
}

TEST_CASE("options: bad lazy_restore values warn and keep the defaults", "[options][lazy]") {
  for (const char* line : {"lazy_restore = always", "lazy_restore =", "lazy_timeout_ms = 0", "lazy_timeout_ms = 3600001",
                           "lazy_timeout_ms = 1m"}) {
    INFO(line);
    auto p = parse(line);
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("ignored") != std::string::npos);
    CHECK(p.options.describe() == PluginOptions().describe());
  }
}

TEST_CASE("options: traffic defaults to auto at an assumed 20 GB/s", "[options][traffic]") {
  PluginOptions o;
  CHECK(o.traffic == PluginOptions::Traffic::kAuto);
  CHECK(o.traffic_gbps == 20);
  CHECK(o.describe().find("traffic=auto traffic_gbps=20") != std::string::npos);
}

TEST_CASE("options: traffic and its rate from the file, the variables over it", "[options][traffic]") {
  auto p = parse("traffic = order\ntraffic_gbps = 50\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.traffic == PluginOptions::Traffic::kOrder);
  CHECK(p.options.traffic_gbps == 50);
  auto q = parse("traffic = order\ntraffic_gbps = 50\n", {{"PHOS_TRAFFIC", "off"}, {"PHOS_TRAFFIC_GBPS", "1000"}});
  CHECK(q.warnings.empty());
  CHECK(q.options.traffic == PluginOptions::Traffic::kOff);
  CHECK(q.options.traffic_gbps == 1000);
  CHECK(q.options.describe().find("traffic=off traffic_gbps=1000") != std::string::npos);
  CHECK(parse("traffic = auto\ntraffic_gbps = 1\n").options.traffic_gbps == 1);
}

TEST_CASE("options: bad traffic values warn and keep the defaults", "[options][traffic]") {
  for (const char* line : {"traffic = on", "traffic = always", "traffic =", "traffic_gbps = 0",
                           "traffic_gbps = 1001", "traffic_gbps = 20GB"}) {
    INFO(line);
    auto p = parse(line);
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("ignored") != std::string::npos);
    CHECK(p.options.describe() == PluginOptions().describe());
  }
  CHECK(parse("traffic = yes\n").warnings.at(0) == "phos.conf:1: traffic = yes: expected auto, order or off; ignored");
  auto env = parse("", {{"PHOS_TRAFFIC", "fast"}});
  REQUIRE(env.warnings.size() == 1);
  CHECK(env.warnings[0] == "PHOS_TRAFFIC=fast: expected auto, order or off; ignored");
}

TEST_CASE("options: migration settings default to none", "[options][migrate]") {
  PluginOptions o;
  CHECK(o.migrate_to.empty());
  CHECK(o.migrate_copy == PluginOptions::MigrateCopy::kAuto);
  CHECK(o.migrate_keep_s == 600);
  CHECK(o.describe().find("migrate_to=none migrate_copy=auto migrate_keep_s=600 parent_image=none") != std::string::npos);
}

TEST_CASE("options: migrate_to takes an ordinal or a GPU UUID", "[options][migrate]") {
  auto p = parse("migrate_to = 1\nmigrate_copy = always\nmigrate_keep_s = 30\n");
  CHECK(p.warnings.empty());
  CHECK(p.options.migrate_to == "1");
  CHECK(p.options.migrate_copy == PluginOptions::MigrateCopy::kAlways);
  CHECK(p.options.migrate_keep_s == 30);
  auto q = parse("", {{"PHOS_MIGRATE_TO", "GPU-bb919f8b-1c2d-3e4f-5a6b-7c8d9e0f1a2b"}});
  CHECK(q.warnings.empty());
  CHECK(q.options.migrate_to == "GPU-bb919f8b-1c2d-3e4f-5a6b-7c8d9e0f1a2b");
}

TEST_CASE("options: migrate_to takes a device map", "[options][migrate]") {
  auto p = parse("", {{"PHOS_MIGRATE_TO", "0:1,1:0"}});
  CHECK(p.warnings.empty());
  CHECK(p.options.migrate_to == "0:1,1:0");
}

TEST_CASE("options: a bad migrate_to is warned about and ignored", "[options][migrate]") {
  for (const char* bad : {"gpu1", "0,1", "0-1", "-1"}) {
    INFO(bad);
    auto p = parse(std::string("migrate_to = ") + bad + "\n");
    CHECK(p.options.migrate_to.empty());
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("expected a GPU ordinal or UUID, or a map SRC:DST") != std::string::npos);
  }
  // A malformed map: its entry named.
  auto m = parse("migrate_to = 0:1,1\n");
  CHECK(m.options.migrate_to.empty());
  REQUIRE(m.warnings.size() == 1);
  CHECK(m.warnings[0].find("'1': expected SRC:DST") != std::string::npos);
  auto k = parse("migrate_keep_s = 0\n");
  CHECK(k.options.migrate_keep_s == 600);
  CHECK(k.warnings.size() == 1);
}

TEST_CASE("options: behind_nice is 10 by default, 0..19 from the file or PHOS_BEHIND_NICE", "[options]") {
  CHECK(parse("").options.behind_nice == 10);
  CHECK(parse("behind_nice = 0\n").options.behind_nice == 0);
  CHECK(parse("", {{"PHOS_BEHIND_NICE", "19"}}).options.behind_nice == 19);
  for (const char* bad : {"behind_nice = 20\n", "behind_nice = -1\n", "behind_nice = low\n"}) {
    CAPTURE(bad);
    auto p = parse(bad);
    CHECK(p.options.behind_nice == 10);
    CHECK(p.warnings.size() == 1);
  }
  CHECK(parse("behind_nice = 5\n").options.describe().find("behind_nice=5") != std::string::npos);
}
