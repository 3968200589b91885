// Constants and names of the GPU image format (see images/proto/).
//
// Files in CRIU's image directory, for a process whose pid in its own pid
// namespace is P:
//   phos-P-manifest.img   framed Manifest (written before the marker)
//   phos-P-data-N.img     data file N: a header, then chunks at the offsets
//                         the manifest records
//   phos-P-complete.img   framed CompletionMarker, written last, atomically
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace phos::image {

// The newest manifest format this phos reads and writes. Version 2 added
// zero chunks (Compression::kZero); a dump writes the oldest version that
// holds its manifest (format_version_for, manifest.h), so a phos that reads
// only version 1 restores every image without a zero chunk and refuses the
// others by their version.
inline constexpr uint32_t kManifestFormatVersion = 8;
inline constexpr uint32_t kZeroChunkFormatVersion = 2;
// Version 3: a migration's manifest, whose GPU data is kept in device
// memory by phos-keeper (KeptMemory) instead of data files.
inline constexpr uint32_t kKeptMemoryFormatVersion = 3;
// Version 4: dead chunks (Compression::kDead), free memory of the program's
// allocator that the image does not hold.
inline constexpr uint32_t kDeadChunkFormatVersion = 4;
// Version 5: CUDA IPC mappings of other processes' memory (ipc_mappings),
// which an older reader would leave unmapped.
inline constexpr uint32_t kIpcFormatVersion = 5;
// Version 6: incremental images, whose PARENT chunks (Compression::kParent)
// are stored in a parent image (Manifest::parent).
inline constexpr uint32_t kParentFormatVersion = 6;
// Version 7: each chunk's 64-bit fingerprint (fingerprint.h, Chunk::
// fingerprint), by which an incremental dump decides a chunk is unchanged
// (parent_index.h); a parent without them is never used as one.
inline constexpr uint32_t kFingerprintFormatVersion = 7;
// Version 8: a migration of a process on several GPUs (KeptMemory's
// targets, one GPU per image device), which an older reader would restore
// onto one GPU.
inline constexpr uint32_t kKeptTargetsFormatVersion = 8;
// The longest chain of parents a reader follows (a loop of parents ends here).
inline constexpr uint32_t kMaxChainLength = 64;
// The completion marker and the data files have kept their first format.
inline constexpr uint32_t kMarkerFormatVersion = 1;
inline constexpr uint32_t kDataFormatVersion = 1;
inline constexpr uint32_t kDefaultChunkSize = 4u << 20;
inline constexpr uint32_t kMaxChunkSize = 64u << 20;
// Large enough for a 64 GiB process in 4 MiB chunks, small enough that a
// corrupted length cannot make a reader allocate without bound.
inline constexpr uint64_t kMaxManifestBytes = 256ull << 20;
inline constexpr uint32_t kDataHeaderSize = 4096;  // chunks start aligned for O_DIRECT

// Every framed file (manifest, marker) starts with this header.
inline constexpr char kManifestMagic[8] = {'P', 'H', 'O', 'S', 'M', 'A', 'N', 'F'};
inline constexpr char kMarkerMagic[8] = {'P', 'H', 'O', 'S', 'D', 'O', 'N', 'E'};
inline constexpr char kDataMagic[8] = {'P', 'H', 'O', 'S', 'D', 'A', 'T', 'A'};

// Allocation.flags bits.
enum AllocationFlag : uint32_t {
  kAllocPitched = 1u << 0,
  kAllocAsync = 1u << 1,       // from cudaMallocAsync / a memory pool
  kAllocUserVmm = 1u << 2,     // the program used the VMM API itself
  kAllocSlab = 1u << 3,        // a slab that small allocations live in
  kAllocIpcImported = 1u << 4, // another process's memory, opened through cuIpcOpenMemHandle
};

std::string manifest_file_name(int32_t pid);
std::string marker_file_name(int32_t pid);
std::string data_file_name(int32_t pid, uint32_t index);

// The pid of a manifest file name, or nothing for other names.
std::optional<int32_t> pid_of_manifest_file(std::string_view name);

// A data file name the manifest may refer to: phos-*.img, no path separator.
bool is_safe_data_file_name(std::string_view name);

std::string_view writer_version();

}  // namespace phos::image
