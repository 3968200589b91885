#include "phos/plugin/options.h"

#include <fcntl.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <string>

#include "phos/plugin/log.h"
#include "phos/images/image_dir.h"

namespace phos::plugin {
namespace {

// Parses `value` into `out`; "" or what was expected.
using Setter = std::string (*)(PluginOptions& o, std::string_view value);

template <class T>
std::string parse_number(std::string_view value, long long min, long long max, T& out) {
  long long n = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec != std::errc() || end != value.data() + value.size() || n < min || n > max)
    return "expected a whole number in " + std::to_string(min) + ".." + std::to_string(max);
  out = static_cast<T>(n);
  return "";
}

// A setting that takes one of a few words: the words and their values, in
// the order the error message lists them.
template <class T>
struct Choice {
  std::string_view word;
  T value;
};
template <class T, size_t N>
std::string parse_choice(std::string_view v, const Choice<T> (&choices)[N], T& out) {
  std::string expected = "expected ";
  for (size_t i = 0; i < N; i++) {
    if (v == choices[i].word) {
      out = choices[i].value;
      return "";
    }
    expected += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(choices[i].word);
  }
  return expected;
}
template <class T, size_t N>
std::string_view choice_word(const Choice<T> (&choices)[N], T value) {
  for (const auto& c : choices)
    if (c.value == value) return c.word;
  return "?";
}

std::string set_agent_timeout(PluginOptions& o, std::string_view v) {
  return parse_number(v, 1, 3600000, o.agent_timeout_ms);
}
std::string set_job_lease(PluginOptions& o, std::string_view v) {
  return parse_number(v, 100, 3600000, o.job_lease_ms);
}
std::string set_quiesce_timeout(PluginOptions& o, std::string_view v) {
  return parse_number(v, 1, 3600000, o.quiesce_timeout_ms);
}
std::string set_engine_workers(PluginOptions& o, std::string_view v) {
  if (v == "auto") {
    o.engine_workers = 0;
    return "";
  }
  return parse_number(v, 1, 64, o.engine_workers).empty() ? "" : "expected auto or a whole number in 1..64";
}
constexpr Choice<image::DirectIo> kDirectIo[] = {{"auto", image::DirectIo::kAuto}, {"off", image::DirectIo::kOff}};
std::string set_direct_io(PluginOptions& o, std::string_view v) { return parse_choice(v, kDirectIo, o.direct_io); }
constexpr Choice<image::Compression> kCompression[] = {{"none", image::Compression::kNone},
                                                       {"zstd", image::Compression::kZstd}};
std::string set_compression(PluginOptions& o, std::string_view v) { return parse_choice(v, kCompression, o.compression); }
std::string set_zstd_level(PluginOptions& o, std::string_view v) { return parse_number(v, 1, 19, o.zstd_level); }
std::string set_chunk_mib(PluginOptions& o, std::string_view v) {
  return parse_number(v, 1, image::kMaxChunkSize >> 20, o.chunk_mib);
}

constexpr Choice<bool> kOnOff[] = {{"on", true}, {"off", false}};
std::string set_gpu_checksums(PluginOptions& o, std::string_view v) { return parse_choice(v, kOnOff, o.gpu_checksums); }
std::string set_driver_parallel(PluginOptions& o, std::string_view v) { return parse_choice(v, kOnOff, o.driver_parallel); }
std::string set_restore_overlap(PluginOptions& o, std::string_view v) { return parse_choice(v, kOnOff, o.restore_overlap); }
constexpr Choice<bool> kCowZero[] = {{"settle", true}, {"copy", false}};
std::string set_cow_zero(PluginOptions& o, std::string_view v) { return parse_choice(v, kCowZero, o.cow_zero_settle); }
std::string set_behind_nice(PluginOptions& o, std::string_view v) { return parse_number(v, 0, 19, o.behind_nice); }

constexpr Choice<bool> kAutoOff[] = {{"auto", true}, {"off", false}};
std::string set_write_behind(PluginOptions& o, std::string_view v) { return parse_choice(v, kAutoOff, o.write_behind); }

constexpr Choice<image::Sparse> kSparse[] = {{"auto", image::Sparse::kAuto}, {"off", image::Sparse::kOff}};
std::string set_sparse(PluginOptions& o, std::string_view v) { return parse_choice(v, kSparse, o.sparse); }

std::string set_gpu_map(PluginOptions& o, std::string_view v) {
  auto spec = parse_gpu_map(v);
  if (!spec) return spec.error().message;
  o.gpu_map = std::move(*spec);
  return "";
}

using Cow = PluginOptions::CopyOnWrite;
using CowStart = PluginOptions::CowStart;
constexpr Choice<Cow> kCopyOnWrite[] = {{"auto", Cow::kAuto}, {"always", Cow::kAlways}, {"off", Cow::kOff}};
constexpr Choice<agent::CopyTrust> kCowTrust[] = {{"exact", agent::CopyTrust::kExact},
                                                  {"speculated", agent::CopyTrust::kSpeculated},
                                                  {"validated", agent::CopyTrust::kValidated},
                                                  {"checksum", agent::CopyTrust::kChecksum}};
constexpr Choice<CowStart> kCowStart[] = {{"resume", CowStart::kResume}, {"pause", CowStart::kPause}};

std::string set_copy_on_write(PluginOptions& o, std::string_view v) { return parse_choice(v, kCopyOnWrite, o.copy_on_write); }
std::string set_cow_pool_mib(PluginOptions& o, std::string_view v) {
  if (v == "auto") {
    o.cow_pool_mib = PluginOptions::kCowPoolAuto;
    return "";
  }
  return parse_number(v, 0, 1 << 20, o.cow_pool_mib).empty() ? "" : "expected auto or a whole number in 0..1048576";
}
std::string set_cow_trust(PluginOptions& o, std::string_view v) { return parse_choice(v, kCowTrust, o.cow_trust); }
std::string set_cow_timeout(PluginOptions& o, std::string_view v) {
  return parse_number(v, 1, 3600000, o.cow_timeout_ms);
}
std::string set_cow_start(PluginOptions& o, std::string_view v) { return parse_choice(v, kCowStart, o.cow_start); }
std::string set_recopy(PluginOptions& o, std::string_view v) { return parse_choice(v, kAutoOff, o.recopy); }
std::string set_recopy_pass_ms(PluginOptions& o, std::string_view v) {
  return parse_number(v, 0, 3600000, o.recopy_pass_ms);
}
std::string set_recopy_min_mib(PluginOptions& o, std::string_view v) {
  return parse_number(v, 0, 1 << 24, o.recopy_min_mib);
}

using Traffic = PluginOptions::Traffic;
constexpr Choice<Traffic> kTraffic[] = {{"auto", Traffic::kAuto}, {"order", Traffic::kOrder}, {"off", Traffic::kOff}};
std::string set_traffic(PluginOptions& o, std::string_view v) { return parse_choice(v, kTraffic, o.traffic); }
std::string set_traffic_gbps(PluginOptions& o, std::string_view v) { return parse_number(v, 1, 1000, o.traffic_gbps); }

using LazyRestore = PluginOptions::LazyRestore;
constexpr Choice<LazyRestore> kLazyRestore[] = {
    {"auto", LazyRestore::kAuto}, {"on", LazyRestore::kOn}, {"off", LazyRestore::kOff}};
std::string set_lazy_restore(PluginOptions& o, std::string_view v) { return parse_choice(v, kLazyRestore, o.lazy_restore); }
std::string set_lazy_timeout(PluginOptions& o, std::string_view v) { return parse_number(v, 1, 3600000, o.lazy_timeout_ms); }

std::string set_parent_image(PluginOptions& o, std::string_view v) {
  if (v.find('\0') != std::string_view::npos) return "expected a directory";
  o.parent_image = std::string(v);
  return "";
}

std::string set_migrate_to(PluginOptions& o, std::string_view v) {
  if (is_migration_map(v)) {
    if (auto map = parse_migration_map(v); !map) return map.error().message;
  } else if (!is_gpu_key(v)) {
    return "expected a GPU ordinal or UUID, or a map SRC:DST[,SRC:DST...]";
  }
  o.migrate_to = std::string(v);
  return "";
}
using MigrateCopy = PluginOptions::MigrateCopy;
constexpr Choice<MigrateCopy> kMigrateCopy[] = {{"auto", MigrateCopy::kAuto}, {"always", MigrateCopy::kAlways}};
std::string set_migrate_copy(PluginOptions& o, std::string_view v) { return parse_choice(v, kMigrateCopy, o.migrate_copy); }
std::string set_migrate_keep_s(PluginOptions& o, std::string_view v) { return parse_number(v, 1, 86400, o.migrate_keep_s); }

struct Key {
  const char* name;  // in the file
  const char* env;   // its environment variable
  Setter set;
};

constexpr Key kKeys[] = {
    {"agent_timeout_ms", "PHOS_AGENT_TIMEOUT_MS", set_agent_timeout},
    {"quiesce_timeout_ms", "PHOS_QUIESCE_TIMEOUT_MS", set_quiesce_timeout},
    {"engine_workers", "PHOS_ENGINE_WORKERS", set_engine_workers},
    {"direct_io", "PHOS_DIRECT_IO", set_direct_io},
    {"compression", "PHOS_COMPRESSION", set_compression},
    {"zstd_level", "PHOS_ZSTD_LEVEL", set_zstd_level},
    {"chunk_mib", "PHOS_CHUNK_MIB", set_chunk_mib},
    {"gpu_map", "PHOS_GPU_MAP", set_gpu_map},
    {"gpu_checksums", "PHOS_GPU_CHECKSUMS", set_gpu_checksums},
    {"driver_parallel", "PHOS_DRIVER_PARALLEL", set_driver_parallel},
    {"restore_overlap", "PHOS_RESTORE_OVERLAP", set_restore_overlap},
    {"write_behind", "PHOS_WRITE_BEHIND", set_write_behind},
    {"copy_on_write", "PHOS_COPY_ON_WRITE", set_copy_on_write},
    {"cow_pool_mib", "PHOS_COW_POOL_MIB", set_cow_pool_mib},
    {"cow_trust", "PHOS_COW_TRUST", set_cow_trust},
    {"cow_timeout_ms", "PHOS_COW_TIMEOUT_MS", set_cow_timeout},
    {"cow_start", "PHOS_COW_START", set_cow_start},
    {"cow_zero", "PHOS_COW_ZERO", set_cow_zero},
    {"behind_nice", "PHOS_BEHIND_NICE", set_behind_nice},
    {"recopy", "PHOS_RECOPY", set_recopy},
    {"recopy_pass_ms", "PHOS_RECOPY_PASS_MS", set_recopy_pass_ms},
    {"recopy_min_mib", "PHOS_RECOPY_MIN_MIB", set_recopy_min_mib},
    {"traffic", "PHOS_TRAFFIC", set_traffic},
    {"traffic_gbps", "PHOS_TRAFFIC_GBPS", set_traffic_gbps},
    {"sparse", "PHOS_SPARSE", set_sparse},
    {"lazy_restore", "PHOS_LAZY_RESTORE", set_lazy_restore},
    {"lazy_timeout_ms", "PHOS_LAZY_TIMEOUT_MS", set_lazy_timeout},
    {"migrate_to", "PHOS_MIGRATE_TO", set_migrate_to},
    {"parent_image", "PHOS_PARENT_IMAGE", set_parent_image},
    {"migrate_copy", "PHOS_MIGRATE_COPY", set_migrate_copy},
    {"migrate_keep_s", "PHOS_MIGRATE_KEEP_S", set_migrate_keep_s},
    {"job_lease_ms", "PHOS_JOB_LEASE_MS", set_job_lease},
};

const Key* find_key(std::string_view name) {
  for (const Key& k : kKeys)
    if (name == k.name) return &k;
  return nullptr;
}

std::string_view trim(std::string_view s) {
  const char* space = " \t\r";
  size_t b = s.find_first_not_of(space);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(space) - b + 1);
}

