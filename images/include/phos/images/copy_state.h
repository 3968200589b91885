// The copy state of a concurrent dump, shared by the engine (in criu) and
// the hooks (in the application) through a memfd that the engine creates
// and the agent maps: for every chunk of the process's device memory,
// whether the dump has copied it, who is copying it, and where its content
// waits when a write came first. While a window is open the hooks consult it
// before every call that writes device memory, with no socket round trip.
//
// Soft copy-on-write (the image is the state at the freeze):
//
//   pending --engine claims--> copying --engine done--> copied
//   pending --a write first--> saving --saved in pool slot S--> saved(S)
//   saved(S) --engine claims--> copying(S) --done, S freed--> copied
//
// A write waits only for a chunk someone is copying right now (copying,
// saving), or where the pool has no free slot: then the chunk goes to the
// engine's urgent list and the write waits until it is copied. A write over
// many chunks first saves or asks for every one of them, then waits: its
// waits overlap instead of adding up, one engine round trip per chunk. The
// engine takes the chunks a write waits for first, then those waiting in
// the pool (each copy frees a slot for the next write), then the rest.
//
// Soft recopy (the image is the latest state): a write marks each chunk it
// touches dirty, whatever the engine has done with it; GPU work is
// asynchronous, so only a copy made after the gate closed and the streams
// drained counts for a chunk written in the window. The engine's first pass
// copies the chunks not yet dirty; after the gate closes it copies the
// dirty ones again. It may take the chunks of regions the program has not
// written since the window opened first (`set_cold_first`): a region being
// written is likely written again, and a chunk copied before its write is
// copied twice.
//
// The program's own transfers between host and device (PhOS §5): while a
// window is open the hooks tell the table of each, so the engine can pause
// between chunks and leave the PCIe link and the copy engines to the
// program. A transfer moves a shared "busy until" time (CLOCK_REALTIME: a
// process in another time namespace reads it alike) on by its bytes at the
// rate the engine assumes (`set_transfer_rate`), from now or from where
// queued transfers end. A synchronous call is not held as in flight: it is
// mostly a wait for its stream's earlier work. The estimate does not know when the stream reaches the
// copy; it is a hint for pauses, never for correctness.
//
// On-demand restore (kOnDemandFill; the image is the source): the process runs
// while the engine fills its device memory. pending means not filled yet,
// copying being filled, copied filled (its checksum checked). A call that
// reads or writes a chunk not filled waits for it, and puts it on the
// engine's urgent list; a call that overwrites whole chunks without reading
// them (an exact memset or copy destination) takes them as filled. The
// window closes once every chunk is in; a window the engine gave up
// (kAborted) lets no call through: the process's memory is not whole.
//
// Giving the pool back (copy-on-write): the pool takes GPU memory the
// program may need. A program allocation that finds the GPU full asks for
// it (ask_pool_back): from then on no write takes a slot (it waits for the
// engine, as with a full pool); once no slot holds a chunk the engine
// unmaps its pool and says so (pool_given_back), and the hooks unmap
// theirs: the memory is free and the allocation is tried again. The engine
// also says so when its copy ends and it lets the pool go.
//
// Each chunk's 32-bit word is also a futex (shared between processes): a
// waiter sleeps on the word and whoever changes it wakes it. The layout is
// fixed little-endian words; both sides are one phos build (the agent
// refuses another version), so no codec is needed: the table is plain
// shared memory, checked when mapped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "phos/images/copy_protocol.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::copystate {

enum class ChunkState : uint32_t {
  kPending = 0,  // not copied; nobody at it
  kCopying = 1,  // the engine is copying it (from the device, or its pool slot)
  kCopied = 2,   // in the image
  kSaving = 3,   // copy-on-write: a hook is saving it into a pool slot
  kSaved = 4,    // copy-on-write: its content at the freeze waits in a pool slot
};

enum class Window : uint32_t { kOpen = 0, kClosed = 1, kAborted = 2 };

// The copy-on-write pool: in use, asked back by the program, given back by
// the engine (no mapping of the engine's holds it any more).
enum class PoolBack : uint32_t { kInUse = 0, kAsked = 1, kGiven = 2 };

// One allocation of the process, as the dump copies it.
struct Region {
  uint64_t id = 0;
  uint64_t address = 0;
  uint64_t size = 0;
};

