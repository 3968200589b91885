// NCCL, interposed (nccl.h names every function that takes a communicator;
// all of them are here, so the program's stable handle never reaches NCCL):
// - creation and destruction, recorded with the recipe a rebuild needs
//   (nccl_communicators.h), and a stable handle given to the program in
//   place of NCCL's communicator;
// - every call on a communicator translated to NCCL's communicator of now,
//   holding a ticket while it runs (a checkpoint's release waits for none
//   to be held, and new calls wait while it is pending);
// - collectives and point-to-point calls recorded with their send and
//   receive buffers (call_ranges.h): sizes from the count and the data type,
//   the rank count (ncclCommCount) where a call moves a count per rank, the
//   caller's rank (ncclCommUserRank) for the root-only sides. Inside a group
//   (ncclGroupStart/End) a call is recorded where it is issued; the work
//   runs at ncclGroupEnd, which a group's ticket covers.
// - the release before a checkpoint and the rebuild after it (nccl.h).
#include "hooks/nccl.h"
#include "phos/hooks/stderr_line.h"
#include "nccl/proxy_wake.h"

#include <nccl.h>
#if __has_include(<nccl_device/core.h>)
#include <nccl_device/core.h>
#include <nccl_device/gin_barrier.h>
#define PHOS_HAVE_NCCL_DEVICE_API 1
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "driver/driver.h"
#include "hooks/library_call.h"
#include "phos/hooks/nccl_rendezvous.h"
#include "phos/support/socket_io.h"
#include "phos/support/clock.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
using phos::Error;
using phos::make_error;
using phos::Result;
using phos::monotonic_ns;
namespace ranges = phos::hooks::ranges;

namespace {

constexpr const char* kNccl = "libnccl.so";
// How long a rank waits for its peers at the rendezvous (the store's host
// may be restored after this one).
constexpr std::chrono::minutes kRendezvousBound{5};

#define PHOS_NCCL_FORWARD(name, args)                  \
  [&] {                                                \
    auto next_ = PHOS_NEXT(name, kNccl);               \
    return next_ ? next_ args : ncclSystemError;       \
  }

// The NCCL functions the agent's thread calls (a checkpoint's release and
// rebuild of the communicators), looked up on the program's thread as its
// first communicator is made: the agent's thread must not call dlsym
// (library_next.h, next_cache).
void warm_agent_nccl() {
  (void)PHOS_NEXT(ncclCommDestroy, kNccl);
  (void)PHOS_NEXT(ncclCommAbort, kNccl);
  (void)PHOS_NEXT(ncclCommGetAsyncError, kNccl);
  (void)PHOS_NEXT(ncclGetErrorString, kNccl);
  (void)PHOS_NEXT(ncclGetUniqueId, kNccl);
  (void)PHOS_NEXT(ncclCommInitRankConfig, kNccl);
  (void)PHOS_NEXT(ncclCommInitAll, kNccl);
}

// What the NCCL hooks use besides a library call's (library_call.h): the
// program's communicators, and the device memory (a release waits for the
// work queued on it).
struct NcclDeps : RuntimeView {
  using RuntimeView::memory;
  using RuntimeView::nccl;
};

NcclCommunicators& registry() { return NcclDeps().nccl(); }
uint64_t id_of(ncclComm_t c) { return reinterpret_cast<uint64_t>(c); }
ncclComm_t comm_of(uint64_t id) { return reinterpret_cast<ncclComm_t>(id); }

// ---- tickets ---------------------------------------------------------------

// Per thread: tickets are counted (a call inside a call, NCCL calling its
// own exported functions) and a group keeps one from its first call on a
// communicator to its outermost ncclGroupEnd. The agent's own thread,
// releasing or rebuilding, takes none.
thread_local int t_tickets = 0;
thread_local int t_group_depth = 0;
thread_local bool t_group_ticket = false;
thread_local bool t_agent = false;

bool take_ticket(bool wait) {
  if (t_agent) return true;
  if (t_tickets > 0 || registry().enter(wait)) {
    t_tickets++;
    return true;
  }
  return false;
}
void drop_ticket() {
  if (t_agent) return;
  if (--t_tickets == 0) registry().leave();
}

struct Ticket {
  explicit Ticket(bool wait = true) : held(take_ticket(wait)) {
    if (held && t_group_depth > 0 && !t_group_ticket && take_ticket(true)) t_group_ticket = true;
  }
  ~Ticket() {
    if (held) drop_ticket();
  }
  Ticket(const Ticket&) = delete;
  Ticket& operator=(const Ticket&) = delete;
  const bool held;
};

// NCCL's communicator behind the program's handle, or null for one released
// and not made again (its rebuild failed): said once.
ncclComm_t real_comm(ncclComm_t handle) {
  uint64_t real = registry().real_of(id_of(handle));
  if (!real && handle) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      stderr_line("phos: an NCCL communicator was not made again after a checkpoint; its calls fail\n");
  }
  return comm_of(real);
}

