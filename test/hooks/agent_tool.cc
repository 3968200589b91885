// Drives a running process's agent the way a checkpoint will, for tests:
//   phos-agent-tool hold PID MS                      close the gate for MS ms
//   phos-agent-tool roundtrip PID [--release-handles] close the gate, unmap all
//       device memory (with --release-handles: drop it too, holding it only
//       through exported fds), map it back at the same addresses, open the gate
//   phos-agent-tool copy-window PID GO MS  the engine's side of a copy window
//       (copy_state.h) without a pool: the gate closed, a table over the
//       process's memory (64 KiB chunks) handed to the agent, the gate
//       opened, the file GO created; MS ms later the first chunk is claimed
//       and marked copied (one a write waits for, if any), MS ms later the
//       others, the window closed, and its account printed: "window: checked=N waited=N unknown=N
//       saved=N aborted=0|1 first=CHUNK written=ADDRESS transfers=N", then
//       "longest: CALL[/KERNEL]:MS:CHUNKS_WAITED:CHUNKS_SAVED ..." (the calls
//       that waited longest, longest first)
//       With PHOS_TOOL_TRUST=exact|speculated|validated|checksum the window
//       trusts those sets (default speculated).
//   phos-agent-tool recopy-window PID GO GO2 MS  the same for soft recopy: the
//       file GO created, for MS ms the process's transfers in flight watched,
//       then the dirty chunks counted and the first chunk a cold-first claim
//       takes looked at (and put back), GO2 created, MS ms later the dirty
//       chunks counted again, the window closed: "recopy: dirty=N
//       at=ADDRESS then dirty=N of N waited=N aborted=0|1 transfers=N
//       transfer_bytes=N queued=0|1 cold_first=ADDRESS unmarked=N" (calls
//       not trusted left unmarked: cow_trust=checksum)
//   phos-agent-tool fill-window PID GO MS  the engine's side of an on-demand
//       restore's fill window (kOnDemandFill, 64 KiB chunks): the file GO
//       created, MS ms later the chunks a call waits for filled, MS ms later
//       the rest, the window closed: "fill: checked=N waited=N unknown=N
//       overwritten=N filled=ADDRESS transfers=N" (the first chunk filled;
//       transfers the process told the fill table of)
//   phos-agent-tool driver-roundtrip PID  as roundtrip --release-handles, with
//       the driver's checkpoint and restore of the process (cuCheckpointProcess*)
//       while it holds no device memory: the dump/restore sequence of the
//       plugin, without CRIU and without copying the data
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "phos/images/copy_state.h"
#include "phos/plugin/agent_client.h"

using phos::make_error;
using phos::plugin::AgentClient;

