// Incremental images: an image's parent chunks resolved against its parent
// image, which may have its own parent. The parent is opened as criu opens
// --prev-images-dir: a path relative to the child's directory.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "phos/images/image_dir.h"

namespace phos::image {

namespace {

std::string join(const std::string& dir, const std::string& below) {
  return below == "." ? dir : dir + "/" + below;
}

// How much of `m` its own data files hold, and how much it leaves to its
// parent; before resolution.
ChainLink link_of(const Manifest& m) {
  ChainLink l{.dir = "."};
  for (const auto& a : m.allocations)
    for (const auto& c : a.chunks) {
      if (c.compression == Compression::kParent) {
        l.referenced_chunks++;
        l.referenced_bytes += c.raw_size;
      } else if (c.stored_size) {
        l.stored_chunks++;
        l.stored_bytes += c.stored_size;
      }
    }
  return l;
}

using ChunkKey = std::pair<uint64_t, uint64_t>;  // allocation id, alloc_offset

std::string fingerprint_text(const std::optional<uint64_t>& f) {
  if (!f) return "none";
  char hex[19];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(*f));
  return hex;
}

// `child`'s parent chunks replaced by `parent`'s chunks, whose data files
// are appended to the child's (read from `parent_dirfd`).
Result<void> take_parent_chunks(Manifest& child, const Manifest& parent, int parent_dirfd, const std::string& path,
                                const std::string& what) {
  std::map<ChunkKey, const Chunk*> index;
  for (const auto& a : parent.allocations)
    for (const auto& c : a.chunks) index[{a.id, c.alloc_offset}] = &c;
  const uint32_t base = uint32_t(child.data_files.size());
  child.parent_files.resize(base);
  for (size_t i = 0; i < parent.data_files.size(); i++) {
    // The parent's own files are in its directory; its parents' are where it found them.
    const auto& at = i < parent.parent_files.size() ? parent.parent_files[i] : std::nullopt;
    child.data_files.push_back(parent.data_files[i]);
    child.parent_files.push_back(at ? ParentFile{at->dirfd, join(path, at->dir)} : ParentFile{parent_dirfd, path});
  }
  for (auto& a : child.allocations)
    for (auto& c : a.chunks) {
      if (c.compression != Compression::kParent) continue;
      const std::string where = "allocation " + std::to_string(a.id) + " chunk at offset " + std::to_string(c.alloc_offset);
      auto it = index.find({a.id, c.alloc_offset});
      if (it == index.end()) return make_error(what + " has no " + where + ", which the image leaves to it", ENOENT);
      const Chunk& p = *it->second;
      // A child of format version 7 names the fingerprint it was compared by.
      if (p.compression == Compression::kDead || p.raw_size != c.raw_size || p.crc32c != c.crc32c ||
          (c.fingerprint && p.fingerprint != c.fingerprint))
        return make_error(what + ": its " + where + " is not the one the image references (" +
                              std::string(chunk_compression_name(p.compression)) + ", " + std::to_string(p.raw_size) +
                              " bytes, CRC-32C " + std::to_string(p.crc32c) + ", fingerprint " +
                              fingerprint_text(p.fingerprint) + "; expected " + std::to_string(c.raw_size) +
                              " bytes, CRC-32C " + std::to_string(c.crc32c) + ", fingerprint " +
                              fingerprint_text(c.fingerprint) + ")",
                          EINVAL);
      c = p;  // its CRC is the child's, checked when the bytes are read
      if (p.compression != Compression::kZero) c.file_index = base + p.file_index;
    }
  return {};
}

}  // namespace

Result<ProcessImage> open_parent_image(int dirfd, const std::string& path, int32_t pid, UniqueFd& dir, uint32_t depth) {
  const std::string what = "parent image " + path;
  if (depth + 1 >= kMaxChainLength)
    return make_error(what + ": the chain is longer than " + std::to_string(kMaxChainLength) + " images (a loop?)", ELOOP);
  dir.reset(::openat(dirfd, path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return errno_error(what + ": open its directory");
  auto img = open_process_image(dir.get(), pid, /*require_complete=*/true, depth + 1);
  if (!img) return make_error(what + ": " + img.error().message, img.error().code ? img.error().code : EINVAL);
  return img;
}

Result<void> resolve_parents(int dirfd, ProcessImage& img, uint32_t depth) {
  img.chain = {link_of(img.manifest)};
  if (!img.manifest.parent) return {};
  const ParentImage& ref = *img.manifest.parent;
  const std::string what = "parent image " + ref.path + " of " + img.manifest_name;
  UniqueFd dir;
  auto parent = open_parent_image(dirfd, ref.path, img.manifest.pid, dir, depth);
  if (!parent) return make_error(img.manifest_name + ": " + parent.error().message, parent.error().code);
  if (parent->manifest_size != ref.manifest_size || parent->manifest_crc32c != ref.manifest_crc32c ||
      parent->manifest.created_unix_ns != ref.created_unix_ns)
    return make_error(what + ": its " + parent->manifest_name +
                          " is not the one the image was made against (changed or replaced since)",
                      ESTALE);
  PHOS_TRY(take_parent_chunks(img.manifest, parent->manifest, dir.get(), ref.path, what));
  for (ChainLink l : parent->chain) {
    l.dir = join(ref.path, l.dir);
    img.chain.push_back(std::move(l));
  }
  img.parent_dirs.push_back(std::move(dir));
  for (auto& d : parent->parent_dirs) img.parent_dirs.push_back(std::move(d));
  return {};
}

}  // namespace phos::image
