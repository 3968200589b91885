// Plugin settings. CRIU gives plugins no command-line options, so they come
// from PHOS_* environment variables.
#pragma once

#include <cstdint>

namespace phos::plugin {

struct PluginOptions {
  int agent_timeout_ms = 10000;         // PHOS_AGENT_TIMEOUT_MS: any one reply
  uint32_t quiesce_timeout_ms = 10000;  // PHOS_QUIESCE_TIMEOUT_MS: CUDA calls to leave the gate
  unsigned engine_workers = 0;          // PHOS_ENGINE_WORKERS: copy threads (0: one per two cores, at most 8)

  static PluginOptions from_env();
};

}  // namespace phos::plugin
