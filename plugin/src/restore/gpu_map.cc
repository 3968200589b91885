#include "phos/plugin/gpu_map.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace phos::plugin {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_ordinal(std::string_view s) {
  if (s.empty() || s.size() > 4) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

bool is_uuid(std::string_view s) { return s.size() == 40 && s.substr(0, 4) == "GPU-"; }

// "A<sep>B[,A<sep>B...]", each side a GPU key, <sep> one of `seps`;
// `shape` names the form in errors ("OLD=NEW").
Result<GpuMapSpec> parse_pairs(std::string_view spec, const char* seps, const char* shape) {
  GpuMapSpec out;
  while (!trim(spec).empty()) {
    size_t comma = spec.find(',');
    std::string_view item = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    size_t at = item.find_first_of(seps);
    if (at == std::string_view::npos)
      return make_error("GPU map entry '" + std::string(item) + "': expected " + shape, EINVAL);
    std::string_view from = trim(item.substr(0, at)), to = trim(item.substr(at + 1));
    for (std::string_view side : {from, to})
      if (!is_gpu_key(side))
        return make_error("GPU map entry '" + std::string(item) + "': '" + std::string(side) +
                              "' is neither an ordinal nor a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                          EINVAL);
    out.push_back({std::string(from), std::string(to)});
  }
  return out;
}

}  // namespace

Result<GpuMapSpec> parse_gpu_map(std::string_view spec) { return parse_pairs(spec, "=", "OLD=NEW"); }

// ':' or '=' (as gpu_map writes its pairs).
bool is_migration_map(std::string_view spec) { return spec.find_first_of(":=") != std::string_view::npos; }

Result<GpuMapSpec> parse_migration_map(std::string_view spec) {
  if (trim(spec).empty()) return make_error("an empty GPU map (expected SRC:DST[,SRC:DST...])", EINVAL);
  return parse_pairs(spec, ":=", "SRC:DST");
}

std::string describe_migration_map(const GpuMapSpec& spec) {
  std::string out;
  for (const auto& e : spec) out += (out.empty() ? "" : ",") + e.from + ":" + e.to;
  return out;
}

namespace {

// The single-GPU form: every GPU of the process (one at most) to `key`.
Result<std::map<int, int>> single_target(const std::string& key, const std::set<int>& sources,
                                         const std::vector<GpuDevice>& host) {
  const GpuDevice* target = find_host_gpu(key, host);
  if (!target) return make_error("this host has no GPU " + key, ENODEV);
  if (sources.size() > 1)
    return make_error("the process uses " + std::to_string(sources.size()) +
                          " GPUs: name a target for each (SRC:DST,..., phosctl migrate --gpu-map)",
                      EINVAL);
  std::map<int, int> out;
  for (int s : sources) out[s] = int(target->ordinal);
  return out;
}

}  // namespace

Result<std::map<int, int>> migration_targets(const std::string& migrate_to, const std::set<int>& sources,
                                             const std::vector<GpuDevice>& host) {
  std::map<int, int> out;
  if (!is_migration_map(migrate_to)) {
    auto single = single_target(migrate_to, sources, host);
    if (!single) return single.error();
    out = std::move(*single);
  } else {
    auto spec = parse_migration_map(migrate_to);
    if (!spec) return spec.error();
    std::map<int, std::string> target_of;  // target ordinal -> the entry that names it
    std::set<int> named;
    for (const auto& e : *spec) {
      const GpuDevice* from = find_host_gpu(e.from, host);
      const GpuDevice* to = find_host_gpu(e.to, host);
      const std::string entry = "GPU map entry " + e.from + ":" + e.to;
      if (!from || !to)
        return make_error(entry + ": this host has no GPU " + (from ? e.to : e.from) + " (it has " +
                              std::to_string(host.size()) + ")",
                          ENODEV);
      if (!named.insert(int(from->ordinal)).second)
        return make_error(entry + ": GPU " + std::to_string(from->ordinal) + " is mapped twice", EINVAL);
      if (auto [it, fresh] = target_of.emplace(int(to->ordinal), e.from + ":" + e.to); !fresh)
        return make_error(entry + ": GPU " + std::to_string(to->ordinal) + " is already the target of " + it->second +
                              "; the map must be one-to-one",
                          EINVAL);
      if (sources.count(int(from->ordinal))) out[int(from->ordinal)] = int(to->ordinal);
    }
    for (int s : sources)
      if (!out.count(s))
        return make_error("the process uses GPU " + std::to_string(s) + ", which the GPU map " +
                              describe_migration_map(*spec) + " leaves unmapped",
                          EINVAL);
  }
  for (auto [s, t] : out)
    if (size_t(s) >= host.size() || host[size_t(s)].name != host[size_t(t)].name)
      return make_error("the process's GPU " + std::to_string(s) + " is a " +
                            (size_t(s) < host.size() ? host[size_t(s)].name : std::string("GPU this host lacks")) +
                            ", GPU " + std::to_string(t) + " a " + host[size_t(t)].name +
                            "; the driver restores onto the same model",
                        ENODEV);
  return out;
}