// A call on `handle`: a ticket held for it, NCCL's communicator given to `f`.
template <class F>
ncclResult_t on_comm(ncclComm_t handle, F&& f) {
  Ticket ticket;
  ncclComm_t real = real_comm(handle);
  if (!real && handle) return ncclSystemError;
  return f(real);
}

// ncclCommDestroy and ncclCommAbort: one whose rebuild failed has nothing
// left to destroy but its record.
template <class F>
ncclResult_t ending(ncclComm_t handle, F&& end) {
  Ticket ticket;
  const uint64_t real = registry().real_of(id_of(handle));
  if (handle && !real) {
    registry().destroyed(id_of(handle));
    return ncclSuccess;
  }
  ncclResult_t r = end(comm_of(real));
  if (r == ncclSuccess) registry().destroyed(id_of(handle));
  return r;
}

// A query: answered from the record (`released`) while a release is
// pending rather than waiting for it (PyTorch's watchdog asks for errors
// all the time).
template <class R, class Released, class F>
R query(ncclComm_t handle, Released&& released, F&& f) {
  Ticket ticket(false);
  if (!ticket.held) return released(registry().find(id_of(handle)));
  ncclComm_t real = real_comm(handle);
  if (!real) return released(registry().find(id_of(handle)));
  return f(real);
}

// ---- the record ------------------------------------------------------------

int rank_count(ncclComm_t real) {
  int n = 0;
  auto count = PHOS_NEXT(ncclCommCount, kNccl);
  return count && count(real, &n) == ncclSuccess ? n : 0;
}

int rank_of(ncclComm_t real) {
  int r = -1;
  auto rank = PHOS_NEXT(ncclCommUserRank, kNccl);
  return rank && rank(real, &r) == ncclSuccess ? r : -1;
}

bool per_rank_count(ranges::Collective op) {
  using C = ranges::Collective;
  return op == C::kAllGather || op == C::kReduceScatter || op == C::kAlltoAll || op == C::kGather ||
         op == C::kScatter;
}

LibraryCall describe(ranges::Collective op, const void* send, const void* recv, size_t count, ncclDataType_t type,
                     ncclComm_t real, cudaStream_t stream, int root = -1) {
  ranges::CollectiveCall c{op, address_of(send), address_of(recv), count, ranges::nccl_data_type_bits(type)};
  if (per_rank_count(op)) c.nranks = rank_count(real);
  if (root >= 0) {
    c.root = root;
    c.rank = rank_of(real);
  }
  return {reinterpret_cast<CUstream>(stream), ranges::collective(c)};
}

// A collective or point-to-point call: counted (a job-wide stop may hold it
// here, before its ticket), translated, recorded, issued.
template <class F>
ncclResult_t collective(const char* name, ncclComm_t handle, ranges::Collective op, const void* send, const void* recv,
                        size_t count, ncclDataType_t type, cudaStream_t stream, int root, F&& issue) {
  PHOS_LIBRARY_SCOPE(name);
  // A stop holds a thread only where it keeps no group's ticket (the
  // release waits for every ticket).
  registry().count_call(id_of(handle), !(t_group_depth > 0 && t_group_ticket));
  return on_comm(handle, [&](ncclComm_t real) {
    return library_call(
        name, [&] { return describe(op, send, recv, count, type, real, stream, root); },
        [&] { return issue(real); });
  });
}

int current_device() {
  CUdevice dev = -1;
  auto get = PHOS_REAL(cuCtxGetDevice);
  return get && get(&dev) == CUDA_SUCCESS ? int(dev) : -1;
}

