// Folding an incremental image's chain into one self-contained image: every
// chunk read from the image that stores it (its CRC checked), written into
// one data file of the new image, which names no parent.
#include <algorithm>
#include <vector>

#include "phos/images/data_file.h"
#include "phos/images/image_dir.h"

namespace phos::image {

namespace {

// The chunks of `a` written into `writer`, read through `reader`.
Result<std::vector<Chunk>> copy_chunks(const Allocation& a, ImageReader& reader, DataFileWriter& writer) {
  std::vector<Chunk> out;
  std::vector<std::byte> buf;
  for (const Chunk& c : a.chunks) {
    if (c.compression == Compression::kZero || c.compression == Compression::kDead) {
      out.push_back(c);  // stored nowhere, as before
      continue;
    }
    buf.resize(c.raw_size);
    PHOS_TRY(reader.read_chunk(c, buf));
    PHOS_TRY(reader.check_fingerprint(a.id, c, buf));  // it goes with the chunk: a later image's parent needs it
    auto written = writer.write_chunk(c.alloc_offset, buf, c.compression, 1, ChunkSum{c.crc32c, false});
    if (!written) return written.error();
    written->fingerprint = c.fingerprint;
    out.push_back(*written);
  }
  return out;
}

}  // namespace

Result<Manifest> merge_chain(int src_dirfd, int32_t pid, int out_dirfd) {
  auto img = open_process_image(src_dirfd, pid, /*require_complete=*/true);
  if (!img) return img.error();
  Manifest m = img->manifest;
  if (m.kept) return make_error(img->manifest_name + ": a migration's image holds no chunks to merge", EINVAL);
  PHOS_TRY(check_own_name(out_dirfd, manifest_file_name(pid)));
  auto writer = DataFileWriter::create(out_dirfd, data_file_name(pid, 0), pid, 0, DirectIo::kOff, Sparse::kOff);
  if (!writer) return writer.error();
  ImageReader reader(src_dirfd, img->manifest);
  for (auto& a : m.allocations) {
    auto chunks = copy_chunks(a, reader, **writer);
    if (!chunks) return chunks.error();
    a.chunks = std::move(*chunks);
  }
  auto file = (*writer)->finish();
  if (!file) return file.error();
  m.data_files = {*file};
  m.parent.reset();
  m.parent_files.clear();
  m.statistics.stored_bytes = file->size;
  m.format_version = format_version_for(m);
  auto written = write_manifest(out_dirfd, m);
  if (!written) return written.error();
  PHOS_TRY(write_completion_marker(out_dirfd, pid, *written));
  return m;
}

}  // namespace phos::image