std::string describe_gpu_map(const GpuMapSpec& spec) {
  std::string out;
  for (const auto& e : spec) out += (out.empty() ? "" : ",") + e.from + "=" + e.to;
  return out.empty() ? "none" : out;
}

std::string format_gpu_uuid(const std::array<uint8_t, 16>& u) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

bool is_gpu_key(std::string_view key) { return is_ordinal(key) || is_uuid(key); }

int host_device(const std::map<uint32_t, int>& host_ordinal, uint32_t ordinal) {
  auto it = host_ordinal.find(ordinal);
  return it == host_ordinal.end() ? int(ordinal) : it->second;
}

const GpuDevice* find_host_gpu(const std::string& key, const std::vector<GpuDevice>& host) {
  for (const auto& h : host)
    if (key == std::to_string(h.ordinal) || key == format_gpu_uuid(h.uuid)) return &h;
  return nullptr;
}

Result<std::map<uint32_t, int>> host_ordinals(const std::vector<GpuDevice>& devices,
                                              const std::vector<GpuDevice>& host) {
  std::map<uint32_t, int> out;
  for (const auto& d : devices) {
    const GpuDevice* found = nullptr;
    for (const auto& h : host)
      if (h.uuid == d.uuid) found = &h;
    if (!found)
      return make_error("the process's device " + std::to_string(d.ordinal) + " is " + format_gpu_uuid(d.uuid) +
                            ", which criu does not see (CUDA_VISIBLE_DEVICES set for criu?)",
                        ENODEV);
    out[d.ordinal] = int(found->ordinal);
  }
  return out;
}

Result<std::vector<GpuPlacement>> place_gpus(const GpuMapSpec& spec, const std::vector<GpuDevice>& image_devices,
                                             const std::vector<GpuDevice>& host, const std::string& manifest_name) {
  auto image_matches = [](const GpuDevice& d, const std::string& key) {
    return key == std::to_string(d.ordinal) || key == format_gpu_uuid(d.uuid);
  };
  for (const auto& e : spec) {
    bool known = false;
    for (const auto& d : image_devices) known = known || image_matches(d, e.from);
    if (!known && !is_ordinal(e.from))  // an ordinal the image does not use is harmless
      return make_error(manifest_name + ": GPU map names " + e.from + ", which the image does not have", ENODEV);
  }
  std::vector<GpuPlacement> out;
  std::set<int> taken;
  for (const auto& d : image_devices) {
    // By default the GPU itself where this host has it (its ordinal here
    // may differ: CUDA_VISIBLE_DEVICES), else the same ordinal.
    std::string target = std::to_string(d.ordinal);
    for (const auto& h : host)
      if (h.uuid == d.uuid) target = format_gpu_uuid(d.uuid);
    for (const auto& e : spec)
      if (image_matches(d, e.from)) target = e.to;
    const GpuDevice* h = find_host_gpu(target, host);
    std::string which = "device " + std::to_string(d.ordinal) + " (" + d.name + ")";
    if (!h) return make_error(manifest_name + ": " + which + ": this host has no GPU " + target, ENODEV);
    if (h->name != d.name)
      return make_error(manifest_name + ": the image's " + which + " would go to GPU " + std::to_string(h->ordinal) +
                            " here, a " + h->name + "; restoring needs the same model",
                        ENODEV);
    if (!taken.insert(int(h->ordinal)).second)
      return make_error(manifest_name + ": two of the image's GPUs would go to GPU " + std::to_string(h->ordinal),
                        EINVAL);
    out.push_back(
        {.image_ordinal = d.ordinal, .host_ordinal = int(h->ordinal), .image_uuid = d.uuid, .host_uuid = h->uuid});
  }
  return out;
}