// A creation that succeeded (or goes on, for a non-blocking one).
bool made(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// The configuration's bytes (as many as its size says) and the strings its
// pointers name, so that a rebuild passes what the program passed.
void keep_config(const ncclConfig_t* config, NcclCommunicator& c) {
  if (!config) return;
  size_t size = std::min<size_t>(config->size, 4096);
  if (size < offsetof(ncclConfig_t, size) + sizeof(size_t)) return;
  const auto* bytes = reinterpret_cast<const uint8_t*>(config);
  c.config.assign(bytes, bytes + size);
  auto keep_string = [&](size_t offset) {
    const char* s = nullptr;
    if (offset + sizeof(s) > size) return;
    std::memcpy(&s, bytes + offset, sizeof(s));
    if (s) c.config_strings.emplace_back(offset, s);
  };
  keep_string(offsetof(ncclConfig_t, netName));
  keep_string(offsetof(ncclConfig_t, commName));
}

// NCCL made `*out`: the program gets a stable handle for it instead (NCCL's
// own when phos has none left).
void adopt(ncclComm_t* out, NcclCommunicator c) {
  if (!*out) return;  // a split that left this rank out (NCCL_SPLIT_NOCOLOR)
  c.real = id_of(*out);
  warm_agent_nccl();  // before the first checkpoint can release it
  uint64_t handle = registry().new_handle();
  c.handle = handle ? handle : c.real;
  if (c.device < 0) c.device = current_device();
  registry().created(c);
  *out = comm_of(c.handle);
}

NcclCommunicator from_unique_id(int rank, int nranks, const void* id, size_t id_bytes, const ncclConfig_t* config) {
  NcclCommunicator c;
  c.rank = rank;
  c.nranks = nranks;
  c.job_id = nccl_job_id(id, id_bytes);
  c.origin = NcclOrigin::kUniqueId;
  keep_config(config, c);
  return c;
}

// `sequence`: the parent's split count (next_split), taken by every rank that
// made the call, a rank the split leaves out too, so that the ranks agree on
// the next split's job id.
NcclCommunicator split_of(ncclComm_t parent, uint32_t sequence, ncclComm_t made_real, int color, int key,
                          const ncclConfig_t* config) {
  NcclCommunicator c;
  auto from = registry().find(id_of(parent));
  c.rank = rank_of(made_real);
  c.nranks = rank_count(made_real);
  c.parent = id_of(parent);
  c.color = color;
  c.key = key;
  c.single_process = from && from->single_process;
  c.job_id = nccl_split_job_id(from ? from->job_id : id_of(parent), color, sequence);
  c.origin = NcclOrigin::kSplit;
  keep_config(config, c);
  return c;
}

}  // namespace

// ---- creation and destruction ------------------------------------------------
// Not through the gate: a creation waits for the other ranks (the
// bootstrap), and a checkpoint's quiesce must not wait for it. It holds a
// ticket: a release waits for it (or gives up after its timeout).

extern "C" PHOS_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  Ticket ticket;
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitRank, (comm, nranks, id, rank))();
  if (made(r)) adopt(comm, from_unique_id(rank, nranks, &id, sizeof(id), nullptr));
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                                           ncclConfig_t* config) {
  Ticket ticket;
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitRankConfig, (comm, nranks, id, rank, config))();
  if (made(r)) adopt(comm, from_unique_id(rank, nranks, &id, sizeof(id), config));
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int nids,
                                                             ncclUniqueId* ids, ncclConfig_t* config) {
  Ticket ticket;
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitRankScalable, (comm, nranks, rank, nids, ids, config))();
  if (made(r)) adopt(comm, from_unique_id(rank, nranks, ids, nids > 0 ? sizeof(*ids) : 0, config));
  return r;
}

