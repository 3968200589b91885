#include "phos/support/tcp_store_protocol.h"

#include <cstring>

namespace phos::net {

// Bytes are added by resize and memcpy: GCC 12 at -O3 warns, wrongly, about
// a vector insert of a few bytes (-Warray-bounds).
void StoreFrame::raw(const void* p, size_t n) {
  const size_t at = bytes_.size();
  bytes_.resize(at + n);
  if (n) std::memcpy(bytes_.data() + at, p, n);
}

template <class T>
StoreFrame& StoreFrame::number(T v) {
  raw(&v, sizeof(T));
  return *this;
}

StoreFrame& StoreFrame::text(std::string_view s) {
  number<uint64_t>(s.size());
  raw(s.data(), s.size());
  return *this;
}

StoreFrame& StoreFrame::data(std::span<const uint8_t> v) {
  number<uint64_t>(v.size());
  raw(v.data(), v.size());
  return *this;
}

std::vector<uint8_t> validate_query() { return StoreFrame(StoreQuery::kValidate).u32(kStoreValidationMagic).bytes(); }
std::vector<uint8_t> ping_query(uint32_t nonce) { return StoreFrame(StoreQuery::kPing).u32(nonce).bytes(); }
std::vector<uint8_t> set_query(std::string_view key, std::span<const uint8_t> value) {
  return StoreFrame(StoreQuery::kSet).text(key).data(value).bytes();
}
std::vector<uint8_t> get_query(std::string_view key) { return StoreFrame(StoreQuery::kGet).text(key).bytes(); }
std::vector<uint8_t> add_query(std::string_view key, int64_t delta) {
  return StoreFrame(StoreQuery::kAdd).text(key).i64(delta).bytes();
}

namespace {
std::vector<uint8_t> keys_query(StoreQuery q, const std::vector<std::string>& keys) {
  StoreFrame f(q);
  f.u64(keys.size());  // size_t on the wire: 8 bytes on every 64-bit host
  for (const auto& k : keys) f.text(k);
  return f.bytes();
}
}  // namespace

std::vector<uint8_t> check_query(const std::vector<std::string>& keys) { return keys_query(StoreQuery::kCheck, keys); }
std::vector<uint8_t> wait_query(const std::vector<std::string>& keys) { return keys_query(StoreQuery::kWait, keys); }
std::vector<uint8_t> cancel_wait_query() { return StoreFrame(StoreQuery::kCancelWait).bytes(); }
std::vector<uint8_t> compare_set_query(std::string_view key, std::span<const uint8_t> expected,
                                       std::span<const uint8_t> desired) {
  return StoreFrame(StoreQuery::kCompareSet).text(key).data(expected).data(desired).bytes();
}
std::vector<uint8_t> delete_key_query(std::string_view key) {
  return StoreFrame(StoreQuery::kDeleteKey).text(key).bytes();
}
std::vector<uint8_t> num_keys_query() { return StoreFrame(StoreQuery::kGetNumKeys).bytes(); }

std::optional<uint8_t> StoreReader::u8() {
  if (at_ + 1 > in_.size()) return std::nullopt;
  return in_[at_++];
}

template <class T>
std::optional<T> StoreReader::number() {
  if (at_ + sizeof(T) > in_.size()) return std::nullopt;
  T v;
  std::memcpy(&v, in_.data() + at_, sizeof(T));
  at_ += sizeof(T);
  return v;
}

std::optional<std::vector<uint8_t>> StoreReader::data(uint64_t max) {
  const size_t start = at_;
  auto n = number<uint64_t>();
  if (!n) return std::nullopt;
  if (*n > max) {
    bad_ = true;
    at_ = start;
    return std::nullopt;
  }
  if (at_ + *n > in_.size()) {
    at_ = start;  // not all here yet: taken again whole later
    return std::nullopt;
  }
  std::vector<uint8_t> v(in_.begin() + long(at_), in_.begin() + long(at_ + *n));
  at_ += *n;
  return v;
}

std::optional<std::string> StoreReader::text(uint64_t max) {
  auto v = data(max);
  if (!v) return std::nullopt;
  return text_of(*v);
}

std::vector<uint8_t> bytes_of(std::string_view s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text_of(std::span<const uint8_t> v) { return std::string(v.begin(), v.end()); }

}  // namespace phos::net

namespace phos::net {
// The widths the protocol uses (the header's inline readers and writers).
template StoreFrame& StoreFrame::number<uint32_t>(uint32_t);
template StoreFrame& StoreFrame::number<uint64_t>(uint64_t);
template StoreFrame& StoreFrame::number<int64_t>(int64_t);
template std::optional<uint32_t> StoreReader::number<uint32_t>();
template std::optional<uint64_t> StoreReader::number<uint64_t>();
template std::optional<int64_t> StoreReader::number<int64_t>();
}  // namespace phos::net
