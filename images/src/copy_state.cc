#include "phos/images/copy_state.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "phos/support/clock.h"

namespace phos::copystate {
namespace {

constexpr uint64_t kMagic = 0x5453504359504850ull;  // "PHPYCPST": phos copy state
constexpr uint32_t kVersion = 5;  // 2: the fill protocol, overwritten; 3: the program's transfers, written regions; 4: the pool's chunks; 5: the pool given back
constexpr size_t kUrgentEntries = 256;
constexpr uint32_t kStateBits = 4;
constexpr uint32_t kStateMask = (1u << kStateBits) - 1;
constexpr uint64_t kMaxChunks = uint64_t(1) << 26;  // 256 TiB of 4 MiB chunks
constexpr uint32_t kMaxPoolSlots = (1u << (32 - kStateBits)) - 2;
constexpr uint32_t kMaxRegions = 1u << 24;
// What the program's asynchronous transfers are assumed to move at when the
// engine set no rate: a PCIe 4/5 link with pinned memory, roughly.
constexpr uint64_t kDefaultTransferRate = 20'000'000'000ull;

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the table is shared between processes: its atomics must be address-free");

// The table's first page. Offsets are from the start of the mapping.
struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t protocol;
  uint64_t chunk_size;
  uint64_t chunk_count;
  uint32_t region_count;
  uint32_t pool_slots;
  uint64_t regions_offset;
  uint64_t chunks_offset;
  uint64_t dirty_offset;
  uint64_t pool_offset;
  uint64_t urgent_offset;
  uint64_t total_bytes;
  std::atomic<uint32_t> window;
  std::atomic<uint32_t> pool_back;  // PoolBack: the program asked for the pool, the engine gave it
  std::atomic<uint64_t> cursor;  // where the engine's scan goes on
  std::atomic<uint64_t> saved, waits, dirtied, overwritten;
  uint64_t written_offset;              // recopy: one bit per region, written in the window
  std::atomic<uint64_t> cold_cursor;    // where the engine's scan of unwritten regions goes on
  std::atomic<uint64_t> transfer_rate;  // bytes per second the engine assumes for the program's transfers
  std::atomic<uint64_t> busy_until_ns;  // the program's queued transfers, estimated done (CLOCK_REALTIME)
  std::atomic<uint64_t> transfers, transfer_bytes;
  uint64_t in_pool_offset;              // copy-on-write: per pool slot, the chunk saved there + 1 (0: none)
  std::atomic<uint64_t> in_pool;        // entries set there (a hint: the engine looks only when not 0)
};

// The header's `protocol`: the numbers the table has always held, whatever
// CopyProtocol's (an agent of an earlier build reads the table the same).
constexpr uint32_t kTableCopyOnWrite = 1, kTableRecopy = 2, kTableFill = 3;

uint32_t table_protocol(CopyProtocol p) {
  switch (p) {
    case CopyProtocol::kSoftCopyOnWrite: return kTableCopyOnWrite;
    case CopyProtocol::kSoftRecopy: return kTableRecopy;
    case CopyProtocol::kOnDemandFill: return kTableFill;
    case CopyProtocol::kStopTheWorld: break;
  }
  return 0;
}

std::optional<CopyProtocol> protocol_of_table(uint32_t v) {
  switch (v) {
    case kTableCopyOnWrite: return CopyProtocol::kSoftCopyOnWrite;
    case kTableRecopy: return CopyProtocol::kSoftRecopy;
    case kTableFill: return CopyProtocol::kOnDemandFill;
  }
  return std::nullopt;
}

struct RegionRecord {
  uint64_t id, address, size, first_chunk;
};

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t chunks_in(uint64_t size, uint64_t chunk_size) { return (size + chunk_size - 1) / chunk_size; }

uint32_t encode(ChunkState s, std::optional<uint32_t> slot = std::nullopt) {
  return uint32_t(s) | (slot ? (*slot + 1) << kStateBits : 0);
}
ChunkState state_of(uint32_t w) { return ChunkState(w & kStateMask); }
std::optional<uint32_t> slot_of(uint32_t w) {
  uint32_t s = w >> kStateBits;
  return s ? std::optional<uint32_t>(s - 1) : std::nullopt;
}

long futex(const std::atomic<uint32_t>& w, int op, uint32_t value, const struct timespec* timeout) {
  // Shared between processes: no FUTEX_PRIVATE_FLAG.
  return ::syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&w), op, value, timeout, nullptr, 0);
}

}  // namespace

struct CopyState::Layout {
  Header* header;
  RegionRecord* records;
  std::atomic<uint32_t>* chunks;
  std::atomic<uint64_t>* dirty;
  std::atomic<uint64_t>* pool;
  std::atomic<uint32_t>* urgent;
  std::atomic<uint64_t>* written;
  std::atomic<uint32_t>* in_pool;
  // Private copies: what the hooks search and the engine computes claims
  // from (the other side may scribble on the shared records).
  std::vector<Region> regions;
  std::vector<uint64_t> first_chunks;
  CopyProtocol protocol;
  uint64_t chunk_size, chunk_count;
  uint32_t pool_slots;
  // The hooks' side: regions the program freed while the window was open.
  std::unique_ptr<std::atomic<bool>[]> forgotten;
  bool cold_first = false;  // the engine's side: claim_next's order (set_cold_first)
};

