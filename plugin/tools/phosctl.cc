// phosctl: look at GPU images and at running agents.
//
//   phosctl show DIR [--json]     what a GPU image holds
//   phosctl verify DIR            read every chunk and check its checksum
//   phosctl merge DIR OUT         fold an incremental image's chain into one image
//   phosctl status PID [--json]   ask a running process's agent
//   phosctl kernels PID [--json]  its kernels' read/write-set speculation
//   phosctl speculate PID on|off  turn that speculation on or off
//   phosctl validate PID on|off   turn the validation of it on or off
//   phosctl migrate PID --to GPU|--gpu-map SRC:DST,... --dir DIR --lib LIBDIR [--criu CRIU] [-- CRIU_ARGS]
//                                 move a running process to another GPU (each
//                                 of its GPUs to its own, with a map)
//   phosctl job dump|restore ...  checkpoint a job whose ranks run on several hosts
//   phosctl periodic PID ...      checkpoint a process every interval, the last N images kept
//   phosctl supervise ...         that, and restore the job from its last image when it dies
//   phosctl hold-gpus             keep a CUDA context on every GPU until SIGTERM, so that
//                                 restores do not pay for the GPU's first client
//   phosctl version
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "phos/images/format.h"
#include "phos/images/image_dir.h"
#include "phos/plugin/agent_client.h"
#include "phos/plugin/nccl_job.h"
#include "phos/plugin/gpu_map.h"
#include "phos/plugin/job_command.h"
#include "phos/plugin/proc.h"
#include "phos/speculation/demangle.h"
#include "phosctl_args.h"
#include "phosctl_hold_gpus.h"
#include "phosctl_job.h"
#include "phosctl_supervise.h"
#include "phos/support/clock.h"

