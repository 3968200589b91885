#include "phos/hooks/store_rendezvous.h"

#include <cinttypes>
#include <cstdio>

namespace phos::hooks {

Result<std::unique_ptr<StoreRendezvous>> StoreRendezvous::connect(const net::HostPort& at, net::Deadline deadline) {
  auto c = net::TcpStoreClient::connect(at.host, at.port, deadline);
  if (!c) return c.error();
  return std::unique_ptr<StoreRendezvous>(new StoreRendezvous(std::move(*c)));
}

std::string StoreRendezvous::key(const NcclMeeting& m, const char* what) {
  char base[96];
  std::snprintf(base, sizeof(base), "phos/nccl/%016" PRIx64 "/%016" PRIx64 "/%" PRIu64 "/", m.job_id, m.run,
                m.at_call);
  return base + std::string(what);
}

Result<void> StoreRendezvous::leave(const NcclMeeting& m, const std::vector<uint8_t>& id) {
  return client_.set(key(m, "id"), id);
}

Result<std::vector<uint8_t>> StoreRendezvous::wait(const NcclMeeting& m, size_t bytes,
                                                   std::chrono::milliseconds timeout) {
  auto id = client_.get(key(m, "id"), net::deadline_in(timeout));
  if (!id) {
    if (id.error().code == ETIMEDOUT)
      return make_error("no unique id from rank 0 at " + where() + " (" + key(m, "id") + ") after " +
                            std::to_string(timeout.count()) + " ms",
                        ETIMEDOUT);
    return id.error();
  }
  if (id->size() != bytes)
    return make_error(where() + " " + key(m, "id") + ": not a unique id of " + std::to_string(bytes) + " bytes (" +
                          std::to_string(id->size()) + ")",
                      EINVAL);
  return id;
}

Result<void> StoreRendezvous::arrive(const NcclMeeting& m, int /*rank*/, int nranks) {
  auto n = client_.add(key(m, "arrived"), 1);
  if (!n) return n.error();
  if (*n == nranks) return client_.set(key(m, "all"), {'1'});
  if (*n > nranks)
    return make_error(where() + ": " + std::to_string(*n) + " ranks arrived at " + key(m, "arrived") + " for " +
                          std::to_string(nranks),
                      EINVAL);
  return {};
}

Result<void> StoreRendezvous::wait_all(const NcclMeeting& m, int nranks, std::chrono::milliseconds timeout) {
  if (auto all = client_.wait({key(m, "all")}, net::deadline_in(timeout)); !all) {
    if (all.error().code != ETIMEDOUT) return all.error();
    return make_error("not every one of " + std::to_string(nranks) + " ranks came to " + where() + " (" +
                          key(m, "arrived") + ") in " + std::to_string(timeout.count()) + " ms",
                      ETIMEDOUT);
  }
  // Every rank has the id now (it arrived after taking it): the last to
  // leave cleans up.
  auto left = client_.add(key(m, "left"), 1);
  if (!left) return left.error();
  if (*left == nranks)
    for (const char* what : {"id", "arrived", "all", "left"})
      if (auto r = client_.remove(key(m, what)); !r) return r.error();
  return {};
}

}  // namespace phos::hooks
