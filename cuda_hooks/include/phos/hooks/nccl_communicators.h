// The NCCL communicators the program has created and not yet destroyed,
// with the layout and the recipe each was made with (rank, rank count,
// device, the communicator it was split from, its configuration).
//
// A checkpoint cannot take a communicator: NCCL's sockets, threads and
// device memory are not the program's to keep. So the program never holds
// NCCL's communicator: it holds a stable handle, an address phos hands out
// (new_handle), and every NCCL call it makes is translated to the
// communicator of now (real_of). Before a checkpoint phos destroys the
// communicators (released), after it creates them again from their recipe,
// behind the same handles (rebuilt). Calls on NCCL wait meanwhile: each
// holds a ticket (enter/leave) and a release waits until none is held.
//
// No CUDA or NCCL here: handles are opaque addresses, configurations opaque
// bytes, so it is unit-tested alone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace phos::hooks {

// How a communicator was made: what creating it again takes.
enum class NcclOrigin : uint8_t {
  kUniqueId,  // ncclCommInitRank/Config/Scalable: every rank, one unique id
  kInitAll,   // ncclCommInitAll: every rank in this process, at once
  kSplit,     // ncclCommSplit or ncclCommShrink of `parent`
};

struct NcclCommunicator {
  uint64_t handle = 0;  // the program's ncclComm_t (a stable handle where new_handle made it)
  uint64_t real = 0;    // NCCL's communicator behind it now; 0 while released
  int rank = -1;
  int nranks = 0;
  int device = -1;      // current at its creation; -1: none
  uint64_t parent = 0;  // ncclCommSplit's source; 0: made from a unique id
  int color = 0, key = 0;  // ncclCommSplit's arguments
  bool single_process = false;  // every rank in this process (ncclCommInitAll, and its splits)
  // The same on every rank of the communicator: a hash of the unique id it
  // was made with, or of its parent's and its split color and key's order.
  uint64_t job_id = 0;
  // Collective and point-to-point calls issued on it (counted only on a
  // handle of new_handle's; as of the list or find that returned it: the
  // count lives beside the entry, which created() does not take it from).
  uint64_t calls = 0;
  // A job-wide quiesce's stop: the call with this number (0 the first)
  // waits before it is issued, until disarmed; held while one does.
  std::optional<uint64_t> stop_at;
  bool held = false;
  // The recipe. The configuration's bytes (none: NCCL's defaults), with the
  // strings its pointers named (offset in the bytes, text) copied aside.
  NcclOrigin origin = NcclOrigin::kUniqueId;
  std::vector<uint8_t> config;
  std::vector<std::pair<size_t, std::string>> config_strings;
  uint64_t init_all_first = 0;  // kInitAll: the handle of the first of its set
  std::vector<int> devices;     // kInitAll: the whole set's devices, in rank order
  // Things NCCL made on it that phos cannot make again (buffer
  // registrations, windows, device communicators, custom reduction
  // operators): while any lives, it cannot be released.
  uint32_t extras = 0;
  uint32_t rebuilds = 0;  // times made again behind its handle
  // Destroyed for a checkpoint, not yet made again.
  bool released() const { return real == 0; }
  bool operator==(const NcclCommunicator&) const = default;
};

// The job-wide name of a communicator made from a unique id (its bytes),
// and of one split from `parent_job` with `color` (every rank of the new
// communicator passed the same color) as the parent's `sequence`th split
// (the same on every rank: they split in one order; two splits of one
// color are two communicators).
uint64_t nccl_job_id(const void* unique_id, size_t bytes);
uint64_t nccl_split_job_id(uint64_t parent_job, int color, uint32_t sequence);

// Why `c` could not be made again after a release, or nothing: where the
// rest of its ranks are matters (single_process, nranks) and what it holds.
std::optional<std::string> nccl_why_not_recreatable(const NcclCommunicator& c);

class NcclCommunicators {
 public:
  static constexpr size_t kMaxHandles = 4096;

  // A stable handle for a communicator about to be listed; 0 when all are
  // taken (the program then holds NCCL's own: it works, and cannot be
  // released).
  uint64_t new_handle();
  // Whether `handle` is one of new_handle's; lock-free.
  bool owns(uint64_t handle) const;
  // NCCL's communicator behind `handle`: itself for one that is not ours,
  // 0 for ours while released. Lock-free: every NCCL call asks it.
  uint64_t real_of(uint64_t handle) const;

