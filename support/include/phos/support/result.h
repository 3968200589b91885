// Result<T>: a value or an Error that says what failed, for code that crosses
// the C boundary of the CRIU plugin and the preload library, where exceptions
// must not travel. Header-only and depending on nothing else of phos, so that
// every library (images and speculation too) speaks it.
//
// The error type is Error unless a library needs callers to tell failures
// apart by kind: it then derives its own from Error (carrying the kind) and
// returns Result<T, ItsError>; such an error still converts to a plain Error
// where it is passed on (PHOS_TRY into a Result<U>).
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace phos {

struct Error {
  std::string message;
  int code = EINVAL;  // an errno value, for callers that must return one
};

inline Error make_error(std::string message, int code = EINVAL) { return Error{std::move(message), code}; }

// An Error carrying errno's text: "what: strerror(errno)".
inline Error errno_error(const std::string& what, int err = errno) {
  return Error{what + ": " + std::strerror(err), err};
}

template <class T, class E = Error>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}
  Result(E error) : v_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  const E& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, E> v_;
};

template <class E>
class [[nodiscard]] Result<void, E> {
 public:
  Result() = default;
  Result(E error) : error_(std::move(error)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const E& error() const { return error_; }

 private:
  E error_{};
  bool ok_ = true;
};

// Propagates an error: PHOS_TRY(expr) returns expr's Error from the caller.
#define PHOS_TRY(expr)                          \
  do {                                          \
    auto phos_try_result_ = (expr);             \
    if (!phos_try_result_.ok())                 \
      return phos_try_result_.error();          \
  } while (0)

}  // namespace phos