namespace {

// Where each part of a table of this shape lies.
struct Offsets {
  uint64_t regions, chunks, dirty, pool, urgent, written, in_pool, total;
};
Offsets offsets_for(uint64_t chunk_count, uint32_t region_count, uint32_t pool_slots) {
  Offsets o;
  o.regions = align_up(sizeof(Header), 64);
  o.chunks = align_up(o.regions + uint64_t(region_count) * sizeof(RegionRecord), 64);
  o.dirty = align_up(o.chunks + chunk_count * sizeof(uint32_t), 64);
  o.pool = align_up(o.dirty + (chunk_count + 63) / 64 * 8, 64);
  o.urgent = align_up(o.pool + (uint64_t(pool_slots) + 63) / 64 * 8, 64);
  o.written = align_up(o.urgent + kUrgentEntries * sizeof(uint32_t), 64);
  o.in_pool = align_up(o.written + (uint64_t(region_count) + 63) / 64 * 8, 64);
  o.total = align_up(o.in_pool + uint64_t(pool_slots) * sizeof(uint32_t), 4096);
  return o;
}

}  // namespace

CopyState::CopyState(UniqueFd fd, void* map, size_t map_bytes, std::unique_ptr<Layout> layout)
    : fd_(std::move(fd)), map_(map), map_bytes_(map_bytes), l_(std::move(layout)) {}

