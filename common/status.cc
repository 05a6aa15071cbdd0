#include "common/status.h"

namespace copse {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kTimeout: return "Timeout";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code()));
  s += ": ";
  s += message();
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message();
  return Status(code(), std::move(m));
}

}  // namespace copse