namespace {

using nlohmann::json;
using phos::image::Manifest;

constexpr const char* kUsage =
    "usage: phosctl show DIR [--json]     print the GPU image in a CRIU image directory\n"
    "       phosctl verify DIR            read every chunk of it and check its checksum\n"
    "       phosctl merge DIR OUT         write DIR's GPU image, its chain of parent images folded in, into\n"
    "                                     the existing directory OUT as one image that names no parent\n"
    "                                     (phos's files only: copy criu's own there)\n"
    "       phosctl status PID [--json]   ask the phos agent of a running process\n"
    "       phosctl kernels PID [--json]  its kernels' read/write-set speculation, most unknown first\n"
    "       phosctl speculate PID on|off  turn that speculation on or off\n"
    "       phosctl validate PID on|off   turn the validation of the speculation on (speculating) or off\n"
    "       phosctl nccl-stop PID JOB CALL  hold the process's calls on NCCL communicator JOB (its job id,\n"
    "                                     as status prints it) before call number CALL\n"
    "       phosctl nccl-go PID JOB       let them go on\n"
    "       phosctl nccl-quiesce PID...   hold every rank of the NCCL communicator these processes share\n"
    "                                     before one call number, the same on each\n"
    "       phosctl migrate PID --to GPU --dir DIR --lib LIBDIR [--criu CRIU] [-- CRIU_ARGS...]\n"
    "                                     move a running process to GPU (an ordinal or UUID) of this host:\n"
    "                                     criu dump with migrate_to=GPU into DIR (GPU data goes GPU to GPU,\n"
    "                                     DIR gets the CPU images), then criu restore -d from DIR; CRIU_ARGS\n"
    "                                     go to both\n"
    "       phosctl migrate PID --gpu-map SRC:DST[,SRC:DST...] --dir DIR --lib LIBDIR ...\n"
    "                                     the same for a process on several GPUs: each GPU SRC it uses (as\n"
    "                                     nvidia-smi numbers them, or a UUID) to its own GPU DST, one to one\n"
    "                                     (e.g. 0:1,1:0 swaps two; SRC=DST too)\n"
    "       phosctl job dump|restore ...  checkpoint (restore) a job whose ranks run on several hosts, each\n"
    "                                     host's tree by its own criu (phosctl job, alone, says how)\n"
    "       phosctl periodic PID --dir ROOT --lib LIBDIR (--interval D | --mtbf D) [--keep N] [--incremental]\n"
    "                                     checkpoint PID every interval (Young/Daly's from --mtbf and the first\n"
    "                                     checkpoint's cost), the last N complete images kept\n"
    "       phosctl supervise (--pid PID | -- COMMAND...) --dir ROOT --lib LIBDIR (--interval D | --mtbf D)\n"
    "                         [--max-restarts N] [--gpu-map MAP] ...\n"
    "                                     that, and the job restored from its last complete image each time it\n"
    "                                     dies (phosctl periodic --help says all options)\n"
    "       phosctl hold-gpus                keep a CUDA context (its limits at their least) on every GPU until\n"
    "                                     SIGTERM or SIGINT: a restore's criu is then not the GPU's first\n"
    "                                     client (its cuInit 48 ms instead of 242 ms on an H200)\n"
    "       phosctl version\n";

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

std::string bytes_text(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, u++;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

double gb_per_s(uint64_t bytes, uint64_t ns) { return ns ? double(bytes) / double(ns) : 0.0; }

// What an image holds and what it takes, from its manifest itself (so an
// image of any version has them, whatever its statistics say).
struct ImageSize {
  uint64_t logical_bytes = 0;  // every allocation's bytes
  uint64_t stored_bytes = 0;   // the data files'
  uint64_t zero_chunks = 0;    // stored as holes (sparse images)
  uint64_t zero_bytes = 0;
  uint64_t dead_chunks = 0;    // free in the program's allocator at the checkpoint (phos.step())
  uint64_t dead_bytes = 0;
};

ImageSize size_of(const Manifest& m) {
  ImageSize size;
  for (const auto& a : m.allocations) {
    size.logical_bytes += a.size;
    for (const auto& c : a.chunks) {
      if (c.compression == phos::image::Compression::kZero) {
        size.zero_chunks++;
        size.zero_bytes += c.raw_size;
      } else if (c.compression == phos::image::Compression::kDead) {
        size.dead_chunks++;
        size.dead_bytes += c.raw_size;
      }
    }
  }
  for (size_t i = 0; i < m.data_files.size(); i++)
    if (!phos::image::parent_file(m, i)) size.stored_bytes += m.data_files[i].size;  // this image's own
  return size;
}

json image_json(const phos::image::ProcessImage& img) {
  const Manifest& m = img.manifest;
  json j = {{"manifest", img.manifest_name},
            {"complete", img.complete},
            {"format_version", m.format_version},
            {"writer_version", m.writer_version},
            {"pid", m.pid},
            {"protocol", std::string(phos::copy_protocol_name(m.protocol))},
            {"copy_trust", std::string(phos::image::copy_trust_name(m.copy_trust))},
            {"validation", std::string(phos::image::validation_name(m.validation))},
            {"chunk_size", m.chunk_size},
            {"created_unix_ns", m.created_unix_ns},
            {"devices", json::array()},
            {"allocations", json::array()},
            {"data_files", json::array()},
            {"unsupported_calls", m.unsupported_calls},
            {"launch_log_entries", m.launch_log.size()},
            {"fill_order", m.fill_order}};
  const ImageSize size = size_of(m);
  j["size"] = {{"logical_bytes", size.logical_bytes},
               {"stored_bytes", size.stored_bytes},
               {"zero_chunks", size.zero_chunks},
               {"zero_bytes", size.zero_bytes},
               {"dead_chunks", size.dead_chunks},
               {"dead_bytes", size.dead_bytes}};
  if (!img.complete) j["incomplete_reason"] = img.incomplete_reason;
  for (const auto& d : m.devices)
    j["devices"].push_back({{"ordinal", d.ordinal}, {"uuid", phos::plugin::format_gpu_uuid(d.uuid)}, {"name", d.name},
                            {"total_memory", d.total_memory},
                            {"compute_capability", std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)}});
  for (const auto& a : m.allocations) {
    uint64_t stored = 0, zero = 0, dead = 0;
    for (const auto& c : a.chunks) {
      stored += c.stored_size;
      zero += c.compression == phos::image::Compression::kZero;
      dead += c.compression == phos::image::Compression::kDead;
    }
    j["allocations"].push_back({{"id", a.id}, {"device", a.device}, {"address", hex(a.address)}, {"size", a.size},
                                {"flags", a.flags}, {"chunks", a.chunks.size()}, {"zero_chunks", zero},
                                {"dead_chunks", dead}, {"stored_bytes", stored}});
  }
  for (size_t i = 0; i < m.data_files.size(); i++)
    if (!phos::image::parent_file(m, i)) j["data_files"].push_back({{"name", m.data_files[i].name}, {"size", m.data_files[i].size}});
  // An incremental image: each image of its chain, this one first.
  j["chain"] = json::array();
  for (const auto& l : img.chain)
    j["chain"].push_back({{"directory", l.dir},
                          {"stored_chunks", l.stored_chunks},
                          {"stored_bytes", l.stored_bytes},
                          {"referenced_chunks", l.referenced_chunks},
                          {"referenced_bytes", l.referenced_bytes}});
  if (m.parent)
    j["parent"] = {{"path", m.parent->path},
                   {"manifest_size", m.parent->manifest_size},
                   {"manifest_crc32c", m.parent->manifest_crc32c},
                   {"created_unix_ns", m.parent->created_unix_ns}};
  j["ipc_mappings"] = json::array();
  for (const auto& a : m.ipc_mappings)
    j["ipc_mappings"].push_back({{"id", a.id}, {"device", a.device}, {"address", hex(a.address)}, {"size", a.size},
                                 {"owner_pid", a.ipc ? a.ipc->owner_pid : 0},
                                 {"owner_allocation", a.ipc ? a.ipc->owner_allocation : 0}});
  if (m.kept)
    j["kept"] = {{"migration", m.kept->migration},
                 {"device_uuid", phos::plugin::format_gpu_uuid(m.kept->device.uuid)},
                 {"device_name", m.kept->device.name},
                 {"in_place", m.kept->in_place},
                 {"kept_bytes", m.kept->kept_bytes},
                 {"targets", json::object()}};
  if (m.kept)
    for (const auto& [ordinal, d] : m.kept->targets)
      j["kept"]["targets"][std::to_string(ordinal)] = phos::plugin::format_gpu_uuid(d.uuid);
  const auto& s = m.statistics;
  j["statistics"] = {{"quiesce_ns", s.quiesce_ns}, {"copy_ns", s.copy_ns}, {"write_ns", s.write_ns},
                     {"raw_bytes", s.raw_bytes}, {"stored_bytes", s.stored_bytes}, {"zero_chunks", s.zero_chunks},
                     {"zero_bytes", s.zero_bytes}, {"total_ns", s.total_ns},
                     {"dma_wait_ns", s.dma_wait_ns}, {"checksum_ns", s.checksum_ns},
                     {"compress_ns", s.compress_ns}, {"workers", s.workers}, {"direct_io", s.direct_io},
                     {"copy_gb_per_s", gb_per_s(s.raw_bytes, s.copy_ns)}, {"stall_ns", s.stall_ns},
                     {"cow_pool_bytes", s.cow_pool_bytes}, {"cow_saved_bytes", s.cow_saved_bytes},
                     {"cow_calls_checked", s.copy_window.calls_checked},
                     {"cow_calls_waited", s.copy_window.calls_waited},
                     {"cow_unknown_waits", s.copy_window.unknown_waits}, {"cow_wait_ns", s.copy_window.wait_ns},
                     {"cow_window_ns", s.cow_window_ns}, {"recopy_first_pass_bytes", s.recopy_first_pass_bytes},
                     {"recopy_first_pass_ns", s.recopy_first_pass_ns}, {"recopied_bytes", s.recopied_bytes},
                     {"final_pass_ns", s.final_pass_ns}, {"program_transfers", s.program_transfers},
                     {"program_transfer_bytes", s.program_transfer_bytes}, {"traffic_pauses", s.traffic_pauses},
                     {"traffic_paused_ns", s.traffic_paused_ns}, {"recopy_wasted_bytes", s.recopy_wasted_bytes},
                     {"gate_closed_unix_ns", s.gate_closed_unix_ns}, {"sum_pass_ns", s.sum_pass_ns},
                     {"sum_checked_chunks", s.sum_checked_chunks}, {"sum_missed_chunks", s.sum_missed_chunks},
                     {"sum_unchanged_dirty_chunks", s.sum_unchanged_dirty_chunks},
                     {"ipc_stopped_bytes", s.ipc_stopped_bytes}};
  return j;
}

void print_image_text(const phos::image::ProcessImage& img) {
  const Manifest& m = img.manifest;
  const ImageSize size = size_of(m);
  std::printf("%s: process %d, %s, format v%u, written by phos %s\n", img.manifest_name.c_str(), m.pid,
              std::string(phos::copy_protocol_name(m.protocol)).c_str(), m.format_version, m.writer_version.c_str());
  std::printf("  complete: %s\n", img.complete ? "yes" : ("no (" + img.incomplete_reason + ")").c_str());
  size_t own_files = 0;
  for (size_t i = 0; i < m.data_files.size(); i++) own_files += !phos::image::parent_file(m, i);
  std::printf("  devices: %zu, allocations: %zu (%s), data files: %zu, chunk size %s\n", m.devices.size(),
              m.allocations.size(), bytes_text(size.logical_bytes).c_str(), own_files,
              bytes_text(m.chunk_size).c_str());
  for (const auto& d : m.devices)
    std::printf("  device %u: %s, %s, compute %u.%u, GPU-%s\n", d.ordinal, d.name.c_str(),
                bytes_text(d.total_memory).c_str(), d.compute_major, d.compute_minor, phos::plugin::format_gpu_uuid(d.uuid).c_str());
  if (!m.allocations.empty()) std::printf("  %8s %6s %18s %12s %7s\n", "id", "device", "address", "size", "chunks");
  for (const auto& a : m.allocations)
    std::printf("  %8" PRIu64 " %6u %18s %12s %7zu\n", a.id, a.device, hex(a.address).c_str(),
                bytes_text(a.size).c_str(), a.chunks.size());
  // Another process's memory, mapped here: its owner's image stores it.
  for (const auto& a : m.ipc_mappings)
    std::printf("  CUDA IPC: allocation %" PRIu64 " of process %d mapped here as %" PRIu64 " at %s on device %u "
                "(%s; stored in process %d's image)\n",
                a.ipc ? a.ipc->owner_allocation : 0, a.ipc ? a.ipc->owner_pid : 0, a.id, hex(a.address).c_str(),
                a.device, bytes_text(a.size).c_str(), a.ipc ? a.ipc->owner_pid : 0);
  if (m.kept && m.kept->targets.empty())
    std::printf(
        "  migration %s: the GPU data is in no file; phos-keeper keeps it on GPU %s (%s)%s until a restore "
        "takes it\n",
        m.kept->migration.c_str(), phos::plugin::format_gpu_uuid(m.kept->device.uuid).c_str(),
        m.kept->device.name.c_str(), m.kept->in_place ? ", where the process left it" : "");
  if (m.kept && !m.kept->targets.empty())
    std::printf("  migration %s: the GPU data is in no file; phos-keeper keeps it on %zu GPUs%s until a restore "
                "takes it:\n",
                m.kept->migration.c_str(), m.kept->targets.size(),
                m.kept->in_place ? ", where the process left it" : "");
  if (m.kept)
    for (const auto& [ordinal, d] : m.kept->targets)
      std::printf("    device %u's memory on GPU %s (%s)\n", ordinal, phos::plugin::format_gpu_uuid(d.uuid).c_str(),
                  d.name.c_str());
  if (m.parent) {
    std::printf("  incremental: a chain of %zu images, this one first\n", img.chain.size());
    for (const auto& l : img.chain)
      std::printf("    %s: stores %" PRIu64 " chunks (%s), references %" PRIu64 " (%s) in its parent\n", l.dir.c_str(),
                  l.stored_chunks, bytes_text(l.stored_bytes).c_str(), l.referenced_chunks,
                  bytes_text(l.referenced_bytes).c_str());
  }
  const auto& s = m.statistics;
  std::printf("  size: %s logical, %s stored; %" PRIu64 " zero chunks (%s) not stored; %" PRIu64
              " dead chunks (%s), free in the program's allocator, not stored\n",
              bytes_text(size.logical_bytes).c_str(), bytes_text(size.stored_bytes).c_str(), size.zero_chunks,
              bytes_text(size.zero_bytes).c_str(), size.dead_chunks, bytes_text(size.dead_bytes).c_str());
  std::printf("  statistics: quiesce %.3f ms, copy %.3f ms (%.2f GB/s), total %.3f ms\n", double(s.quiesce_ns) / 1e6,
              double(s.copy_ns) / 1e6, gb_per_s(s.raw_bytes, s.copy_ns), double(s.total_ns) / 1e6);
  if (s.workers)
    std::printf("  copy steps, summed over %u workers (%s): waiting for DMA %.3f ms, checksums %.3f ms, "
                "compression %.3f ms, writing %.3f ms\n",
                s.workers, s.direct_io ? "O_DIRECT" : "buffered I/O", double(s.dma_wait_ns) / 1e6,
                double(s.checksum_ns) / 1e6, double(s.compress_ns) / 1e6, double(s.write_ns) / 1e6);
  if (s.stall_ns) std::printf("  the process was stopped %.3f ms\n", double(s.stall_ns) / 1e6);
  if (m.protocol == phos::CopyProtocol::kSoftCopyOnWrite)
    std::printf("  copy-on-write: trusted %s write sets; pool %s, %s saved into it, %" PRIu64 " calls checked, %" PRIu64
                " waited (%" PRIu64 " with an unknown set) %.3f ms in all; the copy ended %.3f ms after the process "
                "ran again\n",
                std::string(phos::image::copy_trust_name(m.copy_trust)).c_str(), bytes_text(s.cow_pool_bytes).c_str(),
                bytes_text(s.cow_saved_bytes).c_str(), s.copy_window.calls_checked, s.copy_window.calls_waited,
                s.copy_window.unknown_waits, double(s.copy_window.wait_ns) / 1e6, double(s.cow_window_ns) / 1e6);
  if (s.ipc_stopped_bytes)
    std::printf("  of it, %s that other processes map through CUDA IPC copied while they were all stopped\n",
                bytes_text(s.ipc_stopped_bytes).c_str());
  if (m.protocol == phos::CopyProtocol::kSoftRecopy)
    std::printf("  soft recopy: trusted %s write sets; %s copied in %.3f ms while the process ran, %s written "
                "meanwhile copied again; the final pass took %.3f ms\n",
                std::string(phos::image::copy_trust_name(m.copy_trust)).c_str(),
                bytes_text(s.recopy_first_pass_bytes).c_str(), double(s.recopy_first_pass_ns) / 1e6,
                bytes_text(s.recopied_bytes).c_str(), double(s.final_pass_ns) / 1e6);
  if (m.protocol == phos::CopyProtocol::kSoftRecopy)
    std::printf("  of the first pass, %s written after its copy (copied again)\n",
                bytes_text(s.recopy_wasted_bytes).c_str());
  if (m.validation == phos::image::Validation::kChecksum)
    std::printf("  validated by checksum: %" PRIu64 " copies equal to the memory's fingerprints (pass %.3f ms)%s\n",
                s.sum_checked_chunks, double(s.sum_pass_ns) / 1e6,
                m.protocol == phos::CopyProtocol::kSoftRecopy
                    ? ("; " + std::to_string(s.sum_missed_chunks) + " chunks changed without a dirty mark, " +
                       std::to_string(s.sum_unchanged_dirty_chunks) + " dirty but unchanged")
                          .c_str()
                    : "");
  if (s.program_transfers || s.traffic_pauses)
    std::printf("  the process's own transfers while it ran: %" PRIu64 " (%s) between host and device; the engine "
                "paused %" PRIu64 " times for them, %.3f ms summed over its workers\n",
                s.program_transfers, bytes_text(s.program_transfer_bytes).c_str(), s.traffic_pauses,
                double(s.traffic_paused_ns) / 1e6);
  if (!m.unsupported_calls.empty()) {
    std::printf("  unsupported calls:");
    for (const auto& c : m.unsupported_calls) std::printf(" %s", c.c_str());
    std::printf("\n");
  }
  if (!m.fill_order.empty())
    std::printf("  fill order: %zu allocations the recorded launches touched first (an on-demand restore fills them "
                "first)\n",
                m.fill_order.size());
}

int open_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) std::fprintf(stderr, "phosctl: %s: %s\n", dir.c_str(), std::strerror(errno));
  return fd;
}

