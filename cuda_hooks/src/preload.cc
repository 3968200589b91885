// libphos.so's entry point: started by the dynamic loader in every program
// that preloads it. It starts the agent and stays out of the program's way:
// a failure to start is reported once on stderr and the program runs on.
//
// PHOS_STATS_FILE=PATH: at exit, the hooks' counters go to PATH as
// "name value" lines (the GPU suite compares them with ground truth).
// PHOS_RECORD_LAUNCHES=1: record every launch from the start (the protocols
// turn recording on themselves); the stats then list each kernel with its
// launches and parameter layout, and the records still in the ring, one
// line each: "record SEQ KIND NAME [within=SEQ+1] ACCESS:0xADDRESS+BYTES...",
// ACCESS being r, w or rw, with * for an array of pointers and ? for an
// unknown extent. While speculation is on, kernel records end with their
// set: " set=exact|speculated|unknown ACCESS:#UNIT@0xBUFFER...".
// PHOS_SPECULATE=1: speculate every launch's read and write sets from the
// start (the protocols turn it on themselves; so does `phosctl speculate`;
// PHOS_SPECULATE=never keeps a copy window from turning it on);
// the stats then hold "speculation ..." totals and one "speculated NAME ..."
// line per kernel. PHOS_SIGDB=FILE[:FILE...]: signature databases written
// by phos-sigdb, for kernels whose names carry no types.
// PHOS_VALIDATE=1 (or all): speculate, and validate the speculation: kernels
// with PTX run as their twins, the others in modules patched through the
// Sanitizer API (launch_validation.h, sass_validation.h; PHOS_SANITIZER_LIB
// names libsanitizer-public.so if it is not under CUDA_HOME). =ptx and =sass
// use one validator only. The stats then hold "validation ..." totals and
// one "validated NAME ..." line per kernel.
// PHOS_FAULT=gpu-error with PHOS_FAULT_FILE=PATH: once PATH exists, kernel
// launches and copies fail as on a lost device (fault/gpu_fault.h).
// PHOS_CALL_CYCLES=on: count the CPU time phos's own code takes in each kind
// of call (call_cycles.h); `phosctl status` shows it, and the stats then
// hold "call_cycles cycles_per_second=R calls=N cycles=C ns=T
// floor_ns_per_call=F" (all kinds; F: what the counter counts of itself in
// each call) and one "call_cost NAME calls=N cycles=C ns=T" line per kind.
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "agent/cuda_backend.h"
#include "phos/hooks/stderr_line.h"
#include "driver/driver.h"
#include "fault/gpu_fault.h"
#include "phos/hooks/agent.h"
#include "runtime.h"

