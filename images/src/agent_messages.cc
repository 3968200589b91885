#include "phos/images/agent_messages.h"

#include <cstring>
#include <vector>

namespace phos::wire {

socklen_t abstract_socket_address(const std::string& name, struct sockaddr_un& addr) {
  addr = {};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path)) return 0;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: leading NUL
  return socklen_t(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

namespace {

template <class Msg, class Unpack>
Result<std::unique_ptr<Msg, UnpackedDeleter>> recv_unpacked(int sock, int timeout_ms, Unpack unpack,
                                                           const char* what, std::vector<UniqueFd>& fds) {
  auto frame = recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  Msg* msg = unpack(nullptr, frame->payload.size(), reinterpret_cast<const uint8_t*>(frame->payload.data()));
  if (!msg) return make_error(std::string("malformed ") + what + ": payload does not parse", EPROTO);
  std::unique_ptr<Msg, UnpackedDeleter> owned(msg);
  if (msg->kind_case == 0) return make_error(std::string("malformed ") + what + ": no kind", EPROTO);
  fds = std::move(frame->fds);
  return owned;
}

}  // namespace

void to_message(const AllocationEntry& a, Phos__Agent__Allocation& m) {
  phos__agent__allocation__init(&m);
  m.id = a.id;
  m.device = a.device;
  m.address = a.address;
  m.size = a.size;
  m.flags = a.flags;
}

AllocationEntry from_message(const Phos__Agent__Allocation& m) {
  return AllocationEntry{m.id, m.device, m.address, m.size, m.flags};
}

Result<void> send_message(int sock, const ProtobufCMessage& message, std::span<const int> fds) {
  std::vector<std::byte> buf(protobuf_c_message_get_packed_size(&message));
  protobuf_c_message_pack(&message, reinterpret_cast<uint8_t*>(buf.data()));
  return send_frame(sock, buf, fds);
}

Result<ReceivedRequest> recv_request(int sock, int timeout_ms) {
  ReceivedRequest out;
  auto req = recv_unpacked<Phos__Agent__Request>(sock, timeout_ms, phos__agent__request__unpack, "request", out.fds);
  if (!req) return req.error();
  out.request = std::move(req.value());
  return out;
}

Result<ReceivedReply> recv_reply(int sock, int timeout_ms) {
  ReceivedReply out;
  auto rep = recv_unpacked<Phos__Agent__Reply>(sock, timeout_ms, phos__agent__reply__unpack, "reply", out.fds);
  if (!rep) return rep.error();
  out.reply = std::move(rep.value());
  return out;
}

Result<void> send_error_reply(int sock, int code, const std::string& message) {
  Phos__Agent__Error err = PHOS__AGENT__ERROR__INIT;
  err.code = code;
  err.message = const_cast<char*>(message.c_str());
  Phos__Agent__Reply reply = PHOS__AGENT__REPLY__INIT;
  reply.kind_case = PHOS__AGENT__REPLY__KIND_ERROR;
  reply.error = &err;
  return send_message(sock, reply.base);
}

}  // namespace phos::wire
