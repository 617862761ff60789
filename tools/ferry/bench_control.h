// The control connection of `ferry bench`: one TCP connection carrying JSON lines, each an object
// {"ferry_bench": 1, "type": "...", ...}. It exchanges parameters, paths, memory keys and results,
// never benchmark data. Every wait on it has a deadline, and every message is checked strictly
// before use: the right version, a known type, each field present with the right kind and range.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/json.h"
#include "ferry/common/status.h"

namespace ferry::cli::bench {

// Longest control line accepted (a hello of 1024 QPs' paths fits with room to spare).
inline constexpr size_t kMaxControlLine = size_t{4} << 20;

class ControlChannel {
 public:
  ControlChannel() = default;
  explicit ControlChannel(int fd) : fd_(fd) {}
  ControlChannel(ControlChannel&& other) noexcept;
  ControlChannel& operator=(ControlChannel&& other) noexcept;
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;
  ~ControlChannel();

  // Connects to host:port (a name or an address), trying each address for up to timeoutSec.
  static Result<ControlChannel> connect(const std::string& host, uint16_t port, double timeoutSec);

  // Sends one message: `message` gets "ferry_bench" and "type" in front of its members. Fails
  // with kUnavailable when the peer is gone or does not take the bytes within timeoutSec.
  Status send(std::string_view type, const json::Value& message, double timeoutSec);
  // Waits up to timeoutSec for one message. kTimedOut when none came, kUnavailable when the peer
  // closed the connection, kProtocolError for anything malformed (too long a line, bad JSON, not
  // an object, another protocol version, no type). A message of type "error" from the peer is
  // returned as kUnavailable carrying the peer's own message.
  Result<json::Value> receive(double timeoutSec);
  // As receive(), and the message must be of type `type` (else kProtocolError).
  Result<json::Value> expect(std::string_view type, double timeoutSec);
  // Tells the peer why this side gives up (best effort: errors are ignored).
  void sendError(const std::string& message);
  // Whether a message (or end of file) is waiting; waits up to timeoutMs.
  bool readable(int timeoutMs);

  // Where this connection is bound on this host (an IPv4 or IPv6 address as text).
  std::string localAddress() const;
  std::string peerAddress() const;
  int fd() const { return fd_; }
  void close();

 private:
  int fd_ = -1;
  std::string buffered_;
};

class ControlListener {
 public:
  ControlListener() = default;
  ControlListener(ControlListener&& other) noexcept;
  ControlListener(const ControlListener&) = delete;
  ControlListener& operator=(const ControlListener&) = delete;
  ~ControlListener();

  // Listens on address:port (port 0: the kernel picks one).
  static Result<ControlListener> listen(const std::string& address, uint16_t port);
  uint16_t port() const { return port_; }
  // Waits for one client; timeoutSec < 0 waits until one comes.
  Result<ControlChannel> accept(double timeoutSec);

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Field readers for a received message: kProtocolError naming the message type and field when the
// field is missing, of another kind, or out of [lo, hi].
Result<int64_t> intField(const json::Value& message, std::string_view field, int64_t lo, int64_t hi);
Result<double> numberField(const json::Value& message, std::string_view field, double lo, double hi);
Result<std::string> stringField(const json::Value& message, std::string_view field, size_t maxLength = 4096);
Result<bool> boolField(const json::Value& message, std::string_view field);
// An array field: kProtocolError unless it is an array of exactly `count` elements.
Result<const json::Array*> arrayField(const json::Value& message, std::string_view field, size_t count);
// An object field: kProtocolError unless it is a JSON object.
Result<const json::Value*> objectField(const json::Value& message, std::string_view field);

}  // namespace ferry::cli::bench
