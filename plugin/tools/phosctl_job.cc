// phosctl job: checkpoints and restores of a job whose ranks run on
// several hosts (job_driver.h, job_step.h).
#include "phosctl_job.h"
#include "phosctl_args.h"
#include "phos/support/text.h"

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "phos/plugin/job_driver.h"
#include "phos/plugin/job_env.h"
#include "phos/plugin/job_step.h"
#include "phos/plugin/options.h"

namespace {

using phos::plugin::DriverOptions;
using phos::plugin::StepOptions;
using phosctl::Args;
using phosctl::number;

constexpr const char* kJobUsage =
    "usage: phosctl job dump --hosts N --via TEMPLATE --pid I:PID... --dir DIR --lib LIBDIR --listen HOST[:PORT]\n"
    "                        [--leave-running] [--criu CRIU] [--phosctl PATH] [--vote PATH] [--timeout S]\n"
    "                        [-- CRIU_ARGS...]\n"
    "       phosctl job restore --hosts N --via TEMPLATE --dir DIR --lib LIBDIR --listen HOST[:PORT]\n"
    "                        [--criu CRIU] [--phosctl PATH] [--timeout S] [-- CRIU_ARGS...]\n"
    "  Checkpoint (restore) a job whose ranks run on N hosts, each host's tree dumped (restored) by its own\n"
    "  criu. TEMPLATE runs a host's step: {i} is the host's index, {cmd} the step's command line, e.g.\n"
    "  'ssh node{i} {cmd}' or 'ip netns exec h{i} {cmd}'; '-' prints the steps for node agents to run.\n"
    "  PID: host I's tree root as that host sees it. DIR: each host's image directory ({i} expands).\n"
    "  HOST: this machine's address as every host reaches it (the coordination store's).\n"
    "       phosctl job host-dump --run R --host I --hosts N --coordinator HOST:PORT --pid PID --dir DIR\n"
    "                        --lib LIBDIR --vote PATH [--criu CRIU] [--timeout S] [--leave-running] [-- CRIU_ARGS...]\n"
    "       phosctl job host-restore --run R --host I --hosts N --coordinator HOST:PORT --dir DIR --lib LIBDIR\n"
    "                        [--criu CRIU] [--timeout S] [-- CRIU_ARGS...]\n"
    "  One host's step (what the driver runs through TEMPLATE).\n";

int usage(const std::string& why) {
  std::fprintf(stderr, "phosctl job: %s\n%s", why.c_str(), kJobUsage);
  return 2;
}

// The names every command needs, said at once where missing.
std::string missing(const Args& a, std::initializer_list<const char*> names) {
  std::string out;
  for (const char* n : names)
    if (a.one(n).empty()) phos::append_item(out, ", ", n);
  return out;
}

std::optional<phos::net::HostPort> listen_address(const std::string& text, std::string& error) {
  if (text.find(':') == std::string::npos || text.ends_with(":0")) {
    const std::string host = text.substr(0, text.find(':'));
    if (host.empty()) return error = "--listen names no host", std::nullopt;
    return phos::net::HostPort{host, 0};
  }
  auto hp = phos::net::parse_host_port(text);
  if (!hp) return error = "--listen: " + hp.error().message, std::nullopt;
  return *hp;
}

int driver(const std::string& kind, const std::vector<std::string>& args) {
  std::string error;
  auto a = phosctl::parse_args(args, {"--leave-running"}, 0, error);
  if (!a) return usage(error);
  const bool dump = kind == "dump";
  if (auto m = missing(*a, {"--hosts", "--via", "--dir", "--lib", "--listen"}); !m.empty()) return usage("needs " + m);
  DriverOptions o;
  long n = 0;
  if (!number(a->one("--hosts"), 1, 4096, n)) return usage("--hosts " + a->one("--hosts") + " is not 1..4096");
  o.hosts = int(n);
  o.via = a->one("--via");
  o.dir = a->one("--dir");
  o.lib = a->one("--lib");
  auto listen = listen_address(a->one("--listen"), error);
  if (!listen) return usage(error);
  o.listen = *listen;
  if (!a->one("--criu").empty()) o.criu = a->one("--criu");
  o.phosctl = a->one("--phosctl");
  o.vote = a->one("--vote");
  o.leave_running = a->flag("--leave-running");
  if (!a->one("--timeout").empty()) {
    if (!number(a->one("--timeout"), 1, 86400, n)) return usage("--timeout " + a->one("--timeout") + " is not 1..86400 s");
    o.timeout = std::chrono::seconds(n);
  }
  o.criu_args = a->rest;
  if (dump) {
    auto [from, to] = a->values.equal_range("--pid");
    for (auto it = from; it != to; ++it) {
      const size_t colon = it->second.find(':');
      long host = 0, pid = 0;
      if (colon == std::string::npos || !number(it->second.substr(0, colon), 0, o.hosts - 1, host) ||
          !number(it->second.substr(colon + 1), 1, 1 << 30, pid))
        return usage("--pid " + it->second + " is not I:PID with I below --hosts");
      if (!o.pids.emplace(int(host), pid_t(pid)).second) return usage("--pid names host " + std::to_string(host) + " twice");
    }
    if (int(o.pids.size()) != o.hosts) return usage("--pid I:PID is needed for each of the " + std::to_string(o.hosts) + " hosts");
    return phos::plugin::run_job_dump(o);
  }
  if (a->flag("--leave-running") || a->values.count("--pid")) return usage("a restore takes no --pid or --leave-running");
  return phos::plugin::run_job_restore(o);
}

int step(const std::string& kind, const std::vector<std::string>& args) {
  std::string error;
  auto a = phosctl::parse_args(args, {"--leave-running"}, 0, error);
  if (!a) return usage(error);
  const bool dump = kind == "host-dump";
  if (auto m = missing(*a, {"--run", "--host", "--hosts", "--coordinator", "--dir", "--lib"}); !m.empty())
    return usage("needs " + m);
  if (dump && (a->one("--pid").empty() || a->one("--vote").empty())) return usage("host-dump needs --pid and --vote");
  StepOptions o;
  const std::string env = a->one("--run") + ":" + a->one("--host") + "/" + a->one("--hosts") + "@" + a->one("--coordinator");
  auto job = phos::plugin::parse_job_run(env.c_str());
  if (!job) return usage(job.error().message);
  o.job = **job;
  long n = 0;
  if (dump && !number(a->one("--pid"), 1, 1 << 30, n)) return usage("--pid " + a->one("--pid") + " is not a pid");
  o.root = pid_t(n);
  o.dir = a->one("--dir");
  o.lib = a->one("--lib");
  o.vote = a->one("--vote");
  if (!a->one("--criu").empty()) o.criu = a->one("--criu");
  o.leave_running = a->flag("--leave-running");
  if (!a->one("--timeout").empty()) {
    if (!number(a->one("--timeout"), 1, 86400, n)) return usage("--timeout " + a->one("--timeout") + " is not 1..86400 s");
    o.timeout = std::chrono::seconds(n);
  }
  o.criu_args = a->rest;
  // This host's settings (its phos.conf, then PHOS_* variables): the lease
  // on its ranks' stops.
  o.lease = std::chrono::milliseconds(phos::plugin::PluginOptions::load().job_lease_ms);
  return dump ? phos::plugin::run_dump_step(o) : phos::plugin::run_restore_step(o);
}

}  // namespace

int cmd_job(const std::vector<std::string>& args) {
  if (args.empty()) return usage("which: dump, restore, host-dump or host-restore?");
  const std::string kind = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (kind == "dump" || kind == "restore") return driver(kind, rest);
  if (kind == "host-dump" || kind == "host-restore") return step(kind, rest);
  return usage("no job command '" + kind + "'");
}