int cmd_merge(const std::string& dir, const std::string& out) {
  phos::UniqueFd dirfd(open_dir(dir));
  if (!dirfd.valid()) return 1;
  phos::UniqueFd outfd(open_dir(out));
  if (!outfd.valid()) return 1;
  auto pids = phos::image::list_process_images(dirfd.get());
  if (!pids) {
    std::fprintf(stderr, "phosctl: %s: %s\n", dir.c_str(), pids.error().message.c_str());
    return 1;
  }
  if (pids->empty()) {
    std::fprintf(stderr, "phosctl: %s: no phos GPU image here\n", dir.c_str());
    return 1;
  }
  for (int32_t pid : *pids) {
    auto merged = phos::image::merge_chain(dirfd.get(), pid, outfd.get());
    if (!merged) {
      std::fprintf(stderr, "phosctl: merge into %s: %s\n", out.c_str(), merged.error().message.c_str());
      return 1;
    }
    std::printf("%s: merged into %s, %s stored\n", phos::image::manifest_file_name(pid).c_str(), out.c_str(),
                bytes_text(merged->statistics.stored_bytes).c_str());
  }
  return 0;
}

int cmd_show(const std::string& dir, bool as_json, bool verify) {
  phos::UniqueFd dirfd(open_dir(dir));
  if (!dirfd.valid()) return 1;
  auto pids = phos::image::list_process_images(dirfd.get());
  if (!pids) {
    std::fprintf(stderr, "phosctl: %s: %s\n", dir.c_str(), pids.error().message.c_str());
    return 1;
  }
  json all = {{"directory", dir}, {"images", json::array()}};
  if (pids->empty()) {
    if (as_json)
      std::cout << all.dump(2) << "\n";
    else
      std::printf("%s: no phos GPU image here (no phos-*-manifest.img files)\n", dir.c_str());
    return verify ? 1 : 0;
  }
  int rc = 0;
  for (int32_t pid : *pids) {
    auto img = phos::image::open_process_image(dirfd.get(), pid, /*require_complete=*/false);
    if (!img) {
      std::fprintf(stderr, "phosctl: %s\n", img.error().message.c_str());
      if (as_json) all["images"].push_back({{"manifest", phos::image::manifest_file_name(pid)}, {"error", img.error().message}});
      rc = 1;
      continue;
    }
    if (verify) {
      phos::image::ImageReader reader(dirfd.get(), img->manifest);
      auto checked = reader.verify_all();
      if (!checked) {
        std::fprintf(stderr, "phosctl: %s\n", checked.error().message.c_str());
        rc = 1;
      } else if (!img->complete) {
        std::fprintf(stderr, "phosctl: %s: %s\n", img->manifest_name.c_str(), img->incomplete_reason.c_str());
        rc = 1;
      } else if (img->manifest.kept) {
        std::printf("%s: ok; its GPU data is with phos-keeper (migration %s), not in the image: nothing to check\n",
                    img->manifest_name.c_str(), img->manifest.kept->migration.c_str());
      } else {
        std::printf("%s: ok, %s in %zu allocations checked\n", img->manifest_name.c_str(), bytes_text(*checked).c_str(),
                    img->manifest.allocations.size());
      }
    } else if (as_json) {
      all["images"].push_back(image_json(*img));
    } else {
      print_image_text(*img);
    }
  }
  if (as_json && !verify) std::cout << all.dump(2) << "\n";
  return rc;
}

