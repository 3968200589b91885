#include "phos/hooks/nccl_communicators.h"

#include <algorithm>

namespace phos::hooks {

std::optional<std::string> nccl_why_not_recreatable(const NcclCommunicator& c) {
  if (c.extras)
    return std::to_string(c.extras) + " buffer registration(s), window(s), device communicator(s) or reduction " +
           "operator(s) on it";
  if (c.nranks <= 1) return std::nullopt;  // made again alone, from a unique id of its own
  if (!c.single_process) return std::nullopt;  // its job's coordinator supplies the new unique id
  if (c.origin == NcclOrigin::kInitAll) return std::nullopt;  // ncclCommInitAll again
  return std::string("split from communicators of one process (ncclCommSplit of an ncclCommInitAll set)");
}

uint64_t NcclCommunicators::new_handle() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < kMaxHandles; i++)
    if (!handle_taken_[i]) {
      handle_taken_[i] = true;
      real_[i].store(0, std::memory_order_relaxed);
      calls_[i].store(0, std::memory_order_relaxed);
      return reinterpret_cast<uint64_t>(&handle_space_[i]);
    }
  return 0;
}

bool NcclCommunicators::owns(uint64_t handle) const {
  uint64_t base = reinterpret_cast<uint64_t>(&handle_space_[0]);
  return handle >= base && handle < base + kMaxHandles;
}

uint64_t NcclCommunicators::real_of(uint64_t handle) const {
  if (!owns(handle)) return handle;
  return real_[slot(handle)].load(std::memory_order_acquire);
}

void NcclCommunicators::free_handle(uint64_t handle) {
  if (!owns(handle)) return;
  real_[slot(handle)].store(0, std::memory_order_release);
  handle_taken_[slot(handle)] = false;
}

NcclCommunicator NcclCommunicators::snapshot(const NcclCommunicator& c) const {
  NcclCommunicator out = c;
  if (owns(c.handle)) out.calls = calls_[slot(c.handle)].load(std::memory_order_relaxed);
  return out;
}

void NcclCommunicators::count_stops() {
  stops_armed_.store(uint32_t(std::count_if(live_.begin(), live_.end(),
                                            [](const NcclCommunicator& l) { return l.stop_at.has_value(); })));
}

NcclCommunicator* NcclCommunicators::entry(uint64_t handle) {
  for (NcclCommunicator& l : live_)
    if (l.handle == handle) return &l;
  return nullptr;
}

void NcclCommunicators::created(const NcclCommunicator& c) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(live_, [&](const NcclCommunicator& l) { return l.handle == c.handle; });
  live_.push_back(c);
  if (owns(c.handle)) {
    real_[slot(c.handle)].store(c.real, std::memory_order_release);
    calls_[slot(c.handle)].store(0, std::memory_order_relaxed);  // a new communicator: none issued
  }
  count_stops();
}

void NcclCommunicators::set_real(uint64_t handle, uint64_t real) {
  std::lock_guard<std::mutex> lock(mu_);
  NcclCommunicator* c = entry(handle);
  if (!c) return;
  if (!c->real && real) c->rebuilds++;
  c->real = real;
  if (owns(handle)) real_[slot(handle)].store(real, std::memory_order_release);
}

void NcclCommunicators::count_extra(uint64_t handle, int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  NcclCommunicator* c = entry(handle);
  if (!c) return;
  if (delta < 0 && c->extras < uint32_t(-delta)) c->extras = 0;
  else c->extras += delta;
}

// A ticket is counted, then the release looked at; a release is made
// pending, then the tickets looked at (both sequentially consistent): one
// of the two sees the other, and the ticket is given back or waited for.
bool NcclCommunicators::enter(bool wait) {
  for (;;) {
    if (!release_pending_.load()) {
      tickets_.fetch_add(1);
      if (!release_pending_.load()) return true;
      leave();
    }
    if (!wait) return false;
    std::unique_lock<std::mutex> lock(ticket_mu_);
    ticket_cv_.wait(lock, [&] { return !release_pending_.load(); });
  }
}

void NcclCommunicators::leave() {
  if (tickets_.fetch_sub(1) == 1 && release_pending_.load()) {
    std::lock_guard<std::mutex> lock(ticket_mu_);  // the release waits under it
    ticket_cv_.notify_all();
  }
}

bool NcclCommunicators::begin_release(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(ticket_mu_);
  const bool already = release_pending_.exchange(true);
  if (ticket_cv_.wait_for(lock, timeout, [&] { return tickets_.load() == 0; })) return true;
  if (already) return false;
  release_pending_.store(false);
  ticket_cv_.notify_all();
  return false;
}

void NcclCommunicators::end_release() {
  {
    std::lock_guard<std::mutex> lock(ticket_mu_);
    release_pending_.store(false);
  }
  ticket_cv_.notify_all();
}

void NcclCommunicators::note_release(uint64_t ns) {
  std::lock_guard<std::mutex> lock(ticket_mu_);
  timings_.releases++;
  timings_.last_release_ns = ns;
}

