#include "phos/support/tcp_store_table.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>

#include "phos/support/tcp_store_protocol.h"

namespace phos::net {
namespace {

template <class T>
std::vector<uint8_t> number_bytes(T v) {
  std::vector<uint8_t> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

// A u64 length, then the bytes (sized once: GCC 12 warns, wrongly, about
// an insert after the length).
std::vector<uint8_t> vector_bytes(const std::vector<uint8_t>& v) {
  std::vector<uint8_t> b(sizeof(uint64_t) + v.size());
  const uint64_t n = v.size();
  std::memcpy(b.data(), &n, sizeof(n));
  if (!v.empty()) std::memcpy(b.data() + sizeof(n), v.data(), v.size());
  return b;
}

// A count then that many keys (CHECK, WAIT); nothing while not whole.
// `too_many`: a count past its bound (never whole).
std::optional<std::vector<std::string>> read_keys(StoreReader& r, bool& too_many) {
  auto n = r.u64();
  if (!n) return std::nullopt;
  too_many = *n > kMaxStoreKeysPerQuery;
  if (too_many) return std::nullopt;
  std::vector<std::string> keys;
  for (uint64_t i = 0; i < *n; i++) {
    auto k = r.text(kMaxStoreKeyBytes);
    if (!k) return std::nullopt;
    keys.push_back(std::move(*k));
  }
  return keys;
}

// The decimal text ADD keeps, as a number (a value that is no number: 0,
// as a new key).
int64_t decimal(const std::vector<uint8_t>& v) {
  int64_t n = 0;
  const char* b = reinterpret_cast<const char*>(v.data());
  (void)std::from_chars(b, b + v.size(), n);
  return n;
}

Error protocol_error(const std::string& what) { return make_error("TCPStore query: " + what, EPROTO); }

}  // namespace

Result<size_t> StoreTable::serve(int client, std::span<const uint8_t> in, std::vector<StoreReply>& out) {
  size_t used = 0;
  while (used < in.size()) {
    auto n = serve_one(client, in.subspan(used), out);
    if (!n) return n.error();
    if (*n == 0) break;
    used += *n;
  }
  return used;
}

Result<size_t> StoreTable::serve_one(int client, std::span<const uint8_t> in, std::vector<StoreReply>& out) {
  StoreReader r(in);
  auto type = r.u8();
  if (!type) return size_t(0);
  const auto q = StoreQuery(*type);
  const bool valid = validated_.count(client) > 0;
  if (!valid && q != StoreQuery::kValidate) return protocol_error("the first query is not VALIDATE");
  auto reply = [&](std::vector<uint8_t> bytes) { out.push_back({client, std::move(bytes)}); };
  auto whole = [&](bool got) -> Result<size_t> {
    if (r.bad()) return protocol_error("a length past its bound");
    return got ? r.used() : 0;
  };
  switch (q) {
    case StoreQuery::kValidate: {
      auto magic = r.u32();
      if (!magic) return size_t(0);
      if (*magic != kStoreValidationMagic) return protocol_error("VALIDATE with a wrong magic number");
      validated_.insert(client);
      return r.used();
    }
    case StoreQuery::kPing: {
      auto nonce = r.u32();
      if (!nonce) return size_t(0);
      reply(number_bytes(*nonce));
      return r.used();
    }
    case StoreQuery::kSet: {
      auto key = r.text(kMaxStoreKeyBytes);
      auto value = key ? r.data(kMaxStoreValueBytes) : std::nullopt;
      if (!value) return whole(false);
      values_[*key] = std::move(*value);
      stored(*key, out);
      return r.used();
    }
    case StoreQuery::kCompareSet: {
      auto key = r.text(kMaxStoreKeyBytes);
      auto expected = key ? r.data(kMaxStoreValueBytes) : std::nullopt;
      auto desired = expected ? r.data(kMaxStoreValueBytes) : std::nullopt;
      if (!desired) return whole(false);
      auto it = values_.find(*key);
      // A missing key is set only where nothing was expected; else the
      // expected value comes back (as torch's servers answer).
      if (it == values_.end()) {
        if (!expected->empty()) {
          reply(vector_bytes(*expected));
          return r.used();
        }
        it = values_.emplace(*key, std::move(*desired)).first;
        stored(*key, out);
      } else if (it->second == *expected) {
        it->second = std::move(*desired);
        stored(*key, out);
      }
      reply(vector_bytes(it->second));
      return r.used();
    }
    case StoreQuery::kGet: {
      auto key = r.text(kMaxStoreKeyBytes);
      if (!key) return whole(false);
      auto it = values_.find(*key);
      reply(vector_bytes(it == values_.end() ? std::vector<uint8_t>{} : it->second));
      return r.used();
    }
    case StoreQuery::kAdd: {
      auto key = r.text(kMaxStoreKeyBytes);
      auto delta = key ? r.i64() : std::nullopt;
      if (!delta) return whole(false);
      auto it = values_.find(*key);
      const int64_t now = (it == values_.end() ? 0 : decimal(it->second)) + *delta;
      values_[*key] = bytes_of(std::to_string(now));
      reply(number_bytes(now));
      stored(*key, out);
      return r.used();
    }
    case StoreQuery::kAppend: {
      auto key = r.text(kMaxStoreKeyBytes);
      auto value = key ? r.data(kMaxStoreValueBytes) : std::nullopt;
      if (!value) return whole(false);
      auto& v = values_[*key];
      v.insert(v.end(), value->begin(), value->end());
      stored(*key, out);
      return r.used();
    }
    case StoreQuery::kCheck: {
      bool too_many = false;
      auto keys = read_keys(r, too_many);
      if (too_many) return protocol_error("more than " + std::to_string(kMaxStoreKeysPerQuery) + " keys");
      if (!keys) return whole(false);
      reply({uint8_t(all_present(*keys) ? StoreCheckReply::kReady : StoreCheckReply::kNotReady)});
      return r.used();
    }
    case StoreQuery::kWait: {
      bool too_many = false;
      auto keys = read_keys(r, too_many);
      if (too_many) return protocol_error("more than " + std::to_string(kMaxStoreKeysPerQuery) + " keys");
      if (!keys) return whole(false);
      size_t missing = 0;
      for (const auto& k : *keys)
        if (!values_.count(k)) {
          waiters_[k].push_back(client);
          missing++;
        }
      if (missing == 0)
        reply({uint8_t(StoreWaitReply::kStopWaiting)});
      else
        awaited_[client] = missing;
      return r.used();
    }
    case StoreQuery::kCancelWait: {
      forget_waits(client);
      reply({uint8_t(StoreWaitReply::kWaitCanceled)});
      return r.used();
    }
    case StoreQuery::kDeleteKey: {
      auto key = r.text(kMaxStoreKeyBytes);
      if (!key) return whole(false);
      reply(number_bytes<int64_t>(int64_t(values_.erase(*key))));
      return r.used();
    }
    case StoreQuery::kGetNumKeys:
      reply(number_bytes<int64_t>(int64_t(values_.size())));
      return r.used();
    default:
      return protocol_error("query type " + std::to_string(*type) + " is not served here");
  }
}

void StoreTable::stored(const std::string& key, std::vector<StoreReply>& out) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  for (int c : it->second) {
    auto a = awaited_.find(c);
    if (a == awaited_.end()) continue;
    if (--a->second == 0) {
      awaited_.erase(a);
      out.push_back({c, {uint8_t(StoreWaitReply::kStopWaiting)}});
    }
  }
  waiters_.erase(it);
}

bool StoreTable::all_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return values_.count(k) > 0; });
}

void StoreTable::forget_waits(int client) {
  awaited_.erase(client);
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    std::erase(it->second, client);
    it = it->second.empty() ? waiters_.erase(it) : std::next(it);
  }
}

void StoreTable::forget(int client) {
  forget_waits(client);
  validated_.erase(client);
}

}  // namespace phos::net