// The pid in `text`, or 0 (after saying why) when it is not one.
pid_t parse_pid(const std::string& text) {
  char* end = nullptr;
  long pid = std::strtol(text.c_str(), &end, 10);
  if (*end || pid <= 0 || pid != long(pid_t(pid))) {
    std::fprintf(stderr, "phosctl: '%s' is not a pid\n%s", text.c_str(), kUsage);
    return 0;
  }
  return pid_t(pid);
}

// Runs `fn` with the agent of `pid` and says goodbye; the exit status: 1
// where the agent cannot be reached or `fn` fails (which it says why).
int with_client(pid_t pid, const std::function<phos::Result<void>(phos::plugin::AgentClient&)>& fn) {
  auto client = phos::plugin::AgentClient::connect(pid, 5000);
  if (!client) {
    std::fprintf(stderr, "phosctl: %s\n", client.error().message.c_str());
    return 1;
  }
  auto done = fn(*client);
  (void)client->goodbye();
  if (!done) {
    std::fprintf(stderr, "phosctl: process %d: %s\n", int(pid), done.error().message.c_str());
    return 1;
  }
  return 0;
}

// The agent's status, or nullopt (after saying why).
std::optional<phos::agent::StatusReply> fetch_status(pid_t pid, phos::agent::HelloReply* hello = nullptr) {
  std::optional<phos::agent::StatusReply> out;
  int rc = with_client(pid, [&](phos::plugin::AgentClient& c) -> phos::Result<void> {
    auto status = c.status();
    if (!status) return status.error();
    if (hello) *hello = c.hello();
    out = std::move(*status);
    return {};
  });
  if (rc != 0) out.reset();
  return out;
}

