#include "phos/plugin/job_env.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace phos::plugin {

std::chrono::seconds job_timeout() {
  const char* v = std::getenv(kJobTimeoutEnv);
  const long s = v ? std::strtol(v, nullptr, 10) : 0;
  return std::chrono::seconds(s > 0 && s <= 86400 ? s : 120);
}

std::string run_hex(uint64_t run) {
  char b[24];
  std::snprintf(b, sizeof(b), "%016" PRIx64, run);
  return b;
}

Result<uint64_t> parse_run_hex(const std::string& text) {
  char* end = nullptr;
  const uint64_t v = std::strtoull(text.c_str(), &end, 16);
  if (text.empty() || text.size() > 16 || *end || v == 0)
    return make_error("'" + text + "' is not a run (1 to 16 hexadecimal digits, not 0)", EINVAL);
  return v;
}

std::string JobRun::text() const {
  return run_hex(run) + ":" + std::to_string(host) + "/" + std::to_string(hosts) + "@" + coordinator.text();
}

Result<std::optional<JobRun>> parse_job_run(const char* value) {
  if (!value || !*value) return std::optional<JobRun>();
  const std::string v(value);
  auto bad = [&](const std::string& why) {
    return make_error(std::string(kJobEnv) + "=" + v + ": " + why +
                          " (expected RUN:HOST/HOSTS@HOST:PORT, as phosctl job sets it)",
                      EINVAL);
  };
  const size_t colon = v.find(':'), slash = v.find('/'), at = v.find('@');
  if (colon == std::string::npos || slash == std::string::npos || at == std::string::npos || !(colon < slash) ||
      !(slash < at))
    return bad("not of the form");
  JobRun j;
  auto run = parse_run_hex(v.substr(0, colon));
  if (!run) return bad(run.error().message);
  j.run = *run;
  char* end = nullptr;
  const std::string host = v.substr(colon + 1, slash - colon - 1), hosts = v.substr(slash + 1, at - slash - 1);
  j.host = int(std::strtol(host.c_str(), &end, 10));
  if (host.empty() || *end) return bad("the host index '" + host + "' is not a number");
  j.hosts = int(std::strtol(hosts.c_str(), &end, 10));
  if (hosts.empty() || *end || j.hosts < 1 || j.hosts > 4096) return bad("the host count '" + hosts + "' is not 1..4096");
  if (j.host < 0 || j.host >= j.hosts) return bad("host index " + host + " is not below the host count " + hosts);
  auto coordinator = net::parse_host_port(v.substr(at + 1));
  if (!coordinator) return bad(coordinator.error().message);
  j.coordinator = *coordinator;
  return std::optional<JobRun>(j);
}

const Result<std::optional<JobRun>>& job_run_of_process() {
  static const Result<std::optional<JobRun>> parsed = parse_job_run(std::getenv(kJobEnv));
  return parsed;
}

}  // namespace phos::plugin