// One process, ndev devices: a communicator per device, rank i on devlist[i].
extern "C" PHOS_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  Ticket ticket;
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitAll, (comms, ndev, devlist))();
  if (!made(r)) return r;
  std::vector<int> devices;
  for (int i = 0; i < ndev; i++) devices.push_back(devlist ? devlist[i] : i);
  uint64_t first = 0;
  for (int i = 0; i < ndev; i++) {
    NcclCommunicator c;
    c.rank = i;
    c.nranks = ndev;
    c.device = devices[i];
    c.single_process = true;
    c.origin = NcclOrigin::kInitAll;
    c.devices = devices;
    c.job_id = comms[0] ? id_of(comms[0]) : 0;  // in this process only
    c.init_all_first = first;  // 0 for the first itself
    adopt(&comms[i], c);
    if (i == 0) first = id_of(comms[0]);
  }
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                                  ncclConfig_t* config) {
  return on_comm(comm, [&](ncclComm_t real) {
    ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommSplit, (real, color, key, newcomm, config))();
    if (!made(r)) return r;
    const uint32_t sequence = registry().next_split(id_of(comm));
    if (newcomm && *newcomm) adopt(newcomm, split_of(comm, sequence, *newcomm, color, key, config));
    return r;
  });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int exclude_count, ncclComm_t* newcomm,
                                                   ncclConfig_t* config, int flags) {
  return on_comm(comm, [&](ncclComm_t real) {
    ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommShrink, (real, exclude, exclude_count, newcomm, config, flags))();
    // Like a split to which the excluded ranks passed no color.
    if (!made(r)) return r;
    const uint32_t sequence = registry().next_split(id_of(comm));
    if (newcomm && *newcomm) adopt(newcomm, split_of(comm, sequence, *newcomm, -2, 0, config));
    return r;
  });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return on_comm(comm, [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommFinalize, (real))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return ending(comm, [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommDestroy, (real))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return ending(comm, [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommAbort, (real))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
  return on_comm(comm, [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommRevoke, (real, flags))(); });
}

// ---- queries -----------------------------------------------------------------

namespace {
// ncclCommCount, ncclCommUserRank, ncclCommCuDevice: one number of the
// layout, the record's while released.
template <class Real>
ncclResult_t layout_query(ncclComm_t comm, int* out, int NcclCommunicator::*field, Real&& real) {
  return query<ncclResult_t>(
      comm,
      [&](const std::optional<NcclCommunicator>& c) {
        if (!c) return ncclInvalidArgument;
        *out = (*c).*field;
        return ncclSuccess;
      },
      real);
}
}  // namespace

extern "C" PHOS_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return layout_query(comm, count, &NcclCommunicator::nranks,
                      [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommCount, (real, count))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return layout_query(comm, rank, &NcclCommunicator::rank,
                      [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommUserRank, (real, rank))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return layout_query(comm, device, &NcclCommunicator::device,
                      [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommCuDevice, (real, device))(); });
}

// While released there is no error to report.
extern "C" PHOS_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  return query<ncclResult_t>(
      comm,
      [&](const std::optional<NcclCommunicator>& c) {
        if (!c) return ncclInvalidArgument;
        *error = ncclSuccess;
        return ncclSuccess;
      },
      [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommGetAsyncError, (real, error))(); });
}

extern "C" PHOS_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  return query<const char*>(
      comm, [](const std::optional<NcclCommunicator>&) { return ""; },
      [&](ncclComm_t real) -> const char* {
        auto f = PHOS_NEXT(ncclGetLastError, kNccl);
        return f ? f(real) : "";
      });
}

// ---- what phos cannot make again: counted, a release is refused while any lives

namespace {
// A call that makes (+1) or undoes (-1) such a thing on `comm`.
template <class F>
ncclResult_t extra(ncclComm_t comm, int delta, F&& call) {
  return on_comm(comm, [&](ncclComm_t real) {
    ncclResult_t r = call(real);
    if (r == ncclSuccess) registry().count_extra(id_of(comm), delta);
    return r;
  });
}
}  // namespace

extern "C" PHOS_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  return extra(comm, +1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommRegister, (real, buff, size, handle))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return extra(comm, -1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommDeregister, (real, handle))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                                           int flags) {
  return extra(comm, +1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommWindowRegister, (real, buff, size, win, flags))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return extra(comm, -1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclCommWindowDeregister, (real, win))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                                             ncclScalarResidence_t residence, ncclComm_t comm) {
  return extra(comm, +1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclRedOpCreatePreMulSum, (op, scalar, type, residence, real))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  return extra(comm, -1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclRedOpDestroy, (op, real))(); });
}

