#include "phos/images/manifest.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include <zstd.h>

#include "framed_file.h"
#include "manifest.pb-c.h"
#include "phos/images/crc32c.h"

namespace phos::image {

std::string_view protocol_name(Protocol p) {
  switch (p) {
    case Protocol::kStopTheWorld: return "stop-the-world";
    case Protocol::kSoftRecopy: return "soft-recopy";
    case Protocol::kSoftCopyOnWrite: return "soft-copy-on-write";
  }
  return "unknown";
}

std::string_view copy_trust_name(agent::CopyTrust t) {
  switch (t) {
    case agent::CopyTrust::kExact: return "exact";
    case agent::CopyTrust::kSpeculated: return "speculated";
    case agent::CopyTrust::kValidated: return "validated";
  }
  return uint32_t(t) == 0 ? "none" : "unknown";
}

std::string_view compression_name(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kZstd: return "zstd";
    case Compression::kZero: return "zero";
  }
  return "unknown";
}

namespace {

// Owns the protobuf-c structs of one manifest while it is packed: they point
// into the C++ values and into each other.
struct PbManifest {
  Phos__Image__Manifest m = PHOS__IMAGE__MANIFEST__INIT;
  Phos__Image__Statistics stats = PHOS__IMAGE__STATISTICS__INIT;
  Phos__Image__LaunchLog log = PHOS__IMAGE__LAUNCH_LOG__INIT;
  Phos__Image__KeptMemory kept = PHOS__IMAGE__KEPT_MEMORY__INIT;
  std::vector<Phos__Image__Device> devices;
  std::vector<Phos__Image__Device*> device_ptrs;
  std::vector<Phos__Image__Allocation> allocs;
  std::vector<Phos__Image__Allocation*> alloc_ptrs;
  std::vector<std::vector<Phos__Image__Chunk>> chunks;
  std::vector<std::vector<Phos__Image__Chunk*>> chunk_ptrs;
  std::vector<Phos__Image__DataFile> files;
  std::vector<Phos__Image__DataFile*> file_ptrs;
  std::vector<Phos__Image__LaunchRecord> launches;
  std::vector<Phos__Image__LaunchRecord*> launch_ptrs;
  std::vector<char*> unsupported;

