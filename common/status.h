#pragma once
// Status and Result<T>: how every module boundary in copse reports failure.
//
// The code says what the caller does next, not where the error happened:
//   kInvalidArgument  bad input from a user (job file, flag, message): report it, do not retry
//   kNotFound         a named thing does not exist
//   kUnavailable      a peer or resource is gone for now: retry or re-place
//   kDataLoss         stored bytes failed their checksum or vanished: regenerate them
//   kResourceExhausted a limit (a vertex's memory) was reached: fail that work, not the process
//   kCancelled, kTimeout, kPermissionDenied, kFailedPrecondition, kIOError, kInternal
// Status is cheap to copy when ok (no allocation). Thread-compatible, like any value type.
#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace copse {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kUnavailable,
  kDataLoss,
  kCancelled,
  kTimeout,
  kPermissionDenied,
  kFailedPrecondition,
  kIOError,
  kInternal,
  kResourceExhausted,
};

/// Name of a status code, e.g. "InvalidArgument".
std::string_view StatusCodeName(StatusCode code);

/// The outcome of an operation: ok, or a code and a message that names where and what.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
  static Status Timeout(std::string m) { return {StatusCode::kTimeout, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status IOError(std::string m) { return {StatusCode::kIOError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  /// "InvalidArgument: message", or "OK".
  std::string ToString() const;
  /// The same code with `context` prepended to the message ("context: message").
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;
};

/// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T ValueOr(T fallback) const& { return ok() ? value() : std::move(fallback); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace copse

#define COPSE_CONCAT_INNER(a, b) a##b
#define COPSE_CONCAT(a, b) COPSE_CONCAT_INNER(a, b)

/// Returns the status from the enclosing function when `expr` is not ok.
#define COPSE_RETURN_NOT_OK(expr)          \
  do {                                     \
    ::copse::Status _copse_st = (expr);    \
    if (!_copse_st.ok()) return _copse_st; \
  } while (false)

#define COPSE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

/// `COPSE_ASSIGN_OR_RETURN(auto x, MakeX());` unwraps a Result or returns its status.
#define COPSE_ASSIGN_OR_RETURN(lhs, rexpr) COPSE_ASSIGN_OR_RETURN_IMPL(COPSE_CONCAT(_copse_res_, __LINE__), lhs, rexpr)