bool image_stays_on_its_gpus(const std::vector<GpuDevice>& image_devices,
                             const std::vector<std::array<uint8_t, 16>>& kernel_gpus, bool gpu_map_given,
                             bool criu_sees_all) {
  if (gpu_map_given || !criu_sees_all || image_devices.empty()) return false;
  for (const auto& d : image_devices)
    if (std::find(kernel_gpus.begin(), kernel_gpus.end(), d.uuid) == kernel_gpus.end()) return false;
  return true;
}

std::optional<std::array<uint8_t, 16>> parse_gpu_uuid(std::string_view s) {
  s = trim(s);
  if (!is_uuid(s)) return std::nullopt;
  std::array<uint8_t, 16> out{};
  size_t got = 0;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 4; i < s.size(); i++) {
    if (s[i] == '-') continue;
    if (i + 1 >= s.size() || got == 16) return std::nullopt;
    int hi = nibble(s[i]), lo = nibble(s[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[got++] = uint8_t(hi << 4 | lo);
    i++;
  }
  if (got != 16) return std::nullopt;
  return out;
}

std::vector<std::array<uint8_t, 16>> kernel_driver_gpus(const std::string& dir) {
  std::vector<std::array<uint8_t, 16>> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream info(entry.path() / "information");
    std::string line;
    while (std::getline(info, line))
      if (line.rfind("GPU UUID:", 0) == 0) {
        if (auto u = parse_gpu_uuid(std::string_view(line).substr(9))) out.push_back(*u);
        break;
      }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::array<uint8_t, 16>, std::array<uint8_t, 16>>> driver_gpu_pairs(
    const std::vector<GpuPlacement>& placement, const std::vector<GpuDevice>& host,
    const std::vector<std::array<uint8_t, 16>>& hidden) {
  bool moved = false;
  for (const auto& p : placement) moved = moved || p.moved();
  if (!moved) return {};
  std::map<std::array<uint8_t, 16>, std::array<uint8_t, 16>> to;  // old -> new
  std::set<std::array<uint8_t, 16>> targets;
  for (const auto& p : placement) {
    to[p.image_uuid] = p.host_uuid;
    targets.insert(p.host_uuid);
  }
  std::vector<std::array<uint8_t, 16>> unplaced;
  for (const auto& h : host)
    if (!to.count(h.uuid)) unplaced.push_back(h.uuid);
  std::vector<std::array<uint8_t, 16>> free_targets;
  for (const auto& h : host)
    if (!targets.count(h.uuid)) free_targets.push_back(h.uuid);
  // Unplaced GPUs keep their own place where it is free, else take the
  // first free one left.
  for (const auto& u : unplaced)
    if (!targets.count(u)) {
      to[u] = u;
      targets.insert(u);
      std::erase(free_targets, u);
    }
  for (const auto& u : unplaced)
    if (!to.count(u) && !free_targets.empty()) {
      to[u] = free_targets.front();
      free_targets.erase(free_targets.begin());
    }
  std::vector<std::pair<std::array<uint8_t, 16>, std::array<uint8_t, 16>>> out;
  for (const auto& h : host)
    if (to.count(h.uuid)) out.emplace_back(h.uuid, to[h.uuid]);
  for (const auto& p : placement)  // image GPUs this host lacks (uuid differs)
    if (std::none_of(host.begin(), host.end(), [&](const GpuDevice& h) { return h.uuid == p.image_uuid; }))
      out.emplace_back(p.image_uuid, p.host_uuid);
  for (const auto& u : hidden)  // stay where they are, unless named already
    if (std::none_of(out.begin(), out.end(), [&](const auto& pair) { return pair.first == u || pair.second == u; }))
      out.emplace_back(u, u);
  return out;
}

}  // namespace phos::plugin
