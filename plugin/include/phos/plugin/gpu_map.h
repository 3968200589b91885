// Which GPU of this host each GPU of an image is restored onto. By default
// the same GPU (by UUID) where the host has it, else the same ordinal;
// PHOS_GPU_MAP (or gpu_map in phos.conf) moves them: "OLD=NEW[,OLD=NEW...]"
// where each side is an ordinal ("0=1") or a UUID as nvidia-smi prints it
// ("GPU-bb919f8b-..."). The old side names a GPU of the image (an ordinal
// as the process numbered it), the new side one of this host (an ordinal as
// nvidia-smi numbers it). The models must match (the driver
// restores onto the same chip type only), and no two image GPUs may land on
// one host GPU.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "phos/images/gpu_device.h"
#include "phos/images/manifest.h"
#include "phos/support/result.h"

namespace phos::plugin {

struct GpuMapEntry {
  std::string from, to;  // an ordinal or a GPU UUID each
};
using GpuMapSpec = std::vector<GpuMapEntry>;

Result<GpuMapSpec> parse_gpu_map(std::string_view spec);
// The spec as parse_gpu_map reads it; "none" when empty.
std::string describe_gpu_map(const GpuMapSpec& spec);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints UUIDs.
std::string format_gpu_uuid(const std::array<uint8_t, 16>& uuid);

struct GpuPlacement {
  uint32_t image_ordinal = 0;
  int host_ordinal = 0;
  std::array<uint8_t, 16> image_uuid{}, host_uuid{};
  bool moved() const { return image_uuid != host_uuid; }
};

// Whether `key` names a GPU as gpu_map's sides do: an ordinal or a UUID.
bool is_gpu_key(std::string_view key);

// This host's GPUs (`host`) are GpuDevices in criu's own numbering.

// The GPU of `host` that `key` names (an ordinal or a UUID); null: none.
const GpuDevice* find_host_gpu(const std::string& key, const std::vector<GpuDevice>& host);

// Each GPU of a process, as the process numbers it (its agent reports the
// ordinal with the GPU's UUID), in this process's (criu's) own numbering:
// they differ when the program runs with CUDA_VISIBLE_DEVICES. A device
// reported without a UUID (an older agent) keeps its ordinal; a UUID this
// host does not have is an error.
Result<std::map<uint32_t, int>> host_ordinals(const std::vector<GpuDevice>& devices,
                                              const std::vector<GpuDevice>& host);

// Criu's ordinal of the process's device `ordinal` (host_ordinals' map); a
// device not in it keeps its ordinal.
int host_device(const std::map<uint32_t, int>& host_ordinal, uint32_t ordinal);

// One placement per image device, in the image's order. Errors name the
// device, the spec entry or both models.
Result<std::vector<GpuPlacement>> place_gpus(const GpuMapSpec& spec, const std::vector<GpuDevice>& image_devices,
                                             const std::vector<GpuDevice>& host, const std::string& manifest_name);

// A migration's device map (migrate_to, `phosctl migrate --gpu-map`):
// "SRC:DST[,SRC:DST...]", each side a GPU of this host as criu numbers it
// (an ordinal as nvidia-smi prints it) or its UUID; SRC a GPU the process
// runs on, DST where its memory goes ("SRC=DST" too, as gpu_map writes
// its pairs). A single GPU ("1", no ':' or '=') is the
// one-GPU form: migration_targets() takes it for a process on one GPU.
bool is_migration_map(std::string_view spec);
// Syntax only ("0:1,1:0"); errors name the entry.
Result<GpuMapSpec> parse_migration_map(std::string_view spec);
// "0:1,1:0", as parse_migration_map reads it.
std::string describe_migration_map(const GpuMapSpec& spec);

// Each of the process's GPUs (`sources`, criu's numbering) to its target
// GPU of `host`, from migrate_to: a single GPU (a process on one GPU, or on
// none) or a map. Refused, saying why: a GPU this host does not have, a
// source named twice, two sources on one target (not one-to-one), one of
// the process's GPUs left unmapped, a single target for several GPUs, or a
// target of another model (the driver restores onto the same chip type).
// Entries for GPUs the process does not use are left out.
Result<std::map<int, int>> migration_targets(const std::string& migrate_to, const std::set<int>& sources,
                                             const std::vector<GpuDevice>& host);

// The UUID pairs for the driver's restore when a GPU moves (empty when none
// does): the driver wants every GPU the process had checkpointed, which
// was every GPU it could see (a pair for the used GPU alone
// was refused with CUDA_ERROR_INVALID_VALUE). So the pairs cover all of
// `host`, as a permutation: placed GPUs go where placed, the others stay,
// or take a GPU a placement freed.
// `hidden`: GPUs the kernel driver has that `host` (criu's CUDA, narrowed
// by CUDA_VISIBLE_DEVICES) does not show; each gets a pair onto itself. A
// process on 2 of a 4-GPU host's GPUs, moved with pairs for its 2 alone,
// was refused with CUDA_ERROR_INVALID_VALUE; with every GPU visible the
// same move passed.
std::vector<std::pair<std::array<uint8_t, 16>, std::array<uint8_t, 16>>> driver_gpu_pairs(
    const std::vector<GpuPlacement>& placement, const std::vector<GpuDevice>& host,
    const std::vector<std::array<uint8_t, 16>>& hidden = {});

// Every GPU's UUID the kernel driver lists under `dir` (one directory per
// GPU, its `information` file's "GPU UUID:" line), whatever
// CUDA_VISIBLE_DEVICES says; empty where there is no such directory.
std::vector<std::array<uint8_t, 16>> kernel_driver_gpus(const std::string& dir = "/proc/driver/nvidia/gpus");
// Whether a restore leaves every GPU of an image where it was, known
// without CUDA (whose cuInit in a restore takes 100-210 ms): no GPU map
// given, criu sees every GPU (`criu_sees_all`: no CUDA_VISIBLE_DEVICES), and
// the kernel driver lists each of the image's GPUs. Then place_gpus() moves
// none, and the driver's restore takes no pairs.
bool image_stays_on_its_gpus(const std::vector<GpuDevice>& image_devices,
                             const std::vector<std::array<uint8_t, 16>>& kernel_gpus, bool gpu_map_given,
                             bool criu_sees_all);
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as bytes; nullopt if it is not one.
std::optional<std::array<uint8_t, 16>> parse_gpu_uuid(std::string_view s);

}  // namespace phos::plugin
