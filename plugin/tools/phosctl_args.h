// The command lines of phosctl's subcommands (job, periodic, supervise):
// options of the form --name VALUE or --flag, positional arguments, then
// `--` and what follows it (criu's arguments, or a command).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace phosctl {

struct Args {
  std::multimap<std::string, std::string> values;  // a repeated option keeps each value, in order
  std::vector<std::string> positional;
  std::vector<std::string> rest;  // after `--`
  bool flag(const std::string& name) const { return values.count(name) > 0; }
  // The option's last value; empty where it is not given.
  std::string one(const std::string& name) const;
  // "bad option NAME" for the first option not in `known`; empty if none.
  std::string unknown(const std::vector<std::string>& known) const;
};

// `flags` take no value; at most `max_positional` arguments without `--`.
// Nothing where the line is wrong, `error` saying why.
std::optional<Args> parse_args(const std::vector<std::string>& args, const std::vector<std::string>& flags,
                               size_t max_positional, std::string& error);

// `text` as a whole decimal number in [min, max].
bool number(const std::string& text, long min, long max, long& out);

}  // namespace phosctl