namespace phos::hooks {
namespace {

// What the entry point sets up from the environment and writes to the stats
// file: the gate and the iteration boundaries (the agent's), the launch
// log, the speculation, the validation, the NCCL communicators.
struct PreloadDeps : RuntimeView {
  using RuntimeView::gate;
  using RuntimeView::launches;
  using RuntimeView::nccl;
  using RuntimeView::speculation;
  using RuntimeView::steps;
  using RuntimeView::validation;
};

// Never destroyed: the agent thread may still run while the process exits.
// PHOS_STEP_WAIT_MS: how long a checkpoint waits for the program's next
// iteration boundary, where it marks them (2000 ms by default).
AgentOptions agent_options(PreloadDeps rt) {
  AgentOptions o;
  o.steps = &rt.steps();
  if (const char* v = std::getenv("PHOS_STEP_WAIT_MS"); v && *v) o.step_wait_ms = std::atoi(v);
  return o;
}

struct Preload {
  const PreloadDeps rt;
  CudaBackend backend{CudaBackend::Deps()};
  Agent agent{rt.gate(), backend, agent_options(rt)};
};
Preload* g_preload = nullptr;

void report(const char* what, const Result<void>& r) {
  if (!r.ok()) stderr_line("phos: %s: %s; running without checkpoint support\n", what, r.error().message.c_str());
}

void before_fork() { PreloadDeps().validation().before_fork(); }
void after_fork_in_parent() { PreloadDeps().validation().after_fork_in_parent(); }

bool g_agent_started = false;

void after_fork_in_child() {
  PreloadDeps().validation().after_fork_in_child();
  if (g_preload && g_agent_started) report("agent restart after fork", g_preload->agent.restart_after_fork());
}

std::string range_text(const ranges::BufferRange& r) {
  std::string access = std::string(r.access & ranges::kRead ? "r" : "") + (r.access & ranges::kWrite ? "w" : "") +
                       (r.access & ranges::kPointerArray ? "*" : "") + (r.access & ranges::kExtentUnknown ? "?" : "");
  char buf[80];
  std::snprintf(buf, sizeof(buf), " %s:0x%llx+%llu", access.c_str(), (unsigned long long)r.address,
                (unsigned long long)r.bytes);
  return buf;
}

// " set=KIND[:TOTAL] ACCESS:#UNIT@0xSTART..." (the first LaunchSet::kMax buffers).
std::string set_text(const LaunchSet& s) {
  // Appended piece by piece: GCC 12 at -O3 misreads "literal" + std::string
  // as an overlapping copy (-Wrestrict, GCC bug 105329).
  std::string text = " set=";
  text += speculation::set_kind_name(speculation::SetKind(s.kind));
  if (s.total > s.count) {
    text += ':';
    text += std::to_string(s.total);
  }
  for (uint8_t i = 0; i < s.count; i++) {
    const LaunchSet::Item& it = s.items[i];
    char buf[80];
    std::snprintf(buf, sizeof(buf), " %s%s:#%llu@0x%llx", it.access & speculation::kRead ? "r" : "",
                  it.access & speculation::kWrite ? "w" : "", (unsigned long long)it.unit, (unsigned long long)it.start);
    text += buf;
  }
  return text;
}

void write_record(FILE* f, const LaunchRecord& r) {
  const char* name = r.call;
  if (r.kind == RecordKind::kKernel) name = !r.kernel || r.kernel->name.empty() ? "?" : r.kernel->name.c_str();
  std::string line = "record " + std::to_string(r.sequence) + " " + record_kind_name(r.kind) + " " + (name ? name : "?");
  if (r.within) line += " within=" + std::to_string(r.within);
  if (r.kind == RecordKind::kKernel) line += " module=" + std::to_string(r.module);
  for (uint8_t i = 0; i < r.ranges.count; i++) line += range_text(r.ranges.items[i]);
  if (r.kind == RecordKind::kKernel && r.set.present) line += set_text(r.set);
  std::fprintf(f, "%s\n", line.c_str());
}

// "speculation ..." totals, then one "speculated NAME ..." line per kernel.
void write_speculation(PreloadDeps rt, FILE* f) {
  auto t = rt.speculation().totals();
  if (!rt.speculation().active() && t.launches == 0 && t.calls == 0) return;
  double rate = rt.speculation().measure_lookup_rate(200000);
  std::fprintf(f,
               "speculation kernels=%llu launches=%llu exact=%llu speculated=%llu unknown=%llu calls=%llu "
               "calls_exact=%llu calls_unknown=%llu buffers=%llu lookups=%llu indexed=%llu lookup_rate=%.0f "
               "cubin_checked=%llu cubin_unreadable=%llu index_refused=%llu integer_words=%llu analysis_ms=%.3f "
               "analysis_max_ms=%.3f "
               "analysis_max_parts=lock:%.3f,metadata:%.3f,layout:%.3f\n",
               (unsigned long long)t.kernels, (unsigned long long)t.launches, (unsigned long long)t.exact,
               (unsigned long long)t.speculated, (unsigned long long)t.unknown, (unsigned long long)t.calls,
               (unsigned long long)t.calls_exact, (unsigned long long)t.calls_unknown, (unsigned long long)t.buffers,
               (unsigned long long)t.lookups, (unsigned long long)t.indexed, rate, (unsigned long long)t.cubin_checked,
               (unsigned long long)t.cubin_unreadable, (unsigned long long)t.index_refused,
               (unsigned long long)t.integer_words, t.analysis_ns / 1e6, t.analysis_max_ns / 1e6, t.worst_lock_ns / 1e6, t.worst_metadata_ns / 1e6,
               t.worst_layout_ns / 1e6);
  for (const auto& k : rt.speculation().kernels())
    std::fprintf(f, "speculated %s launches=%llu exact=%llu speculated=%llu unknown=%llu buffers=%llu reads=%llu "
                    "writes=%llu types=%s%s%s\n",
                 k.name.empty() ? "?" : k.name.c_str(), (unsigned long long)k.launches, (unsigned long long)k.exact,
                 (unsigned long long)k.speculated, (unsigned long long)k.unknown, (unsigned long long)k.buffers,
                 (unsigned long long)k.reads, (unsigned long long)k.writes, k.types.c_str(),
                 k.note.empty() ? "" : " note=", k.note.c_str());
}

// "validation ..." totals, then one "validated NAME ..." line per kernel a
// validator looked at (via=ptx or via=sass; skipped=REASON for those not
// validated).
void write_validation(PreloadDeps rt, FILE* f) {
  if (!rt.validation().active() && !rt.validation().ever_active()) return;
  PHOS_REAL(cuCtxSynchronize)();  // the last launches' tables
  auto t = rt.validation().totals();
  std::fprintf(f, "validation modules=%llu twins=%llu incomplete=%llu validated=%llu pending=%llu violations=%llu "
                  "twin_build_ms=%.3f twin_build_max_ms=%.3f twin_background_builds=%llu first_launch_wait_max_ms=%.3f "
                  "sass=%s sass_modules=%llu sass_patch_ms=%.3f sass_patch_max_ms=%.3f\n",
               (unsigned long long)t.modules, (unsigned long long)t.twins, (unsigned long long)t.incomplete,
               (unsigned long long)t.validated, (unsigned long long)t.pending, (unsigned long long)t.violations,
               t.twin_build_ns / 1e6, t.twin_build_max_ns / 1e6, (unsigned long long)t.background_builds,
               t.first_launch_wait_max_ns / 1e6, t.sass_attached ? "attached" : "off",
               (unsigned long long)t.sass.modules, t.sass.patch_ns / 1e6, t.sass.patch_max_ns / 1e6);
  for (const auto& k : rt.validation().kernels()) {
    std::fprintf(f, "validated %s launches=%llu violations=%llu launches_with_violations=%llu",
                 k.name.c_str(), (unsigned long long)k.validated, (unsigned long long)k.violations,
                 (unsigned long long)k.launches_with_violations);
    if (k.violations)
      std::fprintf(f, " first=0x%llx site=%llu", (unsigned long long)k.first_address, (unsigned long long)k.first_site);
    if (!k.validator.empty()) std::fprintf(f, " via=%s", k.validator.c_str());
    if (!k.skipped.empty()) std::fprintf(f, " skipped=%s", k.skipped.c_str());
    std::fprintf(f, "\n");
  }
}

void write_stats() {
  const char* path = std::getenv("PHOS_STATS_FILE");
  if (!path || !*path || !g_preload) return;
  const PreloadDeps rt;
  std::string file = std::string(path);
  auto at = file.find("%p");
  if (at != std::string::npos) file.replace(at, 2, std::to_string(::getpid()));
  FILE* f = std::fopen(file.c_str(), "w");
  if (!f) return;
  auto status = g_preload->backend.status();
  for (const auto& [name, value] : status.counters) std::fprintf(f, "%s %llu\n", name.c_str(), (unsigned long long)value);
  for (const auto& call : status.unsupported_calls) std::fprintf(f, "unsupported %s\n", call.c_str());
  if (status.call_cycles) {
    uint64_t calls = 0, cycles = 0, ns = 0;
    for (const auto& c : status.call_cycles->calls) {
      calls += c.calls;
      cycles += c.cycles;
      ns += c.ns;
    }
    const auto& cc = *status.call_cycles;
    std::fprintf(f, "call_cycles cycles_per_second=%.0f calls=%llu cycles=%llu ns=%llu floor_ns_per_call=%.1f\n",
                 cc.cycles_per_second, (unsigned long long)calls, (unsigned long long)cycles, (unsigned long long)ns,
                 cc.floor_cycles_per_call * 1e9 / cc.cycles_per_second);
    for (const auto& c : status.call_cycles->calls)
      std::fprintf(f, "call_cost %s calls=%llu cycles=%llu ns=%llu\n", c.call.c_str(), (unsigned long long)c.calls,
                   (unsigned long long)c.cycles, (unsigned long long)c.ns);
  }
  for (const auto& c : rt.nccl().list())
    std::fprintf(f,
                 "nccl_communicator rank=%d nranks=%d device=%d split_from=%s single_process=%d calls=%llu "
                 "rebuilds=%u\n",
                 c.rank, c.nranks, c.device, c.parent ? "yes" : "no", c.single_process ? 1 : 0,
                 (unsigned long long)c.calls, c.rebuilds);
  for (const auto& m : status.modules) {
    std::fprintf(f, "module %llu %s %llu %016llx %s functions=", (unsigned long long)m.id, m.kind.c_str(),
                 (unsigned long long)m.size, (unsigned long long)m.hash, m.source.c_str());
    for (size_t i = 0; i < m.functions.size(); i++) std::fprintf(f, "%s%s", i ? "," : "", m.functions[i].c_str());
    std::fprintf(f, " globals=");
    for (size_t i = 0; i < m.globals.size(); i++) std::fprintf(f, "%s%s", i ? "," : "", m.globals[i].c_str());
    std::fprintf(f, "\n");
  }
  if (rt.launches().enabled()) {
    std::fprintf(f, "recorded_launches %llu\n", (unsigned long long)rt.launches().recorded());
    for (const auto& k : rt.launches().kernels()) {
      std::fprintf(f, "kernel %s %llu module=%llu params=", k.name.empty() ? "?" : k.name.c_str(),
                   (unsigned long long)k.launches, (unsigned long long)k.module);
      for (size_t i = 0; i < k.params.size(); i++) std::fprintf(f, "%s%u:%u", i ? "," : "", k.params[i].offset, k.params[i].size);
      std::fprintf(f, "\n");
    }
    for (const auto& r : rt.launches().recent()) write_record(f, r);
  }
  write_speculation(rt, f);
  write_validation(rt, f);
  std::fclose(f);
}

}  // namespace
}  // namespace phos::hooks

