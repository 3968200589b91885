// The dump side of the plugin: one Checkpointer per `criu dump`.
//
//   PAUSE_DEVICES(pid)       the process still runs: agent hello and status,
//                            quiesce (gate closed, work drained), allocations
//                            and their fds; the engine copies device memory
//                            into the image; the process lets go of its
//                            device memory; the driver locks the process
//   CHECKPOINT_DEVICES(pid)  the process is frozen: the driver checkpoints
//                            it (no device memory left, so this is quick);
//                            the manifest is written
//   exit(DUMP, ret)          success: completion markers. Then every process
//                            that lives on (--leave-running, or a failed dump)
//                            gets back exactly what was taken, in reverse:
//                            driver restore and unlock, its very memory mapped
//                            again (zero copy), the gate opened
//
// Write-behind (criu dump --leave-running, write_behind=auto): at PAUSE the
// engine snapshots the device memory on the GPU first; CHECKPOINT_DEVICES
// then writes a manifest without allocations (restore refuses it: no
// completion marker) and does not wait for the copy; exit(DUMP) gives the
// process back at once, so it runs while the image is written, and
// complete_pending(), at criu's exit, waits for the copy and writes the
// manifest and the marker. The process's stall no longer grows with its
// memory; criu still exits only once the image is whole.
//
// Soft copy-on-write (copy_on_write=auto where the snapshot does not fit,
// or always): at PAUSE the engine opens a copy table over the memory and a
// pool on the GPU (Engine::open_window; with cow_pool_mib=auto once criu
// has paused every process, whose pools on a GPU share its free memory)
// and starts copying at once. The
// process gets its memory back at exit(DUMP) like write-behind, with its
// copy window opened before its gate (the hooks save a chunk into the pool
// before any call writes it, copy_window.h); complete_pending() waits for
// the copy, closes the window and refuses the image (no marker, criu exits
// non-zero) where the process gave the window up or a validated launch
// wrote outside its set. With cow_trust=checksum (the default) the copier
// fingerprints every chunk at PAUSE (the freeze, T0), beside the driver's
// checkpoint, and every copy must equal it: one that differs (a write
// speculation missed) refuses the image, naming the chunk and the kernels
// trusted on speculation in the window; the process runs on, and its
// agent remembers it, so that its next dumps copy while it is stopped.
// Memory that other processes map through CUDA IPC is taken out of the
// window: their writes pass no hook of this one. The owner's copier copies
// it (checked against the freeze) before its plan is decided, while every
// process of the tree is still stopped; no process is given back before
// every plan is (finish()).
//
// Soft recopy (recopy=auto, a dump that stops the process): PAUSE_DEVICES
// closes the gate, maps the memory into criu and opens a recopy window in
// the process, opens the gate again and copies the memory while the process
// runs (its writes mark chunks dirty); then closes the gate for good, and
// the copy in the background takes the chunks left and the dirty ones (with
// cow_trust=checksum: every chunk whose fingerprint changed since its copy,
// whatever the marks say). The image is the state at that last gate
// closing, as a stopped dump's. Memory other processes map through CUDA
// IPC: their writes mark nothing, so it gets recopy only by checksum, whose
// final pass waits until every process of the tree is paused.
//
// Migration (migrate_to, a dump that stops the process): the copy goes to
// device memory on the target GPU instead of data files (soft recopy's
// passes, peer to peer), or, to the process's own GPU, its memory stays in
// place. phos-keeper is given that memory (Keep) before the manifest is
// written and keeps it past criu's exit once the dump succeeded
// (KeepCommitted), until `criu restore` takes it; the manifest names it
// (KeptMemory) and the image holds no GPU data files.
//
// phos-keeper (keeper_link.h), started at the first pause, holds a second
// reference to the memory and learns each step before it is taken, so a
// criu that dies mid-dump does not leave a process without its GPU state.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "keeper/keeper_link.h"
#include "phos/images/manifest.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/job_env.h"
#include "phos/plugin/nccl_job.h"
#include "phos/plugin/options.h"
#include "phos/support/result.h"

