#pragma once

#include <string>
#include <vector>

// `phosctl hold-gpus`: a CUDA context on every GPU of the host until SIGTERM
// or SIGINT (phos/plugin/gpu_hold.h says why); the arguments after the
// command's name; the exit status.
int cmd_hold_gpus(const std::vector<std::string>& args);
