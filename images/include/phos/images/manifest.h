// The manifest of one process's GPU image, as C++ values, and its file codec.
// The schema is images/proto/manifest.proto; this header keeps protobuf-c
// out of the code that builds and reads images.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "phos/images/agent_messages.h"
#include "phos/images/copy_protocol.h"
#include "phos/images/format.h"
#include "phos/images/gpu_device.h"
#include "phos/support/result.h"

namespace phos::image {

// How a dump checked the copies made while the process ran
// (manifest.proto Validation).
enum class Validation : uint32_t { kNone = 0, kChecksum = 1 };
std::string_view validation_name(Validation v);

// kZero: every byte of the chunk is 0 and nothing is stored (a sparse image).
// kDead: free in the program's allocator at the checkpoint (dead_ranges.h):
// nothing is stored, and a restore leaves it unfilled.
// kParent: unchanged since the parent image, which holds the bytes (an
// incremental image; open_process_image resolves it).
enum class Compression : uint32_t { kNone = 0, kZstd = 1, kZero = 2, kDead = 3, kParent = 4 };

// exact, speculated, validated; "none" for 0 (no copy window).
std::string_view copy_trust_name(agent::CopyTrust t);
// How an image stores a chunk: none, zstd, zero, dead ("unknown" for another
// value). Not the fatbin's compression (spec::fatbin_compression_name).
std::string_view chunk_compression_name(Compression c);

// A piece of an allocation and where its bytes are. A zero chunk (kZero)
// stores none: its stored_size, file_index and file_offset are 0.
struct Chunk {
  uint64_t alloc_offset = 0;
  uint32_t file_index = 0;
  uint64_t file_offset = 0;
  uint32_t raw_size = 0;
  uint32_t stored_size = 0;
  uint32_t crc32c = 0;
  Compression compression = Compression::kNone;
  // fingerprint.h's hash of the raw bytes (format version 7); none in older
  // images and for a dead chunk.
  std::optional<uint64_t> fingerprint = std::nullopt;
  bool operator==(const Chunk&) const = default;
};

// An allocation of the process, as its agent listed it, and the chunks that
// hold its bytes in the image.
struct Allocation : agent::Allocation {
  std::vector<Chunk> chunks;
  bool operator==(const Allocation&) const = default;
};

struct DataFile {
  std::string name;
  uint64_t size = 0;
  bool operator==(const DataFile&) const = default;
};

// In memory only, never encoded: where a data file of a resolved
// incremental image is (open_process_image), a parent's directory.
struct ParentFile {
  int dirfd = -1;   // the parent's directory, open while the image is
  std::string dir;  // that directory as the image names it (for messages)
  bool operator==(const ParentFile&) const = default;
};

// See Statistics in manifest.proto: the steps' times are sums over workers.
struct Statistics {
  uint64_t quiesce_ns = 0;
  uint64_t copy_ns = 0;
  uint64_t write_ns = 0;
  uint64_t raw_bytes = 0;     // the logical size: every allocation's bytes
  uint64_t stored_bytes = 0;  // the data files' size
  uint64_t total_ns = 0;
  uint64_t dma_wait_ns = 0;
  uint64_t checksum_ns = 0;
  uint64_t compress_ns = 0;
  uint32_t workers = 0;
  bool direct_io = false;
  // A dump that left the process running: how long it was stopped, and
  // what its copy-on-write window cost it (copy_state.h).
  uint64_t stall_ns = 0;
  uint64_t cow_pool_bytes = 0;
  uint64_t cow_saved_bytes = 0;
  // The window's counters (manifest.proto's cow_calls_checked .. cow_wait_ns);
  // soft recopy's window records its calls_checked.
  agent::CopyWindowCounters copy_window{};
  uint64_t cow_window_ns = 0;  // from the gate reopening to the last chunk copied
  // Soft recopy, a dump that stops the process: the first pass, while the
  // process ran; the chunks it wrote meanwhile, copied again once the gate
  // closed; and the final pass (from that gate closing to the last chunk).
  uint64_t recopy_first_pass_bytes = 0;
  uint64_t recopy_first_pass_ns = 0;
  uint64_t recopied_bytes = 0;
  uint64_t final_pass_ns = 0;
  // Chunks stored as zero (Compression::kZero) and their bytes.
  uint64_t zero_chunks = 0;
  uint64_t zero_bytes = 0;
  // PhOS §5's traffic control while the process ran: its own transfers
  // between host and device, the engine's pauses for them (time summed
  // over workers), recopy's first-pass bytes written after their copy.
  uint64_t program_transfers = 0;
  uint64_t program_transfer_bytes = 0;
  uint64_t traffic_pauses = 0;
  uint64_t traffic_paused_ns = 0;
  uint64_t recopy_wasted_bytes = 0;
  // CLOCK_REALTIME when the gate closed for the copy the image holds.
  uint64_t gate_closed_unix_ns = 0;
  // Validation by checksum: the fingerprint pass, the copies checked, recopy's
  // chunks changed without a dirty mark and dirty but unchanged.
  uint64_t sum_pass_ns = 0;
  uint64_t sum_checked_chunks = 0;
  uint64_t sum_missed_chunks = 0;
  uint64_t sum_unchanged_dirty_chunks = 0;
  // Copy-on-write: memory other processes map through CUDA IPC, copied
  // while they were all stopped, before the window opened.
  uint64_t ipc_stopped_bytes = 0;
  bool operator==(const Statistics&) const = default;
};

struct LaunchRecord {
  uint64_t sequence = 0;
  std::string kernel;
  std::vector<uint64_t> read_allocations;
  std::vector<uint64_t> write_allocations;
  bool operator==(const LaunchRecord&) const = default;
};

// A migration's GPU data, kept in device memory by phos-keeper (see
// KeptMemory in manifest.proto): the allocations have no chunks and the
// image no data files.
struct KeptMemory {
  std::string migration;  // 16 hex digits: the keeper's name for it
  // The GPU that holds it: the image records its UUID and name (its
  // ordinal and the rest are 0 once read back).
  GpuDevice device;
  bool in_place = false;  // the process's own memory, not a copy
  uint64_t kept_bytes = 0;
  // A process on several GPUs (format 8): each image device's ordinal to
  // the GPU (UUID, name) holding its memory. Empty: all on `device`.
  std::map<uint32_t, GpuDevice> targets;
  // The GPU holding image device `ordinal`'s memory.
  const GpuDevice& target_of(uint32_t ordinal) const {
    auto it = targets.find(ordinal);
    return it == targets.end() ? device : it->second;
  }
  bool operator==(const KeptMemory&) const = default;
};

// Whether `id` is a migration's name as phos makes them (16 hex digits):
// it becomes part of a socket's name.
bool is_migration_id(std::string_view id);

// An incremental image's parent (manifest.proto ParentImage): `path`
// relative to the image's directory, and the identity of its manifest file.
struct ParentImage {
  std::string path;
  uint64_t manifest_size = 0;
  uint32_t manifest_crc32c = 0;
  uint64_t created_unix_ns = 0;
  bool operator==(const ParentImage&) const = default;
};

struct Manifest {
  uint32_t format_version = kManifestFormatVersion;
  std::string writer_version;
  int32_t pid = 0;
  CopyProtocol protocol = CopyProtocol::kStopTheWorld;  // a dump's (is_dump_protocol)
  // Copy-on-write: which write sets the window trusted (0: no window).
  agent::CopyTrust copy_trust = agent::CopyTrust(0);
  uint32_t chunk_size = kDefaultChunkSize;
  uint64_t created_unix_ns = 0;
  std::vector<GpuDevice> devices;  // as the process numbered them, fully described
  std::vector<Allocation> allocations;
  std::vector<DataFile> data_files;
  Statistics statistics;
  std::vector<LaunchRecord> launch_log;
  std::vector<uint64_t> fill_order;  // allocation ids, as recorded launches first touched them
  std::vector<std::string> unsupported_calls;
  std::optional<KeptMemory> kept;  // a migration: where the GPU data is
  Validation validation = Validation::kNone;
  // CUDA IPC: other processes' memory mapped here, each with its owner
  // (agent::Allocation::ipc); the owner's image holds the bytes.
  std::vector<agent::Allocation> ipc_mappings;
  std::optional<ParentImage> parent;  // an incremental image
  // Resolved (in memory only): by data file index, where data_files holds a
  // parent's file; absent or empty for the image's own.
  std::vector<std::optional<ParentFile>> parent_files;
  bool operator==(const Manifest&) const = default;
};

// A resolved image's data file `index` where it is a parent's (with that
// image's directory); null for the image's own.
inline const ParentFile* parent_file(const Manifest& m, size_t index) {
  return index < m.parent_files.size() && m.parent_files[index] ? &*m.parent_files[index] : nullptr;
}

struct CompletionMarker {
  uint32_t format_version = kMarkerFormatVersion;
  uint64_t manifest_size = 0;
  uint32_t manifest_crc32c = 0;
  uint64_t completed_unix_ns = 0;
  bool operator==(const CompletionMarker&) const = default;
};

// A manifest file's bytes: the framed header, then the protobuf payload.
std::vector<std::byte> encode_manifest(const Manifest& m);
// Checks the frame (magic, version, sizes, checksums), parses, then validates.
// `name` is the file name that error messages carry.
Result<Manifest> decode_manifest(std::span<const std::byte> file, std::string_view name);

// The oldest format version that holds `m`: kKeptMemoryFormatVersion for a
// migration, kDeadChunkFormatVersion where a chunk is dead,
// kZeroChunkFormatVersion where a chunk is zero, 1 otherwise. A
// dump writes its manifest with it.
uint32_t format_version_for(const Manifest& m);

// Structural checks a reader relies on: versions, device references, chunks
// that cover each allocation exactly (none at all where the memory is kept), chunk sizes within chunk_size, data file
// names and extents inside their files.
Result<void> validate_manifest(const Manifest& m, std::string_view name);

// The marker that completes `manifest_file` (the bytes encode_manifest made).
CompletionMarker marker_for(std::span<const std::byte> manifest_file, uint64_t completed_unix_ns);
std::vector<std::byte> encode_marker(const CompletionMarker& marker);
Result<CompletionMarker> decode_marker(std::span<const std::byte> file, std::string_view name);

}  // namespace phos::image
