// The engine: moves device memory between the application's GPU allocations
// and the image directory, from inside criu. Dump: each allocation, reached
// through the fd the agent exported, is mapped into criu's own CUDA context;
// worker threads copy it device-to-host chunk by chunk and write the chunks,
// checksummed, each worker into its own data file (no two writers share a
// file's locks). Restore: each allocation is created anew on its device and
// the workers fill it from the image; the memory is handed on as an fd for
// the agent to map at its original address.
//
// A chunk whose every byte is 0 (the checksum kernel says so while it runs)
// is not written; a restore sets it with a memset instead of reading it.
//
// Validation by checksum (cow_trust=checksum, sum_check.h): a copy made
// while the process runs reads each chunk once on the GPU into a bounce
// buffer of criu's, taking its fingerprint (fingerprint.h) from the bytes
// it copies (chunk_sum.cu), and the DMA reads the bounce; every copy-on-write
// copy must equal the chunk's fingerprint at the freeze, and recopy's final
// pass copies again every chunk whose fingerprint changed since its copy.
//
// Each worker keeps a staging ring of a few slots (pinned buffer, stream per
// device) so that DMA and CPU work overlap: at dump the device-to-host copy of
// the next chunks runs while the worker checksums and writes the previous
// one; at restore the file read of the next chunk runs while the previous
// one goes host-to-device.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "chunk_crc.h"
#include "chunk_sum.h"
#include "driver/cuda_api.h"
#include "phos/images/copy_state.h"
#include "phos/images/dead_ranges.h"
#include "phos/images/data_file.h"
#include "phos/images/manifest.h"
#include "phos/images/parent_index.h"
#include "phos/images/unique_fd.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/cow_pool.h"
#include "phos/plugin/gpu_map.h"
#include "phos/plugin/options.h"
#include "phos/plugin/sum_check.h"
#include "phos/plugin/traffic.h"
#include "phos/support/result.h"

namespace phos::plugin {

struct EngineSettings {
  uint32_t chunk_size = image::kDefaultChunkSize;  // of a dump; a restore uses the image's
  unsigned workers = 0;                             // 0: one per core, at most 16
  image::DirectIo direct_io = image::DirectIo::kAuto;
  image::Compression compression = image::Compression::kNone;
  int zstd_level = 1;
  bool gpu_checksums = true;  // a dump's chunk CRCs computed on the GPU (plugin/gpu/chunk_crc.cu)
  image::Sparse sparse = image::Sparse::kAuto;  // a dump's zero chunks stored as holes (zero_chunk.h)
  // PhOS §5's traffic control of the copies made while the process runs
  // (traffic.h; options.h, traffic): pauses for its transfers, and recopy's
  // first pass cold regions first.
  PluginOptions::Traffic traffic = PluginOptions::Traffic::kAuto;
  uint64_t traffic_bytes_per_second = 20'000'000'000ull;  // the process's transfers, assumed
  // cow_trust=checksum: the copies of a copy window are validated by
  // fingerprints (sum_check.h).
  bool checksum = true;

  static EngineSettings from(const PluginOptions& o);
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> start(const EngineSettings& settings);
  ~Engine();

  // Creates criu's contexts on these devices ahead of time (a dump does it
  // before the process's gate closes: time the process does not wait
  // for). Best effort: a device that fails here fails later.
  void warm_up(const std::vector<int>& ordinals);

  // This host's GPUs as criu numbers them (described once: a dump asks for
  // each process, twice for a migration's).
  Result<std::vector<GpuDevice>> host_gpus();

