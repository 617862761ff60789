#include "ferry/common/status.h"

#include <cstring>

namespace ferry {

const char* statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "Ok";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kTimedOut: return "TimedOut";
    case StatusCode::kClosed: return "Closed";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kProtocolError: return "ProtocolError";
    case StatusCode::kWorkCompletionError: return "WorkCompletionError";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kBusy: return "Busy";
    case StatusCode::kPeerGone: return "PeerGone";
  }
  // A code from a newer peer or a corrupted value: still printable, never a crash.
  return "Unknown";
}

namespace {

// strerror() is not thread-safe; the GNU and XSI strerror_r differ in their return type, so both
// overloads are handled here.
[[maybe_unused]] const char* strerrorResult(int result, const char* buffer) {
  return result == 0 ? buffer : "Unknown error";
}
[[maybe_unused]] const char* strerrorResult(const char* result, const char* /*buffer*/) { return result; }

std::string errnoText(int err) {
  char buffer[128] = {};
  return strerrorResult(strerror_r(err, buffer, sizeof buffer), buffer);
}

}  // namespace

std::string Status::toString() const {
  std::string text = statusCodeName(code_);
  if (!message_.empty()) {
    text += ": ";
    text += message_;
  }
  if (cause_ != 0) {
    // For kWorkCompletionError the cause is a WC status, not an errno.
    if (code_ == StatusCode::kWorkCompletionError) {
      text += " (wc status " + std::to_string(cause_) + ")";
    } else {
      text += " (errno " + std::to_string(cause_) + ": " + errnoText(cause_) + ")";
    }
  }
  return text;
}

Status invalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message), EINVAL);
}

Status notSupported(std::string message) {
  return Status(StatusCode::kNotSupported, std::move(message), EOPNOTSUPP);
}

Status notFound(std::string message) { return Status(StatusCode::kNotFound, std::move(message), ENOENT); }

Status resourceExhausted(std::string message) {
  return Status(StatusCode::kResourceExhausted, std::move(message), ENOMEM);
}

Status closedError(std::string message) { return Status(StatusCode::kClosed, std::move(message), EBADF); }

Status ioError(std::string message, int err) {
  message += ": ";
  message += errnoText(err);
  return Status(StatusCode::kIoError, std::move(message), err);
}

}  // namespace ferry
