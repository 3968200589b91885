#include "phos/images/image_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "phos/images/crc32c.h"
#include "phos/images/fingerprint.h"
#include "phos/images/data_file.h"

namespace phos::image {

// Not blocking: a FIFO planted under one of our names would hold criu in
// open() until someone wrote to it. Anything but a regular file is closed
// again at once and reported as ENXIO (open_error says what it was).
int open_image_file(int dirfd, const std::string& name) {
  int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    errno = ENXIO;
    return -1;
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Error open_error(const std::string& name, int err) {
  if (err == ELOOP) return make_error(name + " is a symbolic link in the image directory; not followed", ELOOP);
  if (err == ENXIO)
    return make_error(name + " in the image directory is not a regular file (a FIFO, socket, device or directory); not read",
                      ENXIO);
  return errno_error("open " + name, err);
}

// The image directory may hold anything (it is the user's): a name of ours
// that is a symbolic link, or anything but a regular file, is refused, never
// followed nor replaced (criu runs as root).
Result<void> check_own_name(int dirfd, const std::string& name) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return {};
    return errno_error("stat " + name);
  }
  if (S_ISLNK(st.st_mode)) return make_error(name + " is a symbolic link in the image directory; not replaced", EEXIST);
  if (!S_ISREG(st.st_mode)) return make_error(name + " in the image directory is not a regular file; not replaced", EEXIST);
  return {};
}

Result<void> write_file_atomic(int dirfd, const std::string& name, std::span<const std::byte> bytes) {
  std::string tmp = name + ".tmp";
  PHOS_TRY(check_own_name(dirfd, name));
  // A .tmp left behind (or planted) goes first: the new one is created
  // afresh, never opened through a link.
  if (::unlinkat(dirfd, tmp.c_str(), 0) != 0 && errno != ENOENT) return errno_error("create " + tmp);
  UniqueFd fd(::openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return errno_error("create " + tmp);
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left) {
    ssize_t w = ::write(fd.get(), p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      Error e = errno_error("write " + tmp);
      ::unlinkat(dirfd, tmp.c_str(), 0);
      return e;
    }
    p += w;
    left -= size_t(w);
  }
  if (::fsync(fd.get()) != 0) {
    Error e = errno_error("fsync " + tmp);
    ::unlinkat(dirfd, tmp.c_str(), 0);
    return e;
  }
  fd.reset();
  if (::renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) != 0) {
    Error e = errno_error("rename " + tmp + " to " + name);
    ::unlinkat(dirfd, tmp.c_str(), 0);
    return e;
  }
  if (::fsync(dirfd) != 0 && errno != EINVAL) return errno_error("fsync image directory");
  return {};
}

