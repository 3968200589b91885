// phosctl job (phosctl_job.cc).
#pragma once

#include <string>
#include <vector>

// `args` after "job"; phosctl's exit status.
int cmd_job(const std::vector<std::string>& args);
