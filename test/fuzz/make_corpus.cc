// Writes seed inputs for fuzz_image_reader: a real manifest, marker and data
// header, each behind the selector byte the target reads first.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

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

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
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
  return 0;
}