namespace phos::plugin {

class Checkpointer {
 public:
  // How a write-behind dump's device memory is copied, decided by the copier
  // at PAUSE: stop-the-world, while the process is stopped or (`snapshot`)
  // from a snapshot on the GPU while it runs again; or copy-on-write, from
  // its own memory while it runs again. The snapshot is no protocol of its
  // own: the image is stop-the-world's, written later.
  struct CopyPlan {
    CopyProtocol protocol = CopyProtocol::kStopTheWorld;
    bool snapshot = false;
    // The copy failed before the process could run again (a stopped
    // stop-the-world plan): the dump fails with it.
    std::optional<Error> error = std::nullopt;
    // The copy goes on once the process runs again.
    bool behind() const { return snapshot || protocol == CopyProtocol::kSoftCopyOnWrite; }
  };

  Checkpointer(int image_dirfd, PluginOptions options);
  // Waits for copies still running (a joinable thread must not be destroyed).
  ~Checkpointer();

  // false: the process has no phos agent (the hook answers -ENOTSUP).
  Result<bool> pause(pid_t pid);
  Result<bool> checkpoint(pid_t pid);
  // Never fails the dump further; logs what it could not do. true: images
  // are still being written behind processes that run again; criu must call
  // complete_pending() before it exits.
  bool finish(bool dump_succeeded);
  // Waits for the write-behind copies, then writes their manifests and
  // completion markers; the first failure (an incomplete image).
  Result<void> complete_pending();
  // A leave-running dump of one host's part of a job that the job aborted:
  // criu runs no vote there (job_step.h), so it must fail at its exit.
  bool job_aborted_here() const { return job_aborted_here_; }