// A chunk the engine claimed: where it lies, and where to copy it from.
struct Claim {
  uint64_t chunk = 0;
  uint32_t region = 0;       // index into the regions
  uint64_t offset = 0;       // within the region
  uint64_t bytes = 0;
  std::optional<uint32_t> pool_slot;  // copy-on-write: its content is there, not on the device
};

// What before_write() did, for the hooks' statistics.
struct WriteReport {
  uint32_t saved = 0;    // chunks saved into the pool
  uint32_t waited = 0;   // chunks waited for (being copied, or no free slot)
  uint32_t dirtied = 0;  // recopy: chunks marked dirty
  uint32_t overwritten = 0;  // fill: chunks taken as filled, wholly overwritten
  uint64_t save_ns = 0;      // copy-on-write: launching the saves and waiting for them
  uint64_t wait_ns = 0;      // copy-on-write: waiting for chunks the engine copies
};

// Pool slots [first, end).
struct SlotRange {
  uint32_t first = 0;
  uint32_t end = 0;
  bool operator==(const SlotRange&) const = default;
};

// Copies `bytes` of device memory at `address` into pool slot `slot`, and
// returns once the copy is complete (the hooks' side of copy-on-write).
using SaveChunk = std::function<Result<void>(uint64_t address, uint64_t bytes, uint32_t slot)>;

// The same in batches: `enqueue` starts the copy of `bytes` at `address`
// into pool slot `slot`, `complete` returns once every copy started is
// complete. A call that saves many chunks waits once, not once a chunk:
// each wait may queue behind the engine's copies on the GPU's copy engines
// (about 1.2 ms a chunk on an H200 while the engine copied: 2 s for one
// kernel launch that saved 1735 chunks of an 8B server's KV cache).
struct SaveChunks {
  std::function<Result<void>(uint64_t address, uint64_t bytes, uint32_t slot)> enqueue;
  std::function<Result<void>()> complete;
};

struct Statistics {
  uint64_t saved = 0;    // chunks saved by copy-on-write
  uint64_t waits = 0;    // chunks writes waited for
  uint64_t dirtied = 0;  // chunk writes marked dirty (recopy)
  uint64_t overwritten = 0;  // chunks a call overwrote before the fill reached them (fill)
  uint64_t transfers = 0;       // the program's host<->device transfers told while the window was open
  uint64_t transfer_bytes = 0;  // their bytes
};

// What the engine sees of the program's transfers now.
struct Traffic {
  uint64_t busy_until_ns = 0;  // those queued: when they are estimated done (CLOCK_REALTIME, see clock.h)
  bool busy(uint64_t now_ns) const { return now_ns < busy_until_ns; }
};

class CopyState {
 public:
  struct Layout;  // where each part lies in the mapping (copy_state.cc)

  // The engine's side: a new table, every chunk pending, the window open.
  // `protocol`: kSoftCopyOnWrite, kSoftRecopy or kOnDemandFill (a stopped
  // copy has no table). Regions must not overlap; pool_slots is the
  // copy-on-write pool's size in chunks (0: every write to a chunk not yet
  // copied waits for the engine).
  static Result<CopyState> create(CopyProtocol protocol, uint64_t chunk_size, std::span<const Region> regions,
                                  uint32_t pool_slots);
  // The agent's side: the table behind `fd`, checked (magic, version, sizes
  // within the file, regions in order).
  static Result<CopyState> attach(int fd);

  CopyState(CopyState&&) noexcept;
  CopyState& operator=(CopyState&&) noexcept;
  ~CopyState();

  int fd() const { return fd_.get(); }
  CopyProtocol protocol() const;
  uint64_t chunk_size() const;
  uint64_t chunk_count() const;
  uint32_t pool_slots() const;
  std::span<const Region> regions() const;
  ChunkState state(uint64_t chunk) const;
  bool dirty(uint64_t chunk) const;
  Window window() const;
  Statistics statistics() const;

