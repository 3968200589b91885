// libFuzzer target: the plugin's decoding of what an agent sends (the agent
// runs inside the process being dumped, which may belong to anyone; the
// plugin runs as root inside criu). The first byte picks replies (0) or
// requests (1); the rest is a frame's payload. Nothing may crash, hang or
// leak, and whatever decodes must encode to bytes that decode to the same
// bytes again (Reply holds an Error, which has no ==: the bytes compare).
#include <cstddef>
#include <cstdint>
#include <span>

#include "phos/images/agent_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto bytes = std::span(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  using namespace phos::agent;
  if (data[0] % 2 == 0) {
    auto r = decode_reply(bytes);
    if (!r.ok()) return 0;
    auto once = encode_reply(*r);
    auto again = decode_reply(once);
    if (!again.ok() || encode_reply(*again) != once) __builtin_trap();
  } else {
    auto q = decode_request(bytes);
    if (!q.ok()) return 0;
    auto once = encode_request(*q);
    auto again = decode_request(once);
    if (!again.ok() || !(again.value() == q.value())) __builtin_trap();
  }
  return 0;
}