 private:
  struct Target {
    pid_t vpid = 0;
    agent::HelloReply hello;
    agent::StatusReply status;
    std::vector<agent::Allocation> allocations;
    std::vector<UniqueFd> fds;  // the device memory, while the process has let go of it
    // The allocations and their fds listed while the process still ran
    // (list_ahead): taken at the closed gate if it lists the same.
    std::vector<agent::Allocation> ahead;
    std::vector<UniqueFd> ahead_fds;
    bool listed_ahead = false;  // the fds at the gate are those exported ahead
    // Its own allocations of t.ahead mapped into criu ahead too: the save's
    // job takes them if they are what it saves (else released).
    Engine::MappedAhead mapped_ahead;
    bool mapped_at_gate = true;  // prepare_save mapped them (none ahead, or not these)
    // criu's CUDA starts beside the gate and the driver's checkpoint: the
    // copier maps the memory and copies once it is up (engine_may_wait).
    bool engine_deferred = false;
    // Why the give-back failed, where it did: the image holds the process
    // waiting for the same thing and is not completed; phos-keeper tries
    // again once criu has let the process go.
    std::string not_given_back;
    // What the engine copies: the allocations without the CUDA IPC mappings
    // of other processes' memory (their owners' images hold it), with
    // duplicates of their fds.
    std::vector<agent::Allocation> own_allocations;
    std::vector<UniqueFd> own_fds;
    image::Manifest manifest;
    std::unique_ptr<Engine::SaveJob> save;  // the copy, started in PAUSE_DEVICES
    // The program's free device memory at the gate closing the image stands
    // for (the final quiesce's; dead_ranges.h): not stored.
    std::vector<dead::Range> dead;
    std::thread copier;
    Result<void> copied;
    // Copy-on-write refused by checksum: the chunks that differed (the
    // first few), for the agent to name the launches that could have
    // written them; kept when the copy's job goes (copy_done).
    std::vector<agent::AddressRange> missed_chunks;
    // How the copy goes on: decided by the copier at PAUSE. Shared: other
    // copiers wait for it too (an owner of memory other processes map has
    // made its stopped copy once its plan is set). Ready on every way out
    // of the copier: set, or its promise dropped with the copier's thread.
    std::shared_future<CopyPlan> plan;
    // Write-behind: the copy from the snapshot waits for this, so that it
    // does not compete with the driver checkpoint and criu for PCIe and
    // memory bandwidth while the process is stopped.
    std::promise<void> write_go;
    bool write_go_given = false;
    std::atomic<bool> abandoned{false};  // the dump failed: a snapshot is not written
    // Copy-on-write's auto pool, split among the dump's processes on a GPU
    // (cow_pool.h): its memory on each GPU (criu's numbering) as a pool
    // counts it, set at PAUSE; and whether it may still take a pool (its
    // copier has not chosen a snapshot or a stopped copy).
    std::map<int, uint64_t> pool_need;
    std::atomic<bool> no_pool{false};
    bool write_behind = false;           // the copy outlives the freeze (snapshotted, or copy-on-write)
    bool agent_window = false;      // the agent has a copy window open: closed at criu's exit
    bool validated = false;         // the copies were checked by checksum (the manifest records it)
    // The image's protocol (the manifest records it): soft recopy once a
    // first pass copied while the process ran, soft copy-on-write once the
    // copier chose it and while the process has its window; else
    // stop-the-world.
    CopyProtocol protocol = CopyProtocol::kStopTheWorld;
    bool recopy() const { return protocol == CopyProtocol::kSoftRecopy; }
    bool copy_on_write() const { return protocol == CopyProtocol::kSoftCopyOnWrite; }
    // The stall's parts (CLOCK_MONOTONIC): PAUSE done, the driver's
    // checkpoint, CHECKPOINT_DEVICES done, the gate reopened.
    uint64_t paused_done_ns = 0, driver_checkpoint_ns = 0, checkpointed_at_ns = 0, resumed_at_ns = 0;
    uint64_t copy_wait_ns = 0;  // CHECKPOINT_DEVICES waiting for a stopped copy to end
    // PAUSE's steps after the quiesce (0 where a step was not taken):
    // allocations listed with their fds, handed to phos-keeper, mapped into
    // criu (the copy's job), released by the process.
    uint64_t listed_at_ns = 0, kept_at_ns = 0, mapped_at_ns = 0, released_at_ns = 0;
    uint64_t paused_at_ns = 0;
    uint64_t nccl_release_ns = 0;  // the quiesce's part that released NCCL communicators
    // The driver's checkpoint, made for every process at the first
    // CHECKPOINT_DEVICES (driver_checkpoints()); its own hook reports it.
    std::optional<Result<void>> driver_checkpointed;
    uint64_t give_back_at_ns = 0;  // the give-back began (its driver restore, with the others')
    uint32_t taken = 0;  // Taken bits (give_back.h): what to give back
    std::map<uint32_t, int> host_ordinal;  // its device ordinals in criu's numbering
    std::optional<Engine::MigrationSink> migrate;  // a migration: where its memory goes
    // Each GPU it is on (criu's numbering) to the GPU its memory goes to
    // (none without device memory).
    std::map<int, GpuDevice> migrate_targets;
    std::vector<UniqueFd> kept;  // a migration's memory once copied, for phos-keeper
    std::vector<std::byte> manifest_file;  // once written
  };
  Result<void> pause_target(pid_t pid, AgentClient& client, Target& t);
  bool engine_may_wait(pid_t pid, const Target& t);
  Result<void> prepare_deferred_save(pid_t pid, Target& t);
  // behind_nice: criu's threads give the CPUs to the processes that run again.
  void yield_cpus_to_processes();
  // The process's allocations and their fds (gate closed), its devices named.
  Result<void> list_allocations(pid_t pid, AgentClient& client, Target& t);
  // The same while the process runs (gate open), kept in t.ahead.
  void list_ahead(pid_t pid, AgentClient& client, Target& t);

