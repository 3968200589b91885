#include "phosctl_hold_gpus.h"

#include <signal.h>

#include <cstdio>

#include "phos/plugin/gpu_hold.h"

int cmd_hold_gpus(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "phosctl hold-gpus: no arguments (got %s)\n", args[0].c_str());
    return 2;
  }
  // Blocked before the contexts exist, so a signal that comes meanwhile is
  // taken by sigwait, not by its default action.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  auto held = phos::plugin::hold_gpu_contexts();
  if (!held) {
    std::fprintf(stderr, "phosctl hold-gpus: %s\n", held.error().message.c_str());
    phos::plugin::release_gpu_contexts();
    return 1;
  }
  size_t n = 0;
  for (const auto& h : *held) {
    if (h.held) {
      n++;
      std::printf("phosctl: holding a CUDA context on GPU %d (%s), %.1f GiB free beside it\n", h.ordinal, h.name.c_str(),
                  double(h.free_bytes) / double(1ull << 30));
    } else {
      std::printf("phosctl: GPU %d (%s) not held: %s\n", h.ordinal, h.name.c_str(), h.why_not.c_str());
    }
  }
  if (n == 0) {
    std::fprintf(stderr, "phosctl hold-gpus: no GPU held\n");
    return 1;
  }
  std::printf("phosctl: holding %zu GPU(s) until SIGTERM or SIGINT\n", n);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  phos::plugin::release_gpu_contexts();
  std::printf("phosctl: released the contexts (signal %d)\n", sig);
  return 0;
}