  explicit PbManifest(const Manifest& in) {
    m.format_version = in.format_version;
    m.writer_version = const_cast<char*>(in.writer_version.c_str());
    m.pid = in.pid;
    m.protocol = static_cast<Phos__Image__Protocol>(in.protocol);
    m.chunk_size = in.chunk_size;
    m.created_unix_ns = in.created_unix_ns;

    devices.resize(in.devices.size());
    for (size_t i = 0; i < in.devices.size(); i++) {
      const Device& d = in.devices[i];
      Phos__Image__Device& o = devices[i];
      phos__image__device__init(&o);
      o.ordinal = d.ordinal;
      o.uuid.len = d.uuid.size();
      o.uuid.data = const_cast<uint8_t*>(d.uuid.data());
      o.name = const_cast<char*>(d.name.c_str());
      o.total_memory = d.total_memory;
      o.has_compute_major = o.has_compute_minor = 1;
      o.compute_major = d.compute_major;
      o.compute_minor = d.compute_minor;
      device_ptrs.push_back(&o);
    }
    m.n_devices = device_ptrs.size();
    m.devices = device_ptrs.data();

    allocs.resize(in.allocations.size());
    chunks.resize(in.allocations.size());
    chunk_ptrs.resize(in.allocations.size());
    for (size_t i = 0; i < in.allocations.size(); i++) {
      const Allocation& a = in.allocations[i];
      Phos__Image__Allocation& o = allocs[i];
      phos__image__allocation__init(&o);
      o.id = a.id;
      o.device = a.device;
      o.address = a.address;
      o.size = a.size;
      o.flags = a.flags;
      chunks[i].resize(a.chunks.size());
      for (size_t k = 0; k < a.chunks.size(); k++) {
        const Chunk& c = a.chunks[k];
        Phos__Image__Chunk& oc = chunks[i][k];
        phos__image__chunk__init(&oc);
        oc.alloc_offset = c.alloc_offset;
        oc.file_index = c.file_index;
        oc.file_offset = c.file_offset;
        oc.raw_size = c.raw_size;
        oc.stored_size = c.stored_size;
        oc.crc32c = c.crc32c;
        oc.compression = static_cast<Phos__Image__Compression>(c.compression);
        chunk_ptrs[i].push_back(&oc);
      }
      o.n_chunks = chunk_ptrs[i].size();
      o.chunks = chunk_ptrs[i].data();
      alloc_ptrs.push_back(&o);
    }
    m.n_allocations = alloc_ptrs.size();
    m.allocations = alloc_ptrs.data();

    files.resize(in.data_files.size());
    for (size_t i = 0; i < in.data_files.size(); i++) {
      phos__image__data_file__init(&files[i]);
      files[i].name = const_cast<char*>(in.data_files[i].name.c_str());
      files[i].size = in.data_files[i].size;
      file_ptrs.push_back(&files[i]);
    }
    m.n_data_files = file_ptrs.size();
    m.data_files = file_ptrs.data();

    const Statistics& s = in.statistics;
    stats.has_quiesce_ns = stats.has_copy_ns = stats.has_write_ns = 1;
    stats.has_raw_bytes = stats.has_stored_bytes = stats.has_total_ns = 1;
    stats.has_dma_wait_ns = stats.has_checksum_ns = stats.has_compress_ns = 1;
    stats.has_workers = stats.has_direct_io = 1;
    stats.dma_wait_ns = s.dma_wait_ns;
    stats.checksum_ns = s.checksum_ns;
    stats.compress_ns = s.compress_ns;
    stats.workers = s.workers;
    stats.direct_io = s.direct_io;
    stats.quiesce_ns = s.quiesce_ns;
    stats.copy_ns = s.copy_ns;
    stats.write_ns = s.write_ns;
    stats.raw_bytes = s.raw_bytes;
    stats.stored_bytes = s.stored_bytes;
    stats.total_ns = s.total_ns;
    // The protocols' figures only where a dump had a window or a stall.
    auto optional = [](protobuf_c_boolean& has, uint64_t& field, uint64_t value) {
      has = value != 0;
      field = value;
    };
    optional(stats.has_stall_ns, stats.stall_ns, s.stall_ns);
    optional(stats.has_cow_pool_bytes, stats.cow_pool_bytes, s.cow_pool_bytes);
    optional(stats.has_cow_saved_bytes, stats.cow_saved_bytes, s.cow_saved_bytes);
    optional(stats.has_cow_calls_checked, stats.cow_calls_checked, s.cow_calls_checked);
    optional(stats.has_cow_calls_waited, stats.cow_calls_waited, s.cow_calls_waited);
    optional(stats.has_cow_unknown_waits, stats.cow_unknown_waits, s.cow_unknown_waits);
    optional(stats.has_cow_wait_ns, stats.cow_wait_ns, s.cow_wait_ns);
    optional(stats.has_cow_window_ns, stats.cow_window_ns, s.cow_window_ns);
    optional(stats.has_recopy_first_pass_bytes, stats.recopy_first_pass_bytes, s.recopy_first_pass_bytes);
    optional(stats.has_recopy_first_pass_ns, stats.recopy_first_pass_ns, s.recopy_first_pass_ns);
    optional(stats.has_recopied_bytes, stats.recopied_bytes, s.recopied_bytes);
    optional(stats.has_final_pass_ns, stats.final_pass_ns, s.final_pass_ns);
    optional(stats.has_zero_chunks, stats.zero_chunks, s.zero_chunks);
    optional(stats.has_zero_bytes, stats.zero_bytes, s.zero_bytes);
    optional(stats.has_program_transfers, stats.program_transfers, s.program_transfers);
    optional(stats.has_program_transfer_bytes, stats.program_transfer_bytes, s.program_transfer_bytes);
    optional(stats.has_traffic_pauses, stats.traffic_pauses, s.traffic_pauses);
    optional(stats.has_traffic_paused_ns, stats.traffic_paused_ns, s.traffic_paused_ns);
    optional(stats.has_recopy_wasted_bytes, stats.recopy_wasted_bytes, s.recopy_wasted_bytes);
    optional(stats.has_gate_closed_unix_ns, stats.gate_closed_unix_ns, s.gate_closed_unix_ns);
    m.statistics = &stats;
    if (in.kept) {
      const KeptMemory& k = *in.kept;
      kept.migration = const_cast<char*>(k.migration.c_str());
      kept.device_uuid.len = k.device_uuid.size();
      kept.device_uuid.data = const_cast<uint8_t*>(k.device_uuid.data());
      kept.device_name = const_cast<char*>(k.device_name.c_str());
      kept.has_in_place = kept.has_kept_bytes = 1;
      kept.in_place = k.in_place;
      kept.kept_bytes = k.kept_bytes;
      m.kept = &kept;
    }
    if (in.copy_trust != agent::CopyTrust(0)) {
      m.has_copy_trust = 1;
      m.copy_trust = uint32_t(in.copy_trust);
    }
    m.n_fill_order = in.fill_order.size();
    m.fill_order = const_cast<uint64_t*>(in.fill_order.data());

    launches.resize(in.launch_log.size());
    for (size_t i = 0; i < in.launch_log.size(); i++) {
      const LaunchRecord& r = in.launch_log[i];
      Phos__Image__LaunchRecord& o = launches[i];
      phos__image__launch_record__init(&o);
      o.sequence = r.sequence;
      o.kernel = const_cast<char*>(r.kernel.c_str());
      o.n_read_allocations = r.read_allocations.size();
      o.read_allocations = const_cast<uint64_t*>(r.read_allocations.data());
      o.n_write_allocations = r.write_allocations.size();
      o.write_allocations = const_cast<uint64_t*>(r.write_allocations.data());
      launch_ptrs.push_back(&o);
    }
    log.n_launches = launch_ptrs.size();
    log.launches = launch_ptrs.data();
    m.launch_log = &log;

    for (const auto& u : in.unsupported_calls) unsupported.push_back(const_cast<char*>(u.c_str()));
    m.n_unsupported_calls = unsupported.size();
    m.unsupported_calls = unsupported.data();
  }
};

Manifest from_pb(const Phos__Image__Manifest& m) {
  Manifest out;
  out.format_version = m.format_version;
  out.writer_version = m.writer_version ? m.writer_version : "";
  out.pid = m.pid;
  out.protocol = static_cast<Protocol>(m.protocol);
  out.chunk_size = m.chunk_size;
  out.created_unix_ns = m.created_unix_ns;
  for (size_t i = 0; i < m.n_devices; i++) {
    const auto& d = *m.devices[i];
    Device o;
    o.ordinal = d.ordinal;
    std::copy_n(d.uuid.data, std::min<size_t>(d.uuid.len, o.uuid.size()), o.uuid.begin());
    o.name = d.name ? d.name : "";
    o.total_memory = d.total_memory;
    o.compute_major = d.has_compute_major ? d.compute_major : 0;
    o.compute_minor = d.has_compute_minor ? d.compute_minor : 0;
    out.devices.push_back(std::move(o));
  }
  for (size_t i = 0; i < m.n_allocations; i++) {
    const auto& a = *m.allocations[i];
    Allocation o{{a.id, a.device, a.address, a.size, a.flags}, {}};
    o.chunks.reserve(a.n_chunks);
    for (size_t k = 0; k < a.n_chunks; k++) {
      const auto& c = *a.chunks[k];
      o.chunks.push_back(Chunk{c.alloc_offset, c.file_index, c.file_offset, c.raw_size, c.stored_size, c.crc32c,
                               static_cast<Compression>(c.compression)});
    }
    out.allocations.push_back(std::move(o));
  }
  for (size_t i = 0; i < m.n_data_files; i++)
    out.data_files.push_back(DataFile{m.data_files[i]->name ? m.data_files[i]->name : "", m.data_files[i]->size});
  if (const auto* s = m.statistics) {
    Statistics& o = out.statistics;
    o.quiesce_ns = s->quiesce_ns;
    o.copy_ns = s->copy_ns;
    o.write_ns = s->write_ns;
    o.raw_bytes = s->raw_bytes;
    o.stored_bytes = s->stored_bytes;
    o.total_ns = s->total_ns;
    o.dma_wait_ns = s->dma_wait_ns;
    o.checksum_ns = s->checksum_ns;
    o.compress_ns = s->compress_ns;
    o.workers = s->workers;
    o.direct_io = s->direct_io;
    o.stall_ns = s->stall_ns;
    o.cow_pool_bytes = s->cow_pool_bytes;
    o.cow_saved_bytes = s->cow_saved_bytes;
    o.cow_calls_checked = s->cow_calls_checked;
    o.cow_calls_waited = s->cow_calls_waited;
    o.cow_unknown_waits = s->cow_unknown_waits;
    o.cow_wait_ns = s->cow_wait_ns;
    o.cow_window_ns = s->cow_window_ns;
    o.recopy_first_pass_bytes = s->recopy_first_pass_bytes;
    o.recopy_first_pass_ns = s->recopy_first_pass_ns;
    o.recopied_bytes = s->recopied_bytes;
    o.final_pass_ns = s->final_pass_ns;
    o.zero_chunks = s->zero_chunks;
    o.zero_bytes = s->zero_bytes;
    o.program_transfers = s->program_transfers;
    o.program_transfer_bytes = s->program_transfer_bytes;
    o.traffic_pauses = s->traffic_pauses;
    o.traffic_paused_ns = s->traffic_paused_ns;
    o.recopy_wasted_bytes = s->recopy_wasted_bytes;
    o.gate_closed_unix_ns = s->gate_closed_unix_ns;
  }
  if (const auto* k = m.kept) {
    KeptMemory o;
    o.migration = k->migration ? k->migration : "";
    // A UUID of another length is refused before (decode_manifest).
    if (k->device_uuid.len == o.device_uuid.size())
      std::copy_n(k->device_uuid.data, o.device_uuid.size(), o.device_uuid.begin());
    o.device_name = k->device_name ? k->device_name : "";
    o.in_place = k->in_place;
    o.kept_bytes = k->kept_bytes;
    out.kept = std::move(o);
  }
  out.copy_trust = agent::CopyTrust(m.has_copy_trust ? m.copy_trust : 0);
  out.fill_order.assign(m.fill_order, m.fill_order + m.n_fill_order);
  if (const auto* log = m.launch_log) {
    for (size_t i = 0; i < log->n_launches; i++) {
      const auto& r = *log->launches[i];
      out.launch_log.push_back(LaunchRecord{
          r.sequence, r.kernel ? r.kernel : "",
          std::vector<uint64_t>(r.read_allocations, r.read_allocations + r.n_read_allocations),
          std::vector<uint64_t>(r.write_allocations, r.write_allocations + r.n_write_allocations)});
    }
  }
  for (size_t i = 0; i < m.n_unsupported_calls; i++) out.unsupported_calls.emplace_back(m.unsupported_calls[i]);
  return out;
}

template <class Msg>
std::vector<std::byte> pack(const Msg& msg) {
  std::vector<std::byte> out(protobuf_c_message_get_packed_size(&msg.base));
  protobuf_c_message_pack(&msg.base, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

}  // namespace

std::vector<std::byte> encode_manifest(const Manifest& m) {
  PbManifest pb(m);
  return frame_file(kManifestMagic, m.format_version, pack(pb.m));
}

Result<Manifest> decode_manifest(std::span<const std::byte> file, std::string_view name) {
  auto unframed = unframe_file(file, kManifestMagic, kManifestFormatVersion, name, "manifest");
  if (!unframed) return unframed.error();
  auto payload = unframed->payload;
  Phos__Image__Manifest* pb = phos__image__manifest__unpack(
      nullptr, payload.size(), reinterpret_cast<const uint8_t*>(payload.data()));
  if (!pb) return make_error(std::string(name) + ": manifest: protobuf payload does not parse");
  if (pb->kept && pb->kept->device_uuid.len != sizeof(KeptMemory{}.device_uuid)) {
    const size_t len = pb->kept->device_uuid.len;
    phos__image__manifest__free_unpacked(pb, nullptr);
    return make_error(std::string(name) + ": manifest: kept memory: a GPU UUID of " + std::to_string(len) +
                      " bytes (16 expected)");
  }
  Manifest m = from_pb(*pb);
  phos__image__manifest__free_unpacked(pb, nullptr);
  if (m.format_version != unframed->format_version)
    return make_error(std::string(name) + ": manifest: header says format version " +
                      std::to_string(unframed->format_version) + ", payload says " +
                      std::to_string(m.format_version));
  PHOS_TRY(validate_manifest(m, name));
  return m;
}

bool is_migration_id(std::string_view id) {
  return id.size() == 16 && id.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

uint32_t format_version_for(const Manifest& m) {
  if (m.kept) return kKeptMemoryFormatVersion;
  for (const auto& a : m.allocations)
    for (const auto& c : a.chunks)
      if (c.compression == Compression::kZero) return kZeroChunkFormatVersion;
  return 1;
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

Result<void> validate_manifest(const Manifest& m, std::string_view name) {
  auto fail = [&](const std::string& why) { return make_error(std::string(name) + ": manifest: " + why); };
  if (m.format_version == 0 || m.format_version > kManifestFormatVersion)
    return fail("format version " + std::to_string(m.format_version) + " is not supported");
  if (m.pid <= 0) return fail("invalid pid " + std::to_string(m.pid));
  if (protocol_name(m.protocol) == "unknown")
    return fail("unknown protocol " + std::to_string(static_cast<uint32_t>(m.protocol)));
  if (copy_trust_name(m.copy_trust) == "unknown")
    return fail("unknown copy trust " + std::to_string(static_cast<uint32_t>(m.copy_trust)));
  if (m.chunk_size < 4096 || m.chunk_size > kMaxChunkSize)
    return fail("chunk size " + std::to_string(m.chunk_size) + " is outside 4096.." + std::to_string(kMaxChunkSize));

  if (m.kept) {
    if (m.format_version < kKeptMemoryFormatVersion)
      return fail("names GPU data kept in device memory, which format version " + std::to_string(m.format_version) +
                  " does not have");
    if (!is_migration_id(m.kept->migration)) return fail("kept memory: invalid migration name '" + m.kept->migration + "'");
    if (!m.data_files.empty()) return fail("kept memory: the image also lists data files");
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
      if (compression_name(c.compression) == "unknown") return fail(cw + " has an unknown compression");
      std::string problem =
          c.compression == Compression::kZero ? zero_chunk_problem(m, c) : stored_chunk_problem(m, c);
      if (!problem.empty()) return fail(cw + " " + problem);
      covered += c.raw_size;
      if (covered > a.size) return fail(what + ": chunks hold more than its " + std::to_string(a.size) + " bytes");
    }
    if (covered != a.size)
      return fail(what + ": chunks hold " + std::to_string(covered) + " of its " + std::to_string(a.size) + " bytes");
  }
  return {};
}

CompletionMarker marker_for(std::span<const std::byte> manifest_file, uint64_t completed_unix_ns) {
  return CompletionMarker{kMarkerFormatVersion, manifest_file.size(), crc32c(manifest_file), completed_unix_ns};
}

std::vector<std::byte> encode_marker(const CompletionMarker& marker) {
  Phos__Image__CompletionMarker pb = PHOS__IMAGE__COMPLETION_MARKER__INIT;
  pb.format_version = marker.format_version;
  pb.manifest_size = marker.manifest_size;
  pb.manifest_crc32c = marker.manifest_crc32c;
  pb.completed_unix_ns = marker.completed_unix_ns;
  return frame_file(kMarkerMagic, marker.format_version, pack(pb));
}

Result<CompletionMarker> decode_marker(std::span<const std::byte> file, std::string_view name) {
  auto unframed = unframe_file(file, kMarkerMagic, kMarkerFormatVersion, name, "completion marker");
  if (!unframed) return unframed.error();
  auto payload = unframed->payload;
  auto* pb = phos__image__completion_marker__unpack(nullptr, payload.size(),
                                                    reinterpret_cast<const uint8_t*>(payload.data()));
  if (!pb) return make_error(std::string(name) + ": completion marker: protobuf payload does not parse");
  CompletionMarker m{pb->format_version, pb->manifest_size, pb->manifest_crc32c, pb->completed_unix_ns};
  phos__image__completion_marker__free_unpacked(pb, nullptr);
  return m;
}

}  // namespace phos::image
