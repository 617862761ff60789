// Link: one TCP connection of the agent's auxiliary channel, driven by the agent's reactor thread.
// It carries newline-terminated lines (the wireup messages) and never blocks: connecting, reading
// and writing all wait in the reactor. Every method runs on the reactor thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/net/admission.h"
#include "common/reactor.h"
#include "ferry/agent/address.h"
#include "ferry/common/status.h"

namespace ferry::agent {

class Link : public std::enable_shared_from_this<Link> {
 public:
  using LineCb = std::function<void(Link& link, std::string_view line)>;
  // Called once when the link ends: OK for an orderly end of file, else why. `connected` says
  // whether a connection was ever made (false: every address refused or did not answer).
  using CloseCb = std::function<void(Link& link, const Status& why, bool connected)>;

  // An accepted connection.
  static std::shared_ptr<Link> adopt(Reactor& reactor, int fd, size_t maxLine, LineCb onLine,
                                     CloseCb onClose);
  // Connects to the first of `targets` that answers, trying them in order; lines sent before
  // the connection is made are kept and written once it is.
  static std::shared_ptr<Link> connect(Reactor& reactor, std::vector<ControlEndpoint> targets, size_t maxLine,
                                       LineCb onLine, CloseCb onClose);
  ~Link();

  // Queues one line (a newline is added) and writes what the socket takes.
  void send(std::string_view line);
  // Closes without calling onClose.
  void close();
  bool open() const { return fd_ >= 0 || connecting_; }
  bool connected() const { return everConnected_; }
  // Lets the kernel find a dead host: TCP keepalive probes after a third of `timeout` idle, and
  // unacknowledged data for longer than `timeout` ends the connection (TCP_USER_TIMEOUT). A dead
  // process is found at once (its kernel closes the socket); neither costs this process anything
  // while idle. Applied to the socket now and to any later one of a connecting link.
  void setDeadPeerTimeout(std::chrono::milliseconds timeout);
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
  Link(Reactor& reactor, size_t maxLine, LineCb onLine, CloseCb onClose)
      : reactor_(reactor), maxLine_(maxLine), onLine_(std::move(onLine)), onClose_(std::move(onClose)) {}
  void tryNextTarget();
  void onEvents(uint32_t events);
  void readSome();
  void writeSome();
  void fail(const Status& why);
  // Stops the connect timer and closes the socket (the link may try another address after).
  void closeSocket();
  void watch();

  Reactor& reactor_;
  const size_t maxLine_;
  LineCb onLine_;
  CloseCb onClose_;
  int fd_ = -1;
  bool connecting_ = false;
  bool everConnected_ = false;
  bool registered_ = false;
  std::vector<ControlEndpoint> targets_;
  size_t nextTarget_ = 0;
  Status lastError_;
  std::string in_;
  std::string out_;
  Reactor::TimerId connectTimer_ = 0;
  std::chrono::milliseconds deadPeerTimeout_{0};
};

}  // namespace ferry::agent
