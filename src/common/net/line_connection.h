// LineConnection: one TCP connection carrying newline-terminated lines, driven by a Reactor, written
// once for every line protocol ferry speaks over TCP (the agent's wireup links, the `ferry store`
// server's clients). It never blocks: connecting, reading and writing all wait in the reactor, and
// every method runs on the reactor's loop.
//
// The bounds a peer must not be able to exceed live here, once:
// - a line longer than LineLimits::maxLine ends the connection (kProtocolError);
// - output the peer leaves unread beyond LineLimits::maxPendingOutput ends it (kResourceExhausted),
//   so a peer that sends requests and never reads the answers cannot grow this process.
// Empty lines are skipped.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/reactor.h"
#include "ferry/common/status.h"

namespace ferry::net {

struct LineLimits {
  size_t maxLine = size_t{1} << 20;
  size_t maxPendingOutput = size_t{64} << 20;
};

// An address to connect to: a numeric IPv4 or IPv6 address and a port.
struct LineTarget {
  bool ipv6 = false;
  std::string ip;
  uint16_t port = 0;
};

// Cuts a byte stream into lines, as LineConnection reads it: feed() appends what arrived, next()
// hands out each whole line in order (without its newline; empty lines are skipped unless the
// framer was made to hand them out), and
// overLimit() says whether the unfinished line is already longer than maxLine (the stream must
// end then). Pure: no I/O, so its whole behaviour is fuzzed (tests/fuzz/line_framer_fuzz.cc).
// LineConnection feeds it from the reactor; the blocking ControlChannel (common/control_channel.h)
// feeds it from its own reads.
class LineFramer {
 public:
  // What next() does with an empty line: skips it (LineConnection's protocols), or hands it out
  // like any other (ControlChannel, for which an empty line is a malformed message, not nothing).
  enum class EmptyLines { kSkip, kHandOut };

  explicit LineFramer(size_t maxLine, EmptyLines empty = EmptyLines::kSkip)
      : maxLine_(maxLine), empty_(empty) {}
  // Appends bytes; lines handed out before are no longer valid.
  void feed(std::string_view bytes);
  // The next whole line (non-empty unless EmptyLines::kHandOut), or nullopt when none is complete;
  // valid until the next call of feed().
  std::optional<std::string_view> next();
  // Whether next() would hand out a line now, without taking it: a blocking reader asks this to
  // know whether a message waits before it reads the socket.
  bool hasLine() const;
  // After next() returned nullopt: whether the bytes of the unfinished line exceed maxLine.
  bool overLimit() const { return unfinished() > maxLine_; }
  // After next() returned nullopt: how many bytes of an unfinished line are buffered (0 when the
  // stream so far ends at a line's end), so a reader at end of file can tell a message cut short
  // from an orderly end.
  size_t unfinished() const { return buffer_.size() - start_; }
  size_t maxLine() const { return maxLine_; }

 private:
  // Not const, so a framer can be moved into (as a ControlChannel is).
  size_t maxLine_;
  EmptyLines empty_;
  std::string buffer_;
  size_t start_ = 0;  // bytes of buffer_ already handed out
};

class LineConnection : public std::enable_shared_from_this<LineConnection> {
 public:
  using LineCb = std::function<void(LineConnection& conn, std::string_view line)>;
  // Called once when the connection ends by itself: OK for an orderly end of file, else why.
  // `connected` says whether a connection was ever made (false: every address refused or did not
  // answer). Not called after close().
  using CloseCb = std::function<void(LineConnection& conn, const Status& why, bool connected)>;
  // The line sent (best effort) before the connection closes on a line too long; none when empty.
  using FarewellCb = std::function<std::string(const Status& why)>;

  // An accepted, connected socket (non-blocking); the connection owns it from now on.
  static std::shared_ptr<LineConnection> adopt(Reactor& reactor, int fd, LineLimits limits, LineCb onLine,
                                               CloseCb onClose);
  // Connects to the first of `targets` that answers, trying them in order, each for at most
  // kConnectTimeout; lines sent before the connection is made are kept and written once it is.
  // `what` names the connection in its errors ("wireup: cannot connect to ...").
  static std::shared_ptr<LineConnection> connect(Reactor& reactor, std::vector<LineTarget> targets,
                                                 std::string what, LineLimits limits, LineCb onLine,
                                                 CloseCb onClose);
  static constexpr std::chrono::seconds kConnectTimeout{3};

  virtual ~LineConnection();
  LineConnection(const LineConnection&) = delete;
  LineConnection& operator=(const LineConnection&) = delete;

  // Queues one line (a newline is added) and writes what the socket takes.
  void send(std::string_view line);
  // Closes without calling onClose.
  void close();
  // Sends `line` if the socket takes it now (best effort), then closes without calling onClose:
  // for telling a peer why it is dropped.
  void closeWith(std::string_view line);
  bool open() const { return fd_ >= 0 || connecting_; }
  bool connected() const { return everConnected_; }
  void setFarewell(FarewellCb farewell) { farewell_ = std::move(farewell); }
  // Lets the kernel find a dead host: TCP keepalive probes after a third of `timeout` idle, and
  // unacknowledged data for longer than `timeout` ends the connection (TCP_USER_TIMEOUT). A dead
  // process is found at once (its kernel closes the socket); neither costs this process anything
  // while idle. Applied to the socket now and to any later one of a connecting connection.
  void setDeadPeerTimeout(std::chrono::milliseconds timeout);

 protected:
  LineConnection(Reactor& reactor, std::string what, LineLimits limits, LineCb onLine, CloseCb onClose);
  // For the factories of a subclass: start on an accepted socket / start connecting.
  void startAccepted(int fd);
  void startConnecting(std::vector<LineTarget> targets);

 private:
  void tryNextTarget();
  void onEvents(uint32_t events);
  void readSome();
  void writeSome();
  void fail(const Status& why);
  // Stops the connect timer and closes the socket (the connection may try another address after).
  void closeSocket();
  void watch();

  Reactor& reactor_;
  const std::string what_;
  const LineLimits limits_;
  LineCb onLine_;
  CloseCb onClose_;
  FarewellCb farewell_;
  int fd_ = -1;
  bool connecting_ = false;
  bool everConnected_ = false;
  bool registered_ = false;
  uint32_t watched_ = 0;  // the events the reactor watches now
  std::vector<LineTarget> targets_;
  size_t nextTarget_ = 0;
  Status lastError_;
  LineFramer in_;
  std::string out_;
  Reactor::TimerId connectTimer_ = 0;
  std::chrono::milliseconds deadPeerTimeout_{0};
};

}  // namespace ferry::net
