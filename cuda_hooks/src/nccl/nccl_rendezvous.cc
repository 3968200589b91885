#include "phos/hooks/nccl_rendezvous.h"

#include "phos/hooks/shm_rendezvous.h"
#include "phos/hooks/store_rendezvous.h"

namespace phos::hooks {

Result<RendezvousChoice> choose_rendezvous(const GetEnv& getenv) {
  RendezvousChoice c;
  const char* store = getenv("PHOS_NCCL_STORE");
  if (store && *store && std::string(store) != "off") {
    auto at = net::parse_host_port(store);
    if (!at) return make_error("PHOS_NCCL_STORE=" + std::string(store) + ": " + at.error().message, EINVAL);
    return RendezvousChoice{true, *at, {}, "PHOS_NCCL_STORE"};
  }
  const char* addr = getenv("MASTER_ADDR");
  const char* port = getenv("MASTER_PORT");
  if (!(store && *store) && addr && *addr && port && *port) {
    auto at = net::parse_host_port(std::string(addr) + ":" + port);
    if (!at)
      return make_error("MASTER_ADDR=" + std::string(addr) + " MASTER_PORT=" + port + ": " + at.error().message,
                        EINVAL);
    return RendezvousChoice{true, *at, {}, "MASTER_ADDR and MASTER_PORT"};
  }
  const char* dir = getenv("PHOS_NCCL_RENDEZVOUS_DIR");
  c.dir = dir && *dir ? dir : ShmRendezvous::default_dir();
  c.why = store && *store ? "PHOS_NCCL_STORE=off" : "no MASTER_ADDR and MASTER_PORT";
  return c;
}

Result<std::unique_ptr<NcclRendezvous>> open_rendezvous(const RendezvousChoice& choice, net::Deadline deadline) {
  if (choice.store) {
    auto s = StoreRendezvous::connect(choice.at, deadline);
    if (!s) return make_error("the rendezvous (" + choice.why + "): " + s.error().message, s.error().code);
    return std::unique_ptr<NcclRendezvous>(std::move(*s));
  }
  auto d = ShmRendezvous::open(choice.dir);
  if (!d) return d.error();
  return std::unique_ptr<NcclRendezvous>(new ShmRendezvous(std::move(*d)));
}

}  // namespace phos::hooks