  // A dump of one process's device memory: prepared (every allocation
  // imported and mapped into criu, so the process may let go of its own)
  // while criu's freeze timer runs, copied after, off that timer.
  struct SaveJob;
  // `host_ordinal`: the process's device ordinals in criu's numbering
  // (host_ordinals(), gpu_map.h); a device not in it keeps its ordinal. The
  // manifest names each device by the process's ordinal.
  //
  // A migration (`sink`, migrate_to) copies into device memory on the
  // sink's GPU instead of data files: device to device, peer to peer where
  // the GPUs differ (NVLink or PCIe, no host staging where the source GPU
  // can map the target's memory), by a few workers. In place, nothing is
  // copied: the process's own memory is what is kept.
  // A process on several GPUs moves each GPU's memory to its own target.
  struct MigrationSink {
    std::map<int, int> targets;  // source GPU -> target GPU, criu's numbering
    bool in_place = false;       // every target the source itself: the memory stays
    int target_of(int source) const { return targets.at(source); }
    std::string describe() const;  // "GPU 1", or "GPUs 0->1, 1->0"
  };
  // `ahead`: the allocations mapped into criu already (map_ahead, for
  // these very allocations), which the job takes over. `workers`: at most
  // this many (0: one per chunk, at most the engine's).
  class MappedAhead;
  Result<std::unique_ptr<SaveJob>> prepare_save(int dirfd, int32_t vpid, const std::vector<agent::Allocation>& allocs,
                                                const std::vector<UniqueFd>& fds,
                                                const std::map<uint32_t, int>& host_ordinal, image::Manifest& m,
                                                const MigrationSink* sink = nullptr, MappedAhead* ahead = nullptr,
                                                unsigned workers = 0);
  // Allocations mapped into criu while their process still runs (the
  // mapping of the 8B server's 203 was 17-44 ms of its stall): a save's
  // job takes them (prepare_save), or they are unmapped with this.
  class MappedAhead {
   public:
    MappedAhead() = default;
    MappedAhead(MappedAhead&& o) noexcept { *this = std::move(o); }
    MappedAhead& operator=(MappedAhead&& o) noexcept;
    ~MappedAhead() { release(); }
    bool empty() const { return vas_.empty(); }
    void release();  // unmapped, now

