#include "phos/images/format.h"

#include <charconv>

namespace phos::image {

std::string manifest_file_name(int32_t pid) { return "phos-" + std::to_string(pid) + "-manifest.img"; }
std::string marker_file_name(int32_t pid) { return "phos-" + std::to_string(pid) + "-complete.img"; }
std::string data_file_name(int32_t pid, uint32_t index) {
  return "phos-" + std::to_string(pid) + "-data-" + std::to_string(index) + ".img";
}

std::optional<int32_t> pid_of_manifest_file(std::string_view name) {
  constexpr std::string_view prefix = "phos-", suffix = "-manifest.img";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
    return std::nullopt;
  std::string_view digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  int32_t pid = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) return std::nullopt;
  return pid;
}

bool is_safe_data_file_name(std::string_view name) {
  return name.starts_with("phos-") && name.ends_with(".img") && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos && name.size() < 256;
}

std::string_view writer_version() { return PHOS_VERSION; }

}  // namespace phos::image
