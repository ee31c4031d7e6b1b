// Status and error vocabulary shared by every entry point.
//
// Messages read `<operator>: <argument> <constraint>, got <actual>`. Categories (docs/decisions.md
// §9): invalid argument (the caller's mistake; index_out_of_range is the sub-case of a bad index
// *value*), not supported (valid but not implemented), internal (our bug), runtime (allocation,
// device). The C++ API returns Status and never throws; `throw_if_error` turns one into an Error.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace moe_routing {

enum class StatusCode : int {
  ok = 0,
  invalid_argument = 1,
  index_out_of_range = 2,  // an invalid argument whose *value* is an out-of-range index
  not_supported = 3,
  internal = 4,
  runtime = 5,
};

/// "ok", "invalid argument", "index out of range", "not supported", "internal error", "runtime
/// error".
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::ok; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

/// Exception form of a non-ok Status, for C++ callers who prefer exceptions.
class Error : public std::runtime_error {
 public:
  explicit Error(const Status& status)
      : std::runtime_error(status.message()), code_(status.code()) {}
  StatusCode code() const { return code_; }

 private:
  StatusCode code_;
};

inline void throw_if_error(const Status& status) {
  if (!status.is_ok()) throw Error(status);
}

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

/// Status builders: the message is the concatenation of the parts (streamed with <<).
template <typename... Parts>
Status invalid_argument(const Parts&... parts) {
  return Status(StatusCode::invalid_argument, detail::concat(parts...));
}
template <typename... Parts>
Status index_out_of_range(const Parts&... parts) {
  return Status(StatusCode::index_out_of_range, detail::concat(parts...));
}
template <typename... Parts>
Status not_supported(const Parts&... parts) {
  return Status(StatusCode::not_supported, detail::concat(parts...));
}
template <typename... Parts>
Status internal_error(const Parts&... parts) {
  return Status(StatusCode::internal, detail::concat(parts...));
}
template <typename... Parts>
Status runtime_error(const Parts&... parts) {
  return Status(StatusCode::runtime, detail::concat(parts...));
}

}  // namespace moe_routing

/// Returns early from the enclosing function with the status if it is not ok.
#define MOE_ROUTING_RETURN_IF_ERROR(expr)                         \
  do {                                                            \
    ::moe_routing::Status moe_routing_status_ = (expr);           \
    if (!moe_routing_status_.is_ok()) return moe_routing_status_; \
  } while (0)