#ifdef PHOS_HAVE_NCCL_DEVICE_API
// The device API (NCCL 2.28): device communicators live in device memory
// NCCL owns; teams are plain values.
extern "C" PHOS_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const* reqs,
                                                      ncclDevComm_t* out) {
  return extra(comm, +1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclDevCommCreate, (real, reqs, out))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* dev) {
  return extra(comm, -1,
               [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclDevCommDestroy, (real, dev))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int n,
                                                                    ncclGinBarrierHandle_t* out,
                                                                    ncclDevResourceRequirements_t* req) {
  return on_comm(comm, [&](ncclComm_t real) {
    return PHOS_NCCL_FORWARD(ncclGinBarrierCreateRequirement, (real, team, n, out, req))();
  });
}

namespace {
template <class R, class F>
R team_call(ncclComm_t comm, F&& f) {
  Ticket ticket;
  ncclComm_t real = real_comm(comm);
  if (!real) return R{};  // not made again after a checkpoint (said once)
  return f(real);
}
}  // namespace

extern "C" PHOS_EXPORT ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  return team_call<ncclTeam_t>(comm, [](ncclComm_t real) { return PHOS_NEXT_AS(ncclTeamWorld, kNccl, ncclTeam_t (*)(ncclComm_t))(real); });
}
extern "C" PHOS_EXPORT ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  return team_call<ncclTeam_t>(comm, [](ncclComm_t real) { return PHOS_NEXT_AS(ncclTeamLsa, kNccl, ncclTeam_t (*)(ncclComm_t))(real); });
}
extern "C" PHOS_EXPORT ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  return team_call<ncclTeam_t>(comm, [](ncclComm_t real) { return PHOS_NEXT_AS(ncclTeamRail, kNccl, ncclTeam_t (*)(ncclComm_t))(real); });
}
extern "C" PHOS_EXPORT int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  return team_call<int>(comm, [&](ncclComm_t real) { return PHOS_NEXT_AS(ncclTeamRankToWorld, kNccl, int (*)(ncclComm_t, ncclTeam_t, int))(real, team, rank); });
}
extern "C" PHOS_EXPORT int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  return team_call<int>(comm, [&](ncclComm_t real) { return PHOS_NEXT_AS(ncclTeamRankToLsa, kNccl, int (*)(ncclComm_t, ncclTeam_t, int))(real, team, rank); });
}
#endif

// ---- groups --------------------------------------------------------------------

extern "C" PHOS_EXPORT ncclResult_t ncclGroupStart() {
  PHOS_LIBRARY_SCOPE("ncclGroupStart");
  t_group_depth++;
  return forwarded_call(kInnermostScope, PHOS_NCCL_FORWARD(ncclGroupStart, ()));
}

namespace {
void group_ended() {
  if (t_group_depth > 0 && --t_group_depth == 0 && t_group_ticket) {
    t_group_ticket = false;
    drop_ticket();
  }
}
}  // namespace

// The group's work is issued here: its ticket is dropped after.
extern "C" PHOS_EXPORT ncclResult_t ncclGroupEnd() {
  PHOS_LIBRARY_SCOPE("ncclGroupEnd");
  ncclResult_t r = forwarded_call(kInnermostScope, PHOS_NCCL_FORWARD(ncclGroupEnd, ()));
  group_ended();
  return r;
}

// Ends the group too, issuing nothing.
extern "C" PHOS_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* info) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclGroupSimulateEnd, (info))();
  group_ended();
  return r;
}

// ---- collectives and point-to-point calls --------------------------------------

using ranges::Collective;

extern "C" PHOS_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllReduce", comm, Collective::kAllReduce, send, recv, count, type, stream, -1,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclAllReduce, (send, recv, count, type, op, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                                  int root, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclBroadcast", comm, Collective::kBroadcast, send, recv, count, type, stream, root,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclBroadcast, (send, recv, count, type, root, real, stream))(); });
}

// The in-place broadcast of old.
extern "C" PHOS_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                                              cudaStream_t stream) {
  return collective("ncclBcast", comm, Collective::kBroadcast, buff, buff, count, type, stream, root,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclBcast, (buff, count, type, root, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclReduce", comm, Collective::kReduce, send, recv, count, type, stream, root,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclReduce, (send, recv, count, type, op, root, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count,
                                                  ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", comm, Collective::kAllGather, send, recv, send_count, type, stream, -1,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclAllGather, (send, recv, send_count, type, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count,
                                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                                      cudaStream_t stream) {
  return collective("ncclReduceScatter", comm, Collective::kReduceScatter, send, recv, recv_count, type, stream, -1,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclReduceScatter, (send, recv, recv_count, type, op, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t type,
                                                 ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAlltoAll", comm, Collective::kAlltoAll, send, recv, count, type, stream, -1,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclAlltoAll, (send, recv, count, type, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclGather(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                               ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclGather", comm, Collective::kGather, send, recv, count, type, stream, root,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclGather, (send, recv, count, type, root, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                                                int root, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclScatter", comm, Collective::kScatter, send, recv, count, type, stream, root,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclScatter, (send, recv, count, type, root, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                                             ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclSend", comm, Collective::kSend, send, nullptr, count, type, stream, -1,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclSend, (send, count, type, peer, real, stream))(); });
}

extern "C" PHOS_EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                             cudaStream_t stream) {
  return collective("ncclRecv", comm, Collective::kRecv, nullptr, recv, count, type, stream, -1,
                    [&](ncclComm_t real) { return PHOS_NCCL_FORWARD(ncclRecv, (recv, count, type, peer, real, stream))(); });
}

// ---- the release before a checkpoint, the rebuild after it ----------------------

namespace {

std::string join_lines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : "; ") + s;
  return out;
}