std::string percent(uint64_t part, uint64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", whole ? 100.0 * double(part) / double(whole) : 0.0);
  return buf;
}

json kernel_json(const phos::agent::KernelSpeculation& k) {
  json j = {{"name", k.name},
            {"demangled", phos::speculation::demangle(k.name.c_str())},
            {"module", k.module},
            {"launches", k.launches},
            {"exact", k.exact},
            {"speculated", k.speculated},
            {"unknown", k.unknown},
            {"buffers", k.buffers},
            {"reads", k.reads},
            {"writes", k.writes},
            {"types", k.types}};
  if (!k.note.empty()) j["note"] = k.note;
  return j;
}

// The speculation part of a status: the same keys in `status --json` and
// `kernels --json`.
json devices_json(const std::vector<phos::GpuDevice>& devices) {
  json out = json::array();
  for (const auto& d : devices) out.push_back({{"ordinal", d.ordinal}, {"uuid", phos::plugin::format_gpu_uuid(d.uuid)}});
  return out;
}

json speculation_json(const phos::agent::StatusReply& s) {
  json j = {{"speculation_active", s.speculation_active},
            {"indexed_buffers", s.indexed_buffers},
            {"kernel_count", s.kernel_count},
            {"kernels", json::array()}};
  for (const auto& k : s.kernels) j["kernels"].push_back(kernel_json(k));
  return j;
}

// The kernels' launches summed: all, exact, speculated, unknown.
struct LaunchTotals {
  uint64_t launches = 0, exact = 0, speculated = 0, unknown = 0;
};
LaunchTotals launch_totals(const std::vector<phos::agent::KernelSpeculation>& kernels) {
  LaunchTotals t;
  for (const auto& k : kernels) {
    t.launches += k.launches;
    t.exact += k.exact;
    t.speculated += k.speculated;
    t.unknown += k.unknown;
  }
  return t;
}

// "12", or "1000 of 1500 (those with the most launches)" where the agent
// sent only those.
std::string kernel_count_text(const phos::agent::StatusReply& s) {
  if (s.kernel_count > s.kernels.size())
    return std::to_string(s.kernels.size()) + " of " + std::to_string(s.kernel_count) +
           " (those with the most launches)";
  return std::to_string(s.kernels.size());
}

// The call counter's part of a status (PHOS_CALL_CYCLES=on): per kind of
// call, how many and the time phos's own code took in them, most time
// first. null while the counter is off.
std::vector<phos::agent::CallCost> by_time(std::vector<phos::agent::CallCost> calls) {
  std::stable_sort(calls.begin(), calls.end(), [](const auto& a, const auto& b) { return a.ns > b.ns; });
  return calls;
}

double mean_ns(uint64_t ns, uint64_t calls) { return calls ? double(ns) / double(calls) : 0.0; }

json call_cycles_json(const phos::agent::StatusReply& s) {
  if (!s.call_cycles) return nullptr;
  const double floor_ns = s.call_cycles->floor_cycles_per_call * 1e9 / s.call_cycles->cycles_per_second;
  json j = {{"cycles_per_second", s.call_cycles->cycles_per_second},
            {"floor_ns_per_call", floor_ns},
            {"calls", json::array()}};
  uint64_t calls = 0, cycles = 0, ns = 0;
  for (const auto& c : by_time(s.call_cycles->calls)) {
    j["calls"].push_back({{"call", c.call}, {"calls", c.calls}, {"cycles", c.cycles}, {"ns", c.ns},
                          {"mean_ns", mean_ns(c.ns, c.calls)}});
    calls += c.calls;
    cycles += c.cycles;
    ns += c.ns;
  }
  j["total"] = {{"calls", calls}, {"cycles", cycles}, {"ns", ns}, {"mean_ns", mean_ns(ns, calls)}};
  return j;
}

void print_call_cycles(const phos::agent::StatusReply& s) {
  if (!s.call_cycles) return;
  uint64_t calls = 0, ns = 0;
  for (const auto& c : s.call_cycles->calls) {
    calls += c.calls;
    ns += c.ns;
  }
  std::printf("  time inside phos (PHOS_CALL_CYCLES, clock %.3f GHz): %" PRIu64 " calls, %.3f ms, %.1f ns a call "
              "(of which the counter's own: %.1f)\n",
              s.call_cycles->cycles_per_second / 1e9, calls, double(ns) / 1e6, mean_ns(ns, calls),
              s.call_cycles->floor_cycles_per_call * 1e9 / s.call_cycles->cycles_per_second);
  for (const auto& c : by_time(s.call_cycles->calls))
    std::printf("    %s: %" PRIu64 " calls, %.3f ms, %.1f ns a call (%" PRIu64 " cycles)\n", c.call.c_str(), c.calls,
                double(c.ns) / 1e6, mean_ns(c.ns, c.calls), c.cycles);
}