namespace {

int fail(const char* what, const phos::Error& e) {
  std::fprintf(stderr, "phos-agent-tool: %s: %s\n", what, e.message.c_str());
  return 1;
}

// After a failure with the gate closed: map back what can be mapped and
// reopen the gate, so the program is not left waiting.
int fail_and_reopen(AgentClient& client, const char* what, const phos::Error& e) {
  fail(what, e);
  if (auto r = client.remap({}, {}); !r) fail("remap after failure", r.error());
  if (auto r = client.resume(); !r) fail("resume after failure", r.error());
  return 1;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// A /proc/PID file's "KEY: N kB" value, in KiB; -1 where absent.
long proc_kib(pid_t pid, const char* file, const char* key) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/" + file).c_str(), "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  const size_t k = std::strlen(key);
  while (std::fgets(line, sizeof(line), f))
    if (std::strncmp(line, key, k) == 0 && line[k] == ':') {
      v = std::atol(line + k + 1);
      break;
    }
  std::fclose(f);
  return v;
}

// The driver's checkpoint of `pid` and its restore, timed; "" on success.
// Also prints the process's resident memory around them (what the driver
// moved into it: test/gpu/driver_state_probe reads this line):
//   driver_rss before_kib=N checkpointed_kib=N restored_kib=N anon_before_kib=N
//   anon_checkpointed_kib=N lock_ms=T checkpoint_ms=T restore_ms=T unlock_ms=T
std::string driver_checkpoint_restore(pid_t pid, std::string* timings) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return dlerror();
  auto sym = [&](const char* n) { return dlsym(lib, n); };
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(sym("cuInit"));
  auto lock = reinterpret_cast<CUresult (*)(int, CUcheckpointLockArgs*)>(sym("cuCheckpointProcessLock"));
  auto ckpt = reinterpret_cast<CUresult (*)(int, CUcheckpointCheckpointArgs*)>(sym("cuCheckpointProcessCheckpoint"));
  auto rest = reinterpret_cast<CUresult (*)(int, CUcheckpointRestoreArgs*)>(sym("cuCheckpointProcessRestore"));
  auto unlock = reinterpret_cast<CUresult (*)(int, CUcheckpointUnlockArgs*)>(sym("cuCheckpointProcessUnlock"));
  if (!init || !lock || !ckpt || !rest || !unlock) return "driver lacks the checkpoint API";
  if (init(0) != CUDA_SUCCESS) return "cuInit failed";
  CUcheckpointLockArgs la{};
  la.timeoutMs = 10000;
  CUcheckpointCheckpointArgs ca{};
  CUcheckpointRestoreArgs ra{};
  CUcheckpointUnlockArgs ua{};
  char buf[256];
  const long rss0 = proc_kib(pid, "status", "VmRSS"), anon0 = proc_kib(pid, "smaps_rollup", "Anonymous");
  auto t = std::chrono::steady_clock::now();
  if (CUresult r = lock(pid, &la)) return "lock: " + std::to_string(r);
  double lock_ms = ms_since(t);
  t = std::chrono::steady_clock::now();
  if (CUresult r = ckpt(pid, &ca)) return "checkpoint: " + std::to_string(r);
  double ckpt_ms = ms_since(t);
  const long rss1 = proc_kib(pid, "status", "VmRSS"), anon1 = proc_kib(pid, "smaps_rollup", "Anonymous");
  t = std::chrono::steady_clock::now();
  if (CUresult r = rest(pid, &ra)) return "restore: " + std::to_string(r);
  double rest_ms = ms_since(t);
  t = std::chrono::steady_clock::now();
  if (CUresult r = unlock(pid, &ua)) return "unlock: " + std::to_string(r);
  double unlock_ms = ms_since(t);
  std::printf("driver_rss before_kib=%ld checkpointed_kib=%ld restored_kib=%ld anon_before_kib=%ld "
              "anon_checkpointed_kib=%ld lock_ms=%.1f checkpoint_ms=%.1f restore_ms=%.1f unlock_ms=%.1f\n",
              rss0, rss1, proc_kib(pid, "status", "VmRSS"), anon0, anon1, lock_ms, ckpt_ms, rest_ms, unlock_ms);
  std::snprintf(buf, sizeof(buf), "driver lock %.1f ms, checkpoint %.1f ms, restore %.1f ms, unlock %.1f ms", lock_ms,
                ckpt_ms, rest_ms, unlock_ms);
  *timings = buf;
  return "";
}

// The window's trust: PHOS_TOOL_TRUST, speculated by default.
phos::agent::CopyTrust tool_trust() {
  const char* v = std::getenv("PHOS_TOOL_TRUST");
  const std::string t = v ? v : "speculated";
  if (t == "exact") return phos::agent::CopyTrust::kExact;
  if (t == "validated") return phos::agent::CopyTrust::kValidated;
  if (t == "checksum") return phos::agent::CopyTrust::kChecksum;
  return phos::agent::CopyTrust::kSpeculated;
}

}  // namespace

