// Running the commands of a job across hosts: criu on one host (with
// PHOS_JOB added to its environment), and each host's step through the
// user's template (`ssh h{i} {cmd}`, `ip netns exec h{i} {cmd}`).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "phos/support/result.h"

namespace phos::plugin {

// `word` quoted for /bin/sh (single quotes; left bare where it is safe).
std::string shell_quote(const std::string& word);
std::string shell_line(const std::vector<std::string>& argv);
// `text` with every {i} replaced by `host` and {cmd} by `cmd`.
std::string expand_template(const std::string& text, int host, const std::string& cmd);

// Starts `argv` (found on PATH) with `extra_env` ("NAME=value") added; its pid.
Result<pid_t> start_command(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env);
// Waits for `pid`: its exit status, 128+N for a signal N.
int wait_command(pid_t pid);
// Both: the exit status, or -1 where it could not start (logged by the caller).
Result<int> run_command(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env);

// The pid `criu restore --pidfile NAME -D DIR` wrote; an error naming what
// is wrong with it.
Result<pid_t> read_pid_file(const std::string& dir, const std::string& name);

// This program's own path (/proc/self/exe), and a program beside it.
std::string own_path();
std::string beside_self(const std::string& name);

}  // namespace phos::plugin
