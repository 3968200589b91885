#include "phos/plugin/kept_memory.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "engine.h"
#include "log.h"
#include "phos/images/agent_wire.h"
#include "phos/images/image_dir.h"
#include "phos/images/keeper_protocol.h"
#include "phos/plugin/options.h"
#include "phos/support/clock.h"

namespace phos::plugin {
namespace {

constexpr int kPollSliceMs = 500;
constexpr int kFrameTimeoutMs = 10000;

std::atomic<bool> g_terminate{false};
void on_terminate(int) { g_terminate = true; }

// Root or our own user, on either end: the memory of a migration is not
// handed to, nor taken from, anyone else.
bool peer_trusted(int conn, uid_t& uid) {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  uid = cred.uid;
  return cred.uid == 0 || cred.uid == ::getuid();
}

bool peer_allowed(int conn) {
  uid_t uid = 0;
  if (peer_trusted(conn, uid)) return true;
  PHOS_WARN("kept memory: refused a connection from uid %u (neither root nor the keeper's user)", uid);
  return false;
}

KeptProcess* find_kept(std::vector<KeptProcess>& kept, const std::string& migration, int32_t vpid) {
  for (auto& p : kept)
    if (p.migration == migration && p.vpid == vpid) return &p;
  return nullptr;
}

Result<void> send_kept(int conn, const KeptProcess& p) {
  size_t at = 0;
  do {
    const size_t end = std::min(p.allocations.size(), at + wire::kMaxFdsPerFrame);
    std::vector<int> raw;
    for (size_t i = at; i < end; i++) raw.push_back(p.fds[i].get());
    keeper::Kept frame{std::vector<agent::Allocation>(p.allocations.begin() + at, p.allocations.begin() + end),
                       end == p.allocations.size(), ""};
    PHOS_TRY(keeper::send_message(conn, frame, raw));
    at = end;
  } while (at < p.allocations.size());
  return {};
}

// One restore's connection: TakeKept requests answered, Taken heard, until
// it closes. A process taken without Taken{restored} stays kept.
void serve_connection(int conn, std::vector<KeptProcess>& kept, uint64_t deadline_ns) {
  for (;;) {
    struct pollfd pfd = {conn, POLLIN, 0};
    int ready = ::poll(&pfd, 1, kPollSliceMs);
    if (g_terminate || monotonic_ns() >= deadline_ns) return;
    if (ready <= 0) continue;
    auto received = keeper::recv_message(conn, kFrameTimeoutMs);
    if (!received) return;  // closed: what it took and did not say restored stays kept
    if (const auto* take = std::get_if<keeper::TakeKept>(&received->message)) {
      KeptProcess* p = find_kept(kept, take->migration, take->vpid);
      if (!p) {
        (void)keeper::send_message(conn, keeper::Kept{{}, true,
                                                      "no memory kept for process " + std::to_string(take->vpid) +
                                                          " of migration " + take->migration});
        continue;
      }
      if (auto sent = send_kept(conn, *p); !sent) {
        PHOS_WARN("kept memory of process %d: %s", p->vpid, sent.error().message.c_str());
        return;
      }
      PHOS_INFO("kept memory of process %d (%zu allocations) given to a restore", p->vpid, p->allocations.size());
    } else if (const auto* taken = std::get_if<keeper::Taken>(&received->message)) {
      auto it = std::find_if(kept.begin(), kept.end(), [&](const KeptProcess& p) { return p.vpid == taken->vpid; });
      if (it == kept.end()) continue;
      if (taken->restored) {
        PHOS_INFO("process %d restored with its kept memory; let go", it->vpid);
        kept.erase(it);
      } else {
        PHOS_WARN("the restore of process %d failed; its memory stays kept for another", it->vpid);
      }
    } else {
      PHOS_WARN("kept memory: unexpected message from a restore; connection closed");
      return;
    }
  }
}

void spill_all(std::vector<KeptProcess>& kept, int image_dirfd, const char* why) {
  PHOS_WARN("%s: writing the kept memory of %zu process(es) into the image directory", why, kept.size());
  for (auto& p : kept) {
    if (auto r = spill_kept_memory(image_dirfd, p); !r)
      PHOS_ERR("process %d: its kept GPU memory could not be written: %s; it is lost", p.vpid, r.error().message.c_str());
    else
      PHOS_INFO("process %d: kept GPU memory written into the image directory; restore it as any image", p.vpid);
  }
  kept.clear();
}

}  // namespace

void serve_kept_memory(std::vector<KeptProcess>& kept, int image_dirfd) {
  std::erase_if(kept, [](const KeptProcess& p) {
    if (!p.committed) PHOS_INFO("process %d: the dump did not commit its migration; its memory is let go", p.vpid);
    return !p.committed;
  });
  if (kept.empty()) return;
  const std::string migration = kept.front().migration;
  uint32_t keep_s = 0;
  for (const auto& p : kept) keep_s = std::max(keep_s, p.keep_s);
  const uint64_t deadline_ns = monotonic_ns() + uint64_t(keep_s) * 1000000000ull;
  struct sigaction sa {};
  sa.sa_handler = on_terminate;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr {};
  socklen_t len = wire::abstract_socket_address(keeper::kept_socket_name(migration), addr);
  if (!listener.valid() || len == 0 || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listener.get(), 4) != 0) {
    PHOS_ERR("kept memory: cannot serve %s: %s", keeper::kept_socket_name(migration).c_str(), std::strerror(errno));
    spill_all(kept, image_dirfd, "no restore can take it");
    return;
  }
  PHOS_INFO("serving the kept memory of %zu process(es) as %s for %u s", kept.size(),
            keeper::kept_socket_name(migration).c_str(), keep_s);
  while (!kept.empty()) {
    if (g_terminate) return spill_all(kept, image_dirfd, "SIGTERM");
    if (monotonic_ns() >= deadline_ns) return spill_all(kept, image_dirfd, "no restore took it in migrate_keep_s");
    struct pollfd pfd = {listener.get(), POLLIN, 0};
    if (::poll(&pfd, 1, kPollSliceMs) <= 0) continue;
    UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid() || !peer_allowed(conn.get())) continue;
    serve_connection(conn.get(), kept, deadline_ns);
  }
  PHOS_INFO("every kept memory taken; phos-keeper exits");
}

