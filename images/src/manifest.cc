#include "phos/images/manifest.h"

#include <zstd.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "agent_pb.h"
#include "framed_file.h"
#include "manifest.pb-c.h"
#include "pb_codec.h"
#include "phos/images/crc32c.h"

namespace phos::image {

std::string_view copy_trust_name(agent::CopyTrust t) {
  switch (t) {
    case agent::CopyTrust::kExact: return "exact";
    case agent::CopyTrust::kSpeculated: return "speculated";
    case agent::CopyTrust::kValidated: return "validated";
    case agent::CopyTrust::kChecksum: return "checksum";
  }
  return uint32_t(t) == 0 ? "none" : "unknown";
}

std::string_view validation_name(Validation v) {
  switch (v) {
    case Validation::kNone: return "none";
    case Validation::kChecksum: return "checksum";
  }
  return "unknown";
}

std::string_view chunk_compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kZstd: return "zstd";
    case Compression::kZero: return "zero";
    case Compression::kDead: return "dead";
    case Compression::kParent: return "parent";
  }
  return "unknown";
}

namespace {

using pb::c_text;
using pb::text;

void encode_chunk(const Chunk& c, Phos__Gpu__Chunk& o) {
  o.alloc_offset = c.alloc_offset;
  o.file_index = c.file_index;
  o.file_offset = c.file_offset;
  o.raw_size = c.raw_size;
  o.stored_size = c.stored_size;
  o.crc32c = c.crc32c;
  o.compression = static_cast<Phos__Gpu__Compression>(c.compression);
  o.has_fingerprint = c.fingerprint.has_value();
  o.fingerprint = c.fingerprint.value_or(0);
}

Chunk decode_chunk(const Phos__Gpu__Chunk& c) {
  return Chunk{.alloc_offset = c.alloc_offset,
               .file_index = c.file_index,
               .file_offset = c.file_offset,
               .raw_size = c.raw_size,
               .stored_size = c.stored_size,
               .crc32c = c.crc32c,
               .compression = static_cast<Compression>(c.compression),
               .fingerprint = c.has_fingerprint ? std::optional<uint64_t>(c.fingerprint) : std::nullopt};
}

void encode_statistics(const Statistics& s, Phos__Image__Statistics& o) {
  // The copy's figures always, as the first phos wrote them.
  pb::set_present(o.has_quiesce_ns, o.quiesce_ns, s.quiesce_ns);
  pb::set_present(o.has_copy_ns, o.copy_ns, s.copy_ns);
  pb::set_present(o.has_write_ns, o.write_ns, s.write_ns);
  pb::set_present(o.has_raw_bytes, o.raw_bytes, s.raw_bytes);
  pb::set_present(o.has_stored_bytes, o.stored_bytes, s.stored_bytes);
  pb::set_present(o.has_total_ns, o.total_ns, s.total_ns);
  pb::set_present(o.has_dma_wait_ns, o.dma_wait_ns, s.dma_wait_ns);
  pb::set_present(o.has_checksum_ns, o.checksum_ns, s.checksum_ns);
  pb::set_present(o.has_compress_ns, o.compress_ns, s.compress_ns);
  pb::set_present(o.has_workers, o.workers, s.workers);
  pb::set_present(o.has_direct_io, o.direct_io, s.direct_io);
  // The protocols' figures only where a dump had a window or a stall.
  auto nonzero = [](protobuf_c_boolean& has, uint64_t& field, uint64_t value) {
    has = value != 0;
    field = value;
  };
  nonzero(o.has_stall_ns, o.stall_ns, s.stall_ns);
  nonzero(o.has_cow_pool_bytes, o.cow_pool_bytes, s.cow_pool_bytes);
  nonzero(o.has_cow_saved_bytes, o.cow_saved_bytes, s.cow_saved_bytes);
  nonzero(o.has_cow_calls_checked, o.cow_calls_checked, s.copy_window.calls_checked);
  nonzero(o.has_cow_calls_waited, o.cow_calls_waited, s.copy_window.calls_waited);
  nonzero(o.has_cow_unknown_waits, o.cow_unknown_waits, s.copy_window.unknown_waits);
  nonzero(o.has_cow_wait_ns, o.cow_wait_ns, s.copy_window.wait_ns);
  nonzero(o.has_cow_window_ns, o.cow_window_ns, s.cow_window_ns);
  nonzero(o.has_recopy_first_pass_bytes, o.recopy_first_pass_bytes, s.recopy_first_pass_bytes);
  nonzero(o.has_recopy_first_pass_ns, o.recopy_first_pass_ns, s.recopy_first_pass_ns);
  nonzero(o.has_recopied_bytes, o.recopied_bytes, s.recopied_bytes);
  nonzero(o.has_final_pass_ns, o.final_pass_ns, s.final_pass_ns);
  nonzero(o.has_zero_chunks, o.zero_chunks, s.zero_chunks);
  nonzero(o.has_zero_bytes, o.zero_bytes, s.zero_bytes);
  nonzero(o.has_program_transfers, o.program_transfers, s.program_transfers);
  nonzero(o.has_program_transfer_bytes, o.program_transfer_bytes, s.program_transfer_bytes);
  nonzero(o.has_traffic_pauses, o.traffic_pauses, s.traffic_pauses);
  nonzero(o.has_traffic_paused_ns, o.traffic_paused_ns, s.traffic_paused_ns);
  nonzero(o.has_recopy_wasted_bytes, o.recopy_wasted_bytes, s.recopy_wasted_bytes);
  nonzero(o.has_gate_closed_unix_ns, o.gate_closed_unix_ns, s.gate_closed_unix_ns);
  nonzero(o.has_sum_pass_ns, o.sum_pass_ns, s.sum_pass_ns);
  nonzero(o.has_sum_checked_chunks, o.sum_checked_chunks, s.sum_checked_chunks);
  nonzero(o.has_sum_missed_chunks, o.sum_missed_chunks, s.sum_missed_chunks);
  nonzero(o.has_sum_unchanged_dirty_chunks, o.sum_unchanged_dirty_chunks, s.sum_unchanged_dirty_chunks);
  nonzero(o.has_ipc_stopped_bytes, o.ipc_stopped_bytes, s.ipc_stopped_bytes);
}

// Absent where an older phos did not write it: 0.
Statistics decode_statistics(const Phos__Image__Statistics& s) {
  return Statistics{.quiesce_ns = s.quiesce_ns,
                    .copy_ns = s.copy_ns,
                    .write_ns = s.write_ns,
                    .raw_bytes = s.raw_bytes,
                    .stored_bytes = s.stored_bytes,
                    .total_ns = s.total_ns,
                    .dma_wait_ns = s.dma_wait_ns,
                    .checksum_ns = s.checksum_ns,
                    .compress_ns = s.compress_ns,
                    .workers = s.workers,
                    .direct_io = s.direct_io != 0,
                    .stall_ns = s.stall_ns,
                    .cow_pool_bytes = s.cow_pool_bytes,
                    .cow_saved_bytes = s.cow_saved_bytes,
                    .copy_window = {.calls_checked = s.cow_calls_checked,
                                    .calls_waited = s.cow_calls_waited,
                                    .unknown_waits = s.cow_unknown_waits,
                                    .wait_ns = s.cow_wait_ns},
                    .cow_window_ns = s.cow_window_ns,
                    .recopy_first_pass_bytes = s.recopy_first_pass_bytes,
                    .recopy_first_pass_ns = s.recopy_first_pass_ns,
                    .recopied_bytes = s.recopied_bytes,
                    .final_pass_ns = s.final_pass_ns,
                    .zero_chunks = s.zero_chunks,
                    .zero_bytes = s.zero_bytes,
                    .program_transfers = s.program_transfers,
                    .program_transfer_bytes = s.program_transfer_bytes,
                    .traffic_pauses = s.traffic_pauses,
                    .traffic_paused_ns = s.traffic_paused_ns,
                    .recopy_wasted_bytes = s.recopy_wasted_bytes,
                    .gate_closed_unix_ns = s.gate_closed_unix_ns,
                    .sum_pass_ns = s.sum_pass_ns,
                    .sum_checked_chunks = s.sum_checked_chunks,
                    .sum_missed_chunks = s.sum_missed_chunks,
                    .sum_unchanged_dirty_chunks = s.sum_unchanged_dirty_chunks,
                    .ipc_stopped_bytes = s.ipc_stopped_bytes};
}

// Owns the protobuf-c structs of one manifest while it is packed: they point
// into the C++ values and into each other.
struct PbManifest {
  Phos__Image__Manifest m = PHOS__IMAGE__MANIFEST__INIT;
  Phos__Image__Statistics stats = PHOS__IMAGE__STATISTICS__INIT;
  Phos__Image__LaunchLog log = PHOS__IMAGE__LAUNCH_LOG__INIT;
  Phos__Image__KeptMemory kept = PHOS__IMAGE__KEPT_MEMORY__INIT;
  Phos__Image__ParentImage parent = PHOS__IMAGE__PARENT_IMAGE__INIT;
  pb::Repeated<Phos__Image__KeptDevice> kept_targets;
  pb::Repeated<Phos__Gpu__Device> devices;
  std::vector<pb::Repeated<Phos__Gpu__Chunk>> chunks;  // per allocation
  pb::Repeated<Phos__Gpu__Allocation> allocs;
  pb::Repeated<Phos__Gpu__Allocation> ipc;
  pb::Repeated<Phos__Image__DataFile> files;
  pb::Repeated<Phos__Image__LaunchRecord> launches;
  std::vector<char*> unsupported;

