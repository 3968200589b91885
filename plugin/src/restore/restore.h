// The restore side of the plugin: one Restorer per `criu restore`.
//
//   init(RESTORE)            every GPU image in the directory is read and
//                            checked (a problem there stops the restore
//                            before CRIU creates a process); a thread
//                            started there places each image's GPUs,
//                            creates its device memory and fills it, while
//                            criu restores the CPU side (restore_overlap)
//   RESUME_DEVICES_LATE(pid) the restored process is still stopped: the
//                            driver restores and unlocks it (once its GPUs
//                            are placed, without waiting for the fill);
//                            once its memory is filled, its agent maps the
//                            memory at the original addresses and opens
//                            the gate. On failure (memory that could not be
//                            created, a chunk that fails its checksum) the
//                            process is killed, never left running, and
//                            criu's exit status says so (failed()); if criu
//                            dies meanwhile, phos-keeper ends the process
//
// With restore_overlap=off the init creates the memory itself (criu waits
// for it) and the driver restore waits for the fill: the order before, kept
// to measure against. The breakdown line of each process says which parts
// overlapped and which bound the gate's opening.
//
// A migration's image (KeptMemory in the manifest) has no data files: at
// init its memory is taken from the phos-keeper that kept it since the dump,
// already on the GPU the manifest names, where the image's device is placed;
// nothing is filled. The keeper hears at the end whether the process was
// restored (it lets go) or not (it keeps the memory for another restore).
//
// On-demand (lazy_restore): the fill runs on after RESUME_DEVICES_LATE. The
// process gets its memory before it is filled (once it is created), with a
// fill window (copy_state.h, kOnDemandFill) through which each of its calls
// waits for what it uses. The filling thread closes the window once the
// fill ends (criu without -d waits for the process before its exit hooks
// run), or ends the process where its memory could not be filled;
// finish(), at criu's exit, waits for that thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <memory>
#include <thread>

#include <optional>

#include "engine/engine.h"
#include "keeper/keeper_link.h"
#include "phos/plugin/kept_memory.h"
#include "phos/images/image_dir.h"
#include "phos/plugin/options.h"
#include "phos/support/result.h"

namespace phos::plugin {

class Restorer {
 public:
  Restorer(int image_dirfd, PluginOptions options);
  // Waits for the thread that fills device memory.
  ~Restorer();

  Result<void> load();
  // false: no GPU image for this process (the hook answers -ENOTSUP).
  Result<bool> resume_late(pid_t pid);
  // At criu's exit, the processes running: an on-demand fill waited for and
  // its windows closed (a process whose fill failed is killed).
  void finish();
  // Whether a process was killed because its GPU state could not be restored.
  bool failed() const { return failed_.load(); }

