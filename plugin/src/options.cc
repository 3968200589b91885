#include "options.h"

#include <cstdlib>
#include <string>

#include "log.h"

namespace phos::plugin {
namespace {

template <class T>
void read_env(const char* name, T& out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || n == 0 || n > 3600000) {
    PHOS_WARN("ignoring %s=%s: expected milliseconds in 1..3600000", name, v);
    return;
  }
  out = static_cast<T>(n);
}

}  // namespace

PluginOptions PluginOptions::from_env() {
  PluginOptions o;
  read_env("PHOS_AGENT_TIMEOUT_MS", o.agent_timeout_ms);
  read_env("PHOS_QUIESCE_TIMEOUT_MS", o.quiesce_timeout_ms);
  read_env("PHOS_ENGINE_WORKERS", o.engine_workers);
  return o;
}

}  // namespace phos::plugin
