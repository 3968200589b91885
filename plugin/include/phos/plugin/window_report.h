// What criu's log says of a copy window's cost to the program: the calls
// that waited longest for the engine (the agent's
// CloseCopyWindowReply::longest_waits), so that "which call pays for
// copy-on-write" is answered by the log of each dump.
#pragma once

#include <string>
#include <vector>

#include "phos/images/agent_messages.h"

namespace phos::plugin {

// "the calls that waited longest: kernel launch of fill_kernel 1712.3 ms
// (537 chunks waited for, 0 saved into the pool); ..."
std::string describe_longest_waits(const std::vector<agent::CallWait>& waits);
// "the calls that saved the most into the pool: cuMemcpyAsync 537 chunks
// (2148 MiB) ...": where the pool absorbed the writes and nothing waited.
std::string describe_most_saved(const std::vector<agent::CallWait>& saved, uint64_t chunk_size);

}  // namespace phos::plugin