CopyState::CopyState(CopyState&& o) noexcept
    : fd_(std::move(o.fd_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(o.map_bytes_),
      l_(std::move(o.l_)),
      region_slots_(std::move(o.region_slots_)) {}

CopyState& CopyState::operator=(CopyState&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    fd_ = std::move(o.fd_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = o.map_bytes_;
    l_ = std::move(o.l_);
    region_slots_ = std::move(o.region_slots_);
  }
  return *this;
}

CopyState::~CopyState() {
  if (map_) ::munmap(map_, map_bytes_);
}

namespace {

// The parts of a mapped table, from its (checked) header.
std::unique_ptr<CopyState::Layout> make_layout(void* map, const Offsets& o) {
  auto* base = static_cast<std::byte*>(map);
  auto l = std::unique_ptr<CopyState::Layout>(new CopyState::Layout{
      reinterpret_cast<Header*>(base), reinterpret_cast<RegionRecord*>(base + o.regions),
      reinterpret_cast<std::atomic<uint32_t>*>(base + o.chunks), reinterpret_cast<std::atomic<uint64_t>*>(base + o.dirty),
      reinterpret_cast<std::atomic<uint64_t>*>(base + o.pool), reinterpret_cast<std::atomic<uint32_t>*>(base + o.urgent),
      reinterpret_cast<std::atomic<uint64_t>*>(base + o.written), reinterpret_cast<std::atomic<uint32_t>*>(base + o.in_pool),
      {}, {}, CopyProtocol(0), 0, 0, 0, {}});
  l->protocol = protocol_of_table(l->header->protocol).value_or(CopyProtocol(0));  // checked by attach
  l->chunk_size = l->header->chunk_size;
  l->chunk_count = l->header->chunk_count;
  l->pool_slots = l->header->pool_slots;
  for (uint32_t i = 0; i < l->header->region_count; i++) {
    l->regions.push_back(Region{l->records[i].id, l->records[i].address, l->records[i].size});
    l->first_chunks.push_back(l->records[i].first_chunk);
  }
  l->forgotten = std::make_unique<std::atomic<bool>[]>(l->regions.size());
  return l;
}

}  // namespace

Result<CopyState> CopyState::create(CopyProtocol protocol, uint64_t chunk_size, std::span<const Region> regions,
                                    uint32_t pool_slots) {
  if (table_protocol(protocol) == 0)
    return make_error("copy state: " + std::string(copy_protocol_name(protocol)) + " has no copy table");
  if (chunk_size == 0 || chunk_size % 4096) return make_error("copy state: chunk size " + std::to_string(chunk_size) + " is not a multiple of 4096");
  if (regions.size() > kMaxRegions) return make_error("copy state: " + std::to_string(regions.size()) + " regions, at most " + std::to_string(kMaxRegions));
  if (pool_slots > kMaxPoolSlots) return make_error("copy state: " + std::to_string(pool_slots) + " pool slots, too many");
  std::vector<Region> sorted(regions.begin(), regions.end());
  std::sort(sorted.begin(), sorted.end(), [](const Region& a, const Region& b) { return a.address < b.address; });
  uint64_t chunk_count = 0;
  for (size_t i = 0; i < sorted.size(); i++) {
    const Region& r = sorted[i];
    if (r.size == 0 || r.address + r.size < r.address)
      return make_error("copy state: allocation " + std::to_string(r.id) + " is empty or wraps");
    if (i && sorted[i - 1].address + sorted[i - 1].size > r.address)
      return make_error("copy state: allocations " + std::to_string(sorted[i - 1].id) + " and " + std::to_string(r.id) +
                        " overlap");
    chunk_count += chunks_in(r.size, chunk_size);
  }
  if (chunk_count > kMaxChunks) return make_error("copy state: " + std::to_string(chunk_count) + " chunks, too many");

  Offsets o = offsets_for(chunk_count, uint32_t(sorted.size()), pool_slots);
  UniqueFd fd(::memfd_create("phos-copy-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return errno_error("copy state: memfd_create");
  if (::ftruncate(fd.get(), off_t(o.total)) != 0) return errno_error("copy state: size the memfd");
  // The application maps it too: it must not be able to shrink it under
  // the engine's mapping (a SIGBUS in criu), nor grow it.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) return errno_error("copy state: seal the memfd");
  void* map = ::mmap(nullptr, o.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return errno_error("copy state: map the memfd");
  // A fresh memfd reads as zeros: every chunk pending, the window open, no
  // slot taken, no urgent chunk.
  auto* h = new (map) Header{};
  h->magic = kMagic;
  h->version = kVersion;
  h->protocol = table_protocol(protocol);
  h->chunk_size = chunk_size;
  h->chunk_count = chunk_count;
  h->region_count = uint32_t(sorted.size());
  h->pool_slots = pool_slots;
  h->regions_offset = o.regions;
  h->chunks_offset = o.chunks;
  h->dirty_offset = o.dirty;
  h->pool_offset = o.pool;
  h->urgent_offset = o.urgent;
  h->written_offset = o.written;
  h->in_pool_offset = o.in_pool;
  h->total_bytes = o.total;
  auto* records = reinterpret_cast<RegionRecord*>(static_cast<std::byte*>(map) + o.regions);
  uint64_t first = 0;
  for (size_t i = 0; i < sorted.size(); i++) {
    records[i] = RegionRecord{sorted[i].id, sorted[i].address, sorted[i].size, first};
    first += chunks_in(sorted[i].size, chunk_size);
  }
  return CopyState(std::move(fd), map, o.total, make_layout(map, o));
}

Result<CopyState> CopyState::attach(int fd_in) {
  UniqueFd fd(::fcntl(fd_in, F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) return errno_error("copy state: duplicate its fd");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("copy state: fstat");
  if (!S_ISREG(st.st_mode) || uint64_t(st.st_size) < sizeof(Header))
    return make_error("copy state: the fd is not a copy-state table (" + std::to_string(st.st_size) + " bytes)", EPROTO);
  int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return make_error("copy state: the table's memfd is not sealed against shrinking", EPROTO);
  size_t bytes = size_t(st.st_size);
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return errno_error("copy state: map the table");
  auto fail = [&](const std::string& what) -> Error {
    ::munmap(map, bytes);
    return make_error("copy state: " + what, EPROTO);
  };
  const Header& h = *static_cast<const Header*>(map);
  if (h.magic != kMagic) return fail("bad magic");
  if (h.version != kVersion) return fail("version " + std::to_string(h.version) + ", this phos reads " + std::to_string(kVersion));
  if (!protocol_of_table(h.protocol)) return fail("unknown protocol " + std::to_string(h.protocol));
  if (h.protocol != kTableCopyOnWrite && h.pool_slots != 0) return fail("a pool for a protocol without one");
  if (h.chunk_size == 0 || h.chunk_size % 4096 || h.chunk_count > kMaxChunks || h.region_count > kMaxRegions ||
      h.pool_slots > kMaxPoolSlots)
    return fail("sizes out of range");
  Offsets o = offsets_for(h.chunk_count, h.region_count, h.pool_slots);
  if (o.regions != h.regions_offset || o.chunks != h.chunks_offset || o.dirty != h.dirty_offset ||
      o.pool != h.pool_offset || o.urgent != h.urgent_offset || o.written != h.written_offset ||
      o.in_pool != h.in_pool_offset ||
      o.total != h.total_bytes || o.total > bytes)
    return fail("its parts do not lie where its sizes say");
  auto l = make_layout(map, o);
  uint64_t first = 0;
  for (uint32_t i = 0; i < h.region_count; i++) {
    const RegionRecord& r = l->records[i];
    if (r.size == 0 || r.address + r.size < r.address || r.first_chunk != first ||
        (i && l->records[i - 1].address + l->records[i - 1].size > r.address))
      return fail("allocation record " + std::to_string(i) + " is inconsistent");
    first += chunks_in(r.size, h.chunk_size);
  }
  if (first != h.chunk_count) return fail("the allocations do not make up its chunks");
  return CopyState(std::move(fd), map, bytes, std::move(l));
}

// The sizes as they were checked when the table was made or attached: the
// other side may scribble on the header since.
CopyProtocol CopyState::protocol() const { return l_->protocol; }
uint64_t CopyState::chunk_size() const { return l_->chunk_size; }
uint64_t CopyState::chunk_count() const { return l_->chunk_count; }
uint32_t CopyState::pool_slots() const { return l_->pool_slots; }
std::span<const Region> CopyState::regions() const { return l_->regions; }
std::atomic<uint32_t>& CopyState::word(uint64_t chunk) const { return l_->chunks[chunk]; }
ChunkState CopyState::state(uint64_t chunk) const { return state_of(word(chunk).load(std::memory_order_acquire)); }
bool CopyState::dirty(uint64_t chunk) const {
  return (l_->dirty[chunk / 64].load(std::memory_order_acquire) >> (chunk % 64)) & 1;
}
Window CopyState::window() const { return Window(l_->header->window.load(std::memory_order_acquire)); }

Statistics CopyState::statistics() const {
  const Header& h = *l_->header;
  return Statistics{h.saved.load(),       h.waits.load(),     h.dirtied.load(),
                    h.overwritten.load(), h.transfers.load(), h.transfer_bytes.load()};
}

Claim CopyState::claim_of(uint64_t chunk, std::optional<uint32_t> slot) const {
  const auto& firsts = l_->first_chunks;
  // The last region whose first chunk is at or before `chunk`.
  uint32_t lo = uint32_t(std::upper_bound(firsts.begin(), firsts.end(), chunk) - firsts.begin());
  lo = lo ? lo - 1 : 0;
  const Region& r = l_->regions[lo];
  Claim c;
  c.chunk = chunk;
  c.region = lo;
  c.offset = (chunk - firsts[lo]) * chunk_size();
  c.bytes = std::min(chunk_size(), r.size - c.offset);
  c.pool_slot = slot;
  return c;
}

void CopyState::chunks_of(uint64_t address, uint64_t bytes, std::vector<std::pair<uint64_t, uint64_t>>& out) const {
  if (bytes == 0) return;
  uint64_t end = address + bytes < address ? UINT64_MAX : address + bytes;
  const auto& regions = l_->regions;
  // The first region that ends after `address`.
  auto it = std::upper_bound(regions.begin(), regions.end(), address,
                             [](uint64_t a, const Region& r) { return a < r.address + r.size; });
  for (; it != regions.end() && it->address < end; ++it) {
    if (l_->forgotten[it - regions.begin()].load(std::memory_order_acquire)) continue;
    uint64_t from = std::max(address, it->address) - it->address;
    uint64_t to = std::min(end, it->address + it->size) - it->address;  // exclusive
    uint64_t first = l_->first_chunks[size_t(it - regions.begin())];
    out.emplace_back(first + from / chunk_size(), first + (to - 1) / chunk_size());
  }
}

bool CopyState::wait_change(const std::atomic<uint32_t>& w, uint32_t seen,
                            std::chrono::steady_clock::time_point deadline) {
  auto now = std::chrono::steady_clock::now();
  if (now >= deadline) return false;
  // Bounded sleeps: a window closed elsewhere is noticed even if nobody
  // woke this word.
  auto left = std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(10));
  struct timespec ts {
    time_t(left.count() / 1000000000), long(left.count() % 1000000000)
  };
  if (w.load(std::memory_order_acquire) == seen) futex(w, FUTEX_WAIT, seen, &ts);
  return true;
}

void CopyState::wake_all(std::atomic<uint32_t>& w) { futex(w, FUTEX_WAKE, INT32_MAX, nullptr); }

Result<void> CopyState::set_region_slots(std::vector<SlotRange> ranges) {
  if (ranges.size() != regions().size())
    return make_error("copy state: " + std::to_string(ranges.size()) + " slot ranges for " +
                          std::to_string(regions().size()) + " regions",
                      EINVAL);
  for (const SlotRange& r : ranges)
    if (r.first > r.end || r.end > pool_slots())
      return make_error("copy state: slot range [" + std::to_string(r.first) + ", " + std::to_string(r.end) +
                            ") outside the pool's " + std::to_string(pool_slots()) + " slots",
                        EINVAL);
  region_slots_ = std::move(ranges);
  return {};
}

std::optional<uint32_t> CopyState::take_slot(uint32_t region) {
  // Asked back: no new slot (the write goes to the engine, as with a full pool).
  if (pool_back() != PoolBack::kInUse) return std::nullopt;
  const uint32_t first = region < region_slots_.size() ? region_slots_[region].first : 0;
  const uint32_t slots = region < region_slots_.size() ? region_slots_[region].end : pool_slots();
  for (uint32_t i = first / 64; i * 64 < slots; i++) {
    std::atomic<uint64_t>& bits = l_->pool[i];
    uint64_t b = bits.load(std::memory_order_relaxed);
    for (;;) {
      uint64_t free = ~b;
      if (i * 64 + 64 > slots) free &= (uint64_t(1) << (slots - i * 64)) - 1;
      if (i * 64 < first) free &= ~((uint64_t(1) << (first - i * 64)) - 1);
      if (!free) break;
      uint64_t bit = free & -free;
      if (!bits.compare_exchange_weak(b, b | bit, std::memory_order_seq_cst)) continue;
      const uint32_t slot = i * 64 + uint32_t(__builtin_ctzll(bit));
      // Against ask_pool_back: either the engine sees this slot taken
      // (pool_in_use), or this sees the pool asked back and lets it go.
      if (l_->header->pool_back.load(std::memory_order_seq_cst) != uint32_t(PoolBack::kInUse)) {
        free_slot(slot);
        return std::nullopt;
      }
      return slot;
    }
  }
  return std::nullopt;
}

void CopyState::free_slot(uint32_t slot) {
  if (slot >= pool_slots()) return;  // the application may have scribbled on the table
  l_->pool[slot / 64].fetch_and(~(uint64_t(1) << (slot % 64)), std::memory_order_release);
}

void CopyState::urgent(uint64_t chunk) {
  for (size_t i = 0; i < kUrgentEntries; i++) {
    uint32_t empty = 0;
    if (l_->urgent[i].compare_exchange_strong(empty, uint32_t(chunk + 1), std::memory_order_release)) return;
    if (l_->urgent[i].load(std::memory_order_relaxed) == chunk + 1) return;  // asked for already
  }
  // A full list: the engine reaches the chunk in its order anyway.
}

Result<bool> CopyState::write_chunk(uint64_t chunk, const SaveChunks& save,
                                    std::chrono::steady_clock::time_point deadline, WriteReport& report,
                                    bool may_wait, std::vector<std::pair<uint64_t, uint32_t>>& batch) {
  std::atomic<uint32_t>& w = word(chunk);
  bool counted_wait = false;
  auto wait = [&](uint32_t seen) -> Result<void> {
    if (!counted_wait) {
      counted_wait = true;
      report.waited++;
      l_->header->waits.fetch_add(1, std::memory_order_relaxed);
    }
    if (!wait_change(w, seen, deadline))
      return make_error(protocol() == CopyProtocol::kOnDemandFill
                            ? "on-demand restore: chunk " + std::to_string(chunk) + " was not filled in time"
                            : "copy-on-write: chunk " + std::to_string(chunk) + " was not copied in time",
                        ETIMEDOUT);
    return {};
  };
  for (;;) {
    if (window() != Window::kOpen) {
      PHOS_TRY(fill_given_up());
      return true;
    }
    uint32_t seen = w.load(std::memory_order_acquire);
    switch (state_of(seen)) {
      case ChunkState::kCopied:
      case ChunkState::kSaved: return true;
      case ChunkState::kCopying:
      case ChunkState::kSaving:
        if (!may_wait) return false;
        PHOS_TRY(wait(seen));
        continue;
      case ChunkState::kPending: break;
      default: return make_error("copy-on-write: chunk " + std::to_string(chunk) + " in an unknown state", EPROTO);
    }
    auto slot = take_slot(claim_of(chunk, std::nullopt).region);
    if (!slot) {  // the pool is full: the engine takes this chunk next
      urgent(chunk);
      if (!may_wait) return false;
      PHOS_TRY(wait(seen));
      continue;
    }
    if (!w.compare_exchange_strong(seen, encode(ChunkState::kSaving), std::memory_order_acq_rel)) {
      free_slot(*slot);  // someone else moved it on
      continue;
    }
    Claim c = claim_of(chunk, slot);
    auto saved = save.enqueue(regions()[c.region].address + c.offset, c.bytes, *slot);
    if (!saved) {
      unsave(chunk, *slot);
      return make_error("copy-on-write: save chunk " + std::to_string(chunk) + ": " + saved.error().message,
                        saved.error().code);
    }
    batch.emplace_back(chunk, *slot);
    return true;
  }
}

void CopyState::unsave(uint64_t chunk, uint32_t slot) {
  free_slot(slot);
  std::atomic<uint32_t>& w = word(chunk);
  w.store(encode(ChunkState::kPending), std::memory_order_release);
  wake_all(w);
}

void CopyState::mark_saved(uint64_t chunk, uint32_t slot, WriteReport& report) {
  std::atomic<uint32_t>& w = word(chunk);
  w.store(encode(ChunkState::kSaved, slot), std::memory_order_release);
  note_in_pool(slot, chunk);
  wake_all(w);
  report.saved++;
  l_->header->saved.fetch_add(1, std::memory_order_relaxed);
}

Result<void> CopyState::complete_saves(std::vector<std::pair<uint64_t, uint32_t>>& batch, const SaveChunks& save,
                                       WriteReport& report) {
  if (batch.empty()) return {};
  auto done = save.complete();
  for (auto [chunk, slot] : batch) {
    if (done) mark_saved(chunk, slot, report);
    else unsave(chunk, slot);
  }
  const size_t n = batch.size();
  batch.clear();
  if (!done)
    return make_error("copy-on-write: save " + std::to_string(n) + " chunks: " + done.error().message,
                      done.error().code);
  return {};
}

void CopyState::note_in_pool(uint32_t slot, uint64_t chunk) {
  if (slot >= pool_slots()) return;
  // An entry the engine's scan left behind (it took that chunk before the
  // entry was written) is replaced, not counted twice: the count stays the
  // number of entries set.
  if (l_->in_pool[slot].exchange(uint32_t(chunk + 1), std::memory_order_acq_rel) == 0)
    l_->header->in_pool.fetch_add(1, std::memory_order_acq_rel);
}

bool CopyState::drop_in_pool(uint32_t slot, uint64_t chunk) {
  if (slot >= pool_slots()) return false;
  uint32_t expected = uint32_t(chunk + 1);
  if (!l_->in_pool[slot].compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) return false;
  l_->header->in_pool.fetch_sub(1, std::memory_order_acq_rel);
  return true;
}

std::optional<Claim> CopyState::claim_saved() {
  if (l_->header->in_pool.load(std::memory_order_acquire) == 0) return std::nullopt;
  const uint64_t n = chunk_count();
  for (uint32_t slot = 0; slot < pool_slots(); slot++) {
    uint32_t v = l_->in_pool[slot].load(std::memory_order_acquire);
    if (!v) continue;
    const uint64_t chunk = v - 1;
    uint32_t seen = encode(ChunkState::kSaved, slot);
    const bool taken = chunk < n && word(chunk).compare_exchange_strong(seen, encode(ChunkState::kCopying, slot),
                                                                         std::memory_order_acq_rel);
    // Not taken: claimed in the engine's order since, or scribbled on (a
    // stale hint). Either way the entry goes.
    drop_in_pool(slot, chunk);
    if (taken) return claim_of(chunk, slot);
  }
  return std::nullopt;
}

Result<void> CopyState::fill_given_up() const {
  if (protocol() == CopyProtocol::kOnDemandFill && window() == Window::kAborted)
    return make_error("on-demand restore: the fill of device memory was given up; the memory is not whole", EIO);
  return {};
}

bool CopyState::chunk_within(uint64_t chunk, uint64_t address, uint64_t end) const {
  Claim c = claim_of(chunk, std::nullopt);
  uint64_t start = l_->regions[c.region].address + c.offset;
  return start >= address && start + c.bytes <= end;
}

Result<WriteReport> CopyState::before_use(uint64_t address, uint64_t bytes, bool overwrite,
                                          std::chrono::milliseconds timeout) {
  WriteReport report;
  PHOS_TRY(fill_given_up());
  if (window() != Window::kOpen) return report;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  chunks_of(address, bytes, spans);
  const uint64_t end = address + bytes < address ? UINT64_MAX : address + bytes;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto [first, last] : spans) {
    for (uint64_t c = first; c <= last; c++) {
      if (overwrite && chunk_within(c, address, end)) {
        std::atomic<uint32_t>& w = word(c);
        uint32_t pending = encode(ChunkState::kPending);
        if (w.compare_exchange_strong(pending, encode(ChunkState::kCopied), std::memory_order_acq_rel)) {
          wake_all(w);
          report.overwritten++;
          l_->header->overwritten.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
      }
      // The rest of the range goes to the engine with it: filled by all
      // its workers at once, not one chunk per wait.
      if (state(c) == ChunkState::kPending)
        for (uint64_t k = c + 1, asked = 0; k <= last && asked < kUrgentEntries / 2; k++)
          if (state(k) == ChunkState::kPending && !(overwrite && chunk_within(k, address, end))) urgent(k), asked++;
      std::vector<std::pair<uint64_t, uint32_t>> none;  // a fill has no pool: nothing is saved
      PHOS_TRY(write_chunk(c, SaveChunks{}, deadline, report, true, none));
    }
  }
  return report;
}

Result<WriteReport> CopyState::before_write(uint64_t address, uint64_t bytes, const SaveChunk& save,
                                            std::chrono::milliseconds timeout) {
  return before_write(address, bytes, SaveChunks{save, [] { return Result<void>{}; }}, timeout);
}

Result<WriteReport> CopyState::before_write(uint64_t address, uint64_t bytes, const SaveChunks& save,
                                            std::chrono::milliseconds timeout) {
  WriteReport report;
  if (window() != Window::kOpen) return report;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  chunks_of(address, bytes, spans);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  // Copy-on-write: every chunk saved (in one batch) or asked for first,
  // then the waits (they overlap: the engine copies what is asked for while
  // this waits). The batch completes before any wait.
  std::vector<uint64_t> deferred;
  std::vector<std::pair<uint64_t, uint32_t>> batch;
  const uint64_t t0 = protocol() == CopyProtocol::kSoftCopyOnWrite ? monotonic_ns() : 0;
  for (auto [first, last] : spans) {
    if (protocol() == CopyProtocol::kSoftRecopy) mark_written(first);
    for (uint64_t c = first; c <= last; c++) {
      if (protocol() == CopyProtocol::kSoftRecopy) {
        uint64_t bit = uint64_t(1) << (c % 64);
        if (!(l_->dirty[c / 64].fetch_or(bit, std::memory_order_acq_rel) & bit)) {
          report.dirtied++;
          l_->header->dirtied.fetch_add(1, std::memory_order_relaxed);
        }
        continue;
      }
      auto r = write_chunk(c, save, deadline, report, false, batch);
      if (!r) {
        (void)complete_saves(batch, save, report);
        close(Window::kAborted);
        return r.error();
      }
      if (!*r) deferred.push_back(c);
    }
  }
  if (auto done = complete_saves(batch, save, report); !done) {
    close(Window::kAborted);
    return done.error();
  }
  if (t0) report.save_ns = monotonic_ns() - t0;
  const uint64_t t1 = deferred.empty() ? 0 : monotonic_ns();
  for (size_t i = 0; i < deferred.size(); i++) {
    // The engine is asked for the next deferred chunks again as its urgent
    // list drains: past the list's first kUrgentEntries, a chunk was reached
    // only after every chunk waiting in the pool (on the 8B server, one
    // launch whose set outgrew the pool waited 2.1 s, its last chunks
    // behind 57 GB of saved ones), not by all the engine's workers at once.
    if (i % (kUrgentEntries / 4) == 0)
      for (size_t k = i; k < deferred.size() && k < i + kUrgentEntries / 2; k++)
        if (state(deferred[k]) == ChunkState::kPending) urgent(deferred[k]);
    auto r = write_chunk(deferred[i], save, deadline, report, true, batch);
    if (auto done = complete_saves(batch, save, report); r && !done) r = done.error();
    if (!r) {
      close(Window::kAborted);
      return r.error();
    }
  }
  if (t1) report.wait_ns = monotonic_ns() - t1;
  return report;
}

void CopyState::mark_all_dirty() {
  const uint64_t n = chunk_count();
  for (uint64_t i = 0; i * 64 < n; i++) {
    uint64_t bits = i * 64 + 64 <= n ? ~uint64_t(0) : (uint64_t(1) << (n - i * 64)) - 1;
    uint64_t before = l_->dirty[i].fetch_or(bits, std::memory_order_acq_rel);
    l_->header->dirtied.fetch_add(uint64_t(__builtin_popcountll(bits & ~before)), std::memory_order_relaxed);
  }
}

void CopyState::forget(uint64_t address) {
  const auto& regions = l_->regions;
  auto it = std::lower_bound(regions.begin(), regions.end(), address,
                             [](const Region& r, uint64_t a) { return r.address < a; });
  if (it != regions.end() && it->address == address)
    l_->forgotten[it - regions.begin()].store(true, std::memory_order_release);
}

Result<void> CopyState::wait_closed(std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::atomic<uint32_t>& w = l_->header->window;
  for (uint32_t seen; (seen = w.load(std::memory_order_acquire)) == uint32_t(Window::kOpen);)
    if (!wait_change(w, seen, deadline))
      return make_error(protocol() == CopyProtocol::kOnDemandFill ? "on-demand restore: the fill did not end in time"
                                                                  : "the dump's copy did not end in time",
                        ETIMEDOUT);
  return fill_given_up();
}

PoolBack CopyState::pool_back() const {
  const uint32_t v = l_->header->pool_back.load(std::memory_order_seq_cst);
  return v <= uint32_t(PoolBack::kGiven) ? PoolBack(v) : PoolBack::kGiven;  // scribbled: treated as gone
}

PoolBack CopyState::ask_pool_back() {
  if (!pool_slots()) return PoolBack::kGiven;
  uint32_t in_use = uint32_t(PoolBack::kInUse);
  l_->header->pool_back.compare_exchange_strong(in_use, uint32_t(PoolBack::kAsked), std::memory_order_seq_cst);
  return pool_back();
}

// A window that ended counts as given back: the engine claims no chunk any
// more, so it will never serve the ask, and its pool goes with the window.
// Looked at every 10 ms, since closing wakes the window's word, not this one.
Result<void> CopyState::wait_pool_back(std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::atomic<uint32_t>& w = l_->header->pool_back;
  for (;;) {
    const uint32_t seen = w.load(std::memory_order_acquire);
    if (seen == uint32_t(PoolBack::kGiven) || window() != Window::kOpen) return {};
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return make_error("the engine did not give the copy-on-write pool back in time", ETIMEDOUT);
    (void)wait_change(w, seen, std::min(deadline, now + std::chrono::milliseconds(10)));
  }
}

bool CopyState::pool_in_use() const {
  for (uint32_t i = 0; i * 64 < pool_slots(); i++)
    if (l_->pool[i].load(std::memory_order_seq_cst)) return true;
  return false;
}

void CopyState::pool_given_back() {
  l_->header->pool_back.store(uint32_t(PoolBack::kGiven), std::memory_order_seq_cst);
  wake_all(l_->header->pool_back);
}

std::optional<Claim> CopyState::claim_urgent() {
  const uint64_t n = chunk_count();
  for (size_t i = 0; i < kUrgentEntries; i++) {
    uint32_t v = l_->urgent[i].exchange(0, std::memory_order_acq_rel);
    if (!v || v - 1 >= n) continue;  // empty, or scribbled on
    std::atomic<uint32_t>& w = word(v - 1);
    uint32_t seen = w.load(std::memory_order_acquire);
    if (state_of(seen) == ChunkState::kPending &&
        w.compare_exchange_strong(seen, encode(ChunkState::kCopying), std::memory_order_acq_rel))
      return claim_of(v - 1, std::nullopt);
  }
  return std::nullopt;
}

std::optional<Claim> CopyState::claim(uint64_t chunk) {
  if (chunk >= chunk_count() || !take_pending(chunk, false)) return std::nullopt;
  return claim_of(chunk, std::nullopt);
}

bool CopyState::take_pending(uint64_t chunk, bool skip_dirty) {
  if (skip_dirty && dirty(chunk)) return false;
  uint32_t pending = encode(ChunkState::kPending);
  return word(chunk).compare_exchange_strong(pending, encode(ChunkState::kCopying), std::memory_order_acq_rel);
}

void CopyState::mark_written(uint64_t chunk) {
  const auto& firsts = l_->first_chunks;
  const size_t r = size_t(std::upper_bound(firsts.begin(), firsts.end(), chunk) - firsts.begin());
  if (r == 0) return;
  std::atomic<uint64_t>& bits = l_->written[(r - 1) / 64];
  const uint64_t bit = uint64_t(1) << ((r - 1) % 64);
  // Most writes find the bit set already: no store to share the line.
  if (!(bits.load(std::memory_order_relaxed) & bit)) bits.fetch_or(bit, std::memory_order_release);
}

bool CopyState::region_written(uint32_t region) const {
  if (region >= l_->regions.size()) return false;
  return (l_->written[region / 64].load(std::memory_order_acquire) >> (region % 64)) & 1;
}

void CopyState::set_cold_first(bool on) { l_->cold_first = on; }

std::optional<Claim> CopyState::claim_cold() {
  const uint64_t n = chunk_count();
  const auto& firsts = l_->first_chunks;
  std::atomic<uint64_t>& cursor = l_->header->cold_cursor;
  const uint64_t from = std::min<uint64_t>(cursor.load(std::memory_order_relaxed), n);  // the process may scribble
  size_t r = size_t(std::upper_bound(firsts.begin(), firsts.end(), from) - firsts.begin());
  for (r = r ? r - 1 : 0; r < firsts.size(); r++) {
    if (region_written(uint32_t(r))) continue;  // taken after the cold ones
    const uint64_t end = r + 1 < firsts.size() ? firsts[r + 1] : n;
    for (uint64_t c = std::max(from, firsts[r]); c < end; c++) {
      if (!take_pending(c, true)) continue;
      cursor.store(c + 1, std::memory_order_relaxed);
      return claim_of(c, std::nullopt);
    }
  }
  cursor.store(n, std::memory_order_relaxed);
  return std::nullopt;
}

void CopyState::transfer_queued(uint64_t bytes, uint64_t now_ns) {
  Header& h = *l_->header;
  h.transfers.fetch_add(1, std::memory_order_relaxed);
  h.transfer_bytes.fetch_add(bytes, std::memory_order_relaxed);
  uint64_t rate = h.transfer_rate.load(std::memory_order_relaxed);
  if (!rate) rate = kDefaultTransferRate;
  const auto takes_ns = uint64_t(double(bytes) * 1e9 / double(rate));
  // After the transfers queued before it, or from now where they are done.
  uint64_t until = h.busy_until_ns.load(std::memory_order_relaxed);
  while (!h.busy_until_ns.compare_exchange_weak(until, std::max(until, now_ns) + takes_ns, std::memory_order_acq_rel)) {
  }
}

void CopyState::set_transfer_rate(uint64_t bytes_per_second) {
  l_->header->transfer_rate.store(bytes_per_second, std::memory_order_relaxed);
}

Traffic CopyState::traffic() const {
  const Header& h = *l_->header;
  return Traffic{h.busy_until_ns.load(std::memory_order_acquire)};
}

bool CopyState::urgent_waiting() const {
  for (size_t i = 0; i < kUrgentEntries; i++)
    if (l_->urgent[i].load(std::memory_order_relaxed)) return true;
  return false;
}

std::vector<std::pair<uint64_t, uint64_t>> CopyState::unfilled_ranges() const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (uint64_t c = 0; c < chunk_count(); c++) {
    if (state(c) == ChunkState::kCopied) continue;
    Claim at = claim_of(c, std::nullopt);
    // Freed by the program: what is at its addresses now is not the fill's.
    if (l_->forgotten[at.region].load(std::memory_order_acquire)) continue;
    uint64_t start = l_->regions[at.region].address + at.offset, end = start + at.bytes;
    if (!out.empty() && out.back().second == start) out.back().second = end;
    else out.emplace_back(start, end);
  }
  return out;
}

uint64_t CopyState::chunk_at(uint32_t region, uint64_t offset) const {
  return l_->first_chunks.at(region) + offset / chunk_size();
}

Claim CopyState::locate(uint64_t chunk) const { return claim_of(chunk, std::nullopt); }

std::vector<uint64_t> CopyState::region_chunks(const std::set<uint64_t>& ids) const {
  std::vector<uint64_t> out;
  for (size_t r = 0; r < l_->regions.size(); r++) {
    if (!ids.count(l_->regions[r].id)) continue;
    const uint64_t first = l_->first_chunks[r], end = first + chunks_in(l_->regions[r].size, chunk_size());
    for (uint64_t c = first; c < end; c++) out.push_back(c);
  }
  return out;
}

std::optional<Claim> CopyState::claim_again(uint64_t chunk) {
  if (chunk >= chunk_count()) return std::nullopt;
  uint32_t copied = encode(ChunkState::kCopied);
  if (!word(chunk).compare_exchange_strong(copied, encode(ChunkState::kCopying), std::memory_order_acq_rel))
    return std::nullopt;
  clear_dirty(chunk);
  return claim_of(chunk, std::nullopt);
}

void CopyState::clear_dirty(uint64_t chunk) {
  if (chunk >= chunk_count()) return;
  l_->dirty[chunk / 64].fetch_and(~(uint64_t(1) << (chunk % 64)), std::memory_order_acq_rel);
}

std::optional<Claim> CopyState::claim_next() {
  if (window() != Window::kOpen) return std::nullopt;
  const uint64_t n = chunk_count();
  // Chunks a write waits for, then those waiting in the pool.
  if (auto c = claim_urgent()) return c;
  if (auto c = claim_saved()) return c;
  bool recopy = protocol() == CopyProtocol::kSoftRecopy;
  if (recopy && l_->cold_first)
    if (auto c = claim_cold()) return c;
  // The others, in order from where the last scan stopped, around once:
  // chunks being saved when it passed are found the next time round.
  uint64_t start = l_->header->cursor.load(std::memory_order_relaxed) % (n ? n : 1);
  for (uint64_t k = 0; k < n; k++) {
    uint64_t c = (start + k) % n;
    if (recopy && dirty(c)) continue;  // copied again at the end
    std::atomic<uint32_t>& w = word(c);
    uint32_t seen = w.load(std::memory_order_acquire);
    ChunkState s = state_of(seen);
    if (s != ChunkState::kPending && s != ChunkState::kSaved) continue;
    std::optional<uint32_t> slot = s == ChunkState::kSaved ? slot_of(seen) : std::nullopt;
    if (slot && *slot >= pool_slots()) continue;  // scribbled on: left for the end check
    if (!w.compare_exchange_strong(seen, encode(ChunkState::kCopying, slot), std::memory_order_acq_rel)) continue;
    if (slot) drop_in_pool(*slot, c);
    l_->header->cursor.store(c + 1, std::memory_order_relaxed);
    return claim_of(c, slot);
  }
  return std::nullopt;
}

std::optional<Claim> CopyState::claim_dirty() {
  const uint64_t n = chunk_count();
  for (uint64_t i = 0; i * 64 < n; i++) {
    uint64_t bits = l_->dirty[i].load(std::memory_order_acquire);
    while (bits) {
      uint64_t c = i * 64 + uint64_t(__builtin_ctzll(bits));
      uint64_t bit = uint64_t(1) << (c % 64);
      bits &= ~bit;
      if (c >= n) break;
      std::atomic<uint32_t>& w = word(c);
      uint32_t seen = w.load(std::memory_order_acquire);
      if (state_of(seen) == ChunkState::kCopying) continue;  // the engine has it already
      if (!(l_->dirty[i].fetch_and(~bit, std::memory_order_acq_rel) & bit)) continue;
      w.store(encode(ChunkState::kCopying), std::memory_order_release);
      return claim_of(c, std::nullopt);
    }
  }
  return std::nullopt;
}

void CopyState::copied(const Claim& claim) {
  if (claim.chunk >= chunk_count()) return;
  std::atomic<uint32_t>& w = word(claim.chunk);
  w.store(encode(ChunkState::kCopied), std::memory_order_release);
  if (claim.pool_slot) free_slot(*claim.pool_slot);
  wake_all(w);
}

void CopyState::unclaim(const Claim& claim) {
  if (claim.chunk >= chunk_count()) return;
  std::atomic<uint32_t>& w = word(claim.chunk);
  w.store(claim.pool_slot ? encode(ChunkState::kSaved, claim.pool_slot) : encode(ChunkState::kPending),
          std::memory_order_release);
  if (claim.pool_slot) note_in_pool(*claim.pool_slot, claim.chunk);
  wake_all(w);
}

uint64_t CopyState::dirty_count() const {
  const uint64_t n = chunk_count();
  uint64_t count = 0;
  for (uint64_t i = 0; i * 64 < n; i++) {
    uint64_t bits = l_->dirty[i].load(std::memory_order_acquire);
    if (i * 64 + 64 > n) bits &= (uint64_t(1) << (n - i * 64)) - 1;  // bits past the table: scribbled on
    count += uint64_t(__builtin_popcountll(bits));
  }
  return count;
}

uint64_t CopyState::copied_dirty_count() const {
  uint64_t count = 0;
  for (uint64_t c = 0; c < chunk_count(); c++)
    if (state(c) == ChunkState::kCopied && dirty(c)) count++;
  return count;
}

bool CopyState::all_copied() const {
  const uint64_t n = chunk_count();
  for (uint64_t c = 0; c < n; c++)
    if (state(c) != ChunkState::kCopied || dirty(c)) return false;
  return true;
}

void CopyState::close(Window how) {
  uint32_t open = uint32_t(Window::kOpen);
  // The first close counts: an abort after completion changes nothing.
  l_->header->window.compare_exchange_strong(open, uint32_t(how), std::memory_order_acq_rel);
  wake_all(l_->header->window);
  for (uint64_t c = 0; c < chunk_count(); c++)
    if (state(c) != ChunkState::kCopied) wake_all(word(c));
}

}  // namespace phos::copystate
