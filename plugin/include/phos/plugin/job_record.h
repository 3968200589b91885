// phos-job: one host's part of a job's checkpoint across hosts, in that
// host's image directory, written by its step once the job committed and
// the host's images are whole. `key = value` lines:
//
//   run = <dump run, hex>     the same on every host of one checkpoint
//   host = <index>            hosts = <count>
//   job = <communicator's job id, hex>   nranks = <ranks>   at_call = <held call>
//   ranks = <the ranks of this host, comma-separated>
//
// phosctl job restore reads every host's and refuses a set that is not one
// checkpoint; the plugin refuses to restore such an image without PHOS_JOB
// (its ranks would wait for peers no one resumes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "phos/plugin/job_env.h"
#include "phos/support/result.h"

namespace phos::plugin {

inline constexpr const char* kJobRecordName = "phos-job";

struct JobRecord {
  uint64_t run = 0;
  int host = 0;
  int hosts = 0;
  uint64_t job_id = 0;
  int nranks = 0;
  uint64_t at_call = 0;
  std::vector<int> ranks;
  bool operator==(const JobRecord&) const = default;
};

std::string format_job_record(const JobRecord& r);
// An error names the line or the field that is wrong.
Result<JobRecord> parse_job_record(const std::string& text);
Result<void> write_job_record(int dirfd, const JobRecord& r);
// Nothing where the directory has none (a checkpoint of one host).
Result<std::optional<JobRecord>> read_job_record(int dirfd);
// Whether a criu restore of the image in `dirfd` may go on: a host's part
// of a job across hosts only under PHOS_JOB (`job`), as the host it was
// dumped as (without, its ranks would wait for peers no one resumes);
// PHOS_JOB only for such an image.
Result<void> check_restore_of_job(int dirfd, const std::optional<JobRun>& job);
// The records of every host of one checkpoint: one run, `hosts` of them,
// each host once, one communicator held at one call, every rank once.
Result<void> check_job_records(const std::vector<JobRecord>& records, int hosts);

}  // namespace phos::plugin