   private:
    friend class Engine;
    std::vector<CUdeviceptr> take();  // the mappings, now the caller's
    Engine* engine_ = nullptr;
    std::vector<agent::Allocation> allocs_;
    std::vector<CUdeviceptr> vas_;
    std::set<int> devices_;  // criu's ordinals of their GPUs
  };
  Result<MappedAhead> map_ahead(const std::vector<agent::Allocation>& allocs, const std::vector<UniqueFd>& fds,
                                const std::map<uint32_t, int>& host_ordinal);
  // A migration's memory once run_save is done, one fd per allocation, in
  // order (empty before): what phos-keeper holds for the restore.
  static std::vector<UniqueFd> take_kept(SaveJob& job);
  // Copies every allocation of a prepared job into device memory of criu's
  // own, on the same GPU (device to device, at the speed of its memory),
  // and lets go of the process's memory: from then on the process may run
  // while run_save writes the image from the snapshot. false, with the job
  // unchanged, where a GPU lacks the free memory for it (the snapshot must
  // leave 5% of the GPU, at least 1 GiB, to the process).
  Result<bool> snapshot(SaveJob& job);
  // An incremental dump (criu --prev-images-dir): a chunk whose size,
  // CRC-32C and fingerprint are those of the parent's stored chunk of the
  // same allocation id and offset (parent_index.h) is not written, only
  // recorded as a parent chunk.
  void set_parent(SaveJob& job, image::ParentIndex parent);
  // Soft copy-on-write (copy_state.h), where the snapshot does not fit: a
  // copy table over the job's allocations (on any number of GPUs) and a
  // pool of up to `pool_bytes` on each of their GPUs (less where the GPU
  // has less free, none where it has no room for a chunk), exported for the
  // process. The table numbers the slots across the pools in their order.
  // From then on run_save takes the chunks the table hands out, from the
  // process's memory or a pool on the chunk's GPU.
  struct CopyWindow {
    copystate::CopyState table;
    std::vector<agent::CopyPool> pools;  // for the process (its ordinals), in slot order
    std::vector<UniqueFd> pool_fds;      // one per pool
    uint64_t pool_bytes = 0;             // all pools together
  };
  // Soft recopy (kSoftRecopy, for a dump that stops the process): the
  // same table without a pool, over memory on any number of GPUs; the
  // process's writes mark chunks dirty. run_first_pass copies the clean
  // chunks while the process runs; run_save, once its gate is closed again,
  // the rest and the dirty ones.
  // pool_bytes: empty for cow_pool_mib=auto (cow_pool.h). `peers`: auto,
  // for each GPU (criu's numbering) the memory of the dump's processes
  // there that may take a pool, this one's included: the GPU's free memory,
  // measured once for them all, is split among them (cow_pool.h).
  Result<CopyWindow*> open_window(SaveJob& job, CopyProtocol protocol, std::optional<uint64_t> pool_bytes,
                                  const std::map<int, PoolPeers>& peers = {});
  // The job's memory on `device` as a pool counts it (whole chunks).
  uint64_t pool_need(const SaveJob& job, int device) const;
  struct FirstPass {
    uint64_t bytes = 0;  // copied, clean when taken
    uint64_t ns = 0;
    bool whole = false;  // every chunk taken (not stopped by the deadline)
    uint64_t pauses = 0, paused_ns = 0;  // for the process's transfers (traffic.h; summed over workers)
  };
  // Soft recopy's first pass: copies chunks not yet dirty until none is left
  // or `deadline_ns` (CLOCK_MONOTONIC) passes. The job keeps them; the
  // window stays open for run_save.
  Result<FirstPass> run_first_pass(SaveJob& job, uint64_t deadline_ns);
  // Validation by checksum: whether the fingerprints of the job's memory
  // can be taken, on its GPUs (the kernels loaded there) or on the CPU
  // (gpu_checksums=off, for tests); why not otherwise.
  Result<void> can_sum(const SaveJob& job);
  // Copy-on-write, the process drained: every chunk of the job's window
  // fingerprinted now (the freeze, T0); from then on every copy is checked
  // against it, and one that differs fails run_save (EBADMSG) naming the
  // chunk. An error: the window cannot be validated (drop_window).
  Result<void> take_freeze_sums(SaveJob& job);
  // Copy-on-write, before the process runs again: the chunks of the
  // allocations `ids` copied into the image now and taken as copied in the
  // window, so that a write to them there saves nothing. For memory other
  // processes map through CUDA IPC (ipc_sharing.h), whose writes pass no
  // hook of this one: copied while every process that shares it is
  // stopped. Checked against the freeze like the window's other copies
  // (after take_freeze_sums). `stop` set: the rest is not copied (ECANCELED).
  struct StoppedPass {
    uint64_t chunks = 0, bytes = 0, ns = 0;
  };
  Result<StoppedPass> copy_stopped(SaveJob& job, const std::set<uint64_t>& ids, const std::atomic<bool>& stop);
  // The staging rings of the job's workers (pinned staging buffers, their
  // streams, the checksum's bounce chunks) made now, on a thread of their
  // own, for its copy to take when it starts; the rings are kept by the
  // engine for its next copies until it ends. Made as a copy-on-write copy
  // started, after the process ran again, the 48 slots of 16 workers held
  // the copy back for about 0.4 s on an H200 (the driver does their
  // allocations one at a time), while the program's first writes waited
  // for it. Nothing for a migration, or where rings wait already.
  void prepare_rings(const SaveJob& job);
  // The same, on this thread, for the GPUs of allocations mapped ahead,
  // before the gate closes: made while criu dumps, the rings' mmap,
  // munmap and pinning (82 ms for the 8B server's 48 slots) ran beside
  // criu's collection of the process's VMAs, whose own mmaps of its files
  // waited for them (the collection took 79 ms for what took 31 ms once
  // the rings were made), inside the stall.
  void prepare_rings(const MappedAhead& ahead, int32_t vpid);
  // The same for `devices` (criu's ordinals, their contexts made), every
  // worker's (or `workers`', where not 0), on a thread of its own (a job's
  // ranks held: made while criu pauses them one by one); `whose` goes into
  // the log. `bounce`: with the checksum's bounce chunks (where checksums
  // are on), which a stopped copy does not use.
  void prepare_rings(const std::set<int>& devices, const std::string& whose, unsigned workers = 0, bool bounce = true);
  // The workers of a stopped copy of `bytes` whose staging is made once
  // the gate is closed: one per 8 chunks, at most the engine's. A worker's
  // 3 slots take ~7.5 ms to make (the driver pins them one at a time),
  // while 8 chunks take it ~18 ms to write into a tmpfs: a small copy's 16
  // workers (48 slots, 118 ms beside the driver's checkpoint) ended after
  // that checkpoint, and held up the dump.
  unsigned workers_for_stopped(uint64_t bytes) const;
  // Copy-on-write, after take_freeze_sums (and copy_stopped), before the
  // process runs again: each chunk still pending that was all 0 bytes at the
  // freeze goes into the image as a zero chunk (a hole, sparse=auto) and is
  // taken as copied, so no write of the process saves it into the pool or
  // waits for it, and the engine copies nothing of it. A program's memory
  // it has not written yet (a preallocated KV cache) is most of a large
  // window's: a kernel whose speculated set reaches into it then waits for
  // none of it. Nothing where the freeze took no zero flags, for a
  // migration (its data goes to device memory, not to holes) or with
  // sparse=off. Its log line says how many.
  void settle_zero_chunks(SaveJob& job);
  // Dead memory (dead_ranges.h): the program's free device memory at the
  // gate closing the image stands for. Its chunks are not copied (dropped
  // from the stopped copy, taken as copied in a copy window, open or
  // opened later, so that no write to them is saved) and the manifest
  // records them dead. Before run_save; none for a migration.
  void set_dead(SaveJob& job, const std::vector<dead::Range>& ranges);
  // A window opened but not to be used: its table and pool dropped, the job
  // as before open_window.
  void drop_window(SaveJob& job);
  // A prepared job that is not to be written after all: criu's mappings
  // released, its data files removed from `dirfd`.
  void discard_save(int dirfd, std::unique_ptr<SaveJob> job);
  // Copies into the process's data files, one per worker; fills the
  // manifest's allocations, data files and copy statistics. Unmaps what
  // prepare_save mapped (or frees the snapshot). With a copy window: closes
  // it (copied, or aborted on failure) and frees the pool.
  Result<void> run_save(SaveJob& job);

