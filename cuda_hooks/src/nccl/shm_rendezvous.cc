#include "phos/hooks/shm_rendezvous.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <thread>

#include "phos/support/result.h"

namespace phos::hooks {

std::string ShmRendezvous::default_dir() {
  if (const char* d = std::getenv("PHOS_NCCL_RENDEZVOUS_DIR"); d && *d) return d;
  return "/dev/shm/phos-nccl-" + std::to_string(::getuid());
}

Result<ShmRendezvous> ShmRendezvous::open(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno_error("make " + dir);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return errno_error("stat " + dir);
  if (!S_ISDIR(st.st_mode)) return make_error(dir + " is not a directory", ENOTDIR);
  if (st.st_uid != ::getuid()) return make_error(dir + " belongs to uid " + std::to_string(st.st_uid), EPERM);
  if (st.st_mode & 077) return make_error(dir + " is open to other users", EPERM);
  return ShmRendezvous(dir);
}

std::string ShmRendezvous::path(const NcclMeeting& m) const {
  char name[64];
  std::snprintf(name, sizeof(name), "/%016" PRIx64 "-%016" PRIx64, m.job_id, m.run);
  return dir_ + name;
}

Result<void> ShmRendezvous::leave(const NcclMeeting& m, const std::vector<uint8_t>& id) {
  const std::string final_path = path(m), tmp = final_path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("create " + tmp);
  ssize_t n = ::write(fd, id.data(), id.size());
  int err = errno;
  ::close(fd);
  if (n != ssize_t(id.size())) return errno_error("write " + tmp, n < 0 ? err : EIO);
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) return errno_error("rename " + tmp);
  (void)prune(std::chrono::hours(1));
  return {};
}

namespace {
// Asks `there` every millisecond until it says yes (true) or `timeout` has
// passed (false).
template <class There>
bool poll(std::chrono::milliseconds timeout, There&& there) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (there()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
}  // namespace

Result<std::vector<uint8_t>> ShmRendezvous::wait(const NcclMeeting& m, size_t bytes,
                                                 std::chrono::milliseconds timeout) {
  const std::string p = path(m);
  std::optional<Result<std::vector<uint8_t>>> got;
  const bool there = poll(timeout, [&] {
    int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT) got = errno_error("open " + p);
      return errno != ENOENT;
    }
    std::vector<uint8_t> id(bytes);
    struct stat st {};
    ssize_t n = ::fstat(fd, &st) == 0 && st.st_uid == ::getuid() ? ::read(fd, id.data(), bytes) : -1;
    ::close(fd);
    if (n == ssize_t(bytes))
      got = std::move(id);
    else
      got = make_error(p + ": not a unique id of " + std::to_string(bytes) + " bytes", EINVAL);
    return true;
  });
  if (!there)
    return make_error("no unique id from rank 0 at " + p + " after " + std::to_string(timeout.count()) + " ms",
                      ETIMEDOUT);
  return std::move(*got);
}

Result<void> ShmRendezvous::arrive(const NcclMeeting& m, int rank, int /*nranks*/) {
  const std::string p = path(m) + ".r" + std::to_string(rank);
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return errno_error("create " + p);
  ::close(fd);
  return {};
}

Result<void> ShmRendezvous::wait_all(const NcclMeeting& m, int nranks, std::chrono::milliseconds timeout) {
  const std::string base = path(m) + ".r";
  int rank = 0;  // every rank below it has come
  const bool all = poll(timeout, [&] {
    struct stat st {};
    while (rank < nranks && ::lstat((base + std::to_string(rank)).c_str(), &st) == 0) rank++;
    return rank == nranks;
  });
  if (!all)
    return make_error("rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " did not come to " + base +
                          "N in " + std::to_string(timeout.count()) + " ms",
                      ETIMEDOUT);
  return {};
}

size_t ShmRendezvous::prune(std::chrono::seconds age) const {
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return 0;
  const time_t before = ::time(nullptr) - time_t(age.count());
  size_t removed = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
        st.st_mtime < before && ::unlinkat(::dirfd(d), e->d_name, 0) == 0)
      removed++;
  }
  ::closedir(d);
  return removed;
}

}  // namespace phos::hooks
