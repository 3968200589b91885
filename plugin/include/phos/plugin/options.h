// Plugin settings. CRIU gives plugins no command-line options, so they come
// from a small configuration file (/etc/phos/phos.conf, or the file PHOS_CONFIG
// names) of `key = value` lines with # comments, and from PHOS_* environment
// variables, which override the file. A missing file is fine; unknown keys and
// bad values are warned about (file and line) and ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "phos/images/data_file.h"
#include "phos/images/manifest.h"
#include "phos/plugin/gpu_map.h"

namespace phos::plugin {

inline constexpr const char* kDefaultConfigPath = "/etc/phos/phos.conf";

struct PluginOptions {
  int agent_timeout_ms = 10000;         // agent_timeout_ms: any one reply
  // job_lease_ms: 100..3600000. The lease on the stops a `phosctl job dump`
  // step arms on its host's ranks: renewed while the step lives, lifted by
  // each rank's agent once not renewed this long (the step killed before
  // criu runs), unless criu's quiesce took the stop over.
  uint32_t job_lease_ms = 10000;
  uint32_t quiesce_timeout_ms = 10000;  // quiesce_timeout_ms: CUDA calls to leave the gate
  unsigned engine_workers = 0;          // engine_workers: copy threads (0: one per core, at most 16)
  image::DirectIo direct_io = image::DirectIo::kAuto;          // direct_io: auto | off
  image::Compression compression = image::Compression::kNone;  // compression: none | zstd
  int zstd_level = 1;                   // zstd_level: 1..19
  uint32_t chunk_mib = 4;               // chunk_mib: 1..64, the dump's chunk size
  GpuMapSpec gpu_map;                   // gpu_map: restore onto other GPUs (gpu_map.h), e.g. 0=1
  bool gpu_checksums = true;            // gpu_checksums: on | off, a dump's CRC-32C on the GPU
  // driver_parallel: on | off. on: the driver's checkpoint and restore of
  // the processes of one dump or restore (a job's ranks) run at once, one
  // thread a process; off: one after another, as CRIU's cuda plugin does.
  bool driver_parallel = true;
  // restore_overlap: on | off. on: the plugin's init only reads and checks
  // the images; a thread started there creates the GPU memory and fills it
  // while criu restores the CPU side, and each process's driver restore
  // runs without waiting for the fill. off: the memory is created inside
  // the init (criu waits for it), and the driver restore waits for the fill
  // (the order before issue 30; kept to measure against).
  bool restore_overlap = true;
  // sparse: auto | off. auto: a dump stores a chunk whose every byte is 0
  // as a hole, which a restore sets with a memset (zero_chunk.h); off: it is
  // written like any other (an image an older phos, of format version 1,
  // reads).
  image::Sparse sparse = image::Sparse::kAuto;
  // write_behind: auto | off. auto: when criu's command line leaves the
  // process running, its device memory is snapshotted on the GPU, the process
  // runs again as soon as criu lets it, and criu exits once the image is
  // written (with an error if that fails).
  bool write_behind = true;
  // copy_on_write: auto | always | off. For a dump that leaves the process
  // running where the snapshot does not fit (auto), or always instead of
  // the snapshot: the process runs again at once while the engine copies
  // its memory, and each call that writes memory not yet copied first
  // saves it into a pool on the GPU (soft copy-on-write, copy_state.h).
  enum class CopyOnWrite { kAuto, kAlways, kOff };
  CopyOnWrite copy_on_write = CopyOnWrite::kAuto;
  // cow_pool_mib: auto | 0..1048576 per GPU, at most what the GPU has free.
  // auto: what the GPU has free at the stall, less a reserve for the program
  // (cow_pool.h); a program allocation that then finds the GPU full gets
  // the pool back (copy_state.h, "giving the pool back").
  static constexpr uint32_t kCowPoolAuto = UINT32_MAX;
  uint32_t cow_pool_mib = kCowPoolAuto;
  // cow_trust: exact | speculated | validated | checksum; a write set not
  // trusted makes its call wait until the copy ends. checksum trusts
  // speculated sets and checks every chunk copied against its fingerprint
  // at the freeze: a write speculation missed refuses the image (the
  // process runs on; its next dumps copy while it is stopped), and recopy's
  // final pass copies again every chunk that changed (docs/design/
  // checksum-validation.md).
  agent::CopyTrust cow_trust = agent::CopyTrust::kChecksum;
  uint32_t cow_timeout_ms = 60000;  // cow_timeout_ms: a call waits at most this long, then the image is given up
  // cow_start: resume | pause. When the copy-on-write copy starts: once the
  // process runs again (the stall is shortest), or already at PAUSE_DEVICES
  // (the image complete sooner, but the stall longer: the copy workers
  // compete with criu and the driver for the CPUs and PCIe;
  // docs/benchmarks/copy-on-write.md).
  enum class CowStart { kResume, kPause };
  CowStart cow_start = CowStart::kResume;
  // cow_zero: settle | copy. settle: a chunk all zero at the freeze (its
  // fingerprint pass says so, cow_trust=checksum) is in the image as a hole
  // before the process runs again, and no write waits for it; copy: copied
  // like any other (the order before; kept to measure against).
  bool cow_zero_settle = true;
  // behind_nice: 0..19. Once criu lets the processes of a --leave-running
  // dump run again, its threads (the engine's copy workers, criu's page
  // writers) take this nice value, so that the program's threads win the
  // CPUs: 32 copy threads on a 16-core host made the 8B server's first
  // calls wait ~4 ms at a time (a scheduler slice) for 0.3 s. 0 leaves them.
  int behind_nice = 10;
  // recopy: auto | off. auto: a dump that stops the process (no
  // --leave-running) copies its device memory while it still runs, then
  // closes the gate and copies again only what it wrote meanwhile (soft
  // recopy, copy_state.h), trusting the write sets cow_trust names.
  bool recopy = true;
  // recopy_pass_ms: the longest the first pass may run; 0: half of what is
  // left of criu's freeze timeout (criu --timeout, 10 s by default), which
  // PAUSE_DEVICES runs under.
  uint32_t recopy_pass_ms = 0;
  // recopy_min_mib: a process with less device memory than this is copied
  // while it is stopped, without a first pass. Its stopped copy (~50 ms for
  // 1 GiB on an H200) runs beside the driver's checkpoint (200-300 ms) and
  // adds nothing to the dump, while a first pass costs its own set-up (70
  // ms for 256 MiB) before the gate closes. 0: every process.
  uint32_t recopy_min_mib = 1024;
  // traffic: auto | order | off. PhOS §5's traffic control of the copies
  // made while the process runs (recopy's first pass, copy-on-write). auto:
  // the engine pauses between chunks while the process has its own
  // transfers between host and device in flight or queued (traffic.h), and
  // recopy's first pass takes the allocations the process has not written
  // since it began first; order: that order without the pauses; off:
  // neither (address order at full speed).
  enum class Traffic { kAuto, kOrder, kOff };
  Traffic traffic = Traffic::kAuto;
  // traffic_gbps: 1..1000, the rate the process's asynchronous transfers
  // are assumed to move at (how long the engine takes one queued to last).
  uint32_t traffic_gbps = 20;
  // lazy_restore: auto | on | off. on: a restore lets the process run once
  // the driver has restored it, before its device memory is in; the engine
  // fills it behind (the recorded launch order first, chunks a call waits
  // for before all), and each call waits only for the memory it uses
  // (exact sets; anything else waits for the whole fill). auto: on where
  // criu restores with --lazy-pages; off: the memory is in before the
  // process runs.
  enum class LazyRestore { kAuto, kOn, kOff };
  LazyRestore lazy_restore = LazyRestore::kAuto;
  // lazy_timeout_ms: the longest a call of the restored process waits for
  // its memory; past it the process is ended (it cannot run without it).
  uint32_t lazy_timeout_ms = 600000;
  // migrate_to: a GPU of this host (an ordinal as nvidia-smi numbers it, or
  // its UUID); empty: none. A dump that stops the process (a migration)
  // moves its device memory there instead of into the image directory:
  // peer to peer while the process still runs (soft recopy), then what it
  // wrote meanwhile. phos-keeper holds the memory after criu exits until
  // `criu restore` takes it, the process then mapping it on that GPU. To
  // the GPU the process is on, its own memory stays where it is (no copy)
  // unless migrate_copy=always. A process on several GPUs needs a map,
  // "SRC:DST[,SRC:DST...]" (gpu_map.h's migration_targets), each GPU's
  // memory going to its own target.
  std::string migrate_to;
  // parent_image: an incremental GPU image against this parent directory
  // (relative to the image directory), as criu's --prev-images-dir names
  // one, which wins where given. For kernels without soft-dirty tracking,
  // where criu refuses --prev-images-dir (its parent needs --track-mem):
  // the CPU pages are then dumped whole, the GPU data incrementally.
  std::string parent_image;
  enum class MigrateCopy { kAuto, kAlways };
  MigrateCopy migrate_copy = MigrateCopy::kAuto;
  // migrate_keep_s: how long phos-keeper keeps a migration's memory for a
  // restore; then it writes it into the image directory as a dump would
  // have (an image like any other) and lets go.
  uint32_t migrate_keep_s = 600;

  uint32_t chunk_size() const { return chunk_mib << 20; }

  // The settings of this process: the file, then the environment; warnings
  // and the effective settings go to the log.
  static PluginOptions load();

  // The same from given sources, for tests. `getenv` returns nullptr for
  // unset variables; each warning is one line naming where it comes from.
  using GetEnv = std::function<const char*(const char*)>;
  static PluginOptions parse(std::string_view config_text, const std::string& config_name, const GetEnv& getenv,
                             std::vector<std::string>& warnings);

  // One line: every setting as `key=value`.
  std::string describe() const;
};

}  // namespace phos::plugin
