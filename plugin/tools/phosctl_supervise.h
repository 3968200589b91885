#pragma once

#include <string>
#include <vector>

// `phosctl periodic ...` (supervise false) and `phosctl supervise ...`: the
// arguments after the command's name; the exit status.
int cmd_periodic(const std::vector<std::string>& args, bool supervise);
