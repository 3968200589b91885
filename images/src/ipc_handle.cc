#include "phos/images/ipc_handle.h"

#include <cstdio>
#include <cstring>

#include "phos/images/agent_messages.h"
#include "phos/images/crc32c.h"

namespace phos::agent {
namespace {

constexpr char kMagic[8] = {'P', 'H', 'O', 'S', 'I', 'P', 'C', '1'};
constexpr size_t kCrcAt = 48;

template <class T>
void put(uint8_t* at, T v) {
  for (size_t i = 0; i < sizeof(T); i++) at[i] = uint8_t(uint64_t(v) >> (8 * i));
}
template <class T>
T get(const uint8_t* at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); i++) v |= uint64_t(at[i]) << (8 * i);
  return T(v);
}

}  // namespace

std::array<uint8_t, kIpcHandleBytes> encode_ipc_handle(const IpcHandle& h) {
  std::array<uint8_t, kIpcHandleBytes> out{};
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  put<int32_t>(out.data() + 8, h.pid);
  put<uint64_t>(out.data() + 16, h.nonce);
  put<uint64_t>(out.data() + 24, h.allocation);
  put<uint64_t>(out.data() + 32, h.offset);
  put<uint64_t>(out.data() + 40, h.size);
  put<uint32_t>(out.data() + kCrcAt, crc32c(0, out.data(), kCrcAt));
  return out;
}

std::optional<IpcHandle> decode_ipc_handle(const uint8_t* b) {
  if (std::memcmp(b, kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  if (get<uint32_t>(b + kCrcAt) != crc32c(0, b, kCrcAt)) return std::nullopt;
  for (size_t i = kCrcAt + 4; i < kIpcHandleBytes; i++)
    if (b[i]) return std::nullopt;
  IpcHandle h{.pid = get<int32_t>(b + 8),
              .nonce = get<uint64_t>(b + 16),
              .allocation = get<uint64_t>(b + 24),
              .offset = get<uint64_t>(b + 32),
              .size = get<uint64_t>(b + 40)};
  if (h.pid <= 0 || h.size == 0 || h.offset + h.size < h.offset) return std::nullopt;
  return h;
}

namespace {
constexpr char kEventMagic[8] = {'P', 'H', 'O', 'S', 'E', 'V', 'T', '1'};
constexpr size_t kEventCrcAt = 12;
}  // namespace

std::array<uint8_t, kIpcHandleBytes> encode_ipc_event_handle(int32_t pid) {
  std::array<uint8_t, kIpcHandleBytes> out{};
  std::memcpy(out.data(), kEventMagic, sizeof(kEventMagic));
  put<int32_t>(out.data() + 8, pid);
  put<uint32_t>(out.data() + kEventCrcAt, crc32c(0, out.data(), kEventCrcAt));
  return out;
}

std::optional<int32_t> decode_ipc_event_handle(const uint8_t* b) {
  if (std::memcmp(b, kEventMagic, sizeof(kEventMagic)) != 0) return std::nullopt;
  if (get<uint32_t>(b + kEventCrcAt) != crc32c(0, b, kEventCrcAt)) return std::nullopt;
  for (size_t i = kEventCrcAt + 4; i < kIpcHandleBytes; i++)
    if (b[i]) return std::nullopt;
  return get<int32_t>(b + 8);
}

std::string agent_socket_name(int32_t pid, uint64_t nonce) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%d.%016llx", kSocketPrefix, int(pid), static_cast<unsigned long long>(nonce));
  return buf;
}

std::optional<uint64_t> agent_socket_nonce(std::string_view name) {
  const size_t dot = name.rfind('.');
  if (!name.starts_with(kSocketPrefix) || dot == std::string_view::npos || name.size() - dot - 1 != 16)
    return std::nullopt;
  uint64_t v = 0;
  for (char c : name.substr(dot + 1)) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

}  // namespace phos::agent
