// The wire protocol of PyTorch's c10d TCPStore as torch 2.6 and later speak
// it (2.11 included), both of its servers (libuv, the default, and the
// legacy one): what phos's client (tcp_store_client.h) sends and its test
// and coordination server (tcp_store_server.h) reads.
//
// A query is one QueryType byte and its arguments, no header: a string or
// byte vector is a u64 length then the raw bytes; a number is its bytes in
// host order (torch's appendValue<T>), little-endian on every host phos
// runs on; a key count (CHECK, WAIT) is a size_t. The first query of a
// connection must be VALIDATE (the libuv server closes it otherwise).
//
//   query        arguments                    reply
//   VALIDATE     u32 magic                    none
//   PING         u32 nonce                    the same u32
//   SET          key, value                   none
//   COMPARE_SET  key, expected, desired       vector: the value now
//   GET          key                          vector (empty for a missing key)
//   ADD          key, i64 delta               i64: the new value (kept as decimal text)
//   CHECK        u64 n, n keys                u8 READY / NOT_READY
//   WAIT         u64 n, n keys                u8 STOP_WAITING once all exist
//   CANCEL_WAIT  none                         u8 WAIT_CANCELED (a late STOP_WAITING may come first)
//   DELETE_KEY   key                          i64: keys deleted (0 or 1)
//   GETNUMKEYS   none                         i64
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace phos::net {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "TCPStore numbers are in host order: little-endian here");

inline constexpr uint32_t kStoreValidationMagic = 0x3C85F7CE;

enum class StoreQuery : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
};
enum class StoreCheckReply : uint8_t { kReady = 0, kNotReady = 1 };
enum class StoreWaitReply : uint8_t { kStopWaiting = 0, kWaitCanceled = 1 };

// Bounds a reader puts on what the other end claims (a hostile or broken
// peer must not make it allocate without limit).
inline constexpr uint64_t kMaxStoreKeyBytes = 64 * 1024;
inline constexpr uint64_t kMaxStoreValueBytes = 64ull * 1024 * 1024;
inline constexpr uint64_t kMaxStoreKeysPerQuery = 4096;

// One query, built argument by argument.
class StoreFrame {
 public:
  explicit StoreFrame(StoreQuery q) { bytes_.push_back(uint8_t(q)); }
  StoreFrame& text(std::string_view s);
  StoreFrame& data(std::span<const uint8_t> v);
  StoreFrame& u32(uint32_t v) { return number(v); }
  StoreFrame& u64(uint64_t v) { return number(v); }
  StoreFrame& i64(int64_t v) { return number(v); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  template <class T>
  StoreFrame& number(T v);
  void raw(const void* p, size_t n);
  std::vector<uint8_t> bytes_;
};

// The queries phos sends.
std::vector<uint8_t> validate_query();
std::vector<uint8_t> ping_query(uint32_t nonce);
std::vector<uint8_t> set_query(std::string_view key, std::span<const uint8_t> value);
std::vector<uint8_t> get_query(std::string_view key);
std::vector<uint8_t> add_query(std::string_view key, int64_t delta);
std::vector<uint8_t> check_query(const std::vector<std::string>& keys);
std::vector<uint8_t> wait_query(const std::vector<std::string>& keys);
std::vector<uint8_t> cancel_wait_query();
std::vector<uint8_t> compare_set_query(std::string_view key, std::span<const uint8_t> expected,
                                       std::span<const uint8_t> desired);
std::vector<uint8_t> delete_key_query(std::string_view key);
std::vector<uint8_t> num_keys_query();

// Reads values from the front of a buffer that may not hold them whole yet:
// each read returns nothing (and takes nothing) where the bytes are not all
// there, and `bad` is set where they can never be (a length past its bound).
class StoreReader {
 public:
  explicit StoreReader(std::span<const uint8_t> in) : in_(in) {}
  std::optional<uint8_t> u8();
  std::optional<uint32_t> u32() { return number<uint32_t>(); }
  std::optional<uint64_t> u64() { return number<uint64_t>(); }
  std::optional<int64_t> i64() { return number<int64_t>(); }
  // A u64 length, then that many bytes (at most `max`).
  std::optional<std::vector<uint8_t>> data(uint64_t max);
  std::optional<std::string> text(uint64_t max);
  size_t used() const { return at_; }
  bool bad() const { return bad_; }

 private:
  template <class T>
  std::optional<T> number();
  std::span<const uint8_t> in_;
  size_t at_ = 0;
  bool bad_ = false;
};

std::vector<uint8_t> bytes_of(std::string_view s);
std::string text_of(std::span<const uint8_t> v);

}  // namespace phos::net