int cmd_status(const std::string& pid_text, bool as_json) {
  pid_t pid = parse_pid(pid_text);
  if (!pid) return 2;
  phos::agent::HelloReply h;
  auto status = fetch_status(pid, &h);
  if (!status) return 1;
  if (as_json) {
    json j = {{"pid", pid},
              {"agent_version", h.agent_version},
              {"protocol_version", h.protocol_version},
              {"pid_in_namespace", h.pid},
              {"agent_tid", h.agent_tid},
              {"uid", h.uid},
              {"gate_open", status->gate_open},
              {"cow_missed", status->cow_missed},
              {"cuda_initialized", status->cuda_initialized},
              {"allocation_count", status->allocation_count},
              {"allocated_bytes", status->allocated_bytes},
              {"device_count", status->device_count},
              {"devices", devices_json(status->devices)},
              {"unsupported_calls", status->unsupported_calls},
              {"counters", json::object()}};
    for (const auto& [name, value] : status->counters) j["counters"][name] = value;
    j["modules"] = json::array();
    for (const auto& m : status->modules)
      j["modules"].push_back({{"id", m.id}, {"kind", m.kind}, {"size", m.size}, {"hash", hex(m.hash)},
                              {"source", m.source}, {"function_count", m.function_count},
                              {"functions", m.functions}, {"globals", m.globals}});
    j["nccl_communicators"] = json::array();
    for (const auto& c : status->nccl_communicators)
      j["nccl_communicators"].push_back({{"rank", c.rank}, {"nranks", c.nranks}, {"device", c.device},
                                         {"job_id", hex(c.job_id)}, {"calls", c.calls},
                                         {"single_process", c.single_process}, {"held", c.held},
                                         {"stop_at", c.stop_at ? json(*c.stop_at) : json(nullptr)},
                                         {"released", c.released}, {"rebuilds", c.rebuilds}});
    j.update(speculation_json(*status));
    j["call_cycles"] = call_cycles_json(*status);
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("process %d: phos agent %s (protocol %u), uid %u\n", int(pid), h.agent_version.c_str(),
                h.protocol_version, h.uid);
    std::printf("  gate: %s\n  CUDA: %s, %u devices\n  allocations: %" PRIu64 " (%s)\n",
                status->gate_open ? "open" : "closed", status->cuda_initialized ? "initialized" : "not initialized",
                status->device_count, status->allocation_count, bytes_text(status->allocated_bytes).c_str());
    for (const auto& d : status->devices)
      std::printf("  device %u: %s\n", d.ordinal, phos::plugin::format_gpu_uuid(d.uuid).c_str());
    for (const auto& c : status->unsupported_calls) std::printf("  unsupported call: %s\n", c.c_str());
    for (const auto& e : status->ipc_exports)
      std::printf("  CUDA IPC: allocation %" PRIu64 " open in %s\n", e.allocation,
                  e.importer_pid ? ("process " + std::to_string(e.importer_pid)).c_str()
                                 : "a process outside its pid namespace");
    for (const auto& c : status->nccl_communicators)
      std::printf("  NCCL communicator %016" PRIx64 ": rank %d of %d%s, device %d, %" PRIu64 " calls%s%s%s\n",
                  c.job_id, c.rank, c.nranks, c.single_process ? " (all in this process)" : "", c.device, c.calls,
                  !c.stop_at ? ""
                  : c.held   ? ", held at its stop"
                             : ", a stop armed",
                  c.released ? ", released for a checkpoint" : "",
                  c.rebuilds ? (", made again " + std::to_string(c.rebuilds) + " times").c_str() : "");
    for (const auto& [name, value] : status->counters) std::printf("  %s: %" PRIu64 "\n", name.c_str(), value);
    for (const auto& m : status->modules)
      std::printf("  module %" PRIu64 ": %s, %s, hash %016" PRIx64 ", %" PRIu64 " functions, %zu globals, from %s\n",
                  m.id, m.kind.c_str(), bytes_text(m.size).c_str(), m.hash, m.function_count, m.globals.size(),
                  m.source.c_str());
    std::printf("  speculation: %s, %" PRIu64 " buffers indexed\n", status->speculation_active ? "on" : "off",
                status->indexed_buffers);
    if (status->cow_missed)
      std::printf("  copy-on-write: off for this process: a dump found a write that speculation missed "
                  "(cow_trust=checksum); its dumps copy while it is stopped\n");
    if (!status->kernels.empty()) {
      LaunchTotals t = launch_totals(status->kernels);
      std::printf("  kernels: %s, %" PRIu64 " launches: %s exact, %s speculated, %s unknown\n",
                  kernel_count_text(*status).c_str(), t.launches, percent(t.exact, t.launches).c_str(),
                  percent(t.speculated, t.launches).c_str(), percent(t.unknown, t.launches).c_str());
    }
    print_call_cycles(*status);
  }
  return 0;
}