  explicit PbManifest(const Manifest& in) {
    m.format_version = in.format_version;
    m.writer_version = c_text(in.writer_version);
    m.pid = in.pid;
    // CopyProtocol numbers a dump's protocols as manifest.proto does.
    m.protocol = static_cast<Phos__Image__Protocol>(in.protocol);
    m.chunk_size = in.chunk_size;
    m.created_unix_ns = in.created_unix_ns;

    devices = pb::Repeated<Phos__Gpu__Device>(phos__gpu__device__init, in.devices,
                                              [](const GpuDevice& d, Phos__Gpu__Device& o) { pb::to_pb(d, o); });
    devices.set(m.n_devices, m.devices);

    chunks.reserve(in.allocations.size());
    allocs = pb::Repeated<Phos__Gpu__Allocation>(phos__gpu__allocation__init, in.allocations,
                                                 [&](const Allocation& a, Phos__Gpu__Allocation& o) {
                                                   pb::to_pb(a, o);
                                                   chunks.emplace_back(phos__gpu__chunk__init, a.chunks, encode_chunk);
                                                   chunks.back().set(o.n_chunks, o.chunks);
                                                 });
    allocs.set(m.n_allocations, m.allocations);
    ipc = pb::allocations_to_pb(in.ipc_mappings);
    ipc.set(m.n_ipc_mappings, m.ipc_mappings);

    files = pb::Repeated<Phos__Image__DataFile>(phos__image__data_file__init, in.data_files,
                                                [](const DataFile& f, Phos__Image__DataFile& o) {
                                                  o.name = c_text(f.name);
                                                  o.size = f.size;
                                                });
    files.set(m.n_data_files, m.data_files);

    encode_statistics(in.statistics, stats);
    m.statistics = &stats;
    if (in.kept) {
      const KeptMemory& k = *in.kept;
      kept.migration = c_text(k.migration);
      kept.device_uuid = {k.device.uuid.size(), const_cast<uint8_t*>(k.device.uuid.data())};
      kept.device_name = c_text(k.device.name);
      pb::set_present(kept.has_in_place, kept.in_place, k.in_place);
      pb::set_present(kept.has_kept_bytes, kept.kept_bytes, k.kept_bytes);
      std::vector<std::pair<uint32_t, const GpuDevice*>> targets;
      for (const auto& [ordinal, d] : k.targets) targets.emplace_back(ordinal, &d);
      kept_targets = pb::Repeated<Phos__Image__KeptDevice>(
          phos__image__kept_device__init, targets,
          [](const std::pair<uint32_t, const GpuDevice*>& t, Phos__Image__KeptDevice& o) {
            o.ordinal = t.first;
            o.uuid = {t.second->uuid.size(), const_cast<uint8_t*>(t.second->uuid.data())};
            o.name = c_text(t.second->name);
          });
      kept_targets.set(kept.n_targets, kept.targets);
      m.kept = &kept;
    }
    if (in.copy_trust != agent::CopyTrust(0)) pb::set_present(m.has_copy_trust, m.copy_trust, uint32_t(in.copy_trust));
    if (in.validation != Validation::kNone) {
      m.has_validation = 1;
      m.validation = static_cast<Phos__Image__Validation>(in.validation);
    }
    pb::set_repeated(m.n_fill_order, m.fill_order, in.fill_order);
    if (in.parent) {
      parent.path = c_text(in.parent->path);
      parent.manifest_size = in.parent->manifest_size;
      parent.manifest_crc32c = in.parent->manifest_crc32c;
      parent.created_unix_ns = in.parent->created_unix_ns;
      m.parent = &parent;
    }

    launches = pb::Repeated<Phos__Image__LaunchRecord>(
        phos__image__launch_record__init, in.launch_log, [](const LaunchRecord& r, Phos__Image__LaunchRecord& o) {
          o.sequence = r.sequence;
          o.kernel = c_text(r.kernel);
          pb::set_repeated(o.n_read_allocations, o.read_allocations, r.read_allocations);
          pb::set_repeated(o.n_write_allocations, o.write_allocations, r.write_allocations);
        });
    launches.set(log.n_launches, log.launches);
    m.launch_log = &log;

    pb::set_strings(m.n_unsupported_calls, m.unsupported_calls, in.unsupported_calls, unsupported);
  }
};

LaunchRecord decode_launch(const Phos__Image__LaunchRecord& r) {
  return LaunchRecord{.sequence = r.sequence,
                      .kernel = text(r.kernel),
                      .read_allocations = pb::repeated(r.read_allocations, r.n_read_allocations),
                      .write_allocations = pb::repeated(r.write_allocations, r.n_write_allocations)};
}

KeptMemory decode_kept(const Phos__Image__KeptMemory& k) {
  KeptMemory out{.migration = text(k.migration),
                 .device = {.name = text(k.device_name)},
                 .in_place = k.in_place != 0,
                 .kept_bytes = k.kept_bytes,
                 .targets = {}};
  // A UUID of another length is refused before (from_pb).
  if (k.device_uuid.len == out.device.uuid.size())
    std::copy_n(k.device_uuid.data, out.device.uuid.size(), out.device.uuid.begin());
  for (size_t i = 0; i < k.n_targets; i++) {
    GpuDevice d{.name = text(k.targets[i]->name)};
    if (k.targets[i]->uuid.len == d.uuid.size()) std::copy_n(k.targets[i]->uuid.data, d.uuid.size(), d.uuid.begin());
    out.targets.emplace(k.targets[i]->ordinal, d);  // a device listed twice is refused before (from_pb)
  }
  return out;
}

// An image's device: the codec the agent's shares, and what an image's
// always has (manifest.proto required them before the two were one).
Result<GpuDevice> decode_device(const Phos__Gpu__Device& d) {
  if (!d.name || !d.has_total_memory)
    return make_error("device " + std::to_string(d.ordinal) + " has no name or no memory size");
  return pb::from_pb(d);
}

// Errors are what is wrong, without the file's name.
Result<Manifest> from_pb(const Phos__Image__Manifest& m) {
  if (m.kept && m.kept->device_uuid.len != sizeof(GpuDevice{}.uuid))
    return make_error("kept memory: a GPU UUID of " + std::to_string(m.kept->device_uuid.len) + " bytes (16 expected)");
  if (m.kept) {
    std::set<uint32_t> seen;
    for (size_t i = 0; i < m.kept->n_targets; i++) {
      const auto& t = *m.kept->targets[i];
      if (t.uuid.len != sizeof(GpuDevice{}.uuid))
        return make_error("kept memory of device " + std::to_string(t.ordinal) + ": a GPU UUID of " +
                          std::to_string(t.uuid.len) + " bytes (16 expected)");
      if (!seen.insert(t.ordinal).second)
        return make_error("kept memory: device " + std::to_string(t.ordinal) + " has two targets");
    }
  }
  auto devices = pb::try_decode_each(m.devices, m.n_devices, decode_device);
  if (!devices) return devices.error();
  return Manifest{
      .format_version = m.format_version,
      .writer_version = text(m.writer_version),
      .pid = m.pid,
      .protocol = static_cast<CopyProtocol>(m.protocol),
      .copy_trust = agent::CopyTrust(pb::value_or_zero(m.has_copy_trust, m.copy_trust)),
      .chunk_size = m.chunk_size,
      .created_unix_ns = m.created_unix_ns,
      .devices = std::move(devices.value()),
      .allocations =
          pb::decode_each(m.allocations, m.n_allocations,
                          [](const Phos__Gpu__Allocation& a) {
                            return Allocation{pb::from_pb(a), pb::decode_each(a.chunks, a.n_chunks, decode_chunk)};
                          }),
      .data_files = pb::decode_each(
          m.data_files, m.n_data_files,
          [](const Phos__Image__DataFile& f) { return DataFile{.name = text(f.name), .size = f.size}; }),
      .statistics = m.statistics ? decode_statistics(*m.statistics) : Statistics{},
      .launch_log = m.launch_log ? pb::decode_each(m.launch_log->launches, m.launch_log->n_launches, decode_launch)
                                 : std::vector<LaunchRecord>{},
      .fill_order = pb::repeated(m.fill_order, m.n_fill_order),
      .unsupported_calls = pb::strings(m.unsupported_calls, m.n_unsupported_calls),
      .kept = m.kept ? std::optional(decode_kept(*m.kept)) : std::nullopt,
      .validation = Validation(pb::value_or_zero(m.has_validation, uint32_t(m.validation))),
      .ipc_mappings = pb::allocations_from_pb(m.ipc_mappings, m.n_ipc_mappings),
      .parent = m.parent ? std::optional(ParentImage{.path = text(m.parent->path),
                                                     .manifest_size = m.parent->manifest_size,
                                                     .manifest_crc32c = m.parent->manifest_crc32c,
                                                     .created_unix_ns = m.parent->created_unix_ns})
                         : std::nullopt,
      .parent_files = {},
  };
}

}  // namespace

