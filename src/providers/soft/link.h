// Link: the byte stream under one connection of the soft provider. A Conn (conn.h) frames the
// bytes (wire.h) and places payloads in registered memory; its Link only moves bytes and tells it
// when to look again. Two implementations stand behind this one interface:
//
//   TcpLink   a TCP socket: between hosts, and within a host where rings are not used.
//   RingLink  a pair of shared-memory rings (ring.h) between two processes of one host, with the
//             AF_UNIX socket that carried their setup, whose hang-up says the peer is gone.
//
// The RC protocol above (rc_requester.cc, rc_responder.cc) sees only Conn and its frames, so every
// rule of it holds the same over either link. Everything here runs on the context's loop (the
// progress thread, or an application thread that holds the loop: Reactor::progressOnce).
#pragma once

#include <netinet/in.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ferry/common/status.h"

namespace ferry {
class Reactor;
}

namespace ferry::soft {

class RingPair;

class Link {
 public:
  // What a link tells the connection above it (on the loop). The link holds it weakly: a
  // connection that is gone is told nothing.
  class Events {
   public:
    virtual ~Events() = default;
    // An outgoing connection finished connecting (kOk), or could not (the reason).
    virtual void onLinkConnected(const Status& result) = 0;
    // Bytes, or the end of the peer's stream, can be read.
    virtual void onLinkReadable() = 0;
    // A write that found no room may be tried again.
    virtual void onLinkWritable() = 0;
    // The link can no longer be trusted (the peer broke its rules): the connection must end.
    virtual void onLinkBroken(const Status& why) = 0;
  };

  // Every link has one socket (takes fd): the TCP connection, or the AF_UNIX socket whose hang-up
  // says a ring's peer is gone. The destructor closes only the descriptors: the reactor may be
  // gone by then. Whoever attached it detaches it first (Conn's close, or its destructor on the
  // loop).
  explicit Link(int fd) : fd_(fd) {}
  virtual ~Link();
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Starts watching the link's descriptors on reactor and telling events what happens.
  virtual Status attach(Reactor& reactor, std::weak_ptr<Events> events) = 0;
  // Stops watching them (the descriptors stay open until the link is destroyed or closed).
  virtual void detach() = 0;
  // Detaches and closes the socket; the peer sees the stream end. Idempotent.
  void close();
  bool closed() const { return fd_ < 0; }
  // Half-closes: the peer reads what was written, then the end of the stream.
  void shutdownWrite();

  // Socket semantics: the bytes taken (or, reading, placed), -1 with errno (EAGAIN: no room, or
  // nothing to read), 0 reading at the end of the peer's stream.
  virtual ssize_t writev(const iovec* iov, int count) = 0;
  virtual ssize_t readv(const iovec* iov, int count) = 0;
  ssize_t read(void* buf, size_t len) {
    iovec v{buf, len};
    return readv(&v, 1);
  }

  // The connection waits for room (writev said EAGAIN) or no longer does.
  virtual void wantWritable(bool want) = 0;
  // The connection reads nothing until told otherwise: stop saying the link is readable (a hang-up
  // or an error meanwhile is onLinkBroken). TCP links only; others ignore it.
  virtual void pauseReading(bool paused) {}
  // The connection stopped reading with bytes still waiting (it yields to the loop's other work):
  // make sure onLinkReadable comes again.
  virtual void resumeReadingLater() = 0;
  // The input is drained: poll briefly for more before waiting for onLinkReadable. True when bytes
  // arrived meanwhile (read on). spin false: no polling first (a look from a poll that found the
  // link empty, which must not hold its caller).
  virtual bool prepareToSleep(bool spin = true) { return false; }
  // The connection can do nothing with fewer than n more bytes (the rest of a large payload it
  // reads straight into place): the link may hold onLinkReadable back until that many wait, or
  // the peer's stream ends. 0: tell it of any byte (the default).
  virtual void awaitBytes(size_t n) {}

  // Whether the application's polls may take this link's input themselves (attend, pending).
  virtual bool pollable() const { return false; }
  // The application polls until untilNs (steadyNs()): the peer does not wake the progress thread
  // for this link's input before then (0: wake it as usual).
  virtual void attend(int64_t untilNs) {}
  // Bytes wait to be read (for a pollable link).
  virtual bool pending() const { return false; }

  // An outgoing connection whose connect() is still in progress (onLinkConnected tells the end).
  virtual bool connecting() const { return false; }
  // Whether the peer is a process of this host reached without the network (over rings).
  virtual bool sameHost() const = 0;
  // The peer's IPv4 address (network order) when the link runs over the network; nullopt otherwise.
  virtual std::optional<in_addr_t> peerAddress() const = 0;

 protected:
  int fd_;
  Reactor* reactor_ = nullptr;  // while attached
};

// A TCP socket (non-blocking, accepted or connected); connecting: the connect() is still in
// progress. Takes the fd and turns off Nagle (TCP_NODELAY).
std::unique_ptr<Link> makeTcpLink(int fd, bool connecting);
// Starts a TCP connection from localIp (0: any) to ip:port (network order): a link that is
// connecting, or the system call's error (kUnavailable).
Result<std::unique_ptr<Link>> dialTcpLink(in_addr_t localIp, in_addr_t ip, uint16_t port);

// Shared-memory rings; fd is the AF_UNIX socket that carried their setup. Takes both.
std::unique_ptr<Link> makeRingLink(int fd, std::unique_ptr<RingPair> rings);
// The requester's side of a ring connection: reaches the ring listener of process pid (nonce:
// its name, from the peer's hello reply), checks that pid owns it, creates the rings and hands them
// over with ticket (ring.h). The link is connected at once. kUnavailable with the reason when any
// step fails (the caller goes on over TCP).
Result<std::unique_ptr<Link>> dialRingLink(uint32_t pid, uint64_t nonce, uint64_t ticket);

}  // namespace ferry::soft
