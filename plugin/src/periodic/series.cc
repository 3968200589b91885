// A series of checkpoint directories, the last N complete ones kept
// (periodic.h).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <span>
#include <sstream>

#include "phos/images/image_dir.h"
#include "phos/plugin/periodic.h"
#include "phos/support/unique_fd.h"

namespace phos::plugin {
namespace {


bool is_seq_name(const char* name, uint64_t* seq) {
  size_t n = std::strlen(name);
  if (n < 6 || n > 18) return false;
  for (size_t i = 0; i < n; i++)
    if (name[i] < '0' || name[i] > '9') return false;
  *seq = std::strtoull(name, nullptr, 10);
  return true;
}

// The marker's "parent=NAME" line, where it has one. A marker too large to
// be ours is read as none.
std::optional<std::string> marker_parent(int dirfd) {
  auto bytes = image::read_small_file(dirfd, kSeriesMarker, 4096);
  if (!bytes) return std::nullopt;
  std::istringstream text(std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size()));
  for (std::string line; std::getline(text, line);)
    if (line.rfind("parent=", 0) == 0 && line.size() > 7) return line.substr(7);
  return std::nullopt;
}

}  // namespace

std::string series_name(uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%06llu", static_cast<unsigned long long>(seq));
  return buf;
}

Result<std::vector<SeriesImage>> list_series(const std::string& root) {
  UniqueFd rootfd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!rootfd.valid()) return errno_error("checkpoint series " + root);
  DIR* d = ::fdopendir(::dup(rootfd.get()));
  if (!d) return errno_error("checkpoint series " + root);
  std::vector<SeriesImage> out;
  while (dirent* e = ::readdir(d)) {
    SeriesImage img;
    if (!is_seq_name(e->d_name, &img.seq)) continue;
    UniqueFd dirfd(::openat(rootfd.get(), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dirfd.valid()) continue;  // not a directory of ours
    struct stat st;
    img.name = e->d_name;
    img.complete = ::fstatat(dirfd.get(), kSeriesMarker, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
    if (img.complete) img.parent = marker_parent(dirfd.get());
    out.push_back(std::move(img));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const SeriesImage& a, const SeriesImage& b) { return a.seq < b.seq; });
  return out;
}

std::optional<SeriesImage> latest_complete(const std::vector<SeriesImage>& series) {
  for (auto it = series.rbegin(); it != series.rend(); ++it)
    if (it->complete) return *it;
  return std::nullopt;
}

std::vector<std::string> series_chain(const std::vector<SeriesImage>& series, const SeriesImage& from) {
  std::map<std::string, const SeriesImage*> by_name;
  for (const auto& s : series) by_name[s.name] = &s;
  std::vector<std::string> chain;
  std::set<std::string> seen;
  for (const SeriesImage* s = &from; s && seen.insert(s->name).second;) {
    chain.push_back(s->name);
    auto p = s->parent ? by_name.find(*s->parent) : by_name.end();
    s = p == by_name.end() ? nullptr : p->second;
  }
  return chain;
}

std::vector<std::string> series_to_remove(const std::vector<SeriesImage>& series, size_t keep) {
  // The newest `keep` complete ones (at least one: the one a restore needs),
  // and every parent their chains reach.
  std::set<std::string> kept;
  size_t complete_kept = 0;
  for (auto it = series.rbegin(); it != series.rend() && complete_kept < std::max<size_t>(keep, 1); ++it) {
    if (!it->complete) continue;
    complete_kept++;
    for (auto& name : series_chain(series, *it)) kept.insert(std::move(name));
  }
  std::vector<std::string> out;
  for (const auto& s : series)
    if (!kept.count(s.name)) out.push_back(s.name);
  return out;
}

Result<void> mark_complete(const std::string& dir, const std::vector<std::string>& lines) {
  UniqueFd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd.valid()) return errno_error("checkpoint " + dir);
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  auto written = image::write_file_atomic(dirfd.get(), kSeriesMarker, std::as_bytes(std::span(text.data(), text.size())));
  if (!written) return make_error(dir + ": " + written.error().message, written.error().code);
  return {};
}

namespace {

// Every entry of `dirfd` unlinked; the first failure, empty where none.
std::string unlink_entries(int dirfd, const std::string& path) {
  DIR* d = ::fdopendir(::dup(dirfd));
  if (!d) return path + ": " + std::strerror(errno);
  ::rewinddir(d);
  std::string failed;
  while (dirent* e = ::readdir(d)) {
    if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
    if (::unlinkat(dirfd, e->d_name, 0) != 0 && errno != ENOENT && failed.empty())
      failed = path + "/" + e->d_name + ": " + std::strerror(errno);
  }
  ::closedir(d);
  return failed;
}

}  // namespace

Result<void> remove_series_dir(const std::string& root, const std::string& name) {
  UniqueFd rootfd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!rootfd.valid()) return errno_error("checkpoint series " + root);
  const std::string path = root + "/" + name;
  UniqueFd dirfd(::openat(rootfd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dirfd.valid()) return errno_error(path);
  // The marker first: a directory half removed is never taken for complete.
  ::unlinkat(dirfd.get(), kSeriesMarker, 0);
  // A failed dump's helpers (phos-keeper, on criu's death) may still write
  // a log into it for a moment: emptied again, up to 5 times.
  for (int attempt = 0;; attempt++) {
    std::string failed = unlink_entries(dirfd.get(), path);
    if (!failed.empty()) return make_error("removing " + failed, EIO);
    if (::unlinkat(rootfd.get(), name.c_str(), AT_REMOVEDIR) == 0) return {};
    if (errno != ENOTEMPTY || attempt == 4) return errno_error("removing " + path);
    ::usleep(100000);
  }
}

}  // namespace phos::plugin