 private:
  // How far the thread beside criu has come with an image's device memory.
  // Each step is published under stage_mu_; a failure jumps to kDone with
  // Loaded::prepared set.
  enum class Stage { kLoaded, kPlaced, kCreated, kDone };
  struct Loaded {
    image::ProcessImage image;
    // Device memory to create and fill here (not a migration's, which
    // phos-keeper holds).
    bool needs_memory = false;
    // No GPU of the image moves, known without criu's CUDA at load
    // (gpu_map.h: image_stays_on_its_gpus; never for a migration's): the
    // driver's restore needs no pairs, so it need not wait for the
    // placement, which waits for criu's cuInit: 100-210 ms on an H200 no
    // other process uses, against 9-12 ms beside one that does.
    bool stays_on_its_gpus = false;
    Stage stage = Stage::kDone;  // under stage_mu_
    Result<void> prepared;       // its placement or memory creation, once kDone (under stage_mu_)
    std::vector<UniqueFd> fds;  // one per allocation, filled device memory
    std::vector<GpuPlacement> placement;  // where each of the image's GPUs went
    std::vector<GpuDevice> host;          // this host's GPUs
    std::unique_ptr<Engine::LoadJob> job;  // its device memory, until filled
    Result<void> filled;                   // by the filling thread
    // Since the plugin's init: GPUs placed, memory created, its fill begun
    // and ended; the driver's restore began and ended.
    uint64_t placed_ns = 0, created_ns = 0, fill_from_ns = 0, filled_ns = 0;
    uint64_t driver_from_ns = 0, driver_to_ns = 0;
    // On-demand, under window_mu_: the fill ended (l.filled says how), and
    // the process whose fill window is open (0: none).
    bool fill_ended = false;
    pid_t window_pid = 0;
    // A migration's image: its memory, taken from the phos-keeper that
    // kept it (told at the end whether the process got it).
    std::optional<KeptMemoryLink> kept;
    // The driver's restore, made with the other processes' at the first
    // RESUME_DEVICES_LATE (driver_restores()); none: resume() makes it.
    std::optional<Result<void>> driver_restored;
    uint64_t driver_ns = 0;
    // The resume was asked to open the gate: the process may have run on
    // its memory (a kept copy is then no longer the checkpoint).
    bool gate_asked_open = false;
  };
  // A migration's image: its memory taken from phos-keeper (already on the
  // GPU it names, which the image's device is placed on).
  Result<void> take_kept(pid_t vpid, Loaded& l);
  // Where each kept image's devices go (CUDA's start in criu, off
  // the restore's path: the thread runs while criu restores the CPU side;
  // a failure there fails the process's resume, the memory stays kept).
  void place_kept();
  // On-demand: the fill's window opened in the process (after its remap).
  Result<void> open_fill_window(pid_t pid, Loaded& l, AgentClient& c);
  // On-demand, once the fill ended (window_mu_ held): the window closed and
  // phos-keeper told, or the process ended where the fill failed.
  void end_fill_window(Loaded& l);
  uint64_t since_init_ns() const;
  // The old -> new GPU pairs of the driver's restore of `l` (none where no
  // GPU moves).
  // `said`, where given, gets each pair for the log.
  std::vector<CUcheckpointGpuPair> driver_pairs(const Loaded& l, std::string* said = nullptr) const;
  // At the first RESUME_DEVICES_LATE: the driver's restore of every restored
  // process of the tree (criu holds them all stopped by then), at once
  // (driver_parallel); each process's own hook then finds its done.
  void driver_restores();
  // What the process maps: its own allocations' fds, then one for each of
  // its CUDA IPC mappings, duplicated from the owner's image's (restored
  // once, by the owner's image).
  Result<std::vector<UniqueFd>> mapping_fds(const Loaded& l, bool lazy) const;
  // Whether another image maps `vpid`'s memory through CUDA IPC: its fds
  // then stay until the restore ends.
  bool ipc_owner(pid_t vpid) const;
  Result<void> resume(pid_t pid, pid_t vpid, Loaded& l);
  // The driver's restore of `pid` in resume() (none where another hook's
  // driver_restores() made it, or the process holds no driver state).
  Result<void> driver_restore(pid_t pid, Loaded& l);
  // Waits until the memory of `l` is placed, created (on-demand) or filled
  // (eager), whatever it takes; the failure of its placement or creation.
  Result<void> wait_for(Loaded& l, Stage stage);
  // Publishes a step of `l` (a failure: kDone with `failed`).
  void advance(Loaded& l, Stage stage, Result<void> failed = {});
  // The engine, once; its failure.
  Result<void> start_engine();
  // Where the image's GPUs go on this host (l.placement, l.host).
  Result<void> place(Loaded& l);
  // Its device memory created (and on-demand, its fill table opened).
  Result<void> create(Loaded& l);
  // Places and creates every image's memory (the thread's first work with
  // restore_overlap; the init's without).
  void prepare_all();
  // Fills every image's device memory (the thread's work).
  void fill_all();
  // The breakdown line of a restored process.
  void log_breakdown(pid_t pid, const Loaded& l, bool lazy, uint64_t hook_ns, uint64_t waited_ns, uint64_t driver_ns,
                     uint64_t remap_ns) const;

  UniqueFd own_dir_;
  int dirfd_;  // own_dir_, or criu's where it could not be duplicated
  PluginOptions options_;
  std::unique_ptr<Engine> engine_;
  std::map<pid_t, Loaded> images_;  // by pid in the process's namespace
  std::thread filler_;
  std::thread kept_placer_;  // place_kept()
  std::unique_ptr<Engine> kept_engine_;  // its own: the filler may use engine_ meanwhile
  std::atomic<bool> failed_{false};
  std::mutex window_mu_;  // the fill windows' state, and phos-keeper's link
  std::mutex stage_mu_;   // each image's Stage and `prepared`
  std::condition_variable stage_cv_;
  uint64_t init_done_ns_ = 0;  // load() returned, since the plugin's init
  bool lazy_ = false;
  bool driver_restores_made_ = false;
  uint64_t init_ns_ = 0;  // CLOCK_MONOTONIC at the plugin's init
  // Ends a process criu leaves half-restored (dying between RESUME_DEVICES_LATE
  // and its end); started at init, before criu reaps every child it has.
  std::optional<KeeperLink> keeper_;
};

}  // namespace phos::plugin