  // Where each of the image's GPUs goes on this host (gpu_map.h): the same
  // ordinal unless `spec` moves it; the models must match.
  // `host` gets this host's GPUs.
  Result<std::vector<GpuPlacement>> place_devices(const image::Manifest& m, const std::string& manifest_name,
                                                  const GpuMapSpec& spec, std::vector<GpuDevice>& host);
  // A restore of one process's device memory: each allocation of `m`
  // created on the GPU `placement` gives its device (so too little memory
  // shows before criu creates a process), then filled by run_load while criu
  // restores the CPU side; one fd per allocation, in order.
  struct LoadJob;
  Result<std::unique_ptr<LoadJob>> prepare_load(const image::Manifest& m,
                                                const std::vector<GpuPlacement>& placement);
  // Eager: one fd per allocation once filled. On-demand (open_fill): none,
  // the fds went out before; chunks are filled as the table hands them out
  // (those a call waits for first, then job.fill_order), each marked filled
  // in the table once its checksum is checked.
  Result<std::vector<UniqueFd>> run_load(int dirfd, LoadJob& job);
  // On-demand restore of a prepared job: a fill table over its allocations
  // at their original addresses (copy_state.h, kOnDemandFill), and one fd
  // per allocation exported now (job.fds), for the process to map while
  // run_load fills the memory. `first`: allocation ids to fill first, in
  // that order (the recorded launches' order); the rest follow in address
  // order.
  Result<void> open_fill(LoadJob& job, const std::vector<uint64_t>& first);

 private:
  Engine(const CudaApi& cu, const EngineSettings& settings);  // in engine.cc, where Slot is complete
  CUcontext context(int ordinal, Result<void>& err);
  Result<CUdeviceptr> map(CUmemGenericAllocationHandle h, size_t size, int device);
  Result<CUdeviceptr> import_and_map(const agent::Allocation& a, const UniqueFd& fd, int device);
  void unmap(CUdeviceptr va, size_t size);
  // Device memory on `device` (its context current) that exports as a POSIX
  // fd: what a process maps, and what phos-keeper holds. h is 0 on failure.
  CUresult create_exportable(CUmemGenericAllocationHandle& h, size_t bytes, int device) const;
  // `h`'s fd; an error names `what`.
  Result<UniqueFd> export_fd(CUmemGenericAllocationHandle h, const std::string& what) const;
  Result<GpuDevice> describe(int ordinal);
  // Unmaps the process's memory from criu, or frees the snapshot.
  void release_sources(SaveJob& job);
  // Frees snapshot memory, one allocation per device, and forgets it.
  void free_snapshot(std::map<int, CUdeviceptr>& bases);
  // Unmaps and releases what a load job still holds.
  void release_load(LoadJob& job);

