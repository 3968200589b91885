// How a process's device memory is copied: by a dump into an image, or by
// an on-demand restore into the process. One enum and one numbering for
// the image (Manifest::protocol, manifest.proto's Protocol), the copy
// table (copy_state.h) and the plugin's dump: the values a manifest
// records are manifest.proto's, and the copy table maps them to the
// numbers its header has always held (copy_state.cc).
#pragma once

#include <cstdint>
#include <string_view>

namespace phos {

enum class CopyProtocol : uint32_t {
  // Copied while the process is stopped, or (write-behind) from a snapshot
  // of its memory made on the GPU then: the image is the state at the stop.
  kStopTheWorld = 1,
  // A first pass copies while the process runs, its writes mark chunks
  // dirty; after the final stop the dirty ones are copied again.
  kSoftRecopy = 2,
  // The process runs again at once; a write to a chunk not copied yet saves
  // it first: the image is the state at the stop.
  kSoftCopyOnWrite = 3,
  // An on-demand restore: the process runs while its memory is filled from
  // the image. No image records it.
  kOnDemandFill = 4,
};

// "stop-the-world", "soft-recopy", "soft-copy-on-write", "on-demand-fill";
// "unknown" for a value that is none of them.
constexpr std::string_view copy_protocol_name(CopyProtocol p) {
  switch (p) {
    case CopyProtocol::kStopTheWorld: return "stop-the-world";
    case CopyProtocol::kSoftRecopy: return "soft-recopy";
    case CopyProtocol::kSoftCopyOnWrite: return "soft-copy-on-write";
    case CopyProtocol::kOnDemandFill: return "on-demand-fill";
  }
  return "unknown";
}

// Whether an image records it: the protocols of a dump.
constexpr bool is_dump_protocol(CopyProtocol p) {
  return p == CopyProtocol::kStopTheWorld || p == CopyProtocol::kSoftRecopy || p == CopyProtocol::kSoftCopyOnWrite;
}

}  // namespace phos