// One line of the file; "" or what is wrong with it.
std::string apply_line(PluginOptions& o, std::string_view line) {
  line = trim(line.substr(0, line.find('#')));
  if (line.empty()) return "";
  size_t eq = line.find('=');
  if (eq == std::string_view::npos) return "expected key = value";
  std::string_view name = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
  const Key* key = find_key(name);
  if (!key) return "unknown key '" + std::string(name) + "'";
  std::string bad = key->set(o, value);
  return bad.empty() ? "" : std::string(name) + " = " + std::string(value) + ": " + bad;
}

void apply_file(PluginOptions& o, std::string_view text, const std::string& name, std::vector<std::string>& warnings) {
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    line_no++;
    std::string bad = apply_line(o, line);
    if (!bad.empty()) warnings.push_back(name + ":" + std::to_string(line_no) + ": " + bad + "; ignored");
  }
}

void apply_env(PluginOptions& o, const PluginOptions::GetEnv& getenv, std::vector<std::string>& warnings) {
  for (const Key& k : kKeys) {
    const char* v = getenv(k.env);
    if (!v || !*v) continue;
    PluginOptions candidate = o;  // a bad value leaves the setting as it was
    std::string bad = k.set(candidate, trim(v));
    if (bad.empty()) o = candidate;
    else warnings.push_back(std::string(k.env) + "=" + v + ": " + bad + "; ignored");
  }
}