__attribute__((constructor)) static void phos_preload_init() {
  using namespace phos::hooks;
  const char* disable = std::getenv("PHOS_DISABLE");
  if (disable && *disable && *disable != '0') return;
  g_preload = new Preload();
  const PreloadDeps rt;
  // NCCL's RAS (2.24 on) keeps a thread and TCP sockets, its own and to the
  // other processes', for the process's life, beyond any communicator: no
  // checkpoint can carry them. Off unless the program's user asked for it
  // (the status then names it).
  setenv("NCCL_RAS_ENABLE", "0", 0);
  gpu_fault::arm_from_environment();
  const char* record = std::getenv("PHOS_RECORD_LAUNCHES");
  if (record && *record && *record != '0') rt.launches().enable(true);
  if (const char* sigdb = std::getenv("PHOS_SIGDB"); sigdb && *sigdb)
    if (auto loaded = rt.speculation().load_signatures(sigdb); !loaded.ok())
      stderr_line("phos: %s; speculating without it\n", loaded.error().message.c_str());
  const char* speculate = std::getenv("PHOS_SPECULATE");
  const char* validate = std::getenv("PHOS_VALIDATE");
  bool validating = validate && *validate && *validate != '0';
  if (validating || (speculate && *speculate && *speculate != '0'))
    rt.speculation().set_active(true);
  if (validating) {
    using V = LaunchValidation::Validators;
    std::string which = validate;
    V validators = which == "ptx" ? V::kPtx : which == "sass" ? V::kSass : V::kPtxAndSass;
    rt.validation().set_validators(validators);
    // Now, before the program's first CUDA call (sass_validation.h).
    if (validators != V::kPtx)
      if (auto attached = rt.validation().attach_sass(); !attached.ok())
        stderr_line("phos: SASS-level validation unavailable: %s\n", attached.error().message.c_str());
    // Twins built as modules load, off the launch path (PHOS_TWIN_BUILD=launch:
    // at each module's first launch, as before).
    const char* build = std::getenv("PHOS_TWIN_BUILD");
    if (validators != V::kSass && !(build && std::string_view(build) == "launch"))
      rt.validation().set_background_builds(true);
  }
  if (const char* fill = std::getenv("PHOS_FILL_TWINS"); fill && *fill == '0')
    rt.validation().set_fill_twins(false);
  rt.validation().set_active(validating);
  auto started = g_preload->agent.start();
  report("agent start", started);
  g_agent_started = started.ok();
  pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
  std::atexit(write_stats);
}