  // A creation that succeeded. A handle listed already is replaced (NCCL
  // handed out the address of one destroyed without phos seeing it).
  void created(const NcclCommunicator& c);
  // ncclCommDestroy or ncclCommAbort succeeded. ncclCommFinalize does not
  // free the communicator: it stays until one of those. Its handle is free
  // for a new one.
  void destroyed(uint64_t handle);
  std::optional<NcclCommunicator> find(uint64_t handle) const;
  // A registration or the like made (+1) or undone (-1) on `handle`.
  void count_extra(uint64_t handle, int delta);
  // The release and the rebuild of one communicator: `real` is NCCL's new
  // communicator (0: released).
  void set_real(uint64_t handle, uint64_t real);

  // Tickets: a thread calling NCCL holds one for the call (enter, leave),
  // taken only while no release is pending; `wait` false: none taken
  // (false) while one is. Lock-free while none is pending.
  bool enter(bool wait = true);
  void leave();
  // A release: new tickets wait from now on; true once none is held, false
  // (and no release pending, unless one was already) if some still were
  // after `timeout`.
  bool begin_release(std::chrono::milliseconds timeout);
  // The release is over (the communicators were made again, or not
  // released after all): waiting tickets are taken.
  void end_release();
  bool release_pending() const;
  // Communicators with ranks in other processes are being made again in
  // the background: no new release, stop or rebuild of them meanwhile.
  void set_rebuilding(bool on) { rebuilding_.store(on, std::memory_order_release); }
  bool rebuilding() const { return rebuilding_.load(std::memory_order_acquire); }
  // What the last release and the last rebuild took (the rebuild: until
  // its last communicator was made, in the background where it waited for
  // other processes), and how many of each there were: the status's.
  void note_release(uint64_t ns);
  void note_rebuild(uint64_t ns);
  struct Timings {
    uint64_t releases = 0, rebuilds = 0, last_release_ns = 0, last_rebuild_ns = 0;
  };
  Timings timings() const;
  // A collective or point-to-point call is about to be issued on `handle`
  // (one not of new_handle's is not counted): counted, lock-free while no
  // stop is armed, after
  // waiting while a stop is armed at it or before it. The caller holds no
  // gate pass: a checkpoint's quiesce goes on while it waits. `may_hold`
  // false (a call inside a group after its first, whose thread holds the
  // group's ticket): it passes, and the stop holds the next call that may
  // be held (the same on every rank: they issue one sequence).
  void count_call(uint64_t handle, bool may_hold = true);
  // The number of the next split of `parent` (see nccl_split_job_id).
  uint32_t next_split(uint64_t parent);
  // Every rank's calls on a communicator are issued in the same order: a
  // stop armed at the same call number on every rank (`job_id`) holds them
  // all at one boundary, none having issued it, each having issued all
  // before it. False where this process has no communicator of the job, or
  // has issued that call already.
  bool arm_stop(uint64_t job_id, uint64_t at_call);
  // Lets the held calls (and those still to come to the stop) go on.
  void disarm(uint64_t job_id);
  // In creation order.
  std::vector<NcclCommunicator> list() const;
  // Communicators with ranks in other processes: what a dump of this
  // process alone cannot take, unless a job-wide stop holds the process's
  // calls on them (not_held: only those not held so).
  size_t spanning_processes(bool not_held = false) const;
  // Why each communicator that cannot be released and made again cannot
  // (nccl_why_not_recreatable), one line each; empty: all can.
  std::vector<std::string> not_recreatable() const;

 private:
  NcclCommunicator* entry(uint64_t handle);  // under mu_
  void free_handle(uint64_t handle);         // under mu_
  void count_stops();                        // under mu_
  size_t slot(uint64_t handle) const { return handle - reinterpret_cast<uint64_t>(&handle_space_[0]); }
  // The entry as the program's calls have it now (its call count).
  NcclCommunicator snapshot(const NcclCommunicator& c) const;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;  // a stop disarmed, or a communicator gone
  std::vector<NcclCommunicator> live_;
  std::vector<std::pair<uint64_t, uint32_t>> splits_;  // parent handle, splits made of it
  std::atomic<bool> rebuilding_{false};
  // new_handle's addresses: one byte each of this space, never read.
  alignas(64) unsigned char handle_space_[kMaxHandles] = {};
  std::atomic<uint64_t> real_[kMaxHandles] = {};
  std::atomic<uint64_t> calls_[kMaxHandles] = {};
  std::atomic<uint32_t> stops_armed_{0};  // communicators with a stop armed
  std::vector<bool> handle_taken_ = std::vector<bool>(kMaxHandles);
  // Tickets: counted without a lock; the lock and the condition variable
  // for the waits around a release.
  std::atomic<uint64_t> tickets_{0};
  std::atomic<bool> release_pending_{false};
  mutable std::mutex ticket_mu_;
  std::condition_variable ticket_cv_;
  Timings timings_;  // under ticket_mu_
};

}  // namespace phos::hooks