int cmd_kernels(const std::string& pid_text, bool as_json) {
  pid_t pid = parse_pid(pid_text);
  if (!pid) return 2;
  auto status = fetch_status(pid);
  if (!status) return 1;
  // Most unknown launches first: those are the kernels whose sets cost a
  // checkpoint the most; then the busiest.
  auto kernels = status->kernels;
  std::stable_sort(kernels.begin(), kernels.end(), [](const auto& a, const auto& b) {
    return a.unknown != b.unknown ? a.unknown > b.unknown : a.launches > b.launches;
  });
  if (as_json) {
    status->kernels = std::move(kernels);
    json j = speculation_json(*status);
    j["pid"] = pid;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("process %d: speculation %s, kernels: %s\n", int(pid), status->speculation_active ? "on" : "off",
              kernel_count_text(*status).c_str());
  if (kernels.empty()) return 0;
  std::printf("  %10s %10s %10s %10s %10s %10s %10s %-6s %s\n", "launches", "exact", "speculated", "unknown",
              "buf/launch", "reads", "writes", "types", "name");
  for (const auto& k : kernels) {
    char avg[32] = "-";
    if (k.launches) std::snprintf(avg, sizeof(avg), "%.1f", double(k.buffers) / double(k.launches));
    std::printf("  %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10s %10" PRIu64 " %10" PRIu64
                " %-6s %s%s%s\n",
                k.launches, k.exact, k.speculated, k.unknown, avg, k.reads, k.writes, k.types.c_str(),
                phos::speculation::demangle(k.name.c_str()).c_str(), k.note.empty() ? "" : "  -- ",
                k.note.c_str());
  }
  return 0;
}

// `phosctl speculate|validate PID on|off`.
int cmd_switch(const std::string& what, const std::string& pid_text, const std::string& switch_text) {
  if (switch_text != "on" && switch_text != "off") {
    std::fprintf(stderr, "phosctl: %s takes on or off, not '%s'\n%s", what.c_str(), switch_text.c_str(), kUsage);
    return 2;
  }
  pid_t pid = parse_pid(pid_text);
  if (!pid) return 2;
  bool on = switch_text == "on", validate = what == "validate", sass = false;
  int rc = with_client(pid, [on, validate, &sass](phos::plugin::AgentClient& c) -> phos::Result<void> {
    if (!validate) return c.set_speculation(on);
    auto set = c.set_validation(on);
    if (!set) return set.error();
    sass = *set;
    return {};
  });
  if (rc != 0) return rc;
  std::printf("process %d: %s %s%s\n", int(pid), validate ? "validation" : "speculation", on ? "on" : "off",
              validate && on && !sass ? " (PTX twins only: the SASS-level validator attaches only at start, with "
                                        "PHOS_VALIDATE=1 or sass)"
                                      : "");
  return rc;
}

// `phosctl nccl-stop PID JOB CALL` and `phosctl nccl-go PID JOB`: JOB as
// status prints it (hexadecimal).
int cmd_nccl_stop(const std::string& pid_text, const std::string& job_text, const std::string* call_text) {
  pid_t pid = parse_pid(pid_text);
  if (!pid) return 2;
  char* end = nullptr;
  uint64_t job = std::strtoull(job_text.c_str(), &end, 16);
  if (job_text.empty() || *end) {
    std::fprintf(stderr, "phosctl: '%s' is not a communicator's job id (hexadecimal, as status prints it)\n",
                 job_text.c_str());
    return 2;
  }
  std::optional<uint64_t> at;
  if (call_text) {
    at = std::strtoull(call_text->c_str(), &end, 10);
    if (call_text->empty() || *end) {
      std::fprintf(stderr, "phosctl: '%s' is not a call number\n", call_text->c_str());
      return 2;
    }
  }
  bool armed = false;
  int rc = with_client(pid, [&](phos::plugin::AgentClient& c) -> phos::Result<void> {
    auto r = c.nccl_stop(job, at);
    if (!r) return r.error();
    armed = *r;
    return {};
  });
  if (rc != 0) return rc;
  if (!at) {
    std::printf("process %d: NCCL communicator %016" PRIx64 ": calls go on\n", int(pid), job);
    return 0;
  }
  if (!armed) {
    std::fprintf(stderr, "phosctl: process %d has no NCCL communicator %016" PRIx64 " short of call %" PRIu64 "\n",
                 int(pid), job, *at);
    return 1;
  }
  std::printf("process %d: NCCL communicator %016" PRIx64 ": held before call %" PRIu64 "\n", int(pid), job, *at);
  return 0;
}


// `phosctl nccl-quiesce PID...`: the ranks of one job, held at one
// collective boundary. Every rank issues a communicator's calls in the
// same order, so a stop armed at the same call number K on each holds them
// all where none has issued K and each has issued all before it. K is a
// little past the furthest rank; a rank that got past K before its stop was
// armed refuses it, and all are disarmed and tried again further on.
int cmd_nccl_quiesce(const std::vector<std::string>& pid_texts) {
  std::vector<pid_t> pids;
  for (const auto& t : pid_texts) {
    pid_t p = parse_pid(t);
    if (!p) return 2;
    pids.push_back(p);
  }
  std::vector<phos::agent::StatusReply> first;
  for (pid_t p : pids) {
    auto s = fetch_status(p);
    if (!s) return 1;
    first.push_back(std::move(*s));
  }
  // The job: the first communicator of the first process that every one has.
  std::optional<uint64_t> job;
  for (const auto& c : first[0].nccl_communicators) {
    bool everywhere = true;
    for (const auto& s : first) everywhere = everywhere && phos::plugin::job_communicator(s, c.job_id);
    if (everywhere && !c.single_process) {
      job = c.job_id;
      break;
    }
  }
  if (!job) {
    std::fprintf(stderr, "phosctl: these processes share no NCCL communicator\n");
    return 1;
  }
  auto held = phos::plugin::hold_nccl_job(pids, *job, 5000, std::chrono::seconds(30), false);
  if (!held) {
    std::fprintf(stderr, "phosctl: %s; every stop lifted\n", held.error().message.c_str());
    return 1;
  }
  std::printf("held %zu processes before call %" PRIu64 " of NCCL communicator %016" PRIx64 "\n", pids.size(),
              held->at_call, *job);
  return 0;
}

// Runs `argv` with `extra_env` added to the environment (job_command.h);
// its exit status, -1 where it could not start (said on stderr).
int run_or_say(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  auto rc = phos::plugin::run_command(argv, extra_env);
  if (!rc) {
    std::fprintf(stderr, "phosctl: %s\n", rc.error().message.c_str());
    return -1;
  }
  return *rc;
}

// phosctl migrate: a dump with migrate_to (the plugin moves the GPU data and
// phos-keeper holds it), then a restore from the same directory.
int cmd_migrate(const std::vector<std::string>& args) {
  std::string error;
  auto a = phosctl::parse_args(args, {}, 1, error);
  if (a) error = a->unknown({"--to", "--gpu-map", "--dir", "--lib", "--criu"});
  if (!a || !error.empty()) {
    std::fprintf(stderr, "phosctl migrate: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  const std::string pid_text = a->positional.empty() ? "" : a->positional[0], gpu_map = a->one("--gpu-map"),
                    dir = a->one("--dir"), lib = a->one("--lib"), criu = a->flag("--criu") ? a->one("--criu") : "criu";
  std::string gpu = a->one("--to");  // or the map, said as the plugin takes it
  const std::vector<std::string>& criu_args = a->rest;
  if (pid_text.empty() || gpu.empty() == gpu_map.empty() || dir.empty() || lib.empty()) {
    std::fprintf(stderr, "phosctl migrate: PID, --to or --gpu-map (one of them), --dir and --lib are needed\n%s",
                 kUsage);
    return 2;
  }
  // The map's syntax here; whether it fits the process's GPUs and this
  // host's, at the dump (the plugin says why not).
  if (!gpu_map.empty()) {
    auto map = phos::plugin::parse_migration_map(gpu_map);
    if (!map) {
      std::fprintf(stderr, "phosctl migrate: --gpu-map %s: %s\n", gpu_map.c_str(), map.error().message.c_str());
      return 2;
    }
    gpu = phos::plugin::describe_migration_map(*map);
  } else if (!phos::plugin::is_gpu_key(gpu)) {
    std::fprintf(stderr, "phosctl migrate: --to %s: neither a GPU ordinal nor a UUID\n", gpu.c_str());
    return 2;
  }
  pid_t pid = parse_pid(pid_text);
  if (!pid) return 2;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "phosctl: %s: %s\n", dir.c_str(), std::strerror(errno));
    return 1;
  }
  {
    phos::UniqueFd dirfd(open_dir(dir));
    if (!dirfd.valid()) return 1;
    auto pids = phos::image::list_process_images(dirfd.get());
    if (!pids || !pids->empty()) {
      std::fprintf(stderr, "phosctl: %s holds a GPU image already; a migration needs a directory of its own\n",
                   dir.c_str());
      return 1;
    }
  }
  std::vector<std::string> dump = {criu, "dump", "-t", std::to_string(pid), "-D", dir, "--lib", lib,
                                   "-o", "migrate-dump.log", "-v4"};
  dump.insert(dump.end(), criu_args.begin(), criu_args.end());
  const uint64_t t0 = phos::realtime_ns();
  int rc = run_or_say(dump, {"PHOS_MIGRATE_TO=" + gpu});
  const uint64_t t1 = phos::realtime_ns();
  if (rc != 0) {
    std::fprintf(stderr, "phosctl: the dump failed (status %d; %s/migrate-dump.log says why)%s\n", rc, dir.c_str(),
                 phos::plugin::process_alive(pid) ? "; the process runs on where it was" : "");
    return 1;
  }
  // criu restores the process with its pid: the source's must be free
  // (without a pid namespace, its parent has to reap it first). How long
  // it took to exit, and to be reaped, goes in the summary.
  // A zombie has exited; its pid is held until it is reaped.
  int exit_ms = 0;
  const int free_ms = phos::plugin::wait_pid_free(pid, 10000, &exit_ms);
  if (free_ms >= 10000)
    std::fprintf(stderr, "phosctl: pid %d is still taken 10 s after the dump (its parent has not reaped it); the "
                 "restore may fail\n", int(pid));
  std::vector<std::string> restore = {criu, "restore", "-D", dir, "--lib", lib, "-d",
                                      "-o", "migrate-restore.log", "-v4", "--pidfile", "migrate-restored.pid"};
  restore.insert(restore.end(), criu_args.begin(), criu_args.end());
  rc = run_or_say(restore, {});
  const uint64_t t2 = phos::realtime_ns();
  if (rc != 0) {
    std::fprintf(stderr,
                 "phosctl: the restore failed (status %d; %s/migrate-restore.log says why). The GPU data stays with "
                 "phos-keeper for migrate_keep_s seconds, then it is written into %s; restore again with: %s restore "
                 "-D %s --lib %s\n",
                 rc, dir.c_str(), dir.c_str(), criu.c_str(), dir.c_str(), lib.c_str());
    return 1;
  }
  // The gate closed for the last time on the source: from the manifests.
  uint64_t gate_closed = 0, moved = 0;
  bool in_place = true;
  phos::UniqueFd dirfd(open_dir(dir));
  if (auto pids = phos::image::list_process_images(dirfd.get()))
    for (int32_t vpid : *pids)
      if (auto img = phos::image::open_process_image(dirfd.get(), vpid, false)) {
        const auto& m = img->manifest;
        if (m.statistics.gate_closed_unix_ns && (!gate_closed || m.statistics.gate_closed_unix_ns < gate_closed))
          gate_closed = m.statistics.gate_closed_unix_ns;
        moved += m.statistics.raw_bytes;
        in_place = in_place && m.kept && m.kept->in_place;
      }
  std::string restored = "?";
  if (auto p = phos::plugin::read_pid_file(dir, "migrate-restored.pid"))
    restored = std::to_string(*p);
  else
    std::fprintf(stderr, "phosctl: the restored process's pid: %s\n", p.error().message.c_str());
  std::printf("migrated process %d to %s %s: now process %s; dump %.1f ms, the source's pid free after %d ms "
              "(a zombie from %d ms), restore %.1f ms; %s %s; "
              "downtime (its gate closed on the source -> restored and running) %.1f ms\n",
              int(pid), gpu_map.empty() ? "GPU" : "GPUs", gpu.c_str(), restored.c_str(), double(t1 - t0) / 1e6, free_ms, exit_ms,
              double(t2 - t1) / 1e6 - free_ms,
              bytes_text(moved).c_str(), in_place ? "kept in place" : "moved GPU to GPU",
              gate_closed && t2 > gate_closed ? double(t2 - gate_closed) / 1e6 : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "migrate") return cmd_migrate(std::vector<std::string>(args.begin() + 1, args.end()));
  if (!args.empty() && (args[0] == "periodic" || args[0] == "supervise"))
    return cmd_periodic(std::vector<std::string>(args.begin() + 1, args.end()), args[0] == "supervise");
  if (!args.empty() && args[0] == "job") return cmd_job(std::vector<std::string>(args.begin() + 1, args.end()));
  if (!args.empty() && args[0] == "hold-gpus")
    return cmd_hold_gpus(std::vector<std::string>(args.begin() + 1, args.end()));
  bool as_json = false;
  std::vector<std::string> pos;
  for (const auto& a : args) {
    if (a == "--json")
      as_json = true;
    else if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "phosctl: unknown option %s\n%s", a.c_str(), kUsage);
      return 2;
    } else
      pos.push_back(a);
  }
  if (pos.size() == 1 && pos[0] == "version") {
    std::printf("phosctl %s (image format %u, agent protocol %u)\n", PHOS_VERSION, phos::image::kManifestFormatVersion,
                phos::agent::kProtocolVersion);
    return 0;
  }
  if (pos.size() == 2 && pos[0] == "show") return cmd_show(pos[1], as_json, false);
  if (pos.size() == 2 && pos[0] == "verify") return cmd_show(pos[1], false, true);
  if (pos.size() == 3 && pos[0] == "merge" && !as_json) return cmd_merge(pos[1], pos[2]);
  if (pos.size() == 2 && pos[0] == "status") return cmd_status(pos[1], as_json);
  if (pos.size() == 2 && pos[0] == "kernels") return cmd_kernels(pos[1], as_json);
  if (pos.size() == 3 && (pos[0] == "speculate" || pos[0] == "validate") && !as_json)
    return cmd_switch(pos[0], pos[1], pos[2]);
  if (pos.size() == 4 && pos[0] == "nccl-stop" && !as_json) return cmd_nccl_stop(pos[1], pos[2], &pos[3]);
  if (pos.size() == 3 && pos[0] == "nccl-go" && !as_json) return cmd_nccl_stop(pos[1], pos[2], nullptr);
  if (pos.size() >= 2 && pos[0] == "nccl-quiesce" && !as_json)
    return cmd_nccl_quiesce(std::vector<std::string>(pos.begin() + 1, pos.end()));
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}
