// ControlChannel: a blocking control connection carrying JSON lines, each an object
// {"<tag>": <version>, "type": "...", ...}, where the tag names the protocol ("ferry_bench" for
// `ferry bench`, "ferry_store" for the ferry:// discovery store's client). Every wait on it has a
// deadline, and every message is checked strictly before use: the right tag and version, a "type"
// string, and (through controlFields() below) each field present with the right kind and range.
//
// Calls: connect/listen/accept/send/receive block the calling thread until done or until their
// deadline (seconds, as a double). A channel is used by one thread at a time; moving it moves the
// connection. Statuses: kUnavailable (peer gone or refusing), kTimedOut (deadline passed),
// kProtocolError (a malformed line), kNotFound (a host name that does not resolve).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/json.h"
#include "common/json_fields.h"
#include "common/net/line_connection.h"
#include "ferry/common/status.h"

namespace ferry {

// What a channel speaks: the version field's name (the tag), the version, the longest line
// receive() accepts.
struct ControlProtocol {
  std::string tag;
  int version = 1;
  size_t maxLine = size_t{4} << 20;
};

class ControlChannel {
 public:
  ControlChannel() = default;
  // Takes ownership of a connected stream socket (or a pipe's read end, for receive only).
  ControlChannel(int fd, ControlProtocol protocol) : fd_(fd), protocol_(std::move(protocol)) {}
  ControlChannel(ControlChannel&& other) noexcept;
  ControlChannel& operator=(ControlChannel&& other) noexcept;
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;
  ~ControlChannel();

  // Connects to host:port (a name or an address), trying each address again until timeoutSec has
  // passed (a server that is still starting refuses at first). kNotFound when the name does not
  // resolve; kUnavailable or kTimedOut when no address answered in time.
  static Result<ControlChannel> connect(const std::string& host, uint16_t port, double timeoutSec,
                                        ControlProtocol protocol);

  // Sends one message: `message` gets the protocol's tag and "type" in front of its members. Fails
  // with kUnavailable when the peer is gone, kTimedOut when it does not take the bytes within
  // timeoutSec.
  Status send(std::string_view type, const json::Value& message, double timeoutSec);
  // Waits up to timeoutSec for one message. kTimedOut when none came, kUnavailable when the peer
  // closed the connection, kProtocolError for anything malformed (a line longer than the
  // protocol's maxLine, bad JSON, not an object, no tag or another version, no type). A message of type
  // "error" from the peer is returned as kUnavailable carrying the peer's own message.
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
  const ControlProtocol& protocol() const { return protocol_; }
  // Closes the connection (idempotent); later calls fail with kClosed.
  void close();

 private:
  int fd_ = -1;
  ControlProtocol protocol_;
  // Cuts the input into lines; an empty one is handed out too, and refused as malformed.
  net::LineFramer in_{protocol_.maxLine, net::LineFramer::EmptyLines::kHandOut};
};

class ControlListener {
 public:
  ControlListener() = default;
  ControlListener(ControlListener&& other) noexcept;
  ControlListener(const ControlListener&) = delete;
  ControlListener& operator=(const ControlListener&) = delete;
  ~ControlListener();

  // Listens on address:port (a numeric address; port 0: the kernel picks one). The channels it
  // accepts speak `protocol`. kInvalidArgument for an address that is not numeric, kIoError when
  // the port cannot be bound.
  static Result<ControlListener> listen(const std::string& address, uint16_t port, ControlProtocol protocol);
  // The port it listens on (the kernel's choice when 0 was asked).
  uint16_t port() const { return port_; }
  // Waits for one client; timeoutSec < 0 waits until one comes. kTimedOut when none came.
  Result<ControlChannel> accept(double timeoutSec);

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  ControlProtocol protocol_;
};

// The strict reader of a received message's fields (common/json_fields.h): kProtocolError worded
// "control message '<type>': field '<name>' <problem>" when a field is missing, of another kind, or
// out of range. The message must outlive the reader.
json::Fields controlFields(const json::Value& message);

}  // namespace ferry