  // --- the hooks ---
  // Before a call writes [address, address + bytes): copy-on-write saves
  // every chunk of it that is still pending into a free pool slot (`save`),
  // waits for chunks being copied, and for chunks it finds no slot for (they
  // go to the engine first); recopy marks them dirty. Bytes outside every
  // region are not the dump's. Nothing to do once the window is closed. An
  // error (a failed save, a wait past `timeout`) aborts the window: the
  // image is then incomplete, and the call may go on.
  Result<WriteReport> before_write(uint64_t address, uint64_t bytes, const SaveChunk& save,
                                   std::chrono::milliseconds timeout);
  // The same, the chunks that can be saved at once saved in one batch (its
  // chunks stay kSaving, which the engine passes over, until `complete`).
  Result<WriteReport> before_write(uint64_t address, uint64_t bytes, const SaveChunks& save,
                                   std::chrono::milliseconds timeout);
  // Copy-on-write over several GPUs: the pool slots [first, end) each
  // region's chunks may take, one range per region in regions() order
  // (those of the pool on the region's GPU: a chunk is saved device to
  // device on its GPU). This side's setting, not the table's: unset, any
  // slot. EINVAL for a count other than the regions' or a range past the pool.
  Result<void> set_region_slots(std::vector<SlotRange> ranges);
  // On-demand restore (kOnDemandFill): before a call reads or writes [address,
  // address + bytes), waits until every chunk of it is filled, asking the
  // engine for those not yet taken first. `overwrite`: the call writes every
  // byte of the range and reads none, so chunks wholly inside it need no
  // fill. An error: a wait past `timeout`, or a fill the engine gave up.
  Result<WriteReport> before_use(uint64_t address, uint64_t bytes, bool overwrite, std::chrono::milliseconds timeout);
  // The program freed the region that starts at `address` (its memory lives
  // on in the engine's mapping): writes to that address from now on go to
  // other memory, and are not the dump's.
  void forget(uint64_t address);
  // Recopy: a call whose write set is unknown (or not trusted) may have
  // written anything: every chunk is dirty.
  void mark_all_dirty();
  // A call whose write set is unknown: waits until the window is closed.
  // For a fill, a window given up is an error: the memory is not whole.
  Result<void> wait_closed(std::chrono::milliseconds timeout) const;
  // The program needs the pool's memory: no write takes a slot from now on.
  // Returns where the pool stands (kGiven at once where there is none).
  PoolBack ask_pool_back();
  // Waits until the engine has given the pool back; ETIMEDOUT past `timeout`.
  Result<void> wait_pool_back(std::chrono::milliseconds timeout) const;
  PoolBack pool_back() const;
  // The program's own host<->device transfer of `bytes`, made at `now_ns`
  // (CLOCK_REALTIME), synchronous or not.
  void transfer_queued(uint64_t bytes, uint64_t now_ns);

  // --- the engine ---
  // The rate the program's asynchronous transfers are assumed to move at,
  // in bytes per second (0 or unset: 20 GB/s).
  void set_transfer_rate(uint64_t bytes_per_second);
  Traffic traffic() const;
  // Recopy: claim_next() takes the chunks of regions not written since the
  // window opened first, then the others (off: address order). The
  // engine's own choice, not shared.
  void set_cold_first(bool on);
  // Recopy: whether region `region` (an index into regions()) was written
  // while the window was open.
  bool region_written(uint32_t region) const;
  // Whether a call waits for a chunk now (copy-on-write, fill): the engine
  // must not pause then.
  bool urgent_waiting() const;
  // The next chunk to copy: those a write waits for first, then the others
  // in order (recopy: those not dirty), each claimed once. Empty when none
  // is left to claim now (some may still be saving, or copying).
  std::optional<Claim> claim_next();
  // Chunks a call waits for, claimed; empty when none is asked for.
  std::optional<Claim> claim_urgent();
  // `chunk`, claimed if it is pending (the engine's own order of a fill).
  std::optional<Claim> claim(uint64_t chunk);
  // Fill: the address ranges [start, end) of the chunks not filled now,
  // adjacent ones merged, in address order.
  std::vector<std::pair<uint64_t, uint64_t>> unfilled_ranges() const;
  // The chunk of `region` (an index into regions()) at byte `offset`.
  uint64_t chunk_at(uint32_t region, uint64_t offset) const;
  // Where `chunk` lies (its region, offset and bytes), claimed or not.
  Claim locate(uint64_t chunk) const;
  // The chunks of the regions whose id is in `ids`, in table order (ids of
  // no region name none).
  std::vector<uint64_t> region_chunks(const std::set<uint64_t>& ids) const;
  // Recopy, after the gate closed and the streams drained: the next dirty
  // chunk, claimed (its dirty mark cleared).
  std::optional<Claim> claim_dirty();
  // Recopy's final pass by checksum, gate closed: a copied chunk whose
  // content changed since its copy, claimed again (copied -> copying, its
  // dirty mark cleared); empty where it is not copied.
  std::optional<Claim> claim_again(uint64_t chunk);
  // The same pass: a dirty chunk whose content did not change keeps its
  // copy; its dirty mark goes.
  void clear_dirty(uint64_t chunk);
  // The claimed chunk is in the image: its pool slot is free again, waiters
  // are woken.
  void copied(const Claim& claim);
  // The engine could not copy it: back to where it was, for another try.
  void unclaim(const Claim& claim);
  // Whether any pool slot holds (or is taking) a chunk: the pool asked
  // back can go only when none does.
  bool pool_in_use() const;
  // The engine holds no pool any more (given back, or its copy ended):
  // waiters in wait_pool_back wake.
  void pool_given_back();
  // True when every chunk is copied (copy-on-write: the window can close).
  bool all_copied() const;
  // Recopy: the chunks dirty now (to be copied again).
  uint64_t dirty_count() const;
  // Recopy, before the final pass: chunks copied (by the first pass) and
  // dirty, written after their copy: the first pass's copies wasted.
  uint64_t copied_dirty_count() const;
  // Closes the window (every chunk copied, or the dump given up); the
  // hooks stop consulting the table, waiters wake.
  void close(Window how);

