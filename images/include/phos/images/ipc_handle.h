// CUDA IPC handles that phos serves (cuIpcGetMemHandle): the 64 bytes of a
// CUipcMemHandle name an allocation of phos's in the exporting process, and
// that process's agent, whom the opening process's libphos asks for the
// memory's fd (agent.proto IpcOpenRequest). The driver never sees an IPC
// mapping, so its checkpoint of either process succeeds.
//
// Layout (little-endian): "PHOSIPC1", pid (int32), 4 zero bytes, the agent
// socket's nonce, the allocation id, the block's offset in the allocation,
// the block's size, then the CRC32C of the 48 bytes before it and 12 zero
// bytes. A handle the driver made fails the magic or the CRC.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace phos::agent {

inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(CUipcMemHandle)

struct IpcHandle {
  int32_t pid = 0;          // the exporter, in its pid namespace
  uint64_t nonce = 0;       // its agent socket's (socket_name)
  uint64_t allocation = 0;  // the exporter's allocation id (a unit)
  uint64_t offset = 0;      // where the block starts in it
  uint64_t size = 0;        // the block's size
  bool operator==(const IpcHandle&) const = default;
};

std::array<uint8_t, kIpcHandleBytes> encode_ipc_handle(const IpcHandle& h);
// Nothing for bytes that are no phos handle (the driver's, or damaged).
std::optional<IpcHandle> decode_ipc_handle(const uint8_t* bytes);

// An event's IPC handle that phos served (cuIpcGetEventHandle): it names
// no driver event ("PHOSEVT1", the exporter's pid, a CRC of the 12 bytes
// before it, zeros): an opener gets an event of its own, complete, since
// phos completes every record of an interprocess event before the record
// returns (cuda_hooks' hooks/ipc.cc). Nothing for the driver's handles.
std::array<uint8_t, kIpcHandleBytes> encode_ipc_event_handle(int32_t pid);
std::optional<int32_t> decode_ipc_event_handle(const uint8_t* bytes);

// An agent's abstract socket name (without the leading NUL) for `pid` and
// `nonce`, and the nonce back from such a name.
std::string agent_socket_name(int32_t pid, uint64_t nonce);
std::optional<uint64_t> agent_socket_nonce(std::string_view name);

}  // namespace phos::agent
