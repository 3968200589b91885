#include "phos/plugin/job_record.h"
#include "phos/support/text.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "phos/images/image_dir.h"
#include "phos/plugin/job_env.h"

namespace phos::plugin {
namespace {

constexpr uint64_t kMaxRecordBytes = 64 * 1024;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

Result<int64_t> number(const std::string& field, const std::string& v, int64_t min, int64_t max) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || n < min || n > max)
    return make_error(std::string(kJobRecordName) + ": " + field + " = '" + v + "' is not " + std::to_string(min) +
                          ".." + std::to_string(max),
                      EINVAL);
  return int64_t(n);
}

}  // namespace

std::string format_job_record(const JobRecord& r) {
  std::string ranks;
  for (int k : r.ranks) append_item(ranks, ",", std::to_string(k));
  return "run = " + run_hex(r.run) + "\nhost = " + std::to_string(r.host) + "\nhosts = " + std::to_string(r.hosts) +
         "\njob = " + run_hex(r.job_id) + "\nnranks = " + std::to_string(r.nranks) +
         "\nat_call = " + std::to_string(r.at_call) + "\nranks = " + ranks + "\n";
}

Result<JobRecord> parse_job_record(const std::string& text) {
  std::map<std::string, std::string> kv;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    if (trim(line).empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos)
      return make_error(std::string(kJobRecordName) + " line " + std::to_string(n) + ": no '='", EINVAL);
    kv[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  for (const char* k : {"run", "host", "hosts", "job", "nranks", "at_call", "ranks"})
    if (!kv.count(k)) return make_error(std::string(kJobRecordName) + ": no " + k, EINVAL);
  JobRecord r;
  auto run = parse_run_hex(kv["run"]);
  if (!run) return make_error(std::string(kJobRecordName) + ": run: " + run.error().message, EINVAL);
  r.run = *run;
  auto job = parse_run_hex(kv["job"]);
  if (!job) return make_error(std::string(kJobRecordName) + ": job: " + job.error().message, EINVAL);
  r.job_id = *job;
  auto hosts = number("hosts", kv["hosts"], 1, 4096);
  if (!hosts) return hosts.error();
  r.hosts = int(*hosts);
  auto host = number("host", kv["host"], 0, r.hosts - 1);
  if (!host) return host.error();
  r.host = int(*host);
  auto nranks = number("nranks", kv["nranks"], 2, 1 << 20);
  if (!nranks) return nranks.error();
  r.nranks = int(*nranks);
  auto at = number("at_call", kv["at_call"], 0, INT64_MAX);
  if (!at) return at.error();
  r.at_call = uint64_t(*at);
  std::istringstream ranks(kv["ranks"]);
  for (std::string k; std::getline(ranks, k, ',');) {
    auto rank = number("ranks", trim(k), 0, r.nranks - 1);
    if (!rank) return rank.error();
    r.ranks.push_back(int(*rank));
  }
  if (r.ranks.empty()) return make_error(std::string(kJobRecordName) + ": no ranks", EINVAL);
  return r;
}

Result<void> write_job_record(int dirfd, const JobRecord& r) {
  const std::string text = format_job_record(r);
  return image::write_file_atomic(dirfd, kJobRecordName,
                                  std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

Result<std::optional<JobRecord>> read_job_record(int dirfd) {
  auto bytes = image::read_small_file(dirfd, kJobRecordName, kMaxRecordBytes);
  if (!bytes) {
    if (bytes.error().code == ENOENT) return std::optional<JobRecord>();
    return bytes.error();
  }
  auto r = parse_job_record(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  if (!r) return r.error();
  return std::optional<JobRecord>(*r);
}

Result<void> check_restore_of_job(int dirfd, const std::optional<JobRun>& job) {
  auto rec = read_job_record(dirfd);
  if (!rec) return rec.error();
  if (!*rec) {
    if (job)
      return make_error(std::string(kJobEnv) + " is set (" + job->text() + "), but the image has no " +
                            kJobRecordName + " record: it is no complete host's part of a job's checkpoint",
                        EINVAL);
    return {};
  }
  const JobRecord& r = **rec;
  if (!job) {
    if (r.hosts == 1) return {};
    return make_error("the image is host " + std::to_string(r.host) + " of a checkpoint of a job across " +
                          std::to_string(r.hosts) + " hosts (run " + run_hex(r.run) +
                          "): restore it with phosctl job restore, which restores every host's at once under one "
                          "resume run (alone, its ranks would wait for peers no one resumes)",
                      EPERM);
  }
  if (job->host != r.host || job->hosts != r.hosts)
    return make_error(std::string(kJobEnv) + " says host " + std::to_string(job->host) + " of " +
                          std::to_string(job->hosts) + ", the image is host " + std::to_string(r.host) + " of " +
                          std::to_string(r.hosts),
                      EINVAL);
  return {};
}

Result<void> check_job_records(const std::vector<JobRecord>& records, int hosts) {
  if (records.empty()) return make_error("no host's phos-job record", ENOENT);
  const JobRecord& first = records.front();
  std::set<int> seen_hosts, seen_ranks;
  for (const auto& r : records) {
    const std::string who = "host " + std::to_string(r.host) + "'s " + kJobRecordName;
    if (r.run != first.run)
      return make_error(who + " is of dump run " + run_hex(r.run) + ", host " + std::to_string(first.host) +
                            "'s of " + run_hex(first.run) + ": not one checkpoint",
                        EINVAL);
    if (r.hosts != hosts) return make_error(who + " says " + std::to_string(r.hosts) + " hosts, not " + std::to_string(hosts), EINVAL);
    if (!seen_hosts.insert(r.host).second) return make_error(who + " comes twice", EINVAL);
    if (r.job_id != first.job_id || r.nranks != first.nranks || r.at_call != first.at_call)
      return make_error(who + " names another communicator or call than host " + std::to_string(first.host) + "'s",
                        EINVAL);
    for (int k : r.ranks)
      if (!seen_ranks.insert(k).second) return make_error(who + ": rank " + std::to_string(k) + " is on two hosts", EINVAL);
  }
  if (int(records.size()) != hosts)
    return make_error(std::to_string(records.size()) + " hosts' records for " + std::to_string(hosts) + " hosts", EINVAL);
  if (int(seen_ranks.size()) != first.nranks)
    return make_error("the hosts hold " + std::to_string(seen_ranks.size()) + " of the job's " +
                          std::to_string(first.nranks) + " ranks",
                      EINVAL);
  return {};
}

}  // namespace phos::plugin
