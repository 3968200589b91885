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

struct ProcessImage {
  std::string manifest_name;
  Manifest manifest;
  bool complete = false;
  std::string incomplete_reason;  // when !complete
};

// Reads and validates the manifest of `pid`, its marker and its data files'
// headers and sizes. With require_complete, an incomplete image is an error.
Result<ProcessImage> open_process_image(int dirfd, int32_t pid, bool require_complete);

// Reads chunks of one process image, from any of its data files; opens them
// on first use.
class ImageReader {
 public:
  ImageReader(int dirfd, const Manifest& manifest);
  Result<void> read_chunk(const Chunk& chunk, std::span<std::byte> out, CrcCheck check = CrcCheck::kHere);
  // The name of the data file that holds `chunk`, "zero chunk" for one that
  // no file holds (for messages).
  std::string_view file_name(const Chunk& chunk) const;
  // Reads every chunk of every allocation and checks it (phosctl verify).
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
