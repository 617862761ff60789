// WireupConnection: one TCP connection of the agent's auxiliary channel (the wireup messages),
// driven by the agent's reactor thread: a line-framed connection (common/net/line_connection.h,
// where its bounds are) with what the agent keeps of each. Every method runs on the reactor thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/net/admission.h"
#include "common/net/line_connection.h"
#include "common/reactor.h"
#include "ferry/agent/address.h"
#include "ferry/common/status.h"

namespace ferry::agent {

class WireupConnection : public net::LineConnection {
 public:
  using LineCb = std::function<void(WireupConnection& link, std::string_view line)>;
  // Called once when the link ends: OK for an orderly end of file, else why. `connected` says
  // whether a connection was ever made (false: every address refused or did not answer).
  using CloseCb = std::function<void(WireupConnection& link, const Status& why, bool connected)>;

  // An accepted connection. Lines longer than maxLine, or more than kMaxPendingOutput of answers
  // the peer leaves unread, end it.
  static std::shared_ptr<WireupConnection> adopt(Reactor& reactor, int fd, size_t maxLine, LineCb onLine,
                                                 CloseCb onClose);
  // Connects to the first of `targets` that answers, trying them in order; lines sent before
  // the connection is made are kept and written once it is.
  static std::shared_ptr<WireupConnection> connect(Reactor& reactor, std::vector<ControlEndpoint> targets,
                                                   size_t maxLine, LineCb onLine, CloseCb onClose);
  static constexpr size_t kMaxPendingOutput = size_t{64} << 20;

  std::shared_ptr<WireupConnection> self() {
    return std::static_pointer_cast<WireupConnection>(shared_from_this());
  }

  // Who this link belongs to, for the agent (the peer's uuid once known).
  Uuid owner{};
  bool hasOwner = false;
  // An accepted link: its slot in the listener's admission (released with the link), when it last
  // carried a message that decoded, and whether a peer's wireup authenticated it (its REPLY or ACK
  // came on it, or it echoed a probe): an unauthenticated link is closed when idle (guard.cc).
  net::Admission::Ticket ticket;
  std::chrono::steady_clock::time_point lastValid{};
  bool authenticated = false;
  // Lines that change a peer's state, held while the link is being probed (guard.cc).
  std::vector<std::string> held;

 private:
  WireupConnection(Reactor& reactor, size_t maxLine, LineCb onLine, CloseCb onClose);
};

}  // namespace ferry::agent