std::vector<std::byte> encode_manifest(const Manifest& m) {
  PbManifest encoded(m);
  return frame_file(kManifestMagic, m.format_version, pb::pack(encoded.m));
}

Result<Manifest> decode_manifest(std::span<const std::byte> file, std::string_view name) {
  auto unframed = unframe_file(file, kManifestMagic, kManifestFormatVersion, name, "manifest");
  if (!unframed) return unframed.error();
  auto unpacked = pb::unpack<Phos__Image__Manifest>(phos__image__manifest__descriptor, unframed->payload);
  if (!unpacked) return make_error(std::string(name) + ": manifest: protobuf payload does not parse");
  auto decoded = from_pb(*unpacked);
  if (!decoded) return make_error(std::string(name) + ": manifest: " + decoded.error().message);
  Manifest& m = decoded.value();
  if (m.format_version != unframed->format_version)
    return make_error(std::string(name) + ": manifest: header says format version " +
                      std::to_string(unframed->format_version) + ", payload says " +
                      std::to_string(m.format_version));
  PHOS_TRY(validate_manifest(m, name));
  return decoded;
}

bool is_migration_id(std::string_view id) {
  return id.size() == 16 && id.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

uint32_t format_version_for(const Manifest& m) {
  if (m.kept && !m.kept->targets.empty()) return kKeptTargetsFormatVersion;
  for (const auto& a : m.allocations)
    for (const auto& c : a.chunks)
      if (c.fingerprint) return kFingerprintFormatVersion;
  if (m.parent) return kParentFormatVersion;
  if (!m.ipc_mappings.empty()) return kIpcFormatVersion;
  if (m.kept) return kKeptMemoryFormatVersion;
  uint32_t version = 1;
  for (const auto& a : m.allocations)
    for (const auto& c : a.chunks) {
      if (c.compression == Compression::kDead) return kDeadChunkFormatVersion;
      if (c.compression == Compression::kZero) version = kZeroChunkFormatVersion;
    }
  return version;
}

namespace {

// A zero chunk stores nothing, and only a manifest of a version that knows
// zero chunks may have one. "" or what is wrong with it.
std::string zero_chunk_problem(const Manifest& m, const Chunk& c) {
  if (m.format_version < kZeroChunkFormatVersion)
    return "is a zero chunk, which format version " + std::to_string(m.format_version) + " does not have";
  if (c.stored_size != 0 || c.file_index != 0 || c.file_offset != 0)
    return "is a zero chunk but names " + std::to_string(c.stored_size) + " stored bytes in data file " +
           std::to_string(c.file_index) + " at offset " + std::to_string(c.file_offset);
  return "";
}

// A dead chunk stores nothing and has no checksum (its bytes are no part of
// the image). "" or what is wrong with it.
std::string dead_chunk_problem(const Manifest& m, const Chunk& c) {
  if (m.format_version < kDeadChunkFormatVersion)
    return "is a dead chunk, which format version " + std::to_string(m.format_version) + " does not have";
  if (c.stored_size != 0 || c.file_index != 0 || c.file_offset != 0 || c.crc32c != 0)
    return "is a dead chunk but names " + std::to_string(c.stored_size) + " stored bytes in data file " +
           std::to_string(c.file_index) + " at offset " + std::to_string(c.file_offset) + " (CRC-32C " +
           std::to_string(c.crc32c) + ")";
  return "";
}

// A parent chunk stores nothing here: an incremental image's parent holds it.
std::string parent_chunk_problem(const Manifest& m, const Chunk& c) {
  if (m.format_version < kParentFormatVersion)
    return "is a parent chunk, which format version " + std::to_string(m.format_version) + " does not have";
  if (!m.parent) return "is a parent chunk, but the manifest names no parent image";
  if (c.stored_size != 0 || c.file_index != 0 || c.file_offset != 0)
    return "is a parent chunk but names " + std::to_string(c.stored_size) + " stored bytes in data file " +
           std::to_string(c.file_index) + " at offset " + std::to_string(c.file_offset);
  return "";
}

// A chunk with stored bytes: their size fits its encoding and they lie in a
// listed data file. "" or what is wrong with it.
std::string stored_chunk_problem(const Manifest& m, const Chunk& c) {
  if (c.compression == Compression::kNone && c.stored_size != c.raw_size)
    return "is uncompressed but stores " + std::to_string(c.stored_size) + " of " + std::to_string(c.raw_size) +
           " bytes";
  if (c.stored_size == 0 || c.stored_size > ZSTD_compressBound(c.raw_size))
    return "stored size " + std::to_string(c.stored_size) + " is impossible";
  if (c.file_index >= m.data_files.size())
    return "refers to data file " + std::to_string(c.file_index) + ", not listed";
  const DataFile& f = m.data_files[c.file_index];
  if (c.file_offset < kDataHeaderSize || c.file_offset > f.size || f.size - c.file_offset < c.stored_size)
    return "lies outside " + f.name + " (" + std::to_string(f.size) + " bytes)";
  return "";
}

}  // namespace

namespace {

// Another process's memory mapped here: after version 4 only, with its
// owner, and apart from the process's own allocations.
template <class Fail>
Result<void> validate_ipc_mappings(const Manifest& m, std::set<uint64_t>& ids, std::map<uint64_t, uint64_t>& ranges,
                                   Fail& fail) {
  if (!m.ipc_mappings.empty() && m.format_version < kIpcFormatVersion)
    return fail("has CUDA IPC mappings, which format version " + std::to_string(m.format_version) + " does not have");
  for (const auto& a : m.ipc_mappings) {
    std::string what = "IPC mapping " + std::to_string(a.id);
    if (!a.ipc || a.ipc->owner_pid <= 0) return fail(what + " names no owner process");
    if (!(a.flags & kAllocIpcImported)) return fail(what + " is not marked imported");
    if (!ids.insert(a.id).second) return fail(what + " has the id of another allocation");
    if (a.size == 0 || a.address == 0 || a.address + a.size < a.address)
      return fail(what + " has an invalid address range");
    auto [it, inserted] = ranges.emplace(a.address, a.address + a.size);
    if (!inserted || (it != ranges.begin() && std::prev(it)->second > a.address) ||
        (std::next(it) != ranges.end() && std::next(it)->first < it->second))
      return fail(what + " overlaps another allocation");
  }
  return {};
}

}  // namespace

Result<void> validate_manifest(const Manifest& m, std::string_view name) {
  auto fail = [&](const std::string& why) { return make_error(std::string(name) + ": manifest: " + why); };
  if (m.format_version == 0 || m.format_version > kManifestFormatVersion)
    return fail("format version " + std::to_string(m.format_version) + " is not supported");
  if (m.pid <= 0) return fail("invalid pid " + std::to_string(m.pid));
  if (!is_dump_protocol(m.protocol)) {
    const std::string number = std::to_string(static_cast<uint32_t>(m.protocol));
    const std::string_view name_of = copy_protocol_name(m.protocol);
    return fail(name_of == "unknown" ? "unknown protocol " + number
                                     : "protocol " + number + " (" + std::string(name_of) + ") is no dump's");
  }
  if (copy_trust_name(m.copy_trust) == "unknown")
    return fail("unknown copy trust " + std::to_string(static_cast<uint32_t>(m.copy_trust)));
  if (validation_name(m.validation) == "unknown")
    return fail("unknown validation " + std::to_string(static_cast<uint32_t>(m.validation)));
  if (m.chunk_size < 4096 || m.chunk_size > kMaxChunkSize)
    return fail("chunk size " + std::to_string(m.chunk_size) + " is outside 4096.." + std::to_string(kMaxChunkSize));

  if (m.parent) {
    if (m.format_version < kParentFormatVersion)
      return fail("names a parent image, which format version " + std::to_string(m.format_version) + " does not have");
    if (m.parent->path.empty() || m.parent->path.find('\0') != std::string::npos)
      return fail("the parent image's path is empty or not text");
    if (m.kept) return fail("a migration's image names a parent image");
  }
  if (m.kept) {
    if (m.format_version < kKeptMemoryFormatVersion)
      return fail("names GPU data kept in device memory, which format version " + std::to_string(m.format_version) +
                  " does not have");
    if (!is_migration_id(m.kept->migration)) return fail("kept memory: invalid migration name '" + m.kept->migration + "'");
    if (!m.data_files.empty()) return fail("kept memory: the image also lists data files");
    if (!m.kept->targets.empty() && m.format_version < kKeptTargetsFormatVersion)
      return fail("keeps memory on several GPUs, which format version " + std::to_string(m.format_version) +
                  " does not have");
    for (const auto& d : m.devices)
      if (!m.kept->targets.empty() && !m.kept->targets.count(d.ordinal))
        return fail("kept memory: device " + std::to_string(d.ordinal) + " has no target GPU");
    for (const auto& target : m.kept->targets) {
      const uint32_t ordinal = target.first;  // not a structured binding: clang 14 cannot capture one
      if (std::none_of(m.devices.begin(), m.devices.end(), [&](const GpuDevice& x) { return x.ordinal == ordinal; }))
        return fail("kept memory: a target for device " + std::to_string(ordinal) + ", which the image does not have");
    }
  }

  std::set<uint32_t> ordinals;
  for (const auto& d : m.devices)
    if (!ordinals.insert(d.ordinal).second) return fail("device " + std::to_string(d.ordinal) + " listed twice");

  std::set<std::string> file_names;
  for (const auto& f : m.data_files) {
    if (!is_safe_data_file_name(f.name)) return fail("data file name '" + f.name + "' is not a phos-*.img name");
    if (!file_names.insert(f.name).second) return fail("data file " + f.name + " listed twice");
    if (f.size < kDataHeaderSize) return fail("data file " + f.name + " is smaller than its header");
  }

  std::set<uint64_t> ids;
  std::map<uint64_t, uint64_t> ranges;  // address -> end
  for (const auto& a : m.allocations) {
    std::string what = "allocation " + std::to_string(a.id);
    if (!ids.insert(a.id).second) return fail(what + " listed twice");
    if (!ordinals.count(a.device)) return fail(what + " is on device " + std::to_string(a.device) + ", not listed");
    if (a.size == 0) return fail(what + " has size 0");
    if (a.address == 0 || a.address + a.size < a.address) return fail(what + " has an invalid address range");
    auto [it, inserted] = ranges.emplace(a.address, a.address + a.size);
    if (!inserted) return fail(what + " overlaps another allocation");
    if (it != ranges.begin() && std::prev(it)->second > a.address) return fail(what + " overlaps another allocation");
    if (std::next(it) != ranges.end() && std::next(it)->first < it->second)
      return fail(what + " overlaps another allocation");

    if (m.kept) {
      if (!a.chunks.empty()) return fail(what + " has chunks, but its data is kept in device memory");
      continue;
    }
    uint64_t covered = 0;
    for (size_t k = 0; k < a.chunks.size(); k++) {
      const Chunk& c = a.chunks[k];
      std::string cw = what + " chunk " + std::to_string(k);
      if (c.alloc_offset != covered)
        return fail(cw + " starts at " + std::to_string(c.alloc_offset) + ", expected " + std::to_string(covered));
      if (c.raw_size == 0 || c.raw_size > m.chunk_size)
        return fail(cw + " has " + std::to_string(c.raw_size) + " bytes, chunk size is " + std::to_string(m.chunk_size));
      if (chunk_compression_name(c.compression) == "unknown") return fail(cw + " has an unknown compression");
      if (c.fingerprint && m.format_version < kFingerprintFormatVersion)
        return fail(cw + " has a fingerprint, which format version " + std::to_string(m.format_version) +
                    " does not have");
      if (c.fingerprint && c.compression == Compression::kDead) return fail(cw + " is a dead chunk with a fingerprint");
      std::string problem = c.compression == Compression::kZero     ? zero_chunk_problem(m, c)
                            : c.compression == Compression::kDead   ? dead_chunk_problem(m, c)
                            : c.compression == Compression::kParent ? parent_chunk_problem(m, c)
                                                                    : stored_chunk_problem(m, c);
      if (!problem.empty()) return fail(cw + " " + problem);
      covered += c.raw_size;
      if (covered > a.size) return fail(what + ": chunks hold more than its " + std::to_string(a.size) + " bytes");
    }
    if (covered != a.size)
      return fail(what + ": chunks hold " + std::to_string(covered) + " of its " + std::to_string(a.size) + " bytes");
  }
  return validate_ipc_mappings(m, ids, ranges, fail);
}

CompletionMarker marker_for(std::span<const std::byte> manifest_file, uint64_t completed_unix_ns) {
  return CompletionMarker{.format_version = kMarkerFormatVersion,
                          .manifest_size = manifest_file.size(),
                          .manifest_crc32c = crc32c(manifest_file),
                          .completed_unix_ns = completed_unix_ns};
}

std::vector<std::byte> encode_marker(const CompletionMarker& marker) {
  Phos__Image__CompletionMarker encoded = PHOS__IMAGE__COMPLETION_MARKER__INIT;
  encoded.format_version = marker.format_version;
  encoded.manifest_size = marker.manifest_size;
  encoded.manifest_crc32c = marker.manifest_crc32c;
  encoded.completed_unix_ns = marker.completed_unix_ns;
  return frame_file(kMarkerMagic, marker.format_version, pb::pack(encoded));
}

Result<CompletionMarker> decode_marker(std::span<const std::byte> file, std::string_view name) {
  auto unframed = unframe_file(file, kMarkerMagic, kMarkerFormatVersion, name, "completion marker");
  if (!unframed) return unframed.error();
  auto unpacked =
      pb::unpack<Phos__Image__CompletionMarker>(phos__image__completion_marker__descriptor, unframed->payload);
  if (!unpacked) return make_error(std::string(name) + ": completion marker: protobuf payload does not parse");
  return CompletionMarker{.format_version = unpacked->format_version,
                          .manifest_size = unpacked->manifest_size,
                          .manifest_crc32c = unpacked->manifest_crc32c,
                          .completed_unix_ns = unpacked->completed_unix_ns};
}

}  // namespace phos::image
