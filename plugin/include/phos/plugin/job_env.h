// PHOS_JOB: the run of a job across hosts that this criu is one host's
// part of (phosctl job, job_step.h), in criu's environment (and so in its
// action script's):
//
//   PHOS_JOB=<run, hex>:<host index>/<hosts>@<coordinator HOST:PORT>
//
// The run is the dump run D for a dump and the resume run E for a
// restore: a dump's plugin gives its processes back (a leave-running dump,
// or an aborted one) under D, a restore's resumes them under E, so that
// every rank on every host meets its peers under one name. Not a file in
// the image directory: that may be read-only at restore.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "phos/support/result.h"
#include "phos/support/socket_io.h"

namespace phos::plugin {

inline constexpr const char* kJobEnv = "PHOS_JOB";

struct JobRun {
  uint64_t run = 0;
  int host = 0;
  int hosts = 0;
  net::HostPort coordinator;
  std::string text() const;  // PHOS_JOB's value
};

// Nothing where `value` is null or empty; an error naming what is wrong
// with it otherwise.
Result<std::optional<JobRun>> parse_job_run(const char* value);
// PHOS_JOB of this process, parsed once; an error where it is malformed.
const Result<std::optional<JobRun>>& job_run_of_process();

// PHOS_JOB_TIMEOUT_S (the step passes its --timeout on): how long criu's
// vote and the plugin wait for the job's outcome; 120 s without it.
inline constexpr const char* kJobTimeoutEnv = "PHOS_JOB_TIMEOUT_S";
std::chrono::seconds job_timeout();

std::string run_hex(uint64_t run);
Result<uint64_t> parse_run_hex(const std::string& text);

}  // namespace phos::plugin
