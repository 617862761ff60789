// The soft provider's shared-memory rings: the byte stream of a connection between two processes of
// one host, without the TCP stack. The connection reaches them through a RingLink (link.h,
// ring_link.cc), which adds the socket whose hang-up says the peer is gone.
//
// A RingPair is one connection's pair of single-producer single-consumer byte rings in a sealed
// memfd that both processes map: ring 0 carries the requester's bytes to the responder, ring 1 the
// responder's to the requester. The frames on them are the TCP path's (wire.h), so every RC rule,
// check and error of the protocol holds unchanged; only the transport differs. Each side sleeps on
// an eventfd of its own; a producer writes the peer's eventfd only when the peer said it sleeps
// (after emptying its ring) and a consumer only when the producer said it waits for room, so a
// busy stream makes no system call per frame. Before it says it sleeps, a consumer polls its ring
// for a short while (an adaptive spin: longer while spinning keeps finding data, none once it
// stops paying). A consumer whose application polls (and takes the ring's frames itself) says
// until when it does: before then a producer wakes no one.
//
// The requester creates the segment and both eventfds and hands them to the responder over an
// AF_UNIX SOCK_SEQPACKET connection (SCM_RIGHTS) to the responder's ring listener, whose abstract
// name carries a random nonce the responder gave in a TCP hello reply. That name is visible to
// every process of the host (/proc/net/unix), so it proves nothing: the setup must also carry the
// one-time ticket of the same reply, which went only over the TCP connection, and come from a
// process of the listener's user. That connection stays open
// for the ring's life: its hang-up tells either side that the other is gone (or closed), just as a
// TCP reset does.
//
// Everything in the shared segment may be scribbled on by a hostile peer: a side keeps its own
// indices privately, checks the peer's (a ring never holds more than its size), and the frames are
// decoded by the one fuzzed decoder. The segment must be sealed against shrinking and growing, so
// the peer cannot take mapped pages away.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ferry/common/status.h"

namespace ferry::soft {

namespace ring_layout {
struct RingSegment;
struct Control;
}  // namespace ring_layout

// The setup message the requester sends with its three descriptors (memfd, its own eventfd, the
// responder's eventfd), little-endian: u64 magic, u32 version, u32 ring bytes, u64 ticket (the
// one-time secret of the responder's hello reply, wire::FrameHeader::ringTicket).
struct RingSetupMessage {
  static constexpr uint64_t kMagic = 0x676e6972'79727266ull;  // "ferryring"
  static constexpr uint32_t kVersion = 3;
  uint64_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t ringBytes = 0;
  uint64_t ticket = 0;
};
static_assert(sizeof(RingSetupMessage) == 24);

class RingPair {
 public:
  // The size of each of the two rings (a power of two): FERRY_SOFT_RING_BYTES, default 1 MiB,
  // 64 KiB to 64 MiB.
  static size_t defaultRingBytes();

  // The requester's side: a new segment with rings of ringBytes and two new eventfds.
  static Result<std::unique_ptr<RingPair>> create(size_t ringBytes);
  // The responder's side: adopts the descriptors a requester sent (takes ownership of all three,
  // closing them on failure). Refuses a segment that is not a sealed memfd of the size the message
  // says, rings of a size out of range, and descriptors that are not eventfds.
  static Result<std::unique_ptr<RingPair>> adopt(const RingSetupMessage& msg, int memfd, int ownWake,
                                                 int peerWake);
  ~RingPair();
  RingPair(const RingPair&) = delete;
  RingPair& operator=(const RingPair&) = delete;

  // What the requester sends: the message and its descriptors (memfd, requester's and
  // responder's eventfds), owned by this pair.
  RingSetupMessage setupMessage() const;
  int memfd() const { return memfd_; }
  int ownWakeFd() const { return ownWake_; }
  int peerWakeFd() const { return peerWake_; }

