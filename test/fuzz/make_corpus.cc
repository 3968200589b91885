// Writes seed inputs: for fuzz_image_reader a real manifest, marker and data
// header, each behind the selector byte the target reads first; for
// fuzz_fatbin a cubin and fatbins holding it, plain and compressed.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../unit/fatbin_builders.h"
#include "../unit/fixtures.h"
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

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IMAGE_CORPUS_DIR FATBIN_CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  Manifest full = phos::test::full_manifest();
  Manifest empty;
  empty.writer_version = "seed";
  empty.pid = 1;
  write_seed(dir, "manifest-full", 0, encode_manifest(full));
  write_seed(dir, "manifest-empty", 0, encode_manifest(empty));
  write_seed(dir, "marker", 1, encode_marker(marker_for(encode_manifest(full), 1)));
  write_seed(dir, "data-header", 2, encode_data_header(DataHeader{kDataFormatVersion, 42, 0}));
  write_fatbin_seeds(argv[2]);
  return 0;
}