  // migrate_to: the target GPU of each of the process's GPUs; refused
  // where criu leaves it running, or the map does not fit its GPUs
  // (migration_targets, gpu_map.h), or the models differ.
  Result<void> plan_migration(pid_t pid, Target& t);
  // A migration's allocations, once listed: all on GPUs planned from.
  Result<void> check_migration(pid_t pid, const Target& t);
  // A migration's memory handed to phos-keeper (before the manifest).
  Result<void> keep_migration(pid_t pid, Target& t);
  const Engine::MigrationSink* sink(const Target& t) const { return t.migrate ? &*t.migrate : nullptr; }
  // Soft recopy (copy_state.h), for a dump that stops the process: whether
  // this one gets it (why not is logged).
  bool recopy_wanted(pid_t pid, const Target& t);
  uint64_t first_pass_budget_ms() const;
  // Gate closed: allocations mapped into criu, a recopy window opened in the
  // process; gate open again; the first pass copied while it runs. On an
  // error the gate is open and the window closed (discard_first_pass()
  // drops the rest).
  Result<void> first_pass(pid_t pid, AgentClient& c, Target& t);
  // Soft recopy of a process that shares memory through CUDA IPC: its own
  // memory only; memory others map only where the final pass goes by
  // checksum. Why not otherwise.
  Result<void> recopy_allows_sharing(const Target& t) const;
  // Gate closed for good: the window's account; a violation or a window the
  // process gave up makes every chunk dirty.
  Result<void> end_first_window(pid_t pid, AgentClient& c, Target& t);
  // The first pass's copy dropped (its data files removed): the dump copies
  // while the process is stopped.
  void discard_first_pass(Target& t);
  // Waits for the copy of `t` to end; its result.
  Result<void> copy_done(Target& t);
  // Lets a write-behind copy start (once).
  static void let_write(Target& t);
  // wait_copy: the engine may still map the process's memory (no snapshot).
  void give_back(pid_t pid, Target& t, bool wait_copy = true);
  static std::string not_given_back_text(const Target& t);
  void refuse_image(pid_t pid, const Target& t);
  // The manifest's own fields, then the manifest written.
  Result<void> write_manifest(pid_t pid, Target& t);
  // An incremental dump (criu --prev-images-dir): the parent image of the
  // process, opened and checked; the manifest and the save job use it.
  Result<void> use_parent(Target& t);
  // Snapshot, copy-on-write or neither (the copier, at PAUSE).
  CopyPlan choose_copy(Target& t);
  // Copy-on-write: the process's memory that other processes map through
  // CUDA IPC copied before any of them runs again (ipc_sharing.h).
  Result<void> copy_shared_now(Target& t);
  // cow_start=pause: before t's copy, until every owner of memory other
  // processes map has decided its plan (and so made its stopped copy).
  void wait_stopped_copies(const Target& t, std::shared_future<void>& tree_paused);
  // cow_pool_mib=auto: the dump's processes that may take a pool on each of
  // `t`'s GPUs, `t` included; once the tree is paused (every process known).
  std::map<int, PoolPeers> pool_peers(const Target& t) const;
  // CUDA IPC between the dumped processes (ipc_sharing.h), checked once all
  // of them are paused: the first CHECKPOINT_DEVICES does it.
  Result<void> check_ipc();
  std::optional<Result<void>> ipc_checked_;
  // Every process of the tree is paused (the first CHECKPOINT_DEVICES), or
  // the dump ends: the copies of memory shared through CUDA IPC wait for it.
  void tree_is_paused();
  std::promise<void> tree_paused_promise_;
  std::shared_future<void> tree_paused_ = tree_paused_promise_.get_future().share();
  bool tree_paused_given_ = false;
  // Copy-on-write: opens the process's copy window (before its gate opens).
  // false: it cannot have one (the reason is logged), and must stay stopped
  // until its memory is copied.
  Result<bool> open_window(pid_t pid, Target& t, AgentClient& c);
  // Copy-on-write, at criu's exit: closes the window; an error where the
  // image cannot be trusted. `missed`: the engine found a copy that differs
  // from the freeze (the agent remembers it); `reply` gets the agent's
  // account where given.
  Result<void> close_window(pid_t pid, Target& t, bool missed = false, agent::CloseCopyWindowReply* reply = nullptr);
  // Copy-on-write with cow_trust=checksum: whether this process may copy
  // while it runs (why not is logged), and its freeze fingerprinted once
  // the window is open; false: the window is dropped, the copy stops it.
  bool checksum_allows(const Target& t);
  bool take_freeze_sums(Target& t);
  // The driver's checkpoint of every process whose driver is locked, all at
  // once (driver_parallel): a job's ranks wait for the slowest, not the sum.
  void driver_checkpoints();
  // At a give-back of several processes: their driver restores, all at once.
  void driver_restores(const std::vector<pid_t>& pids);
  // Records that the dump is about to take `step` from the process: in the
  // target, and with the keeper, before it happens.
  void taking(pid_t pid, Target& t, uint32_t step);
  // The engine, started once (after a warm-up begun by a job's hold).
  Result<void> start_engine();
  Result<void> start_engine_now();
  // criu's CUDA start-up and its contexts on the GPUs of `ranks` (their
  // statuses), on a thread of its own, then the copy's staging: begun at
  // the pause of a process that started CUDA but holds no memory (a job's
  // launcher, paused before its ranks), else at a job's hold (~0.2 s),
  // rather than by each rank's PAUSE in turn (~150 ms a GPU) while every
  // rank waits, held. Only their GPUs: on a 4-GPU host the other two cost
  // 0.3 s more than the hold. `when` goes into the log line. Once a dump.
  // `stopped_bytes` (where not 0): the staging of a stopped copy of that
  // much, made at the gate (Engine::workers_for_stopped).
  void warm_up_engine(std::vector<agent::StatusReply> ranks, const char* when, uint64_t stopped_bytes = 0);
  // The statuses of the processes of criu's tree, not yet paused nor
  // `paused`, that have phos's agent; `all_answered` (where given): false
  // where an agent did not give its status.
  std::vector<agent::StatusReply> tree_statuses(pid_t paused, bool* all_answered = nullptr);
  // Those of them that hold device memory.
  std::vector<agent::StatusReply> statuses_with_memory(pid_t paused);
  // `tree` less the processes criu has paused (seized) already.
  std::vector<pid_t> not_paused_yet(std::vector<pid_t> tree) const;
  // The process's GPUs in criu's numbering (gpu_map.h: host_ordinals), and
  // criu's contexts on them started.
  Result<std::map<uint32_t, int>> process_gpus(pid_t pid, const agent::StatusReply& status);
  // Starts phos-keeper once per dump; a dump goes on without one (warned).
  void start_keeper();
  // A process with an NCCL communicator whose ranks are in other processes:
  // every rank in criu's tree held at one collective boundary, its release
  // made pending (nccl_job.h), once per job.
  Result<void> hold_nccl_job(pid_t pid, const agent::NcclCommunicatorStatus& c);
  void abandon_nccl_job(const NcclJobHeld& job);
  // Under PHOS_JOB: the step (job_step.h) held every rank before criu ran;
  // a rank not held is refused.
  Result<void> check_job_rank(pid_t pid, const agent::NcclCommunicatorStatus& c) const;
  // Under PHOS_JOB, at criu's end: whether the job's dump committed. An
  // abort is proposed where this criu failed; an outcome that cannot be
  // learnt is an abort (the processes run on). A leave-running dump votes
  // here (criu runs no action script for it: its tree runs on either way,
  // and without one criu resumes it once its pages are copied).
  bool job_verdict(bool dump_succeeded);

  // criu's image directory, duplicated: criu closes its own before a
  // write-behind finishes.
  UniqueFd own_dir_;
  int dirfd_;  // own_dir_, or criu's where it could not be duplicated
  PluginOptions options_;
  std::unique_ptr<Engine> engine_;
  std::future<void> engine_warming_;  // warm_up_engine()
  std::map<pid_t, Target> targets_;
  std::vector<NcclJobHeld> nccl_jobs_;  // held by this dump
  std::map<uint64_t, std::string> failed_nccl_jobs_;  // refused by this dump, and why
  std::optional<KeeperLink> keeper_;
  bool keeper_tried_ = false;
  bool write_behind_ = false;  // write_behind=auto and criu leaves the processes running
  std::string migration_id_;    // a migration: the name phos-keeper serves its memory under
  std::optional<JobRun> job_;   // PHOS_JOB: one host's part of a job across hosts
  bool job_aborted_here_ = false;
};

}  // namespace phos::plugin