std::string nccl_error(const char* call, ncclResult_t r) {
  auto text = PHOS_NEXT(ncclGetErrorString, kNccl);
  return std::string(call) + ": " + (text ? text(r) : "error " + std::to_string(int(r)));
}

// The agent's thread calls NCCL as itself: no tickets.
struct AgentCalls {
  AgentCalls() { t_agent = true; }
  ~AgentCalls() { t_agent = false; }
};

// The device's primary context current on this thread (NCCL asks the
// runtime for its device), for as long as it lives.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    auto retain = PHOS_REAL(cuDevicePrimaryCtxRetain);
    if (device_ < 0 || !retain || retain(&ctx_, device_) != CUDA_SUCCESS) {
      ctx_ = nullptr;
      return;
    }
    pushed_ = PHOS_REAL(cuCtxPushCurrent_v2)(ctx_) == CUDA_SUCCESS;
  }
  ~DeviceScope() {
    CUcontext popped = nullptr;
    if (pushed_) PHOS_REAL(cuCtxPopCurrent_v2)(&popped);
    if (ctx_) PHOS_REAL(cuDevicePrimaryCtxRelease_v2)(device_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_;
  CUcontext ctx_ = nullptr;
  bool pushed_ = false;
};

// The configuration the program passed, its strings copied for good (NCCL
// may keep the pointers); null where it passed none.
ncclConfig_t* config_again(const NcclCommunicator& c, std::vector<uint8_t>& bytes) {
  if (c.config.empty()) return nullptr;
  bytes = c.config;
  for (const auto& [offset, text] : c.config_strings) {
    const char* kept = strdup(text.c_str());
    std::memcpy(bytes.data() + offset, &kept, sizeof(kept));
  }
  return reinterpret_cast<ncclConfig_t*>(bytes.data());
}

// A non-blocking communicator is made in the background: waited for.
ncclResult_t ready(ncclComm_t real, ncclResult_t r) {
  auto error = PHOS_NEXT(ncclCommGetAsyncError, kNccl);
  for (int i = 0; r == ncclInProgress && error && i < 600000; i++) {
    if (error(real, &r) != ncclSuccess) break;
    if (r == ncclInProgress) usleep(100);
  }
  return r;
}

Result<ncclUniqueId> new_unique_id() {
  ncclUniqueId id;
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclGetUniqueId, (&id))();
  if (r != ncclSuccess) return make_error(nccl_error("ncclGetUniqueId", r), EIO);
  return id;
}

// `c` made again from `id` with the configuration it was made with (its
// device current: the caller's DeviceScope).
Result<ncclComm_t> init_rank(const NcclCommunicator& c, const ncclUniqueId& id) {
  std::vector<uint8_t> bytes;
  ncclConfig_t* config = config_again(c, bytes);
  ncclComm_t real = nullptr;
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitRankConfig, (&real, c.nranks, id, c.rank, config))();
  if (r == ncclInProgress) r = ready(real, r);
  if (r != ncclSuccess) return make_error(nccl_error("ncclCommInitRankConfig", r), EIO);
  return real;
}

// A communicator of one rank: a unique id of its own.
Result<ncclComm_t> make_alone(const NcclCommunicator& c) {
  DeviceScope scope(c.device);
  auto id = new_unique_id();
  if (!id) return id.error();
  return init_rank(c, *id);
}

