#include "phos/plugin/kept_memory.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/engine.h"
#include "phos/plugin/log.h"
#include "phos/images/agent_wire.h"
#include "phos/images/image_dir.h"
#include "phos/images/keeper_protocol.h"
#include "phos/plugin/options.h"
#include "phos/support/clock.h"

namespace phos::plugin {
namespace {

constexpr int kPollSliceMs = 200;
constexpr int kFrameTimeoutMs = 10000;
// On SIGTERM, how long a restore that holds some of the memory is waited
// for before the rest is written out.
constexpr uint64_t kTerminateGraceNs = 30'000'000'000ull;
// How long a restore waits for phos-keeper to serve a migration's memory
// (kept_memory.h: take): it does once the dump's criu has exited.
constexpr uint64_t kKeeperServesWithinNs = 3'000'000'000ull;

// SIGTERM or SIGINT pending. phos-keeper blocks both once it keeps a
// migration's memory (block_termination), so neither interrupts it, and
// this sees them.
bool termination_pending() {
  sigset_t pending;
  if (::sigpending(&pending) != 0) return false;
  return sigismember(&pending, SIGTERM) == 1 || sigismember(&pending, SIGINT) == 1;
}

// Root or our own user, on either end: the memory of a migration is not
// handed to, nor taken from, anyone else.
bool peer_allowed(int conn) {
  uid_t uid = 0;
  if (wire::peer_trusted(conn, uid)) return true;
  PHOS_WARN("kept memory: refused a connection from uid %u (neither root nor the keeper's user)", uid);
  return false;
}

bool any_lent(const std::vector<KeptProcess>& kept) {
  return std::any_of(kept.begin(), kept.end(), [](const KeptProcess& p) { return p.lent_to >= 0; });
}

// The restores' connections, each of which may hold (have been lent) some
// processes' memory until it says Taken or closes.
class KeptServer {
 public:
  KeptServer(std::vector<KeptProcess>& kept, UniqueFd listener, int image_dirfd)
      : kept_(kept), listener_(std::move(listener)), image_dirfd_(image_dirfd) {}

  // Serves for up to `slice_ms`: new connections, requests.
  void poll_once(int slice_ms, bool accepting) {
    std::vector<struct pollfd> fds{{listener_.get(), short(accepting ? POLLIN : 0), 0}};
    for (const auto& c : conns_) fds.push_back({c.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), slice_ms) <= 0) return;
    if (fds[0].revents & POLLIN) accept_one();
    std::vector<int> closed;
    for (size_t i = 1; i < fds.size(); i++)
      if (fds[i].revents && !serve_one(fds[i].fd, accepting)) closed.push_back(fds[i].fd);
    for (int fd : closed) close_conn(fd);
  }

 private:
  void accept_one() {
    UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.valid() && peer_allowed(conn.get())) conns_.push_back(std::move(conn));
  }

  // false: the connection is done (closed, broken, or sent what is not ours).
  bool serve_one(int conn, bool accepting) {
    auto received = keeper::recv_message(conn, kFrameTimeoutMs);
    if (!received) return false;
    if (const auto* take = std::get_if<keeper::TakeKept>(&received->message)) return lend(conn, *take, accepting);
    if (const auto* taken = std::get_if<keeper::Taken>(&received->message)) {
      settle(conn, *taken);
      return true;
    }
    PHOS_WARN("kept memory: unexpected message from a restore; connection closed");
    return false;
  }

  bool lend(int conn, const keeper::TakeKept& take, bool accepting) {
    auto refuse = [&](const std::string& why) {
      return keeper::send_message(conn, keeper::Kept{.allocations = {}, .last = true, .error = why}).ok();
    };
    auto it = std::find_if(kept_.begin(), kept_.end(), [&](const KeptProcess& p) {
      return p.migration == take.migration && p.vpid == take.vpid;
    });
    if (it == kept_.end())
      return refuse("no memory kept for process " + std::to_string(take.vpid) + " of migration " + take.migration);
    if (it->lent_to >= 0) return refuse("process " + std::to_string(take.vpid) + " is being restored by another restore");
    if (!accepting) return refuse("phos-keeper is ending (SIGTERM): it writes the memory into the image directory");
    auto sent = keeper::send_allocations(conn, it->allocations, it->fds, [](std::vector<agent::Allocation> slice,
                                                                             bool last) {
      return keeper::Message(keeper::Kept{.allocations = std::move(slice), .last = last, .error = ""});
    });
    if (!sent) {
      PHOS_WARN("kept memory of process %d: %s", it->vpid, sent.error().message.c_str());
      return false;
    }
    it->lent_to = conn;
    PHOS_INFO("kept memory of process %d (%zu allocations) given to a restore", it->vpid, it->allocations.size());
    return true;
  }

