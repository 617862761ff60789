// TcpLink: a connection's bytes over a non-blocking TCP socket (link.h).
//
// epoll is level-triggered here: a reader that stops with bytes still queued is called again
// without being asked to, and EPOLLOUT is watched only while a write waits for room (or the
// connect() is in progress), so an idle connection wakes nobody.
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/device_access.h"
#include "common/reactor.h"
#include "providers/soft/link.h"

namespace ferry::soft {
namespace {

// TCP_NOTSENT_LOWAT of every TCP link, and the cap of its SO_RCVLOWAT (awaitBytes). Chosen together
// on loopback (docs/performance-log.md, "TCP: unsent bytes held to 1 MiB, reads of 512 KiB"): 16-64
// MiB WRITEs and READs 11-19% faster (29% in one round) than with the whole send buffer unsent and
// a 256 KiB mark, the same 8 B and 1 MiB latency.
constexpr size_t kNotSentLowWater = 1024 * 1024;
constexpr size_t kMaxLowWater = 512 * 1024;

class TcpLink final : public Link {
 public:
  TcpLink(int fd, bool connecting) : Link(fd), connecting_(connecting) {}

  Status attach(Reactor& reactor, std::weak_ptr<Events> events) override {
    reactor_ = &reactor;
    return reactor.addFd(fd_, interest(), [this, events = std::move(events)](uint32_t ev) {
      // The link lives as long as its connection: one that is gone is told nothing.
      if (auto owner = events.lock()) onEvents(*owner, ev);
    });
  }

  void detach() override {
    if (reactor_ && fd_ >= 0) reactor_->removeFd(fd_);
    reactor_ = nullptr;
  }

  ssize_t writev(const iovec* iov, int count) override {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(count);
    DeviceAccess device;  // the pieces are registered memory (and frame headers)
    return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  ssize_t readv(const iovec* iov, int count) override {
    DeviceAccess device;  // straight into registered memory
    return ::readv(fd_, iov, count);
  }

  void wantWritable(bool want) override {
    if (want == wantWrite_) return;
    wantWrite_ = want;
    updateInterest();
  }

  // Level-triggered: the socket stays readable, so the loop comes back by itself.
  void resumeReadingLater() override {}

  void pauseReading(bool paused) override {
    if (paused == readingPaused_) return;
    readingPaused_ = paused;
    updateInterest();
  }

  // SO_RCVLOWAT: epoll says the socket is readable only once this many bytes wait (a hang-up or
  // an error still says so at once, and a read still returns what there is). A large payload is
  // then read in a few large reads, and the sender's every segment does not wake this side's
  // thread (on a machine with few cores each wake-up costs the sender its core for a while).
  // Capped well inside the receive window, so the bytes can always come.
  void awaitBytes(size_t n) override {
    const int lowWater = static_cast<int>(std::clamp<size_t>(n, 1, kMaxLowWater));
    if (lowWater == lowWater_ || fd_ < 0) return;
    if (::setsockopt(fd_, SOL_SOCKET, SO_RCVLOWAT, &lowWater, sizeof lowWater) == 0) lowWater_ = lowWater;
  }

  bool connecting() const override { return connecting_; }
  bool sameHost() const override { return false; }

  std::optional<in_addr_t> peerAddress() const override {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    if (fd_ < 0 || ::getpeername(fd_, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer.sin_family != AF_INET) {
      return std::nullopt;
    }
    return peer.sin_addr.s_addr;
  }

 private:
  uint32_t interest() const {
    const uint32_t out = (wantWrite_ || connecting_) ? uint32_t{EPOLLOUT} : 0;
    const uint32_t in = readingPaused_ ? 0 : uint32_t{EPOLLIN} | uint32_t{EPOLLRDHUP};
    return in | out;
  }

  void updateInterest() {
    if (reactor_ && fd_ >= 0) (void)reactor_->modFd(fd_, interest());
  }

  void onEvents(Events& owner, uint32_t events) {
    if (connecting_) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
        // A refused connect says ECONNREFUSED in SO_ERROR; a hang-up without an error reached the
        // listener, which dropped it: not a refusal (rc_requester.cc takes refusals for a peer gone).
        const int cause = err ? err : ECONNRESET;
        owner.onLinkConnected(
            Status(StatusCode::kUnavailable, std::string("connect failed: ") + std::strerror(cause), cause));
        return;
      }
      connecting_ = false;
      updateInterest();
      owner.onLinkConnected(Status::ok());
      return;
    }
    if (readingPaused_ && (events & (EPOLLERR | EPOLLHUP))) {
      // Reported whatever the interest (level-triggered: again and again): the connection ends.
      owner.onLinkBroken(
          Status(StatusCode::kUnavailable, "the connection failed while its input waited", ECONNRESET));
      return;
    }
    // The owner may close this link from the first call: the fd says whether to go on.
    if (!readingPaused_ && (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))) owner.onLinkReadable();
    if (fd_ >= 0 && (events & EPOLLOUT)) owner.onLinkWritable();
  }

  bool connecting_;
  bool wantWrite_ = false;
  bool readingPaused_ = false;
  int lowWater_ = 1;  // SO_RCVLOWAT now
};

}  // namespace

std::unique_ptr<Link> makeTcpLink(int fd, bool connecting) {
  int one = 1;  // frames leave when written: a small message waits for no acknowledgement
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // At most kNotSentLowWater bytes wait in the kernel unsent: a large payload is taken from the
  // caller's memory as the connection drains it, not up to the whole send buffer (4 MiB here)
  // ahead, so what the kernel copied is still in the caches when it leaves.
  int notSent = static_cast<int>(kNotSentLowWater);
  ::setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &notSent, sizeof notSent);
  return std::make_unique<TcpLink>(fd, connecting);
}

Result<std::unique_ptr<Link>> dialTcpLink(in_addr_t localIp, in_addr_t ip, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ioError("socket");
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = localIp;
  (void)::bind(fd, reinterpret_cast<sockaddr*>(&local),
               sizeof local);  // a soft device speaks from its own address
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_addr.s_addr = ip;
  peer.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) != 0 && errno != EINPROGRESS) {
    Status st = ioError("connect");
    ::close(fd);
    return st;
  }
  return makeTcpLink(fd, /*connecting=*/true);
}

}  // namespace ferry::soft