  // A piece of work for the workers: `size` bytes at `offset` of mapping `va`.
  struct Piece {
    size_t allocation;  // index in the allocation list
    size_t chunk;       // index of the chunk in that allocation
    uint64_t offset;    // in the allocation
    size_t size;
    int device;
    std::optional<copystate::Claim> claim = std::nullopt;  // copy-on-write: the table's chunk
  };
  // The workers' next piece: kTaken, or none left (kDone), or none now but
  // more to come (kLater: a copy window's chunk is being saved or copied).
  enum class Take { kTaken, kDone, kLater };
  using NextPiece = std::function<Take(Piece&)>;
  // What a copy does with each piece, in a slot of a worker's staging ring.
  struct PieceWork {
    // Queues the piece's DMA on `stream` (dump: device to host; restore: the
    // file read into `buffer`, then host to device). `bounce`: device memory
    // of criu's of the staging buffer's size, where `bounce` below asks for
    // it and the GPU had room (else 0).
    std::function<Result<void>(const Piece&, void* buffer, CUstream stream, unsigned worker, CUdeviceptr bounce)>
        start;
    // Runs once the DMA is done (dump: checksum and write); may be empty.
    std::function<Result<void>(const Piece&, void* buffer, unsigned worker)> done;
    bool bounce = false;  // each slot gets a bounce buffer on the piece's GPU
  };
  struct Slot;
  struct Queue;
  // The number of workers for `pieces` pieces: each has its own data file.
  unsigned workers_for(size_t pieces) const;
  // Runs `work` over all pieces on the workers (`workers`, 0: workers_for),
  // each with staging buffers of `buffer_size` bytes; the first error stops
  // them. dma_wait_ns: per worker, the time spent waiting for DMA.
  Result<void> run_workers(const std::vector<Piece>& pieces, size_t buffer_size, const PieceWork& work,
                           std::vector<uint64_t>& dma_wait_ns, unsigned workers = 0);
  // The same over the pieces `next` hands out, on `workers` workers.
  Result<void> run_workers(unsigned workers, const NextPiece& next, size_t buffer_size, const PieceWork& work,
                           std::vector<uint64_t>& dma_wait_ns);
  Result<void> run_worker(unsigned worker, std::vector<Slot>& ring, size_t buffer_size, const NextPiece& next,
                          Queue& queue, const PieceWork& work, uint64_t& dma_wait_ns);
  // A copy-on-write pool on one GPU: none where the GPU has no room for a chunk.
  struct Pool {
    UniqueFd fd;
    CUdeviceptr va = 0;
    uint64_t bytes = 0;
    uint32_t slots = 0;
  };
  Result<Pool> make_pool(SaveJob& job, int device, std::optional<uint64_t> pool_bytes, const PoolPeers* peers);
  // A pool on each GPU the job has memory on with room for a chunk, mapped
  // in criu (job.pools), its fd for the process appended to `fds`.
  Result<void> make_pools(SaveJob& job, const std::set<int>& devices, std::optional<uint64_t> pool_bytes,
                          const std::map<int, PoolPeers>& peers, std::vector<UniqueFd>& fds);
  void unmap_pools(SaveJob& job);
  // unmap_pools, the exported fds closed and the table told it is given back.
  void return_pools(SaveJob& job);
  // The program asked for the pool (copy_state.h, "giving the pool back"):
  // once no slot holds a chunk, the pools go and the table says so.
  void give_pool_back(SaveJob& job);
  // For the log: each pool's GPU, slots and size, of `gpus` GPUs.
  std::string describe_pools(const SaveJob& job, size_t gpus) const;
  // Where pool slot `slot` lies in criu's mapping of its pool.
  static CUdeviceptr pool_address(const SaveJob& job, uint32_t slot, uint64_t chunk_size);
  // Whether chunk `chunk` of allocation `allocation` is dead (set_dead).
  static bool is_dead(const SaveJob& job, size_t allocation, size_t chunk);
  // The same for chunk `chunk` of the job's window.
  bool window_chunk_dead(const SaveJob& job, uint64_t chunk) const;
  // The window's dead chunks, pending, taken as copied.
  void mark_dead_copied(SaveJob& job);
  // A copy window's next chunk as a piece; `traffic` may pause before one
  // no call waits for.
  Take next_claim(SaveJob& job, TrafficControl& traffic, Piece& out);
  Piece piece_of(const SaveJob& job, const copystate::Claim& claim) const;
  // On-demand restore: the next chunk to fill (urgent ones first, then the
  // job's order from `cursor`).
  Take next_fill(LoadJob& job, std::atomic<size_t>& cursor, Piece& out);
  // What a dump does with each piece: read it from the process's memory
  // (or its pool slot), then checksum and write it; a migration's copies it
  // to the target memory (migrate_work).
  PieceWork save_work(SaveJob& job);
  PieceWork migrate_work(SaveJob& job);
  // A migration's target memory: one allocation per source allocation on
  // the sink's GPU, exported, mapped in criu (for the source GPU too where
  // it has peer access).
  Result<void> create_migration_target(SaveJob& job);
  // The staging buffer size of the job's workers (a migration's need none).
  size_t staging_size(const SaveJob& job) const;
  // Queues the memset that restores a zero chunk (read from no file) on
  // `stream`, the worker's: it is done when the worker syncs that stream.
  Result<void> queue_zero_chunk(const LoadJob& job, const Piece& p, CUstream stream);
  void close_window(SaveJob& job, bool copied);
  Result<void> prepare_slot(Slot& slot, int device, CUcontext ctx, size_t buffer_size, bool bounce);
  // The prepare_rings: up to `workers` rings kept for `devices`, made on
  // this thread or on one of its own; `whose` and `when` go into the log.
  void make_spare_rings(const std::set<int>& devices, size_t workers, bool bounce, bool in_background,
                        const std::string& whose, const char* when);
  // `want` rings for these contexts, or what failed (nothing kept).
  Result<std::vector<std::vector<Slot>>> make_rings(const std::map<int, CUcontext>& contexts, size_t want,
                                                    size_t buffer_size, bool bounce);
  // A worker's ring: one prepare_rings made, or a new one; given back
  // (kept) after a copy that went through, else released.
  std::vector<Slot> take_ring();
  void give_ring(std::vector<Slot>&& ring, bool whole);
  // Waits for the rings being made (prepare_rings).
  void wait_rings();
  // The bounce chunks on `device` of the rings kept (made ahead).
  uint64_t bounce_held(int device);
  // Validation by checksum: the fingerprints of every chunk of the job's
  // window now, on its GPUs (one block per chunk) or, with gpu_checksums
  // off, on the CPU through the staging ring.
  Result<void> sum_chunks(SaveJob& job, sum_check::ChunkSums& out);
  Result<void> sum_chunks_on_gpu(SaveJob& job, sum_check::ChunkSums& out);
  Result<void> sum_chunks_on_host(SaveJob& job, sum_check::ChunkSums& out);
  // Recopy's final pass by checksum, gate closed: T1 taken, the chunks to
  // copy (again) planned, every dirty mark settled.
  Result<sum_check::FinalPass> plan_final_pass(SaveJob& job);
  // A copied chunk's fingerprint checked against the job's reference, or
  // kept as its copy's (recopy's first pass); an error names a chunk that
  // differs.
  Result<void> check_copy(SaveJob& job, const Piece& p, uint64_t fingerprint);
  // The run's misses as one error (EBADMSG at the freeze, EIO in the final
  // pass).
  Error misses_error(SaveJob& job);
  // A migration's copies fingerprinted on their target (pinned host slots
  // the sum kernel writes, one per table chunk); none where not validated.
  Result<void> prepare_target_sums(SaveJob& job);
  // A pinned staging buffer on huge pages (its address and mapped length).
  std::optional<std::pair<void*, size_t>> huge_staging(size_t size) const;
  Result<void> finish_slot(Slot& slot, unsigned worker, const PieceWork& work, uint64_t& dma_wait_ns);
  void release_ring(std::vector<Slot>& ring);
  // The same with `contexts` (a thread that must not read the engine's map).
  void release_ring(std::vector<Slot>& ring, const std::map<int, CUcontext>& contexts);
  // After the copy: data files, allocations and statistics into the manifest.
  Result<void> finish_save(SaveJob& job, uint64_t elapsed_ns, const std::vector<uint64_t>& dma_wait_ns);