// An ncclCommInitAll set, all its members at once.
Result<void> make_set(const std::vector<NcclCommunicator>& live, const NcclCommunicator& first, uint32_t& made) {
  std::vector<ncclComm_t> reals(first.devices.size());
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitAll, (reals.data(), int(reals.size()), first.devices.data()))();
  if (r != ncclSuccess) return make_error(nccl_error("ncclCommInitAll", r), EIO);
  for (const auto& m : live)
    if (m.released() && (m.handle == first.handle || m.init_all_first == first.handle) && m.rank >= 0 &&
        size_t(m.rank) < reals.size()) {
      registry().set_real(m.handle, id_of(reals[m.rank]));
      made++;
    }
  return {};
}

// A communicator with ranks in other processes, made again: rank 0 draws
// the unique id and leaves it at the rendezvous, the others take it there.
Result<ncclComm_t> make_with_peers(const NcclCommunicator& c, NcclRendezvous& meet, const NcclMeeting& m) {
  DeviceScope scope(c.device);
  ncclUniqueId id;
  if (c.rank == 0) {
    auto drawn = new_unique_id();
    if (!drawn) return drawn.error();
    id = *drawn;
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    PHOS_TRY(meet.leave(m, std::vector<uint8_t>(bytes, bytes + sizeof(id))));
  } else {
    auto got = meet.wait(m, sizeof(id), kRendezvousBound);
    if (!got) return got.error();
    std::memcpy(&id, got->data(), sizeof(id));
  }
  // NCCL's creation has no deadline: it starts once every rank is here.
  PHOS_TRY(meet.arrive(m, c.rank, c.nranks));
  PHOS_TRY(meet.wait_all(m, c.nranks, kRendezvousBound));
  return init_rank(c, id);
}

// Each communicator with ranks elsewhere made again at the rendezvous the
// process's environment names (nccl_rendezvous.h), oldest first (every rank
// made them in one order); nothing of the rendezvous (the store's
// connection) outlives it.
void make_all_with_peers(const std::vector<NcclCommunicator>& spanning, uint64_t nonce) {
  auto fail_all = [&](const Error& e) {
    for (const auto& c : spanning)
      stderr_line("phos: NCCL communicator (rank %d of %d) not made again after a checkpoint: %s\n", c.rank,
                  c.nranks, e.message.c_str());
  };
  auto choice = choose_rendezvous([](const char* name) { return std::getenv(name); });
  if (!choice) return fail_all(choice.error());
  auto meet = open_rendezvous(*choice, phos::net::deadline_in(kRendezvousBound));
  if (!meet) return fail_all(meet.error());
  for (const auto& c : spanning) {
    // c.calls: the call every rank was held before (a stop holds them at
    // one number), restored with the process.
    auto real = make_with_peers(c, **meet, NcclMeeting{c.job_id, nonce, c.calls});
    if (real)
      registry().set_real(c.handle, id_of(*real));
    else
      stderr_line("phos: NCCL communicator (rank %d of %d) not made again after a checkpoint at %s: %s\n",
                  c.rank, c.nranks, (*meet)->where().c_str(), real.error().message.c_str());
  }
}

// In the background; the stops lifted and the waiting calls let go at the
// end, made or not.
void make_spanning(const std::vector<NcclCommunicator>& spanning, uint64_t nonce, uint64_t t0) {
  AgentCalls as_agent;
  make_all_with_peers(spanning, nonce);
  registry().note_rebuild(monotonic_ns() - t0);
  registry().set_rebuilding(false);
  registry().end_release();
  for (const auto& c : spanning) registry().disarm(c.job_id);
}

}  // namespace

