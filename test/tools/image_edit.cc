// phos-image-edit: changes a complete GPU image the way only a different
// machine would, for the GPU suite's restore-refusal cases. The manifest is
// rewritten through the images library (valid frame and checksums) and its
// completion marker renewed, so the only thing wrong is what was changed.
//
// usage: phos-image-edit DIR PID device-name INDEX NAME
//        phos-image-edit DIR PID kept-allocation ADDRESS SIZE
//          (a migration's image: one more allocation it says is kept, on
//          device 0, listed first if the image has no device)
//        phos-image-edit DIR PID fingerprints flip|drop
//          (an image without a parent: every chunk's fingerprint with its
//          low bit flipped, as if its bytes had been others with the same
//          CRC-32C; or none, as a phos of format version 6 wrote it)
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "phos/images/image_dir.h"

namespace {
int die(const std::string& msg) {
  std::fprintf(stderr, "phos-image-edit: %s\n", msg.c_str());
  return 1;
}
}  // namespace

// Every chunk's fingerprint flipped or dropped (`how`); what was done, or
// "" for an unknown `how`.
std::string edit_fingerprints(phos::image::Manifest& m, const std::string& how) {
  if (how != "flip" && how != "drop") return "";
  size_t n = 0;
  for (auto& a : m.allocations)
    for (auto& c : a.chunks) {
      if (!c.fingerprint) continue;
      n++;
      if (how == "flip") *c.fingerprint ^= 1;
      else c.fingerprint.reset();
    }
  m.format_version = phos::image::format_version_for(m);
  return std::to_string(n) + " fingerprints " + (how == "flip" ? "flipped" : "dropped") + " (format version " +
         std::to_string(m.format_version) + ")";
}

int main(int argc, char** argv) {
  const std::string what = argc == 6 || argc == 5 ? argv[3] : "";
  if (!(argc == 6 && (what == "device-name" || what == "kept-allocation")) && !(argc == 5 && what == "fingerprints"))
    return die("usage: phos-image-edit DIR PID device-name INDEX NAME | DIR PID kept-allocation ADDRESS SIZE | "
               "DIR PID fingerprints flip|drop");
  phos::UniqueFd dir(::open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return die(std::string("cannot open ") + argv[1]);
  auto img = phos::image::open_process_image(dir.get(), std::atoi(argv[2]), /*require_complete=*/true);
  if (!img) return die(img.error().message);
  phos::image::Manifest m = img->manifest;
  std::string done;  // what was changed, for the line printed
  if (what == "fingerprints") {
    // A resolved chain's manifest lists its parents' chunks and files as its own.
    if (m.parent) return die(img->manifest_name + " names a parent image: only an image without one is edited");
    done = edit_fingerprints(m, argv[4]);
    if (done.empty()) return die(std::string("fingerprints: flip or drop, not ") + argv[4]);
  } else if (what == "kept-allocation") {
    if (!m.kept) return die(img->manifest_name + " is not a migration's image");
    if (m.devices.empty())
      m.devices.push_back(phos::GpuDevice{.ordinal = 0,
                                          .uuid = {},
                                          .name = "NVIDIA H200",
                                          .total_memory = 150ull << 30,
                                          .compute_major = 9,
                                          .compute_minor = 0});
    phos::image::Allocation a;
    a.id = 1000000 + m.allocations.size();
    a.device = m.devices.front().ordinal;
    a.address = std::strtoull(argv[4], nullptr, 0);
    a.size = std::strtoull(argv[5], nullptr, 0);
    m.allocations.push_back(a);
    done = "allocation " + std::to_string(a.id) + " added";
  } else {
    size_t index = std::strtoul(argv[4], nullptr, 10);
    if (index >= m.devices.size())
      return die(img->manifest_name + " has " + std::to_string(m.devices.size()) + " devices");
    done = "device " + std::to_string(index) + " renamed from \"" + m.devices[index].name + "\" to \"" + argv[5] + "\"";
    m.devices[index].name = argv[5];
  }
  auto written = phos::image::write_manifest(dir.get(), m);
  if (!written) return die(written.error().message);
  if (auto r = phos::image::write_completion_marker(dir.get(), m.pid, *written); !r) return die(r.error().message);
  std::printf("%s: %s\n", img->manifest_name.c_str(), done.c_str());
  return 0;
}
