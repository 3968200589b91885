// A GPU image in CRIU's image directory: writing it file by file with the
// completion marker last, and opening it with every check a restore needs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "phos/images/data_file.h"
#include "phos/images/manifest.h"
#include "phos/images/unique_fd.h"
#include "phos/support/result.h"

namespace phos::image {

// The image directory is the user's and may hold anything: phos's files are
// opened without following a symbolic link (O_NOFOLLOW), and a name of ours
// that exists as anything but a regular file is refused, not replaced.

// Writes `bytes` to `name` in `dirfd` atomically: a temporary file (0600,
// created afresh), fsync, rename over `name`, fsync of the directory.
Result<void> write_file_atomic(int dirfd, const std::string& name, std::span<const std::byte> bytes);
// An error where `name` exists as a symbolic link or anything but a file.
Result<void> check_own_name(int dirfd, const std::string& name);
// Opens an image file for reading, not through a link (-1 and errno).
int open_image_file(int dirfd, const std::string& name);
// What a failed open_image_file says.
Error open_error(const std::string& name, int err = errno);

// Reads a whole file of at most `max_bytes`.
Result<std::vector<std::byte>> read_small_file(int dirfd, const std::string& name, uint64_t max_bytes);

// Writes the manifest (atomically); returns its file bytes for the marker.
Result<std::vector<std::byte>> write_manifest(int dirfd, const Manifest& m);
// Writes the completion marker of manifest `m.pid`: the last step of a dump.
Result<void> write_completion_marker(int dirfd, int32_t pid, std::span<const std::byte> manifest_file);
// Removes the marker (a dump that failed after writing it), if present.
Result<void> remove_completion_marker(int dirfd, int32_t pid);

// The pids that have a manifest in `dirfd`, sorted.
Result<std::vector<int32_t>> list_process_images(int dirfd);

// One image of an incremental chain, as stored (before resolve_parents):
// its directory as reached from the first image ("." for that one), and the
// chunks it stores itself against those it references in its parent.
struct ChainLink {
  std::string dir;
  uint64_t stored_chunks = 0, stored_bytes = 0;  // bytes in its data files
  uint64_t referenced_chunks = 0, referenced_bytes = 0;  // raw bytes left to the parent
};

struct ProcessImage {
  std::string manifest_name;
  // With its parent chunks resolved (resolve_parents): each is the chunk of
  // the image that stores it, in a data file appended to data_files with
  // that image's directory (Manifest::parent_files). `parent` stays as
  // recorded.
  Manifest manifest;
  bool complete = false;
  std::string incomplete_reason;  // when !complete
  uint64_t manifest_size = 0;     // the manifest file's identity (ParentImage)
  uint32_t manifest_crc32c = 0;
  std::vector<ChainLink> chain;   // this image first, then its parents
  std::vector<UniqueFd> parent_dirs;  // the parents' directories, open while the image is
};

// Reads and validates the manifest of `pid`, its marker and its data files'
// headers and sizes. With require_complete, an incomplete image is an error.
// An incremental image's parents (each complete, with the identity its child
// recorded) are opened and its parent chunks resolved, to
// kMaxChainLength images; `depth`: the images below this one in its chain.
Result<ProcessImage> open_process_image(int dirfd, int32_t pid, bool require_complete, uint32_t depth = 0);

// Resolves `img`'s parent chunks against its parent image (opened relative
// to `dirfd`, the directory of `img`), recursively; `depth`: images below.
Result<void> resolve_parents(int dirfd, ProcessImage& img, uint32_t depth);

// Opens the image of `pid` in `path` (relative to `dirfd`) as a parent:
// complete, with its own parents resolved. Its directory fd goes to `dir`.
Result<ProcessImage> open_parent_image(int dirfd, const std::string& path, int32_t pid, UniqueFd& dir,
                                       uint32_t depth = 0);

// Writes the image of `pid` in `src_dirfd`, its parent chain resolved
// (open_process_image), into `out_dirfd` as one self-contained image: every
// chunk read and checked, written into one data file, no parent named.
// The phos files only: criu's own are the caller's to copy. The new
// manifest.
Result<Manifest> merge_chain(int src_dirfd, int32_t pid, int out_dirfd);

// Reads chunks of one process image, from any of its data files; opens them
// on first use.
class ImageReader {
 public:
  ImageReader(int dirfd, const Manifest& manifest);
  Result<void> read_chunk(const Chunk& chunk, std::span<std::byte> out, CrcCheck check = CrcCheck::kHere);
  // The name of the data file that holds `chunk` (with its directory where
  // a parent image holds it), "zero chunk" for one that no file holds (for
  // messages).
  std::string file_name(const Chunk& chunk) const;
  // An error, naming the chunk's file, where `bytes` (the chunk's, as read)
  // do not have the fingerprint the manifest records for it; none recorded
  // passes. Not part of read_chunk: a restore's check is the CRC.
  Result<void> check_fingerprint(uint64_t allocation, const Chunk& chunk, std::span<const std::byte> bytes) const;
  // Reads every chunk of every allocation and checks it, its fingerprint
  // too (phosctl verify).
  Result<uint64_t> verify_all();
  // Summed over every read_chunk so far.
  const ChunkTimes& times() const { return times_; }

 private:
  int dirfd_;
  const Manifest& manifest_;
  std::vector<UniqueFd> files_;
  std::vector<std::byte> scratch_;
  ChunkTimes times_;
};

}  // namespace phos::image