 private:
  CopyState(UniqueFd fd, void* map, size_t map_bytes, std::unique_ptr<Layout> layout);
  std::atomic<uint32_t>& word(uint64_t chunk) const;
  Claim claim_of(uint64_t chunk, std::optional<uint32_t> slot) const;
  // Whether `chunk` lies wholly inside [address, end).
  bool chunk_within(uint64_t chunk, uint64_t address, uint64_t end) const;
  // A fill the engine gave up: no call may go on.
  Result<void> fill_given_up() const;
  // The chunks [first, last] that [address, address + bytes) touches in each
  // region, appended as pairs.
  void chunks_of(uint64_t address, uint64_t bytes, std::vector<std::pair<uint64_t, uint64_t>>& out) const;
  // Makes `chunk` safe to write: saved into a free slot, or found copied
  // or saved. Where it would wait (being copied or saved, or no free slot:
  // then asked for first), `may_wait` false returns false at once instead.
  // A save is only started, its chunk added to `batch` (complete_saves
  // finishes them).
  Result<bool> write_chunk(uint64_t chunk, const SaveChunks& save, std::chrono::steady_clock::time_point deadline,
                           WriteReport& report, bool may_wait, std::vector<std::pair<uint64_t, uint32_t>>& batch);
  // Waits for the saves of `batch` (chunk, slot) and marks them saved; where
  // they failed, puts them back pending. Empties `batch`.
  Result<void> complete_saves(std::vector<std::pair<uint64_t, uint32_t>>& batch, const SaveChunks& save,
                              WriteReport& report);
  void mark_saved(uint64_t chunk, uint32_t slot, WriteReport& report);
  // A chunk whose save failed: pending again, its slot free.
  void unsave(uint64_t chunk, uint32_t slot);
  // A free slot of those `region` may take (set_region_slots).
  std::optional<uint32_t> take_slot(uint32_t region);
  void free_slot(uint32_t slot);
  void urgent(uint64_t chunk);
  // Copy-on-write: the chunks waiting in the pool, slot by slot, for the
  // engine to take before the rest (a hint: each is checked against its
  // chunk's state).
  void note_in_pool(uint32_t slot, uint64_t chunk);
  bool drop_in_pool(uint32_t slot, uint64_t chunk);
  std::optional<Claim> claim_saved();
  // Recopy: the region holding `chunk` was written.
  void mark_written(uint64_t chunk);
  // Recopy with cold_first: the next clean pending chunk of a region not
  // written, claimed; empty once the cold scan has passed every region.
  std::optional<Claim> claim_cold();
  // Claims `chunk` if it is pending (recopy: and clean).
  bool take_pending(uint64_t chunk, bool skip_dirty);
  // Sleeps while `w` holds `seen` (or until the deadline); false at the deadline.
  static bool wait_change(const std::atomic<uint32_t>& w, uint32_t seen, std::chrono::steady_clock::time_point deadline);
  static void wake_all(std::atomic<uint32_t>& w);

  UniqueFd fd_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::unique_ptr<Layout> l_;  // where each part lies in the mapping
  std::vector<SlotRange> region_slots_;  // this side's only (set_region_slots)
};

}  // namespace phos::copystate