namespace phos::hooks {

// Why the communicators cannot be released now, or nothing.
std::vector<std::string> why_not_released(const std::vector<NcclCommunicator>& live) {
  std::vector<std::string> why = registry().not_recreatable();
  if (size_t n = registry().spanning_processes(true))
    why.push_back(std::to_string(n) + " communicator(s) with ranks in other processes, not held at a job-wide stop");
  for (const auto& c : live)
    if (!registry().owns(c.handle)) why.push_back("a communicator the program holds NCCL's own handle of");
  if (registry().rebuilding()) why.push_back("they are still being made again after the last checkpoint");
  return why;
}

Result<NcclReleased> nccl_release(std::chrono::milliseconds timeout) {
  if (registry().list().empty() && !registry().release_pending()) return NcclReleased{};
  if (auto why = why_not_released(registry().list()); !why.empty())
    return make_error("NCCL communicators cannot be released: " + join_lines(why), ENOTSUP);
  uint64_t t0 = monotonic_ns();
  const bool was_pending = registry().release_pending();
  if (!registry().begin_release(timeout))
    return make_error("NCCL calls still running after " + std::to_string(timeout.count()) + " ms", ETIMEDOUT);
  // Listed again now that no call runs: one destroyed or made meanwhile
  // counts as it is now.
  auto live = registry().list();
  if (auto why = why_not_released(live); !why.empty()) {
    if (!was_pending) registry().end_release();
    return make_error("NCCL communicators cannot be released: " + join_lines(why), ENOTSUP);
  }
  // NCCL's kernels already queued use the communicator's memory.
  if (auto synced = NcclDeps().memory().synchronize(); !synced) {
    registry().end_release();
    return make_error("before releasing NCCL communicators: " + synced.error().message, synced.error().code);
  }
  AgentCalls as_agent;
  NcclReleased out;
  nccl_proxy_wake_begin();
  for (auto it = live.rbegin(); it != live.rend(); ++it) {
    if (it->released()) continue;
    DeviceScope scope(it->device);
    // A non-blocking communicator may still be issuing a group's work.
    (void)ready(comm_of(it->real), ncclInProgress);
    // One with ranks in other processes is aborted: a destroy may wait for
    // the peers, which release theirs in their own time.
    const bool spanning = it->nranks > 1 && !it->single_process;
    ncclResult_t r = spanning ? PHOS_NCCL_FORWARD(ncclCommAbort, (comm_of(it->real)))()
                              : PHOS_NCCL_FORWARD(ncclCommDestroy, (comm_of(it->real)))();
    // Gone or not, it is made again from its recipe.
    if (r != ncclSuccess)
      stderr_line("phos: releasing NCCL communicator (rank %d of %d): %s\n", it->rank, it->nranks,
                  nccl_error(spanning ? "ncclCommAbort" : "ncclCommDestroy", r).c_str());
    registry().set_real(it->handle, 0);
    out.communicators++;
  }
  nccl_proxy_wake_end();
  out.ns = monotonic_ns() - t0;
  registry().note_release(out.ns);
  return out;
}

Result<uint32_t> nccl_rebuild(std::optional<uint64_t> nonce) {
  const uint64_t t0 = monotonic_ns();
  auto live = registry().list();
  AgentCalls as_agent;
  uint32_t made = 0;
  std::optional<Error> first_error;
  std::vector<NcclCommunicator> spanning;
  bool waiting = false;
  auto failed = [&](const NcclCommunicator& c, const Error& e) {
    if (!first_error)
      first_error = Error{"NCCL communicator (rank " + std::to_string(c.rank) + " of " + std::to_string(c.nranks) +
                              ") not made again: " + e.message,
                          e.code};
  };
  for (const auto& c : live) {
    if (!c.released()) continue;
    if (c.origin == NcclOrigin::kInitAll) {
      if (c.init_all_first != 0) continue;  // made with the first of its set
      if (auto r = make_set(live, c, made); !r) failed(c, r.error());
    } else if (c.nranks == 1) {
      auto real = make_alone(c);
      if (!real) {
        failed(c, real.error());
        continue;
      }
      registry().set_real(c.handle, id_of(*real));
      made++;
    } else if (!nonce || registry().rebuilding()) {
      // Its ranks meet under a resuming criu run's nonce (none came: the
      // release stays pending until one does), or a rebuild of them is on.
      waiting = true;
    } else {
      spanning.push_back(c);
    }
  }
  if (waiting) {
    if (!nonce)
      stderr_line("phos: NCCL communicators with ranks in other processes wait to be made again "
                  "(their calls wait too): no criu run resumed them\n");
  } else if (spanning.empty()) {
    if (made || first_error) registry().note_rebuild(monotonic_ns() - t0);
    registry().end_release();
  } else {
    // Each rank waits for the others here: criu resumes them one by one.
    registry().set_rebuilding(true);
    std::thread([spanning, nonce, t0] { make_spanning(spanning, *nonce, t0); }).detach();
  }
  if (first_error) return *first_error;
  return made + uint32_t(spanning.size());
}

Result<bool> nccl_pend_release(bool pend) {
  if (pend && registry().rebuilding())
    return make_error("NCCL communicators are still being made again after the last checkpoint", EBUSY);
  if (pend) return registry().begin_release(std::chrono::seconds(10));
  for (const auto& c : registry().list())
    if (c.released()) return false;
  registry().end_release();
  return true;
}

}  // namespace phos::hooks
