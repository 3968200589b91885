#include "phos/images/agent_messages.h"

#include <vector>

namespace phos::wire {

Result<void> send_message(int sock, const ProtobufCMessage& message, std::span<const int> fds) {
  std::vector<std::byte> buf(protobuf_c_message_get_packed_size(&message));
  protobuf_c_message_pack(&message, reinterpret_cast<uint8_t*>(buf.data()));
  return send_frame(sock, buf, fds);
}

Result<ReceivedRequest> recv_request(int sock, int timeout_ms) {
  auto frame = recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  auto* req = phos__agent__request__unpack(nullptr, frame->payload.size(),
                                           reinterpret_cast<const uint8_t*>(frame->payload.data()));
  if (!req) return make_error("malformed request: payload does not parse", EPROTO);
  RequestPtr owned(req);
  if (req->kind_case == PHOS__AGENT__REQUEST__KIND__NOT_SET) return make_error("malformed request: no kind", EPROTO);
  return ReceivedRequest{std::move(owned), std::move(frame->fds)};
}

Result<ReceivedReply> recv_reply(int sock, int timeout_ms) {
  auto frame = recv_frame(sock, timeout_ms);
  if (!frame) return frame.error();
  auto* rep = phos__agent__reply__unpack(nullptr, frame->payload.size(),
                                         reinterpret_cast<const uint8_t*>(frame->payload.data()));
  if (!rep) return make_error("malformed reply: payload does not parse", EPROTO);
  ReplyPtr owned(rep);
  if (rep->kind_case == PHOS__AGENT__REPLY__KIND__NOT_SET) return make_error("malformed reply: no kind", EPROTO);
  return ReceivedReply{std::move(owned), std::move(frame->fds)};
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