  void settle(int conn, const keeper::Taken& taken) {
    auto it = std::find_if(kept_.begin(), kept_.end(),
                           [&](const KeptProcess& p) { return p.vpid == taken.vpid && p.lent_to == conn; });
    if (it == kept_.end()) return;
    if (taken.restored) {
      PHOS_INFO("process %d restored with its kept memory; let go", it->vpid);
      kept_.erase(it);
    } else if (taken.spoilt) {
      // Its restore failed after the process may have run on it: no longer
      // the checkpoint. The image must not restore as if it were.
      PHOS_ERR("process %d may have run on its kept memory before its restore failed: let go; its image is refused "
               "from now on (no completion marker)",
               it->vpid);
      if (auto r = image::remove_completion_marker(image_dirfd_, it->vpid); !r)
        PHOS_ERR("process %d: %s", it->vpid, r.error().message.c_str());
      kept_.erase(it);
    } else {
      PHOS_WARN("the restore of process %d failed; its memory stays kept for another", it->vpid);
      it->lent_to = -1;
    }
  }

  void close_conn(int fd) {
    for (auto& p : kept_)
      if (p.lent_to == fd) {
        PHOS_WARN("the restore of process %d ended without a word; its memory stays kept for another", p.vpid);
        p.lent_to = -1;
      }
    std::erase_if(conns_, [&](const UniqueFd& c) { return c.get() == fd; });
  }

  std::vector<KeptProcess>& kept_;
  UniqueFd listener_;
  int image_dirfd_;
  std::vector<UniqueFd> conns_;
};

// Writes `p`'s memory into the image directory as data files and rewrites
// its manifest as an ordinary image's. `engine`: started for the first
// process that has memory, then shared (one CUDA start for a tree).
Result<void> spill_kept_memory(int image_dirfd, KeptProcess& p, std::unique_ptr<Engine>& engine) {
  // Its completion marker may have failed to be written at the dump: the
  // manifest naming this migration is enough (the spill writes a marker).
  auto img = image::open_process_image(image_dirfd, p.vpid, /*require_complete=*/false);
  if (!img) return img.error();
  image::Manifest m = std::move(img->manifest);
  if (!m.kept || m.kept->migration != p.migration)
    return make_error(img->manifest_name + " no longer names migration " + p.migration, ESTALE);
  if (!p.allocations.empty()) {
    if (!engine) {
      auto started = Engine::start(EngineSettings::from(PluginOptions::load()));
      if (!started) return started.error();
      engine = std::move(*started);
    }
    auto host = engine->host_gpus();
    if (!host) return host.error();
    // Each device's memory is on its own GPU (KeptMemory::targets).
    std::map<uint32_t, int> host_ordinal;
    for (const auto& a : p.allocations) {
      const std::string uuid = format_gpu_uuid(m.kept->target_of(a.device).uuid);
      const GpuDevice* gpu = find_host_gpu(uuid, *host);
      if (!gpu) return make_error("GPU " + uuid + ", which holds device " + std::to_string(a.device) + "'s memory, is gone",
                                  ENODEV);
      host_ordinal[a.device] = int(gpu->ordinal);
    }
    // The data as a stopped dump writes it; the devices stay the process's
    // own (the driver restores it there unless gpu_map moves it).
    image::Manifest copied;
    auto job = engine->prepare_save(image_dirfd, p.vpid, p.allocations, p.fds, host_ordinal, copied);
    if (!job) return job.error();
    PHOS_TRY(engine->run_save(**job));
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

// Writes what no restore holds into the image directory; what could not be
// written stays kept. true: nothing is left kept.
bool spill_unlent(std::vector<KeptProcess>& kept, int image_dirfd, const char* why) {
  PHOS_WARN("%s: writing the kept memory of %zu process(es) into the image directory", why, kept.size());
  std::unique_ptr<Engine> engine;
  std::erase_if(kept, [&](KeptProcess& p) {
    if (p.lent_to >= 0) return false;
    if (auto r = spill_kept_memory(image_dirfd, p, engine); !r) {
      PHOS_ERR("process %d: its kept GPU memory could not be written: %s", p.vpid, r.error().message.c_str());
      return false;
    }
    PHOS_INFO("process %d: kept GPU memory written into the image directory; restore it as any image", p.vpid);
    return true;
  });
  return kept.empty();
}

}  // namespace

void block_termination() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
}