  // The GPU checksum kernel in `ordinal`'s context (loaded with it); null
  // where it could not be (crc_unavailable_ says why): the CPU checksums.
  CUfunction crc_function(int ordinal) const;
  // Queues the checksum of `size` bytes at `data` on `stream`, into `tail`
  // (marked not done first), with whether they are all zero; false where it
  // could not be queued, and the CPU checksums the chunk.
  bool queue_crc(int device, CUdeviceptr data, size_t size, ChunkCrcTail* tail, CUstream stream) const;
  // The fingerprint kernels in `ordinal`'s context (chunk_sum.h); null where
  // they could not be loaded (sum_unavailable_ says why).
  struct SumKernels {
    CUfunction sum = nullptr;       // phos_chunk_sum
    CUfunction copy_sum = nullptr;  // phos_chunk_copy_sum
  };
  SumKernels sum_kernels(int ordinal) const;
  void load_sum_kernels(int ordinal, CUcontext ctx);
  // Queues the copy of `size` bytes at `src` into `bounce` with their
  // CRC-32C, zero bit and fingerprint into `tail`; false where it could not
  // be queued (the caller copies from `src` and the CPU fingerprints).
  bool queue_copy_sum(int device, CUdeviceptr src, CUdeviceptr bounce, size_t size, ChunkCrcTail* tail,
                      CUstream stream) const;
  // Queues the fingerprint of `task` (device memory `device` can read) into
  // `out`, both pinned host memory; false where it could not be queued.
  bool queue_sum(int device, ChunkSumTask* task, ChunkSumOut* out, CUstream stream) const;

