// Writes seed inputs: for fuzz_image_reader a real manifest, marker and data
// header, each behind the selector byte the target reads first; for
// fuzz_fatbin a cubin and fatbins holding it, plain and compressed; for
// fuzz_agent_reply (a third directory) replies and requests of every kind
// that carries data.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../unit/fatbin_builders.h"
#include "../unit/fixtures.h"
#include "phos/images/agent_protocol.h"
#include "phos/images/data_file.h"
#include "phos/images/manifest.h"

using namespace phos::image;

static void write_seed(const std::string& dir, const std::string& name, uint8_t selector,
                       const std::vector<std::byte>& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(char(selector));
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

static void write_file(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

static void write_fatbin_seeds(const std::string& dir) {
  using namespace phos::test;
  TestKernel k;
  k.name = "_Z1kPfic";
  k.params = {{0, 0, 8, 0, 5, false}, {1, 8, 4, 0, 0, false}, {2, 12, 1, 0, 0, false}};
  k.cbank_param_size = 16;
  TestKernel big;
  big.name = "big";
  big.params = {{0, 0, 5000, 0, 0, true}, {1, 5000, 8, 4, 4, true}};
  big.param_cbank_size = 5008;
  ByteVec cubin = make_cubin({k, big});
  ByteVec ptx = to_bytes(".version 9.0\n.target sm_90\n.address_size 64\n");
  ByteVec plain = make_fatbin({plain_entry(kTestKindElf, 90, cubin), plain_entry(kTestKindPtx, 90, ptx)});
  write_file(dir + "/cubin", cubin);
  write_file(dir + "/fatbin-plain", plain);
  write_file(dir + "/fatbin-lz4", make_fatbin({lz4_entry(kTestKindElf, 90, cubin), lz4_entry(kTestKindPtx, 90, ptx)}));
  write_file(dir + "/fatbin-zstd",
             make_fatbin({zstd_entry(kTestKindElf, 90, cubin), zstd_entry(kTestKindPtx, 90, ptx)}));
  ByteVec two = plain;
  two.insert(two.end(), plain.begin(), plain.end());
  write_file(dir + "/fatbins-end-to-end", two);
}

static void write_agent_seeds(const std::string& dir) {
  namespace agent = phos::agent;
  agent::StatusReply status;
  status.cuda_initialized = true;
  status.allocation_count = 2;
  status.unsupported_calls = {"cuIpcGetMemHandle"};
  status.counters = {{"launches", 7}};
  status.modules = {{.id = 1,
                     .kind = "fatbin",
                     .size = 216,
                     .hash = 0x1234,
                     .source = "cuModuleLoadData",
                     .functions = {"k"},
                     .function_count = 1,
                     .globals = {"g"}}};
  status.kernels = {{.name = "_Z1kPf",
                     .module = 1,
                     .launches = 3,
                     .exact = 0,
                     .speculated = 3,
                     .unknown = 0,
                     .buffers = 3,
                     .reads = 3,
                     .writes = 3,
                     .types = "name",
                     .note = ""}};
  status.kernel_count = 1;
  status.devices = {{.ordinal = 0, .uuid = {}}};
  status.validation_active = true;
  write_seed(dir, "status", 0, agent::encode_reply(status));
  write_seed(dir, "allocations", 0,
             agent::encode_reply(agent::ListAllocationsReply{
                 .allocations = {{.id = 1, .device = 0, .address = 0x7f0000000000ull, .size = 2u << 20, .flags = 0}},
                 .total_count = 1}));
  write_seed(dir, "close-window", 0,
             agent::encode_reply(agent::CloseCopyWindowReply{
                 .counters = {.calls_checked = 3, .calls_waited = 1, .unknown_waits = 0, .wait_ns = 10},
                 .chunks_saved = 1,
                 .violations = 1,
                 .violation = "kernel k",
                 .aborted = false,
                 .abort_reason = ""}));
  write_seed(dir, "error", 0, agent::encode_reply(phos::make_error("refused", 1)));
  write_seed(dir, "hello", 0,
             agent::encode_reply(agent::HelloReply{
                 .protocol_version = 1, .agent_version = "0.1.0", .pid = 1, .agent_tid = 2, .uid = 0}));
  write_seed(dir, "remap", 1, agent::encode_request(agent::RemapRequest{{1, 2}}));
  write_seed(dir, "open-window", 1,
             agent::encode_request(agent::OpenCopyWindowRequest{
                 .trust = agent::CopyTrust::kValidated, .timeout_ms = 1, .pools = {{.device = 0, .bytes = 2u << 20, .slots = 1}}}));
}

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: %s IMAGE_CORPUS_DIR FATBIN_CORPUS_DIR [AGENT_CORPUS_DIR]\n", argv[0]);
    return 2;
  }
  if (argc == 4) write_agent_seeds(argv[3]);
  std::string dir = argv[1];
  Manifest full = phos::test::full_manifest();
  Manifest empty;
  empty.writer_version = "seed";
  empty.pid = 1;
  write_seed(dir, "manifest-full", 0, encode_manifest(full));
  write_seed(dir, "manifest-empty", 0, encode_manifest(empty));
  // A sparse image's manifest: a zero chunk (4 KiB, its CRC-32C) after the full one's chunks.
  Manifest sparse = full;
  sparse.allocations[0].chunks.push_back({sparse.allocations[0].size, 0, 0, 4096, 0, 0x98f94189, Compression::kZero});
  sparse.allocations[0].size += 4096;
  sparse.format_version = kZeroChunkFormatVersion;
  write_seed(dir, "manifest-sparse", 0, encode_manifest(sparse));
  write_seed(dir, "marker", 1, encode_marker(marker_for(encode_manifest(full), 1)));
  write_seed(dir, "data-header", 2, encode_data_header(DataHeader{kDataFormatVersion, 42, 0}));
  write_fatbin_seeds(argv[2]);
  return 0;
}
