#include "pb_codec.h"

namespace phos::pb {

std::vector<std::byte> pack(const ProtobufCMessage& m) {
  std::vector<std::byte> out(protobuf_c_message_get_packed_size(&m));
  protobuf_c_message_pack(&m, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

Error malformed(std::string_view what, std::string_view why) {
  return make_error("malformed " + std::string(what) + ": " + std::string(why), EPROTO);
}

std::string no_kind(const ProtobufCMessage& envelope) {
  if (envelope.n_unknown_fields == 0) return "no kind";
  return "unknown kind (field " + std::to_string(envelope.unknown_fields[0].tag) + ")";
}

Error no_kind_error(std::string_view what, const ProtobufCMessage& envelope) {
  return malformed(what, no_kind(envelope));
}

std::vector<std::string> strings(char* const* items, size_t n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (size_t i = 0; i < n; i++) out.push_back(text(items[i]));
  return out;
}

void set_strings(size_t& n, char**& field, const std::vector<std::string>& values, std::vector<char*>& owner) {
  owner.clear();
  for (const auto& v : values) owner.push_back(c_text(v));
  n = owner.size();
  field = owner.data();
}

}  // namespace phos::pb
