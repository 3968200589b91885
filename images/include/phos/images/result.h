// Result<T>: a value or an Error that says what failed, for code that crosses
// the C boundary of the CRIU plugin and the preload library, where exceptions
// must not travel.
#pragma once

#include <cerrno>
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
Error errno_error(const std::string& what, int err = errno);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_{};
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