// The recopy side of copy-window: counts the dirty chunks after the first
// write, and again after a call with an unknown set.
int recopy_window(pid_t pid, phos::copystate::CopyState& table, const char* go2, std::chrono::milliseconds hold) {
  auto dirty = [&](uint64_t* first) {
    uint64_t n = 0;
    for (uint64_t c = 0; c < table.chunk_count(); c++)
      if (table.dirty(c) && n++ == 0 && first) *first = c;
    return n;
  };
  // The process writes and transfers meanwhile.
  std::this_thread::sleep_for(hold);
  uint64_t first = UINT64_MAX;
  const uint64_t after_write = dirty(&first);
  // Cold first: the allocation written comes last; put back at once.
  table.set_cold_first(true);
  uint64_t cold_first = 0;
  if (auto c = table.claim_next()) {
    cold_first = table.regions()[c->region].address + c->offset;
    table.unclaim(*c);
  }
  if (FILE* go = std::fopen(go2, "w")) std::fclose(go);
  std::this_thread::sleep_for(hold);
  const uint64_t after_unknown = dirty(nullptr);
  auto again = AgentClient::connect(pid, 30000);
  if (!again) return fail("connect again", again.error());
  auto closed = again->close_copy_window();
  if (!closed) return fail("close copy window", closed.error());
  (void)again->goodbye();
  uint64_t at = 0;
  for (const auto& r : table.regions()) {
    // The address of chunk `first`: regions are in address order, chunks in region order.
    uint64_t chunks = (r.size + table.chunk_size() - 1) / table.chunk_size();
    if (first < chunks) {
      at = r.address + first * table.chunk_size();
      break;
    }
    first -= chunks;
  }
  const phos::copystate::Statistics s = table.statistics();
  std::printf("recopy: dirty=%" PRIu64 " at=0x%" PRIx64 " then dirty=%" PRIu64 " of %" PRIu64 " waited=%" PRIu64
              " aborted=%d transfers=%" PRIu64 " transfer_bytes=%" PRIu64 " queued=%d"
              " cold_first=0x%" PRIx64 " unmarked=%" PRIu64 "\n",
              after_write, at, after_unknown, table.chunk_count(), closed->counters.calls_waited,
              closed->aborted ? 1 : 0, s.transfers, s.transfer_bytes, table.traffic().busy_until_ns ? 1 : 0,
              cold_first, closed->unmarked_calls);
  return 0;
}