void serve_kept_memory(std::vector<KeptProcess>& kept, int image_dirfd) {
  std::erase_if(kept, [](const KeptProcess& p) {
    if (!p.committed) PHOS_INFO("process %d: the dump did not commit its migration; its memory is let go", p.vpid);
    return !p.committed;
  });
  if (kept.empty()) return;
  for (auto& p : kept) p.lent_to = -1;
  const std::string migration = kept.front().migration;
  uint32_t keep_s = 0;
  for (const auto& p : kept) keep_s = std::max(keep_s, p.keep_s);
  uint64_t deadline_ns = monotonic_ns() + uint64_t(keep_s) * 1000000000ull;

  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr {};
  socklen_t len = wire::abstract_socket_address(keeper::kept_socket_name(migration), addr);
  if (!listener.valid() || len == 0 || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listener.get(), 8) != 0) {
    PHOS_ERR("kept memory: cannot serve %s: %s", keeper::kept_socket_name(migration).c_str(), std::strerror(errno));
    spill_unlent(kept, image_dirfd, "no restore can take it");
    return;
  }
  PHOS_INFO("serving the kept memory of %zu process(es) as %s for %u s", kept.size(),
            keeper::kept_socket_name(migration).c_str(), keep_s);
  KeptServer server(kept, std::move(listener), image_dirfd);
  uint64_t terminating_since = 0;
  while (!kept.empty()) {
    const uint64_t now = monotonic_ns();
    if (!terminating_since && termination_pending()) {
      terminating_since = now;
      PHOS_WARN("SIGTERM: no new restore is served; %s", any_lent(kept) ? "waiting for the one running" : "");
    }
    if (terminating_since && (!any_lent(kept) || now - terminating_since >= kTerminateGraceNs)) {
      if (!spill_unlent(kept, image_dirfd, "SIGTERM"))
        PHOS_ERR("phos-keeper ends with the kept memory of %zu process(es) not written (a restore holds it, or it "
                 "could not be written): lost",
                 kept.size());
      return;
    }
    // A restore that holds memory is never cut off by the deadline; one
    // that failed to be written is tried again a period later.
    if (!terminating_since && now >= deadline_ns && !any_lent(kept)) {
      if (spill_unlent(kept, image_dirfd, "no restore took it in migrate_keep_s")) return;
      deadline_ns = now + uint64_t(keep_s) * 1000000000ull;
    }
    server.poll_once(kPollSliceMs, terminating_since == 0);
  }
  PHOS_INFO("every kept memory taken; phos-keeper exits");
}

Result<KeptMemoryLink> KeptMemoryLink::take(const std::string& migration, int32_t vpid, int timeout_ms) {
  struct sockaddr_un addr {};
  const std::string name = keeper::kept_socket_name(migration);
  socklen_t len = wire::abstract_socket_address(name, addr);
  if (len == 0) return make_error("invalid migration name '" + migration + "'", EINVAL);
  // phos-keeper serves the memory once the dump's criu has gone, after it
  // let go of the source's: a restore started the moment that criu exited
  // (phosctl migrate) may come first, by tens of milliseconds (16 GiB).
  UniqueFd sock;
  const uint64_t waited_from = monotonic_ns();
  for (;;) {
    sock = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sock.valid()) return errno_error("socket");
    if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    if (errno != ECONNREFUSED || monotonic_ns() - waited_from >= kKeeperServesWithinNs)
      return errno_error("no phos-keeper serves migration " + migration +
                         " (it keeps a migration's memory migrate_keep_s seconds, then writes it into the image "
                         "directory: restore again once it has)");
    ::usleep(5000);
  }
  if (uint64_t waited = monotonic_ns() - waited_from; waited > 5000000)
    PHOS_INFO("phos-keeper served migration %s after %.1f ms", migration.c_str(), double(waited) / 1e6);
  if (uid_t uid = 0; !wire::peer_trusted(sock.get(), uid))
    return make_error(name + " is served by uid " + std::to_string(uid) + ", neither root nor this user: not taken",
                      EPERM);
  PHOS_TRY(keeper::send_message(sock.get(), keeper::TakeKept{.migration = migration, .vpid = vpid}));
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

Result<void> KeptMemoryLink::taken(bool restored, bool spoilt) {
  auto r = keeper::send_message(sock_.get(), keeper::Taken{.vpid = vpid_, .restored = restored, .spoilt = spoilt});
  sock_.reset();
  return r;
}

}  // namespace phos::plugin