  // Producer: copies as much of iov as fits; returns the bytes taken. When the ring is full it
  // asks the peer to wake us once there is room and returns -1 with errno EAGAIN.
  ssize_t writev(const iovec* iov, int count);
  // Consumer: copies up to the bytes available into iov; -1 with errno EAGAIN when the ring is
  // empty, EPROTO when the peer's index is impossible (the link must be dropped).
  ssize_t readv(const iovec* iov, int count);
  ssize_t read(void* buf, size_t len) {
    iovec v{buf, len};
    return readv(&v, 1);
  }
  // Consumer, with the input drained: polls briefly (the adaptive spin), then tells the producer we
  // sleep. Returns true when bytes arrived meanwhile (keep reading; we are not asleep). nowNs is
  // the caller's reading of steadyNs(), possibly a run's (Reactor::runNow): while our lease
  // (attend) holds at nowNs, the producer is told we are attended, so that it neither wakes us
  // nor reads the clock to see the lease; the first drained poll after the lease's end (the
  // thread's sweep) puts us to sleep, and takes what was left before.
  // spin false: no adaptive spin first.
  bool prepareToSleep(int64_t nowNs, bool spin = true);
  // Consumer: bytes are waiting in the incoming ring.
  bool readable() const;
  // Consumer: our application polls this ring itself until untilNs (steadyNs()): the producer
  // does not wake us before then. 0 or a time past: wake us as usual. Whoever says so must take
  // what the ring holds at untilNs, as the producer may have left it there unannounced.
  void attend(int64_t untilNs);
  // Clears our eventfd after a wake-up.
  void clearWake();
  // Makes our eventfd readable: the progress thread comes back to this pair soon.
  void wakeSelf();

 private:
  RingPair() = default;
  ring_layout::Control& outCtl() const;
  ring_layout::Control& inCtl() const;
  void wakePeer();
  // Reads the consumer's tail again (with order) into outTailSeen_ and *room; false, with errno
  // EPROTO, when it is outside what we saw and our head (a peer breaking the rings' rules).
  bool refreshOutTail(ring_layout::Control& ctl, std::memory_order order, size_t* room);

  bool requester_ = false;
  int memfd_ = -1;
  int ownWake_ = -1;
  int peerWake_ = -1;
  uint8_t* base_ = nullptr;
  size_t mapBytes_ = 0;
  size_t ringBytes_ = 0;
  uint8_t* outData_ = nullptr;
  uint8_t* inData_ = nullptr;
  uint64_t outHead_ = 0;  // ours: bytes produced (the shared copy is only published)
  // The consumer's tail as we last read it. Room is counted from it, and the shared tail is read
  // again only when that room is short: the line the consumer writes at every read then stays in
  // its cache, where reading it at every write would pull it over (a cache miss on each side per
  // frame). The consumer only moves its tail on, so the room counted from an old tail is never
  // more than there is.
  uint64_t outTailSeen_ = 0;
  uint64_t inTail_ = 0;  // ours: bytes consumed
  int64_t spinNs_ = 0;   // the current spin budget (adapts between 0 and the maximum)
  int idleSleeps_ = 0;   // sleeps since the budget fell to 0
};

// How many ring links this process has set up (either side) and how many bytes it has written
// into rings: what tests and `ferry bench` read to tell which path carried the traffic.
uint64_t ringLinksMade();
uint64_t ringBytesWritten();
// How many times a producer of this process did not wake a sleeping consumer because its
// application was polling the ring (RingPair::attend).
uint64_t ringWakesSpared();
// How many ring connections this process's listeners refused (a stranger's user, too many pending,
// no valid ticket, a setup that cannot be trusted), and the count the listener adds to.
uint64_t ringSetupsRefused();
void countRingSetupRefused();

// The abstract AF_UNIX name a responder's ring listener is bound to, and its socket address.
std::string ringListenerName(uint32_t pid, uint64_t nonce);
socklen_t ringListenerAddress(uint32_t pid, uint64_t nonce, sockaddr_un* out);

// The requester's side of the handover: the pair's setup message, carrying ticket, and its three
// descriptors on sock.
Status sendRingSetup(int sock, const RingPair& rings, uint64_t ticket);
// The responder's side: reads a setup message and its descriptors from sock and adopts them when
// admit(ticket) says the message's ticket is one this process issued (admit consumes it).
// kUnavailable (cause EAGAIN) when nothing has arrived yet; kProtocolError for a hang-up, a
// ticket admit refuses, or a setup that cannot be trusted, with every descriptor that came closed.
Result<std::unique_ptr<RingPair>> receiveRingSetup(int sock,
                                                   const std::function<bool(uint64_t ticket)>& admit);

}  // namespace ferry::soft