Result<void> spill_kept_memory(int image_dirfd, KeptProcess& p) {
  auto img = image::open_process_image(image_dirfd, p.vpid, /*require_complete=*/true);
  if (!img) return img.error();
  image::Manifest m = std::move(img->manifest);
  if (!m.kept || m.kept->migration != p.migration)
    return make_error(img->manifest_name + " no longer names migration " + p.migration, ESTALE);
  if (!p.allocations.empty()) {
    auto engine = Engine::start(EngineSettings::from(PluginOptions::load()));
    if (!engine) return engine.error();
    auto host = (*engine)->host_gpus();
    if (!host) return host.error();
    const HostGpu* gpu = find_host_gpu(format_gpu_uuid(m.kept->device_uuid), *host);
    if (!gpu) return make_error("the GPU that holds the memory is gone", ENODEV);
    std::map<uint32_t, int> host_ordinal;
    for (const auto& a : p.allocations) host_ordinal[a.device] = gpu->ordinal;
    // The data as a stopped dump writes it; the devices stay the process's
    // own (the driver restores it there unless gpu_map moves it).
    image::Manifest copied;
    auto job = (*engine)->prepare_save(image_dirfd, p.vpid, p.allocations, p.fds, host_ordinal, copied);
    if (!job) return job.error();
    PHOS_TRY((*engine)->run_save(**job));
    job->reset();
    m.allocations = std::move(copied.allocations);
    m.data_files = std::move(copied.data_files);
    m.chunk_size = copied.chunk_size;
    m.statistics.raw_bytes = copied.statistics.raw_bytes;
    m.statistics.stored_bytes = copied.statistics.stored_bytes;
    m.statistics.zero_chunks = copied.statistics.zero_chunks;
    m.statistics.zero_bytes = copied.statistics.zero_bytes;
  }
  m.kept.reset();
  m.format_version = image::format_version_for(m);
  PHOS_TRY(image::remove_completion_marker(image_dirfd, p.vpid));
  auto written = image::write_manifest(image_dirfd, m);
  if (!written) return written.error();
  return image::write_completion_marker(image_dirfd, p.vpid, *written);
}

Result<KeptMemoryLink> KeptMemoryLink::take(const std::string& migration, int32_t vpid, int timeout_ms) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return errno_error("socket");
  struct sockaddr_un addr {};
  const std::string name = keeper::kept_socket_name(migration);
  socklen_t len = wire::abstract_socket_address(name, addr);
  if (len == 0) return make_error("invalid migration name '" + migration + "'", EINVAL);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return errno_error("no phos-keeper serves migration " + migration +
                       " (it keeps a migration's memory migrate_keep_s seconds, then writes it into the image "
                       "directory: restore again once it has)");
  if (uid_t uid = 0; !peer_trusted(sock.get(), uid))
    return make_error(name + " is served by uid " + std::to_string(uid) + ", neither root nor this user: not taken",
                      EPERM);
  PHOS_TRY(keeper::send_message(sock.get(), keeper::TakeKept{migration, vpid}));
  KeptMemoryLink link(std::move(sock), vpid);
  for (;;) {
    auto received = keeper::recv_message(link.sock_.get(), timeout_ms);
    if (!received) return make_error("phos-keeper (migration " + migration + "): " + received.error().message, EIO);
    const auto* kept = std::get_if<keeper::Kept>(&received->message);
    if (!kept) return make_error("phos-keeper (migration " + migration + ") answered something else", EPROTO);
    if (!kept->error.empty()) return make_error("phos-keeper: " + kept->error, ENOENT);
    if (received->fds.size() != kept->allocations.size())
      return make_error("phos-keeper sent " + std::to_string(received->fds.size()) + " fds for " +
                            std::to_string(kept->allocations.size()) + " allocations",
                        EPROTO);
    link.allocations.insert(link.allocations.end(), kept->allocations.begin(), kept->allocations.end());
    for (auto& fd : received->fds) link.fds.push_back(std::move(fd));
    if (kept->last) return link;
  }
}

Result<void> KeptMemoryLink::taken(bool restored) {
  auto r = keeper::send_message(sock_.get(), keeper::Taken{vpid_, restored});
  sock_.reset();
  return r;
}

}  // namespace phos::plugin
