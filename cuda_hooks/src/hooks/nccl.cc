// NCCL communicators' creation and destruction, recorded (the layout a
// multi-process checkpoint needs: nccl_communicators.h), and NCCL
// collectives and point-to-point calls, interposed so that a recorded
// call carries its send and receive buffers (call_ranges.h): sizes from the
// count and the data type, the rank count (ncclCommCount) for AllGather and
// ReduceScatter, the caller's rank (ncclCommUserRank) for the root-only
// sides of Broadcast and Reduce. Inside a group (ncclGroupStart/End) the
// call is recorded where it is issued; the work runs at ncclGroupEnd.
#include <nccl.h>

#include "driver/driver.h"
#include "hooks/library_call.h"

#define PHOS_EXPORT __attribute__((visibility("default")))

using namespace phos::hooks;
namespace ranges = phos::hooks::ranges;

namespace {

constexpr const char* kNccl = "libnccl.so";

int rank_count(ncclComm_t comm) {
  int n = 0;
  auto count = PHOS_NEXT(ncclCommCount, kNccl);
  return count && count(comm, &n) == ncclSuccess ? n : 0;
}

int rank_of(ncclComm_t comm) {
  int r = -1;
  auto rank = PHOS_NEXT(ncclCommUserRank, kNccl);
  return rank && rank(comm, &r) == ncclSuccess ? r : -1;
}

LibraryCall describe(ranges::Collective op, const void* send, const void* recv, size_t count, ncclDataType_t type,
                     ncclComm_t comm, cudaStream_t stream, int root = -1) {
  ranges::CollectiveCall c{op, address_of(send), address_of(recv), count, ranges::nccl_data_type_bits(type)};
  if (op == ranges::Collective::kAllGather || op == ranges::Collective::kReduceScatter) c.nranks = rank_count(comm);
  if (root >= 0) {
    c.root = root;
    c.rank = rank_of(comm);
  }
  return {reinterpret_cast<CUstream>(stream), ranges::collective(c)};
}

}  // namespace

#define PHOS_NCCL_FORWARD(name, args)                  \
  [&] {                                                \
    auto real = PHOS_NEXT(name, kNccl);                \
    return real ? real args : ncclSystemError;         \
  }

namespace {

int current_device() {
  CUdevice dev = -1;
  return PHOS_REAL(cuCtxGetDevice)(&dev) == CUDA_SUCCESS ? int(dev) : -1;
}

// A creation that succeeded (or goes on, for a non-blocking one).
bool made(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

void note_created(ncclComm_t comm, int rank, int nranks, uint64_t job_id, uint64_t parent = 0, int color = 0,
                  int key = 0) {
  if (!comm) return;  // a split that left this rank out (NCCL_SPLIT_NOCOLOR)
  auto from = parent ? runtime().nccl.find(parent) : std::nullopt;
  if (from) job_id = nccl_split_job_id(from->job_id, color);
  NcclCommunicator c;
  c.handle = reinterpret_cast<uint64_t>(comm);
  c.rank = rank;
  c.nranks = nranks;
  c.device = current_device();
  c.parent = parent;
  c.color = color;
  c.key = key;
  c.single_process = from && from->single_process;
  c.job_id = job_id;
  runtime().nccl.created(c);
}

// A call issued on `comm`, counted on its communicator.
void issued(ncclComm_t comm) { runtime().nccl.count_call(reinterpret_cast<uint64_t>(comm)); }

}  // namespace

// Not through the gate: a creation waits for the other ranks (the
// bootstrap), and a checkpoint's quiesce must not wait for it.
extern "C" PHOS_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitRank, (comm, nranks, id, rank))();
  if (made(r)) note_created(*comm, rank, nranks, nccl_job_id(&id, sizeof(id)));
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                                           ncclConfig_t* config) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitRankConfig, (comm, nranks, id, rank, config))();
  if (made(r)) note_created(*comm, rank, nranks, nccl_job_id(&id, sizeof(id)));
  return r;
}

// One process, ndev devices: a communicator per device, rank i on devlist[i].
extern "C" PHOS_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommInitAll, (comms, ndev, devlist))();
  if (made(r))
    for (int i = 0; i < ndev; i++) {
      if (!comms[i]) continue;
      NcclCommunicator c;
      c.handle = reinterpret_cast<uint64_t>(comms[i]);
      c.rank = i;
      c.nranks = ndev;
      c.device = devlist ? devlist[i] : i;
      c.single_process = true;
      c.job_id = reinterpret_cast<uint64_t>(comms[0]);  // in this process only
      runtime().nccl.created(c);
    }
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                                  ncclConfig_t* config) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommSplit, (comm, color, key, newcomm, config))();
  if (made(r) && newcomm && *newcomm)
    note_created(*newcomm, rank_of(*newcomm), rank_count(*newcomm), 0, reinterpret_cast<uint64_t>(comm), color, key);
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommDestroy, (comm))();
  if (r == ncclSuccess) runtime().nccl.destroyed(reinterpret_cast<uint64_t>(comm));
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ncclResult_t r = PHOS_NCCL_FORWARD(ncclCommAbort, (comm))();
  if (r == ncclSuccess) runtime().nccl.destroyed(reinterpret_cast<uint64_t>(comm));
  return r;
}

extern "C" PHOS_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclAllReduce", [&] { return describe(ranges::Collective::kAllReduce, send, recv, count, type, comm, stream); },
      PHOS_NCCL_FORWARD(ncclAllReduce, (send, recv, count, type, op, comm, stream)));
}

extern "C" PHOS_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                                  int root, ncclComm_t comm, cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclBroadcast",
      [&] { return describe(ranges::Collective::kBroadcast, send, recv, count, type, comm, stream, root); },
      PHOS_NCCL_FORWARD(ncclBroadcast, (send, recv, count, type, root, comm, stream)));
}

extern "C" PHOS_EXPORT ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclReduce", [&] { return describe(ranges::Collective::kReduce, send, recv, count, type, comm, stream, root); },
      PHOS_NCCL_FORWARD(ncclReduce, (send, recv, count, type, op, root, comm, stream)));
}

extern "C" PHOS_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count,
                                                  ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclAllGather",
      [&] { return describe(ranges::Collective::kAllGather, send, recv, send_count, type, comm, stream); },
      PHOS_NCCL_FORWARD(ncclAllGather, (send, recv, send_count, type, comm, stream)));
}

extern "C" PHOS_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count,
                                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                                      cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclReduceScatter",
      [&] { return describe(ranges::Collective::kReduceScatter, send, recv, recv_count, type, comm, stream); },
      PHOS_NCCL_FORWARD(ncclReduceScatter, (send, recv, recv_count, type, op, comm, stream)));
}

extern "C" PHOS_EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                                             ncclComm_t comm, cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclSend", [&] { return describe(ranges::Collective::kSend, send, nullptr, count, type, comm, stream); },
      PHOS_NCCL_FORWARD(ncclSend, (send, count, type, peer, comm, stream)));
}

extern "C" PHOS_EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                             cudaStream_t stream) {
  issued(comm);
  return library_call(
      "ncclRecv", [&] { return describe(ranges::Collective::kRecv, nullptr, recv, count, type, comm, stream); },
      PHOS_NCCL_FORWARD(ncclRecv, (recv, count, type, peer, comm, stream)));
}
