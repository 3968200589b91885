// libFuzzer target: every reader of untrusted image bytes. The first byte
// picks the reader; the rest is the file. Nothing may crash, hang or leak,
// and whatever decodes must survive validation and re-encode identically.
#include <cstddef>
#include <cstdint>
#include <span>

#include "phos/images/data_file.h"
#include "phos/images/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto bytes = std::span(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  using namespace phos::image;
  switch (data[0] % 3) {
    case 0: {
      auto m = decode_manifest(bytes, "fuzz");
      if (m.ok()) {
        auto again = decode_manifest(encode_manifest(*m), "fuzz");
        if (!again.ok() || !(again.value() == m.value())) __builtin_trap();
      }
      break;
    }
    case 1: {
      auto mk = decode_marker(bytes, "fuzz");
      if (mk.ok() && !(decode_marker(encode_marker(*mk), "fuzz").value() == mk.value())) __builtin_trap();
      break;
    }
    case 2:
      (void)decode_data_header(bytes, "fuzz");
      break;
  }
  return 0;
}
