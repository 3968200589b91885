#include "phos/plugin/window_report.h"

#include <cstdio>

namespace phos::plugin {

std::string describe_longest_waits(const std::vector<agent::CallWait>& waits) {
  if (waits.empty()) return "no call waited for the engine";
  std::string out = waits.size() == 1 ? "the call that waited: " : "the calls that waited longest: ";
  for (size_t i = 0; i < waits.size(); i++) {
    const agent::CallWait& w = waits[i];
    char figures[256];
    int n = std::snprintf(figures, sizeof(figures), " %.1f ms (%llu chunks waited for, %llu saved into the pool",
                          double(w.wait_ns) / 1e6, (unsigned long long)w.chunks_waited,
                          (unsigned long long)w.chunks_saved);
    // Where the time went, where the hooks said (an older libphos does not).
    if (w.save_ns || w.engine_wait_ns)
      n += std::snprintf(figures + n, sizeof(figures) - size_t(n), "; saving %.1f ms, waiting for the engine %.1f ms",
                         double(w.save_ns) / 1e6, double(w.engine_wait_ns) / 1e6);
    std::snprintf(figures + n, sizeof(figures) - size_t(n), ")");
    out += (i ? "; " : "") + w.call + (w.kernel.empty() ? "" : " of " + w.kernel) + figures;
  }
  return out;
}

std::string describe_most_saved(const std::vector<agent::CallWait>& saved, uint64_t chunk_size) {
  if (saved.empty()) return "no call saved a chunk into the pool";
  std::string out = saved.size() == 1 ? "the call that saved into the pool: " : "the calls that saved the most into the pool: ";
  for (size_t i = 0; i < saved.size(); i++) {
    const agent::CallWait& w = saved[i];
    char figures[96];
    std::snprintf(figures, sizeof(figures), " %llu chunks (%.0f MiB)", (unsigned long long)w.chunks_saved,
                  double(w.chunks_saved * chunk_size) / (1 << 20));
    out += (i ? "; " : "") + w.call + (w.kernel.empty() ? "" : " of " + w.kernel) + figures;
  }
  return out;
}

}  // namespace phos::plugin