// The engine of an on-demand restore, the process's memory standing for
// the restored memory (the fake driver has no data): the calls' chunks
// first, then, after another hold, the rest in address order.
int fill_window(AgentClient& client, pid_t pid, const char* go, int hold_ms) {
  auto allocs = client.list_allocations(false, nullptr);
  if (!allocs) return fail_and_reopen(client, "list allocations", allocs.error());
  std::vector<phos::copystate::Region> regions;
  for (const auto& a : *allocs) regions.push_back({.id = a.id, .address = a.address, .size = a.size});
  auto table = phos::copystate::CopyState::create(phos::CopyProtocol::kOnDemandFill, 64u << 10, regions, 0);
  if (!table) return fail_and_reopen(client, "fill table", table.error());
  int fd = table->fd();
  auto opened = client.open_copy_window({phos::agent::CopyTrust::kExact, 30000, {}}, std::span(&fd, 1));
  if (!opened) return fail_and_reopen(client, "open fill window", opened.error());
  if (auto r = client.resume(); !r) return fail("resume", r.error());
  (void)client.goodbye();
  if (FILE* f = std::fopen(go, "w")) std::fclose(f);
  const auto hold = std::chrono::milliseconds(hold_ms);
  std::this_thread::sleep_for(hold);
  std::optional<phos::copystate::Claim> first;
  while (auto c = table->claim_urgent()) {
    table->copied(*c);
    if (!first) first = c;
  }
  std::this_thread::sleep_for(hold);
  for (uint64_t c = 0; c < table->chunk_count(); c++)
    if (auto claim = table->claim(c)) table->copied(*claim);
  table->close(phos::copystate::Window::kClosed);
  auto again = AgentClient::connect(pid, 30000);
  if (!again) return fail("connect again", again.error());
  auto closed = again->close_copy_window();
  if (!closed) return fail("close fill window", closed.error());
  (void)again->goodbye();
  std::printf("fill: checked=%" PRIu64 " waited=%" PRIu64 " unknown=%" PRIu64 " overwritten=%" PRIu64
              " filled=0x%" PRIx64 " transfers=%" PRIu64 "\n",
              closed->counters.calls_checked, closed->counters.calls_waited, closed->counters.unknown_waits,
              table->statistics().overwritten, first ? table->regions()[first->region].address + first->offset : 0,
              table->statistics().transfers);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s hold PID MS | roundtrip PID [--release-handles] | driver-roundtrip PID\n", argv[0]);
    return 2;
  }
  pid_t pid = pid_t(std::atoi(argv[2]));
  auto client = AgentClient::connect(pid, 30000);
  if (!client) return fail("connect", client.error());
  auto t0 = std::chrono::steady_clock::now();
  auto q = client->quiesce(30000);
  if (!q) return fail("quiesce", q.error());
  double quiesce_ms = ms_since(t0);
  if (q->nccl_released)
    std::printf("nccl: %u communicators released in %.2f ms\n", q->nccl_released, double(q->nccl_release_ns) / 1e6);
  // For a test that samples the process only while the gate is closed.
  std::printf("quiesced\n");
  std::fflush(stdout);
  if (q->at_step) std::printf("gate closed at the program's iteration boundary\n");
  if (!q->touch_order.empty()) {
    // The allocations' addresses, in the order recorded launches first touched them.
    auto listed = client->list_allocations(false, nullptr);
    std::printf("touch order:");
    for (uint64_t id : q->touch_order)
      for (const auto& a : listed ? *listed : std::vector<phos::agent::Allocation>{})
        if (a.id == id) std::printf(" 0x%" PRIx64, a.address);
    std::printf("\n");
  }

  const bool recopy = !std::strcmp(argv[1], "recopy-window") && argc == 6;
  if ((!std::strcmp(argv[1], "copy-window") && argc == 5) || recopy) {
    auto allocs = client->list_allocations(false, nullptr);
    if (!allocs) return fail_and_reopen(*client, "list allocations", allocs.error());
    std::vector<phos::copystate::Region> regions;
    for (const auto& a : *allocs) regions.push_back({.id = a.id, .address = a.address, .size = a.size});
    auto table = phos::copystate::CopyState::create(
        recopy ? phos::CopyProtocol::kSoftRecopy : phos::CopyProtocol::kSoftCopyOnWrite, 64u << 10, regions, 0);
    if (!table) return fail_and_reopen(*client, "copy table", table.error());
    int fd = table->fd();
    auto opened = client->open_copy_window({tool_trust(), 30000, {}}, std::span(&fd, 1));
    if (!opened) return fail_and_reopen(*client, "open copy window", opened.error());
    if (auto r = client->resume(); !r) return fail("resume", r.error());
    (void)client->goodbye();
    if (FILE* go = std::fopen(argv[3], "w")) std::fclose(go);
    const auto hold = std::chrono::milliseconds(std::atoi(argv[recopy ? 5 : 4]));
    if (recopy) return recopy_window(pid, *table, argv[4], hold);
    std::this_thread::sleep_for(hold);
    // The engine: the first claim is the chunk a write waits for; the rest
    // after another hold, for a call that waits for the close.
    std::optional<phos::copystate::Claim> first;
    while (!table->all_copied()) {
      auto c = table->claim_next();
      if (!c) continue;
      table->copied(*c);
      if (!first) {
        first = c;
        std::this_thread::sleep_for(hold);
      }
    }
    table->close(phos::copystate::Window::kClosed);
    auto again = AgentClient::connect(pid, 30000);
    if (!again) return fail("connect again", again.error());
    auto closed = again->close_copy_window();
    if (!closed) return fail("close copy window", closed.error());
    (void)again->goodbye();
    std::printf("window: checked=%" PRIu64 " waited=%" PRIu64 " unknown=%" PRIu64 " saved=%" PRIu64
                " aborted=%d first=%" PRIu64 " written=0x%" PRIx64 " transfers=%" PRIu64 "\n",
                closed->counters.calls_checked, closed->counters.calls_waited, closed->counters.unknown_waits,
                closed->chunks_saved, closed->aborted ? 1 : 0, first ? first->chunk : UINT64_MAX,
                first ? table->regions()[first->region].address + first->offset : 0, table->statistics().transfers);
    // The calls that waited longest: "longest: CALL[/KERNEL]:MS:WAITED:SAVED ...".
    std::printf("longest:");
    for (const auto& w : closed->longest_waits)
      std::printf(" %s%s%s:%" PRIu64 ":%" PRIu64 ":%" PRIu64, w.call.c_str(), w.kernel.empty() ? "" : "/",
                  w.kernel.c_str(), w.wait_ns / 1000000, w.chunks_waited, w.chunks_saved);
    std::printf("\n");
    return 0;
  }
  if (!std::strcmp(argv[1], "fill-window") && argc == 5) return fill_window(*client, pid, argv[3], std::atoi(argv[4]));
  if (!std::strcmp(argv[1], "hold") && argc == 4) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(argv[3])));
  } else if (!std::strcmp(argv[1], "roundtrip") || !std::strcmp(argv[1], "driver-roundtrip")) {
    bool with_driver = !std::strcmp(argv[1], "driver-roundtrip");
    bool drop = with_driver || (argc > 3 && !std::strcmp(argv[3], "--release-handles"));
    std::vector<phos::UniqueFd> fds;
    auto allocs = client->list_allocations(drop, &fds);
    if (!allocs) return fail_and_reopen(*client, "list allocations", allocs.error());
    auto t1 = std::chrono::steady_clock::now();
    for (const auto& a : *allocs)
      std::fprintf(stderr, "allocation %" PRIu64 ": device %u, 0x%" PRIx64 ", %" PRIu64 " bytes, flags %u\n", a.id,
                   a.device, a.address, a.size, a.flags);
    auto released = client->release_mappings(drop);
    if (!released) return fail_and_reopen(*client, "release mappings", released.error());
    double release_ms = ms_since(t1);
    std::string driver_timings;
    if (with_driver) {
      std::string err = driver_checkpoint_restore(pid, &driver_timings);
      if (!err.empty()) {
        // The memory is held only through our fds: put it back first.
        (void)client->remap_all(*allocs, fds);
        return fail_and_reopen(*client, "driver checkpoint/restore", make_error(err));
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    auto t2 = std::chrono::steady_clock::now();
    auto mapped = client->remap_all(drop ? *allocs : std::vector<phos::agent::Allocation>{}, fds);
    if (!mapped) return fail("remap", mapped.error());
    double remap_ms = ms_since(t2);
    std::printf("roundtrip%s: %zu allocations, %" PRIu64 " bytes released in %.2f ms, %" PRIu64
                " bytes mapped back in %.2f ms%s%s\n",
                with_driver ? " (handles released, driver checkpoint+restore)" : drop ? " (handles released)" : "",
                allocs->size(), *released, release_ms, *mapped, remap_ms, with_driver ? "; " : "",
                driver_timings.c_str());
  } else {
    std::fprintf(stderr, "phos-agent-tool: unknown command %s\n", argv[1]);
    return 2;
  }
  auto r = client->resume();
  if (!r) return fail("resume", r.error());
  std::printf("gate closed %.2f ms after the request, open again after %.2f ms\n", quiesce_ms, ms_since(t0));
  (void)client->goodbye();
  return 0;
}