// The program's iteration boundaries, for a checkpoint to land on
// (step_boundary.h; the Python SDK's phos.step()). C linkage, exported.
extern "C" __attribute__((visibility("default"))) void phos_step() {
  const phos::hooks::PreloadDeps rt;
  rt.steps().step(rt.gate());
}
// The same, with the program's allocator's free device memory at this
// boundary: `count` ranges as (address, size) pairs in `pairs`. A checkpoint
// whose gate closes in this call stores none of it (dead_ranges.h).
extern "C" __attribute__((visibility("default"))) void phos_step_dead(const uint64_t* pairs, size_t count) {
  std::vector<phos::dead::Range> dead;
  for (size_t i = 0; pairs && i < count; i++) dead.push_back({pairs[2 * i], pairs[2 * i + 1]});
  const phos::hooks::PreloadDeps rt;
  rt.steps().step(rt.gate(), std::move(dead));
}
// 1 where a checkpoint waits for the program's next boundary now: only then
// is its allocator's free memory worth taking (phos_step_dead), and only
// after this said 1 (step_boundary.h).
extern "C" __attribute__((visibility("default"))) int phos_step_pending() {
  const phos::hooks::PreloadDeps rt;
  return rt.steps().pending(rt.gate()) ? 1 : 0;
}
// idle != 0: the program stays at a boundary (it waits for a checkpoint it
// asked for itself) until it calls this with 0.
extern "C" __attribute__((visibility("default"))) void phos_step_idle(int idle) {
  phos::hooks::PreloadDeps().steps().set_idle(idle != 0);
}
