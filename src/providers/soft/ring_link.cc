// RingLink: a connection's bytes over a pair of shared-memory rings between two processes of one
// host (link.h, ring.h).
//
// Two descriptors are watched: our eventfd, which the peer writes when it put bytes in a ring we
// said we sleep on or freed room it said it waits for, and the AF_UNIX socket that carried the
// rings' setup. Nothing may arrive on that socket after the setup; its hang-up says the peer is
// gone (or closed its side), and the peer's stream then ends once its ring is empty, as a TCP
// stream ends at the FIN.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/clock.h"
#include "common/reactor.h"
#include "providers/soft/link.h"
#include "providers/soft/ring.h"

namespace ferry::soft {
namespace {

class RingLink final : public Link {
 public:
  // The rings close their own descriptors; Link the socket.
  RingLink(int fd, std::unique_ptr<RingPair> rings) : Link(fd), rings_(std::move(rings)) {}

  Status attach(Reactor& reactor, std::weak_ptr<Events> events) override {
    // Control, not data (Reactor::FdUse): the context's poller takes the frames of a ring its
    // application polls, and its producer writes the eventfd only when that application sleeps;
    // the socket tells of a hang-up.
    using Use = Reactor::FdUse;
    FERRY_RETURN_IF_ERROR(reactor.addFd(
        rings_->ownWakeFd(), EPOLLIN,
        [this, events](uint32_t) {
          if (auto owner = events.lock()) onWake(*owner);
        },
        Use::kControl));
    Status st = reactor.addFd(
        fd_, EPOLLIN | EPOLLRDHUP,
        [this, events](uint32_t ev) {
          if (auto owner = events.lock()) onSocket(*owner, ev);
        },
        Use::kControl);
    if (!st.isOk()) {
      reactor.removeFd(rings_->ownWakeFd());
      return st;
    }
    reactor_ = &reactor;
    socketWatched_ = true;
    // Bytes may have arrived before we watched the eventfd.
    reactor.post([this, events] {
      if (auto owner = events.lock()) onWake(*owner);
    });
    return Status::ok();
  }

  void detach() override {
    if (!reactor_) return;
    reactor_->removeFd(rings_->ownWakeFd());
    if (socketWatched_) reactor_->removeFd(fd_);
    socketWatched_ = false;
    reactor_ = nullptr;
  }

  ssize_t writev(const iovec* iov, int count) override { return rings_->writev(iov, count); }

  ssize_t readv(const iovec* iov, int count) override {
    ssize_t n = rings_->readv(iov, count);
    if (n < 0 && errno == EAGAIN && peerHungUp_) return 0;  // the ring is empty and the peer is gone
    return n;
  }

  // A producer waiting for room is woken through our eventfd (RingPair::writev asked for it).
  void wantWritable(bool) override {}

  // Nothing else would bring the loop back: the peer writes our eventfd only when we said we sleep.
  void resumeReadingLater() override { rings_->wakeSelf(); }

  bool prepareToSleep(bool spin) override {
    if (peerHungUp_) return false;
    // The run's clock: the loop's pollers read it already, so a drained poll reads it no more.
    const int64_t now = reactor_ ? reactor_->runNowNs() : steadyNs();
    return rings_->prepareToSleep(now, spin);
  }

  bool pollable() const override { return true; }
  void attend(int64_t untilNs) override {
    if (fd_ >= 0) rings_->attend(untilNs);
  }
  bool pending() const override { return fd_ >= 0 && rings_->readable(); }

  // It reached our abstract socket from our network namespace: a process of this host.
  bool sameHost() const override { return true; }
  std::optional<in_addr_t> peerAddress() const override { return std::nullopt; }

 private:
  void onWake(Events& owner) {
    if (fd_ < 0) return;
    rings_->clearWake();
    // The wake-up may be for bytes to read or for room to write.
    owner.onLinkReadable();
    if (fd_ >= 0) owner.onLinkWritable();
  }

  void onSocket(Events& owner, uint32_t events) {
    if (fd_ < 0) return;
    if (events & EPOLLIN) {
      char byte;
      ssize_t n = ::recv(fd_, &byte, 1, MSG_DONTWAIT);
      if (n > 0) {
        owner.onLinkBroken(Status(StatusCode::kProtocolError, "bytes on a ring's socket after its setup"));
        return;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    } else if (!(events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR))) {
      return;
    }
    // The peer closed its side (or died): what it wrote before is in the ring; read it, then end.
    peerHungUp_ = true;
    if (socketWatched_ && reactor_) reactor_->removeFd(fd_);
    socketWatched_ = false;
    owner.onLinkReadable();
  }

  std::unique_ptr<RingPair> rings_;
  bool socketWatched_ = false;
  bool peerHungUp_ = false;  // the socket hung up: the peer's stream ends with the ring's bytes
};

}  // namespace

std::unique_ptr<Link> makeRingLink(int fd, std::unique_ptr<RingPair> rings) {
  return std::make_unique<RingLink>(fd, std::move(rings));
}

Result<std::unique_ptr<Link>> dialRingLink(uint32_t pid, uint64_t nonce, uint64_t ticket) {
  auto fail = [](std::string why) { return Status(StatusCode::kUnavailable, std::move(why)); };
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(std::string("socket: ") + std::strerror(errno));
  sockaddr_un un;
  socklen_t unLen = ringListenerAddress(pid, nonce, &un);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&un), unLen) != 0) {
    int err = errno;
    ::close(fd);
    return fail(std::string("connect to the peer's ring listener: ") + std::strerror(err));
  }
  // The listener's name came from the peer's hello reply; its owner must be the process named there.
  ucred cred{};
  socklen_t credLen = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credLen) != 0 ||
      static_cast<uint32_t>(cred.pid) != pid) {
    ::close(fd);
    return fail("the ring listener belongs to another process");
  }
  auto rings = RingPair::create(RingPair::defaultRingBytes());
  if (!rings.isOk()) {
    ::close(fd);
    return fail(rings.status().toString());
  }
  if (Status sent = sendRingSetup(fd, **rings, ticket); !sent.isOk()) {
    ::close(fd);
    return fail(sent.toString());
  }
  return makeRingLink(fd, std::move(*rings));
}

}  // namespace ferry::soft
