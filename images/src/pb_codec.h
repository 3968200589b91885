// What every protobuf-c codec of images/src does alike (the agent protocol,
// the keeper link, the manifest), written once: a message packed into
// bytes; bytes unpacked into a message that frees itself, or an Error that
// names the message that did not parse; a body put into its envelope's
// oneof, and the error for an envelope whose oneof holds nothing known; and
// protobuf-c's NULL strings, has_ flags and pointer arrays to and from C++
// values. Inside images/src only: no header outside sees protobuf-c.
#pragma once

#include <protobuf-c/protobuf-c.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "phos/support/result.h"

namespace phos::pb {

// --- bytes ---

std::vector<std::byte> pack(const ProtobufCMessage& m);
template <class Msg>
std::vector<std::byte> pack(const Msg& m) {
  return pack(m.base);
}

struct FreeUnpacked {
  void operator()(void* m) const { protobuf_c_message_free_unpacked(static_cast<ProtobufCMessage*>(m), nullptr); }
};
// A message protobuf-c unpacked, freed with its parts when it goes.
template <class Msg>
using Unpacked = std::unique_ptr<Msg, FreeUnpacked>;

// `payload` as the message `descriptor` describes (Msg is its struct); null
// where it does not parse: not such a message, or a required field missing.
template <class Msg>
Unpacked<Msg> unpack(const ProtobufCMessageDescriptor& descriptor, std::span<const std::byte> payload) {
  return Unpacked<Msg>(reinterpret_cast<Msg*>(protobuf_c_message_unpack(
      &descriptor, nullptr, payload.size(), reinterpret_cast<const uint8_t*>(payload.data()))));
}

// The error of a protocol peer's message that is wrong: EPROTO, "malformed
// <what>: <why>".
Error malformed(std::string_view what, std::string_view why);

// `payload` unpacked and handed to `decode` (which takes a const Msg& and
// returns a Result); where it does not parse, malformed(what, ...) says so.
template <class Msg, class Decode>
auto unpack_and_decode(const ProtobufCMessageDescriptor& descriptor, std::span<const std::byte> payload,
                       std::string_view what, Decode&& decode) -> decltype(decode(std::declval<const Msg&>())) {
  Unpacked<Msg> msg = unpack<Msg>(descriptor, payload);
  if (!msg)
    return malformed(what, "payload does not parse (not a " + std::string(what) + ", or a required field is missing)");
  return decode(*msg);
}

// --- envelopes ---

// `envelope` (initialized) holding `body` as `kind` of its oneof, packed.
template <class Envelope, class Kind, class Body>
std::vector<std::byte> pack_oneof(Envelope envelope, Kind kind, Body* Envelope::*field, Body& body) {
  envelope.kind_case = kind;
  envelope.*field = &body;
  return pack(envelope);
}

// What an envelope whose oneof the decoder does not take holds: "no kind",
// or "unknown kind (field N)" where the peer sent a kind this build does not
// know (protobuf-c keeps it as an unknown field).
std::string no_kind(const ProtobufCMessage& envelope);
// That, as malformed(what, ...).
Error no_kind_error(std::string_view what, const ProtobufCMessage& envelope);

// --- fields ---

// A string field as protobuf-c leaves it: NULL where absent.
inline std::string text(const char* s) { return s ? s : ""; }
// A string for protobuf-c to pack (it does not write through it); c_text_or_null
// leaves an empty one absent (an optional field).
inline char* c_text(const std::string& s) { return const_cast<char*>(s.c_str()); }
inline char* c_text_or_null(const std::string& s) { return s.empty() ? nullptr : c_text(s); }

// An optional scalar field: its value where present.
template <class T>
std::optional<T> optional(protobuf_c_boolean has, T value) {
  return has ? std::optional<T>(value) : std::nullopt;
}
// An optional bool or count: false or 0 where absent (what an older peer meant).
inline bool flag(protobuf_c_boolean has, protobuf_c_boolean value) { return has && value; }
template <class T>
T value_or_zero(protobuf_c_boolean has, T value) {
  return has ? value : T{};
}
// An optional scalar field set from `value` (absent where it has none).
template <class Field, class T>
void set_optional(protobuf_c_boolean& has, Field& field, const std::optional<T>& value) {
  has = value.has_value();
  field = value ? Field(*value) : Field{};
}
// An optional scalar field, present: written whatever its value.
template <class Field, class T>
void set_present(protobuf_c_boolean& has, Field& field, T value) {
  has = 1;
  field = Field(value);
}

// A repeated scalar field as a vector, and a vector for protobuf-c to pack.
template <class T>
std::vector<T> repeated(const T* items, size_t n) {
  return n ? std::vector<T>(items, items + n) : std::vector<T>{};
}
template <class T>
void set_repeated(size_t& n, T*& field, const std::vector<T>& values) {
  n = values.size();
  field = const_cast<T*>(values.data());
}
// A repeated string field, both ways: `owner` keeps the pointers while the
// message is packed.
std::vector<std::string> strings(char* const* items, size_t n);
void set_strings(size_t& n, char**& field, const std::vector<std::string>& values, std::vector<char*>& owner);

// The messages of a repeated message field while its envelope is packed:
// one per item, each initialized by `init` (protobuf-c's
// phos__..._init) and filled by `fill(item, msg)`.
template <class Msg>
class Repeated {
 public:
  Repeated() = default;
  template <class Items, class Fill>
  Repeated(void (*init)(Msg*), const Items& items, Fill&& fill) {
    msgs_.resize(std::size(items));
    size_t i = 0;
    for (const auto& item : items) {
      init(&msgs_[i]);
      fill(item, msgs_[i]);
      ptrs_.push_back(&msgs_[i]);
      i++;
    }
  }
  Repeated(Repeated&&) = default;  // the messages stay where they are
  Repeated& operator=(Repeated&&) = default;
  // The field `n`, `field` of the envelope pointing at them.
  void set(size_t& n, Msg**& field) {
    n = ptrs_.size();
    field = ptrs_.data();
  }

 private:
  std::vector<Msg> msgs_;
  std::vector<Msg*> ptrs_;
};

// A repeated message field decoded item by item: `decode` takes a const
// Msg& and returns a value (each), or a Result (the first error is the
// answer).
template <class Msg, class Decode>
auto decode_each(Msg* const* items, size_t n, Decode&& decode) {
  using Out = std::decay_t<decltype(decode(std::declval<const Msg&>()))>;
  std::vector<Out> out;
  out.reserve(n);
  for (size_t i = 0; i < n; i++) out.push_back(decode(*items[i]));
  return out;
}
template <class Msg, class Decode>
auto try_decode_each(Msg* const* items, size_t n, Decode&& decode)
    -> Result<std::vector<std::decay_t<decltype(decode(std::declval<const Msg&>()).value())>>> {
  std::vector<std::decay_t<decltype(decode(std::declval<const Msg&>()).value())>> out;
  out.reserve(n);
  for (size_t i = 0; i < n; i++) {
    auto one = decode(*items[i]);
    if (!one) return one.error();
    out.push_back(std::move(one.value()));
  }
  return out;
}

}  // namespace phos::pb
