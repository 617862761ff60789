// Status and Result<T>: how every fallible call in ferry's C++ core reports its outcome.
//
// The core never throws. A call returns a Status (or a Result<T> that holds either a T or a
// non-OK Status). A Status carries a stable code, a human-readable message and, where the
// failure came from the system or from a work completion, its cause (an errno value).
#pragma once

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ferry {

// Stable status codes. Numbers never change; new codes are only appended.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,       // EINVAL: bad handle, bad attribute, bad state for the call
  kNotSupported = 2,          // EOPNOTSUPP: the provider or device does not offer this
  kNotFound = 3,              // ENOENT / ENODEV: no such device, key or object
  kResourceExhausted = 4,     // ENOMEM: a queue is full, a limit is reached
  kPermissionDenied = 5,      // EACCES / EPERM
  kTimedOut = 6,              // ETIMEDOUT: a wait ran out of time
  kClosed = 7,                // the object (or its parent) was closed
  kIoError = 8,               // an operating-system call failed (cause holds errno)
  kProtocolError = 9,         // a peer sent something malformed or hostile
  kWorkCompletionError = 10,  // a work completion finished with an error status
  kCancelled = 11,            // the operation was cancelled
  kUnavailable = 12,          // the peer or device cannot be reached right now
  kInternal = 13,             // a broken invariant inside ferry (a bug: please report)
  kBusy = 14,                 // EBUSY: the object is still in use
  kPeerGone = 15,             // the peer died, restarted or stopped answering (agent layer)
};

// The name of a status code, e.g. "InvalidArgument".
const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, int cause = 0)
      : code_(code), cause_(cause), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  // errno for system failures (and the errno a libibverbs call would have set for verbs
  // refusals, e.g. EINVAL or ENOMEM); the WC status for kWorkCompletionError; else 0.
  int cause() const { return cause_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message> (errno 22: Invalid argument)"
  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  int cause_ = 0;
  std::string message_;
};

// Shorthands for the common refusals; each sets cause() to the errno libibverbs uses.
Status invalidArgument(std::string message);    // EINVAL
Status notSupported(std::string message);       // EOPNOTSUPP
Status notFound(std::string message);           // ENOENT
Status resourceExhausted(std::string message);  // ENOMEM
Status closedError(std::string message);        // EBADF
// An OS call failed: message plus strerror(err).
Status ioError(std::string message, int err = errno);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : value_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(value_).isOk()) {
      value_ = Status(StatusCode::kInternal, "Result constructed from an OK status");
    }
  }

  bool isOk() const { return std::holds_alternative<T>(value_); }
  explicit operator bool() const { return isOk(); }
  // The status: OK when a value is held.
  Status status() const { return isOk() ? Status() : std::get<Status>(value_); }
  T& value() & { return std::get<T>(value_); }
  const T& value() const& { return std::get<T>(value_); }
  T&& value() && { return std::get<T>(std::move(value_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace ferry

// Propagates a non-OK Status from an expression that yields a Status.
#define FERRY_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::ferry::Status ferryStatus_ = (expr);         \
    if (!ferryStatus_.isOk()) return ferryStatus_; \
  } while (0)

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)
// Declares `lhs` from a Result<T> expression, or returns its Status.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr)                                                                   \
  auto FERRY_CONCAT_(ferryResult_, __LINE__) = (expr);                                                      \
  if (!FERRY_CONCAT_(ferryResult_, __LINE__).isOk()) return FERRY_CONCAT_(ferryResult_, __LINE__).status(); \
  lhs = std::move(FERRY_CONCAT_(ferryResult_, __LINE__)).value()