Result<std::vector<std::byte>> read_small_file(int dirfd, const std::string& name, uint64_t max_bytes) {
  UniqueFd fd(open_image_file(dirfd, name));
  if (!fd.valid()) return open_error(name);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("stat " + name);
  if (!S_ISREG(st.st_mode)) return make_error(name + ": not a regular file");
  if (uint64_t(st.st_size) > max_bytes)
    return make_error(name + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                      std::to_string(max_bytes) + " a reader accepts");
  std::vector<std::byte> out(size_t(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t r = ::read(fd.get(), out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_error("read " + name);
    if (r == 0) break;
    done += size_t(r);
  }
  out.resize(done);
  return out;
}

Result<std::vector<std::byte>> write_manifest(int dirfd, const Manifest& m) {
  PHOS_TRY(validate_manifest(m, manifest_file_name(m.pid)));
  auto bytes = encode_manifest(m);
  PHOS_TRY(write_file_atomic(dirfd, manifest_file_name(m.pid), bytes));
  return bytes;
}

Result<void> write_completion_marker(int dirfd, int32_t pid, std::span<const std::byte> manifest_file) {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  auto marker = marker_for(manifest_file, uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec));
  return write_file_atomic(dirfd, marker_file_name(pid), encode_marker(marker));
}

Result<void> remove_completion_marker(int dirfd, int32_t pid) {
  if (::unlinkat(dirfd, marker_file_name(pid).c_str(), 0) != 0 && errno != ENOENT)
    return errno_error("remove " + marker_file_name(pid));
  return {};
}

Result<std::vector<int32_t>> list_process_images(int dirfd) {
  int dup = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return errno_error("dup image directory fd");
  DIR* dir = ::fdopendir(dup);
  if (!dir) {
    Error e = errno_error("open image directory");
    ::close(dup);
    return e;
  }
  std::vector<int32_t> pids;
  errno = 0;
  while (struct dirent* de = ::readdir(dir)) {
    if (auto pid = pid_of_manifest_file(de->d_name)) pids.push_back(*pid);
  }
  int err = errno;
  ::closedir(dir);
  if (err) return errno_error("read image directory", err);
  std::sort(pids.begin(), pids.end());
  return pids;
}

namespace {

Result<void> check_data_file(int dirfd, const Manifest& m, uint32_t index) {
  const DataFile& f = m.data_files[index];
  UniqueFd fd(open_image_file(dirfd, f.name));
  if (!fd.valid()) {
    if (errno == ENOENT) return make_error("data file " + f.name + " is missing", ENOENT);
    return open_error(f.name);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_error("stat " + f.name);
  if (uint64_t(st.st_size) != f.size)
    return make_error(f.name + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
                      std::to_string(f.size) + (uint64_t(st.st_size) < f.size ? " (truncated)" : ""));
  std::vector<std::byte> header(kDataHeaderSize);
  if (::pread(fd.get(), header.data(), header.size(), 0) != ssize_t(header.size()))
    return make_error(f.name + ": cannot read its header");
  auto h = decode_data_header(header, f.name);
  if (!h) return h.error();
  if (h->pid != m.pid || h->file_index != index)
    return make_error(f.name + ": belongs to process " + std::to_string(h->pid) + " file " +
                      std::to_string(h->file_index) + ", not to this manifest");
  return {};
}

}  // namespace

Result<ProcessImage> open_process_image(int dirfd, int32_t pid, bool require_complete, uint32_t depth) {
  ProcessImage img;
  img.manifest_name = manifest_file_name(pid);
  auto bytes = read_small_file(dirfd, img.manifest_name, kMaxManifestBytes);
  if (!bytes) return bytes.error();
  auto manifest = decode_manifest(*bytes, img.manifest_name);
  if (!manifest) return manifest.error();
  img.manifest = std::move(*manifest);
  img.manifest_size = bytes->size();
  img.manifest_crc32c = crc32c(*bytes);
  if (img.manifest.pid != pid)
    return make_error(img.manifest_name + ": manifest is for pid " + std::to_string(img.manifest.pid));

  std::string marker_name = marker_file_name(pid);
  auto marker_bytes = read_small_file(dirfd, marker_name, 4096);
  if (!marker_bytes) {
    if (marker_bytes.error().code != ENOENT) return marker_bytes.error();
    img.incomplete_reason = "incomplete image: " + marker_name + " is missing (the dump did not finish)";
  } else {
    auto marker = decode_marker(*marker_bytes, marker_name);
    if (!marker) return marker.error();
    if (marker.value() != marker_for(*bytes, marker->completed_unix_ns))
      img.incomplete_reason = "incomplete image: " + marker_name + " does not match " + img.manifest_name;
    else
      img.complete = true;
  }
  if (!img.complete && require_complete) return make_error(img.incomplete_reason, ENOENT);

  for (uint32_t i = 0; i < img.manifest.data_files.size(); i++) PHOS_TRY(check_data_file(dirfd, img.manifest, i));
  PHOS_TRY(resolve_parents(dirfd, img, depth));
  return img;
}

ImageReader::ImageReader(int dirfd, const Manifest& manifest)
    : dirfd_(dirfd), manifest_(manifest), files_(manifest.data_files.size()) {}

std::string ImageReader::file_name(const Chunk& chunk) const {
  if (chunk.compression == Compression::kZero) return "zero chunk";
  if (chunk.compression == Compression::kDead) return "dead chunk";
  if (chunk.compression == Compression::kParent) return "parent chunk";
  if (chunk.file_index >= manifest_.data_files.size()) return "?";
  const DataFile& f = manifest_.data_files[chunk.file_index];
  const auto* at = image::parent_file(manifest_, chunk.file_index);
  return at ? "parent image " + at->dir + ": " + f.name : f.name;
}

Result<void> ImageReader::read_chunk(const Chunk& chunk, std::span<std::byte> out, CrcCheck check) {
  if (chunk.compression == Compression::kZero || chunk.compression == Compression::kDead)  // in no file
    return image::read_chunk(-1, file_name(chunk), chunk, out, scratch_, &times_, check);
  // open_process_image resolves them: one left is a manifest read otherwise.
  if (chunk.compression == Compression::kParent)
    return make_error("chunk at offset " + std::to_string(chunk.alloc_offset) +
                      " is stored in the parent image, which was not opened");
  if (chunk.file_index >= files_.size()) return make_error("chunk refers to a data file the manifest lacks");
  const DataFile& file = manifest_.data_files[chunk.file_index];
  const auto* at = image::parent_file(manifest_, chunk.file_index);
  const std::string shown = file_name(chunk);
  UniqueFd& fd = files_[chunk.file_index];
  if (!fd.valid()) {
    // A parent's file from the parent's directory, through the same checks.
    fd.reset(open_image_file(at ? at->dirfd : dirfd_, file.name));
    if (!fd.valid()) return open_error(shown);
  }
  return image::read_chunk(fd.get(), shown, chunk, out, scratch_, &times_, check);
}

Result<void> ImageReader::check_fingerprint(uint64_t allocation, const Chunk& chunk,
                                            std::span<const std::byte> bytes) const {
  if (!chunk.fingerprint || fingerprint::of(bytes.data(), bytes.size()) == *chunk.fingerprint) return {};
  return make_error(file_name(chunk) + ": allocation " + std::to_string(allocation) + " chunk at offset " +
                        std::to_string(chunk.alloc_offset) + ": its bytes do not have the fingerprint the manifest records",
                    EIO);
}

Result<uint64_t> ImageReader::verify_all() {
  std::vector<std::byte> buf;
  uint64_t total = 0;
  for (const auto& a : manifest_.allocations) {
    for (const auto& c : a.chunks) {
      if (c.compression == Compression::kDead) continue;  // no part of the image
      buf.resize(c.raw_size);
      PHOS_TRY(read_chunk(c, buf));
      PHOS_TRY(check_fingerprint(a.id, c, buf));
      total += c.raw_size;
    }
  }
  return total;
}

}  // namespace phos::image