// The file's text; "" for a missing file (a warning for one that cannot be read).
std::string read_config(const std::string& path, std::vector<std::string>& warnings) {
  auto bytes = image::read_small_file(AT_FDCWD, path, 1 << 20);
  if (!bytes) {
    if (bytes.error().code != ENOENT) warnings.push_back(bytes.error().message + "; ignored");
    return "";
  }
  return std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
}

}  // namespace

PluginOptions PluginOptions::parse(std::string_view config_text, const std::string& config_name,
                                   const GetEnv& getenv, std::vector<std::string>& warnings) {
  PluginOptions o;
  apply_file(o, config_text, config_name, warnings);
  apply_env(o, getenv, warnings);
  return o;
}

PluginOptions PluginOptions::load() {
  const char* named = std::getenv("PHOS_CONFIG");
  std::string path = named && *named ? named : kDefaultConfigPath;
  std::vector<std::string> warnings;
  std::string text = read_config(path, warnings);
  PluginOptions o = parse(text, path, [](const char* name) { return std::getenv(name); }, warnings);
  for (const auto& w : warnings) PHOS_WARN("settings: %s", w.c_str());
  PHOS_INFO("settings (%s, then PHOS_* variables): %s", path.c_str(), o.describe().c_str());
  return o;
}

std::string PluginOptions::describe() const {
  return "agent_timeout_ms=" + std::to_string(agent_timeout_ms) +
         " quiesce_timeout_ms=" + std::to_string(quiesce_timeout_ms) +
         " engine_workers=" + (engine_workers ? std::to_string(engine_workers) : std::string("auto")) +
         " direct_io=" + std::string(choice_word(kDirectIo, direct_io)) +
         " compression=" + std::string(image::chunk_compression_name(compression)) +
         " zstd_level=" + std::to_string(zstd_level) + " chunk_mib=" + std::to_string(chunk_mib) +
         " gpu_map=" + describe_gpu_map(gpu_map) + " gpu_checksums=" + std::string(choice_word(kOnOff, gpu_checksums)) +
         " driver_parallel=" + std::string(choice_word(kOnOff, driver_parallel)) +
         " restore_overlap=" + std::string(choice_word(kOnOff, restore_overlap)) +
         " write_behind=" + std::string(choice_word(kAutoOff, write_behind)) +
         " copy_on_write=" + std::string(choice_word(kCopyOnWrite, copy_on_write)) +
         " cow_pool_mib=" +
         (cow_pool_mib == kCowPoolAuto ? std::string("auto") : std::to_string(cow_pool_mib)) +
         " cow_trust=" + std::string(choice_word(kCowTrust, cow_trust)) +
         " cow_timeout_ms=" + std::to_string(cow_timeout_ms) +
         " cow_start=" + std::string(choice_word(kCowStart, cow_start)) +
         " cow_zero=" + std::string(choice_word(kCowZero, cow_zero_settle)) +
         " behind_nice=" + std::to_string(behind_nice) +
         " recopy=" + std::string(choice_word(kAutoOff, recopy)) + " recopy_pass_ms=" + std::to_string(recopy_pass_ms) +
         " recopy_min_mib=" + std::to_string(recopy_min_mib) +
         " traffic=" + std::string(choice_word(kTraffic, traffic)) + " traffic_gbps=" + std::to_string(traffic_gbps) +
         " sparse=" + std::string(choice_word(kSparse, sparse)) +
         " lazy_restore=" + std::string(choice_word(kLazyRestore, lazy_restore)) +
         " lazy_timeout_ms=" + std::to_string(lazy_timeout_ms) +
         " migrate_to=" + (migrate_to.empty() ? std::string("none") : migrate_to) +
         " migrate_copy=" + std::string(choice_word(kMigrateCopy, migrate_copy)) +
         " migrate_keep_s=" + std::to_string(migrate_keep_s) +
         " parent_image=" + (parent_image.empty() ? std::string("none") : parent_image) +
         " job_lease_ms=" + std::to_string(job_lease_ms);
}

}  // namespace phos::plugin
