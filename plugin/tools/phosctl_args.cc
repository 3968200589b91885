#include "phosctl_args.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>

namespace phosctl {

std::string Args::one(const std::string& name) const {
  auto [from, to] = values.equal_range(name);
  return from == to ? std::string() : std::prev(to)->second;
}

std::string Args::unknown(const std::vector<std::string>& known) const {
  for (const auto& [name, value] : values)
    if (std::find(known.begin(), known.end(), name) == known.end()) return "bad option " + name;
  return {};
}

std::optional<Args> parse_args(const std::vector<std::string>& args, const std::vector<std::string>& flags,
                               size_t max_positional, std::string& error) {
  Args out;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a == "--") {
      out.rest.assign(args.begin() + long(i) + 1, args.end());
      break;
    }
    if (a.rfind("--", 0) != 0) {
      if (out.positional.size() >= max_positional) {
        error = "unexpected argument " + a;
        return std::nullopt;
      }
      out.positional.push_back(a);
    } else if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
      out.values.emplace(a, "");
    } else if (i + 1 < args.size()) {
      out.values.emplace(a, args[++i]);
    } else {
      error = a + " needs a value";
      return std::nullopt;
    }
  }
  return out;
}

bool number(const std::string& text, long min, long max, long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtol(text.c_str(), &end, 10);
  return !text.empty() && !*end && errno == 0 && out >= min && out <= max;
}

}  // namespace phosctl
