// Dialer: how a queue pair's requester reaches its peer, and what it learned of the peer on the way.
//
// It dials the peer's listener over TCP, or the shared-memory rings the peer's hello reply names
// (a peer on this host), and while work waits (or for a while after RTS: the peer may not be at
// RTR yet) retries a refused or unanswered dial with backoff, 1 ms doubling to 100 ms. It keeps
// what the retries decide on: whether a connection to the peer's listener was ever made, whether
// a hello was ever accepted, whether the peer is gone, and whether rings to it failed (every later
// connection is TCP then). The queue pair adopts the links it dials (a Conn with itself as the
// delegate) and tells it how each ended. Reactor thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/reactor.h"
#include "ferry/common/status.h"
#include "ferry/verbs/types.h"
#include "providers/soft/link.h"

namespace ferry::soft {

class Dialer {
 public:
  using Clock = std::chrono::steady_clock;

  Dialer(Reactor& reactor, const uint32_t& qpn) : reactor_(reactor), qpn_(qpn) {}
  Dialer(const Dialer&) = delete;
  Dialer& operator=(const Dialer&) = delete;

  // The queue pair entered RTS: dialing starts afresh.
  void begin();
  // Back to RESET: everything learned of the peer is forgotten.
  void reset();

  // A TCP link to the peer's listener at its GID (connecting), from localIp. A refusal or an
  // unreachable peer may be retried; a failure of this process (no descriptors) is logged.
  Result<std::unique_ptr<Link>> dialTcp(in_addr_t localIp, const verbs::Gid& peerGid);
  // Rings to the peer process pid (from its hello reply); a failure means TCP from now on.
  Result<std::unique_ptr<Link>> dialRing(uint32_t pid, uint64_t nonce, uint64_t ticket);

  // Calls dial after the backoff, unless a retry is already pending, or no retry is due: the peer
  // is gone and nothing waits (`hasWork`), or nothing waits and the window since begin() (the
  // larger of `budget` and 2 s) has passed. dial holds its queue pair weakly (the timer may outlive
  // it) and calls retryDue() first.
  void scheduleRetry(bool hasWork, Clock::duration budget, std::function<void()> dial);
  void retryDue() { retryTimer_ = 0; }
  bool retryPending() const { return retryTimer_ != 0; }
  void cancelRetry();

  // What the connections told.
  void listenerReached() { listenerReached_ = true; }
  void helloAccepted() {
    peerReached_ = true;
    delayMs_ = 1;
  }
  // The peer is gone (why, logged the first time); false when that was known already.
  bool markPeerGone(const char* why);
  // Rings to the peer failed: every later connection is TCP.
  void stayOnTcp(const std::string& why);

  bool wasListenerReached() const { return listenerReached_; }
  bool wasPeerReached() const { return peerReached_; }
  bool peerGone() const { return peerGone_; }
  bool ringsRefused() const { return ringRefused_; }

 private:
  Reactor& reactor_;
  const uint32_t& qpn_;  // the queue pair's number, for the log (set after construction)
  Reactor::TimerId retryTimer_ = 0;
  Clock::time_point started_{};
  int delayMs_ = 1;
  bool listenerReached_ = false;  // a connection to the peer's listener was made once
  bool peerReached_ = false;      // a hello of ours was accepted once
  bool peerGone_ = false;         // since then, the peer refused a connection or lost its QP
  bool ringRefused_ = false;      // a ring connection to the peer failed: stay on TCP
};

}  // namespace ferry::soft