void NcclCommunicators::note_rebuild(uint64_t ns) {
  std::lock_guard<std::mutex> lock(ticket_mu_);
  timings_.rebuilds++;
  timings_.last_rebuild_ns = ns;
}

NcclCommunicators::Timings NcclCommunicators::timings() const {
  std::lock_guard<std::mutex> lock(ticket_mu_);
  return timings_;
}

bool NcclCommunicators::release_pending() const { return release_pending_.load(); }

std::vector<std::string> NcclCommunicators::not_recreatable() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> why;
  for (const NcclCommunicator& c : live_)
    if (auto w = nccl_why_not_recreatable(c))
      why.push_back("NCCL communicator (rank " + std::to_string(c.rank) + " of " + std::to_string(c.nranks) +
                    "): " + *w);
  return why;
}

// FNV-1a (64 bits): a name, not a defence; the ids are NCCL's own random
// bytes.
uint64_t nccl_job_id(const void* unique_id, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ static_cast<const unsigned char*>(unique_id)[i]) * 0x100000001b3ull;
  return h;
}

uint64_t nccl_split_job_id(uint64_t parent_job, int color, uint32_t sequence) {
  unsigned char bytes[16];
  for (int i = 0; i < 8; i++) bytes[i] = static_cast<unsigned char>(parent_job >> (8 * i));
  for (int i = 0; i < 4; i++) bytes[8 + i] = static_cast<unsigned char>(uint32_t(color) >> (8 * i));
  for (int i = 0; i < 4; i++) bytes[12 + i] = static_cast<unsigned char>(sequence >> (8 * i));
  return nccl_job_id(bytes, sizeof(bytes));
}

uint32_t NcclCommunicators::next_split(uint64_t parent) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [p, n] : splits_)
    if (p == parent) return n++;
  splits_.emplace_back(parent, 1);
  return 0;
}

void NcclCommunicators::count_call(uint64_t handle, bool may_hold) {
  if (!owns(handle)) return;
  std::atomic<uint64_t>& calls = calls_[slot(handle)];
  // Counted, then the check (both seq_cst): arm_stop publishes a stop before
  // it reads the counts, so either this call sees the stop or the stop sees
  // this call. Checked first, a call could pass just before a stop at its
  // number was armed and be issued anyway.
  calls.fetch_add(1);
  if (stops_armed_.load() == 0) return;
  calls.fetch_sub(1);  // a stop is armed somewhere: counted below, under the lock
  std::unique_lock<std::mutex> lock(mu_);
  NcclCommunicator* c = entry(handle);
  if (!c) return;
  if (may_hold && c->stop_at && *c->stop_at <= calls.load()) {
    c->held = true;
    // The vector may change meanwhile: found again after each wake.
    stop_cv_.wait(lock, [&] {
      c = entry(handle);
      return !c || !c->stop_at || *c->stop_at > calls.load();
    });
    if (!c) return;
    c->held = false;
  }
  calls.fetch_add(1, std::memory_order_relaxed);
}

bool NcclCommunicators::arm_stop(uint64_t job_id, uint64_t at_call) {
  std::lock_guard<std::mutex> lock(mu_);
  // Published first, then the counts read (see count_call); a communicator
  // already past the call gets its stop as it was. The lock keeps every
  // held path out until then.
  std::vector<std::pair<NcclCommunicator*, std::optional<uint64_t>>> mine;
  for (NcclCommunicator& l : live_)
    if (l.job_id == job_id && owns(l.handle)) {
      mine.emplace_back(&l, l.stop_at);
      l.stop_at = at_call;
    }
  count_stops();
  bool armed = false;
  for (auto& [l, before] : mine)
    if (calls_[slot(l->handle)].load() <= at_call)
      armed = true;
    else
      l->stop_at = before;
  count_stops();
  return armed;
}

void NcclCommunicators::disarm(uint64_t job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (NcclCommunicator& l : live_)
      if (l.job_id == job_id) l.stop_at.reset();
    count_stops();
  }
  stop_cv_.notify_all();
}

void NcclCommunicators::destroyed(uint64_t handle) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(live_, [&](const NcclCommunicator& l) { return l.handle == handle; });
    std::erase_if(splits_, [&](const auto& s) { return s.first == handle; });
    free_handle(handle);
    count_stops();
  }
  stop_cv_.notify_all();
}

std::optional<NcclCommunicator> NcclCommunicators::find(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(live_.begin(), live_.end(), [&](const NcclCommunicator& l) { return l.handle == handle; });
  if (it == live_.end()) return std::nullopt;
  return snapshot(*it);
}

std::vector<NcclCommunicator> NcclCommunicators::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NcclCommunicator> out;
  for (const auto& l : live_) out.push_back(snapshot(l));
  return out;
}

size_t NcclCommunicators::spanning_processes(bool not_held) const {
  std::lock_guard<std::mutex> lock(mu_);
  return size_t(std::count_if(live_.begin(), live_.end(), [&](const NcclCommunicator& l) {
    return l.nranks > 1 && !l.single_process && !(not_held && (l.held || l.released()));
  }));
}

}  // namespace phos::hooks