  const CudaApi& cu_;
  EngineSettings settings_;
  std::map<int, CUcontext> contexts_;
  std::map<int, CUfunction> crc_functions_;
  std::string crc_unavailable_;
  std::map<int, SumKernels> sum_kernels_;
  std::string sum_unavailable_;
  std::atomic<bool> bounce_warned_{false};  // once per engine: a slot the GPU had no bounce for
  std::mutex run_mu_;  // one copy at a time (the workers share the engine's contexts)
  // Auto pools split among several processes: each GPU's free memory when
  // the first of them was sized (under run_mu_).
  std::map<int, uint64_t> split_free_;
  std::mutex host_gpus_mu_;
  std::optional<std::vector<GpuDevice>> host_gpus_;  // once described
  std::mutex rings_mu_;
  std::vector<std::vector<Slot>> spare_rings_;  // made ahead, or left by a copy (prepare_rings)
  std::vector<std::future<void>> rings_made_;   // prepare_rings' threads
  pid_t owner_pid_;                             // criu's: its forked children release nothing
};

struct Engine::SaveJob {
  int32_t vpid = 0;
  std::vector<agent::Allocation> allocs;
  std::vector<CUdeviceptr> vas;  // where each allocation is read: criu's mapping of it, or its snapshot
  std::vector<int> devices;      // each allocation's GPU, as criu numbers it
  std::map<int, CUdeviceptr> snapshot_bases;  // per device, once snapshot() took one
  std::optional<CopyWindow> window;            // soft copy-on-write, once open_window() opened one
  // The window's pools, mapped in criu: slot s of the table (first_slot <=
  // s < first_slot + slots) in the pool on `device` (criu's numbering).
  struct PoolMapping {
    int device = 0;
    uint32_t ordinal = 0;  // the process's number for the GPU
    CUdeviceptr va = 0;
    uint64_t bytes = 0;
    uint32_t first_slot = 0;
    uint32_t slots = 0;
  };
  std::vector<PoolMapping> pools;
  std::atomic<bool> pool_returned{false};      // the program asked for the pool and got it (give_pool_back)
  std::vector<size_t> region_allocation;       // the allocation of each of the table's regions
  std::vector<std::vector<bool>> dead;         // per allocation, its dead chunks (set_dead)
  uint64_t dead_chunks = 0, dead_bytes = 0;
  uint64_t first_pass_chunks = 0;              // soft recopy: chunks its first pass copied
  uint64_t recopied_chunks = 0;                // soft recopy: dirty chunks copied again by run_save
  // Validation by checksum (sum_check.h), by table chunk: what each copy is
  // checked against once `checked` (copy-on-write: the freeze; recopy: the
  // final gate closing), the fingerprints of the copies the image holds
  // (recopy's first pass), the copies that differed, and the figures.
  bool validated = false;  // the window's copies are fingerprinted
  bool checked = false;    // and compared with `reference`
  sum_check::Against against = sum_check::Against::kFreeze;
  sum_check::ChunkSums reference;
  sum_check::ChunkSums image_sums;
  std::mutex misses_mu;
  sum_check::Misses misses;
  uint64_t sum_pass_ns = 0;
  std::atomic<uint64_t> sum_checked{0};
  uint64_t sum_missed = 0;           // recopy: changed without a dirty mark
  uint64_t sum_unchanged_dirty = 0;  // recopy: dirty, unchanged, not copied again
  // A migration's copies fingerprinted on their target: one pinned slot per
  // table chunk.
  ChunkSumTask* target_tasks = nullptr;
  ChunkSumOut* target_sums = nullptr;
  // Pauses of the copies made while the process ran, for its own transfers
  // (traffic.h), and their time summed over the workers.
  uint64_t traffic_pauses = 0, traffic_paused_ns = 0;
  std::atomic<uint64_t> chunk_copies{0};       // chunks copied to the image (recopy: some twice)
  std::atomic<uint64_t> gpu_checksummed{0};    // of those, checksummed on the GPU
  std::atomic<uint64_t> gpu_fingerprinted{0};  // of those, fingerprinted on the GPU
  std::vector<Piece> pieces;
  std::vector<std::vector<image::Chunk>> chunks;
  // set_parent: the parent's stored chunks; and the chunks left to it.
  image::ParentIndex parent;
  std::atomic<uint64_t> parent_chunks{0};
  std::vector<std::unique_ptr<image::DataFileWriter>> writers;  // one per worker
  unsigned workers = 0;  // the copy's threads: one per data file; a migration's, a few
  // A migration (migrate_to): the memory the data goes to, and its fds.
  struct Migration {
    MigrationSink sink;
    std::vector<CUmemGenericAllocationHandle> handles;  // the copy's target memory
    std::vector<CUdeviceptr> vas;                       // mapped in criu
    std::vector<UniqueFd> fds;                          // for phos-keeper
    std::map<int, bool> peer;  // per source GPU: it maps the target memory (else cuMemcpyPeerAsync)
  };
  std::optional<Migration> migration;
  image::Manifest* manifest = nullptr;
  Engine* engine = nullptr;
  ~SaveJob();  // releases what it still holds
};

struct Engine::LoadJob {
  const image::Manifest* manifest = nullptr;
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<CUdeviceptr> vas;
  std::vector<int> devices;  // the host GPU of each allocation
  std::vector<Piece> pieces;
  Engine* engine = nullptr;
  // On-demand restore (open_fill): the fill's table, the allocations' fds
  // exported ahead of the fill, and the order of the table's chunks.
  std::optional<copystate::CopyState> fill;
  std::vector<UniqueFd> fds;
  std::vector<uint64_t> fill_order;   // table chunks, the recorded order first
  std::vector<size_t> piece_of_chunk;  // table chunk -> index in pieces (SIZE_MAX: none)
  std::atomic<size_t> fills_in_flight{0};  // chunks taken, not yet marked filled
  ~LoadJob();  // releases what it still holds
};

}  // namespace phos::plugin
