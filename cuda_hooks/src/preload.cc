// libphos.so's entry point: started by the dynamic loader in every program
// that preloads it. It starts the agent and stays out of the program's way:
// a failure to start is reported once on stderr and the program runs on.
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "phos/hooks/agent.h"
#include "phos/hooks/agent_backend.h"
#include "phos/hooks/gate.h"

namespace phos::hooks {
namespace {

// Never destroyed: the agent thread may still run while the process exits.
struct Runtime {
  Gate gate;
  NoCudaBackend backend;
  Agent agent{gate, backend};
};
Runtime* g_runtime = nullptr;

void report(const char* what, const Result<void>& r) {
  if (!r.ok()) std::fprintf(stderr, "phos: %s: %s; running without checkpoint support\n", what, r.error().message.c_str());
}

void after_fork_in_child() {
  if (g_runtime) report("agent restart after fork", g_runtime->agent.restart_after_fork());
}

}  // namespace
}  // namespace phos::hooks

__attribute__((constructor)) static void phos_preload_init() {
  using namespace phos::hooks;
  const char* disable = std::getenv("PHOS_DISABLE");
  if (disable && *disable && *disable != '0') return;
  g_runtime = new Runtime();
  auto started = g_runtime->agent.start();
  report("agent start", started);
  if (started.ok()) pthread_atfork(nullptr, nullptr, after_fork_in_child);
}
