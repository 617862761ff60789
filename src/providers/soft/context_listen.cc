// SoftContext's listeners: TCP connections and ring handovers accepted (bounded in number and in
// time), their hellos answered, and each handed to the queue pair it names (reactor thread).
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/log.h"
#include "providers/soft/conn.h"
#include "providers/soft/hello_gate.h"
#include "providers/soft/qp.h"
#include "providers/soft/ring.h"
#include "providers/soft/soft.h"

namespace ferry::soft {
namespace {

constexpr int kHelloTimeoutMs = 5000;
// Handshakes not finished yet are bounded in number (each holds a descriptor and, over TCP, a
// connection's buffers) as well as in time (kHelloTimeoutMs): past the bound a new connection is
// closed at once, so a flood of silent connections costs this process a bounded amount.
constexpr size_t kMaxPendingConns = 4096;
constexpr size_t kMaxPendingRingSockets = 1024;
constexpr size_t kMaxRingTickets = 4096;

// Whether ip is an address of this host (in this network namespace): it can be bound.
bool isLocalAddress(in_addr_t ip) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = ip;
  bool local = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return local;
}

// The address a hello that came over a same-host link speaks for: a process of this host (it
// reached our abstract socket from our network namespace) may speak for any address of this host,
// as over loopback TCP, and for no other (0).
in_addr_t sameHostPeerIp(const wire::FrameHeader& hello) {
  in_addr_t ip;
  uint16_t port;
  verbs::Gid src;
  src.raw = hello.srcGid;
  return parseSoftGid(src, &ip, &port) && isLocalAddress(ip) ? ip : 0;
}

}  // namespace

void SoftContext::onAcceptFromLoop() {
  FERRY_ON_LOOP(reactor_);
  for (int i = 0; i < 64; ++i) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    int fd = ::accept4(listenFd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        FERRY_LOG(kWarn, "%s: accept failed: %s", device_.info.name.c_str(), std::strerror(errno));
      }
      return;
    }
    if (pendingConns_.size() >= kMaxPendingConns) {
      FERRY_LOG(kWarn, "%s: %zu connections have not said hello yet; closing a new one",
                device_.info.name.c_str(), pendingConns_.size());
      ::close(fd);
      continue;
    }
    auto conn = std::make_shared<Conn>(this, makeTcpLink(fd, /*connecting=*/false), gate_.get());
    if (!conn->attach().isOk()) continue;
    awaitHelloFromLoop(conn);
  }
}

void SoftContext::awaitHelloFromLoop(const std::shared_ptr<Conn>& conn) {
  FERRY_ON_LOOP(reactor_);
  pendingConns_[conn.get()] = conn;
  // A connection that does not introduce itself in time is dropped.
  std::weak_ptr<Conn> weak = conn;
  reactor_.addTimer(Reactor::Clock::now() + std::chrono::milliseconds(kHelloTimeoutMs), [this, weak] {
    auto c = weak.lock();
    if (!c) return;
    auto it = pendingConns_.find(c.get());
    if (it == pendingConns_.end()) return;
    pendingConns_.erase(it);
    c->close(Status::ok(), true);
  });
}

void SoftContext::onRingAcceptFromLoop() {
  FERRY_ON_LOOP(reactor_);
  for (int i = 0; i < 64; ++i) {
    int fd = ::accept4(ringListenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        FERRY_LOG(kWarn, "%s: ring accept failed: %s", device_.info.name.c_str(), std::strerror(errno));
      }
      return;
    }
    // Only a process of our own user may hand us a ring (its memory and descriptors become ours
    // to map and wait on), and only so many may be half-way through their setup at once.
    ucred cred{};
    socklen_t credLen = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credLen) != 0 || cred.uid != ::geteuid()) {
      FERRY_LOG(kWarn, "%s: refused a ring connection from process %d of user %u (not ours)",
                device_.info.name.c_str(), static_cast<int>(cred.pid), static_cast<unsigned>(cred.uid));
      countRingSetupRefused();
      ::close(fd);
      continue;
    }
    if (pendingRingSockets_.size() >= kMaxPendingRingSockets) {
      FERRY_LOG(kWarn, "%s: %zu ring connections have not sent their setup yet; closing a new one",
                device_.info.name.c_str(), pendingRingSockets_.size());
      countRingSetupRefused();
      ::close(fd);
      continue;
    }
    if (onRingSetupFromLoop(fd)) continue;
    // The setup message is not here yet: wait for it, for as long as a hello may take.
    auto timer =
        reactor_.addTimer(Reactor::Clock::now() + std::chrono::milliseconds(kHelloTimeoutMs), [this, fd] {
          if (pendingRingSockets_.erase(fd) == 0) return;
          reactor_.removeFd(fd);
          ::close(fd);
        });
    pendingRingSockets_[fd] = timer;
    Status st = reactor_.addFd(fd, EPOLLIN | EPOLLRDHUP, [this, fd](uint32_t) {
      auto it = pendingRingSockets_.find(fd);
      if (it == pendingRingSockets_.end()) return;
      Reactor::TimerId timer = it->second;
      reactor_.removeFd(fd);
      pendingRingSockets_.erase(it);
      reactor_.cancelTimer(timer);
      if (!onRingSetupFromLoop(fd)) ::close(fd);  // readable but nothing usable: a hang-up
    });
    if (!st.isOk()) {
      pendingRingSockets_.erase(fd);
      reactor_.cancelTimer(timer);
      ::close(fd);
    }
  }
}

bool SoftContext::onRingSetupFromLoop(int fd) {
  FERRY_ON_LOOP(reactor_);
  auto link = receiveRingSetup(fd, [this](uint64_t ticket) { return admitRingTicketFromLoop(ticket); });
  if (!link.isOk() && link.status().code() == StatusCode::kUnavailable) return false;
  if (!link.isOk()) {
    FERRY_LOG(kWarn, "%s: %s", device_.info.name.c_str(), link.status().toString().c_str());
    ::close(fd);
    return true;
  }
  auto conn = std::make_shared<Conn>(this, makeRingLink(fd, std::move(*link)), gate_.get());
  if (!conn->attach().isOk()) return true;  // the link closes fd
  awaitHelloFromLoop(conn);
  return true;
}

uint64_t SoftContext::issueRingTicketFromLoop() {
  FERRY_ON_LOOP(reactor_);
  auto now = std::chrono::steady_clock::now();
  if (ringTickets_.size() >= kMaxRingTickets)
    std::erase_if(ringTickets_, [&](const auto& t) { return t.second <= now; });
  if (ringTickets_.size() >= kMaxRingTickets) return 0;
  const uint64_t ticket = randomTicket();
  if (ticket == 0) return 0;
  ringTickets_[ticket] = now + std::chrono::milliseconds(kHelloTimeoutMs);
  return ticket;
}

bool SoftContext::admitRingTicketFromLoop(uint64_t ticket) {
  FERRY_ON_LOOP(reactor_);
  auto it = ringTickets_.find(ticket);
  if (ticket == 0 || it == ringTickets_.end()) return false;
  bool inTime = it->second > std::chrono::steady_clock::now();
  ringTickets_.erase(it);
  return inTime;
}

void SoftContext::onHelloFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello) {
  FERRY_ON_LOOP(reactor_);
  pendingConns_.erase(conn.get());
  wire::FrameHeader reply;
  reply.type = wire::FrameType::kHelloReply;
  reply.qpn = hello.srcQpn;
  auto answer = [&](wire::HelloResult result) {
    reply.aux = static_cast<uint32_t>(result);
    conn->sendHeader(reply);
    if (result != wire::HelloResult::kAccepted) conn->closeAfterFlush();
  };
  if (hello.flags & wire::kFlagStripe) {
    // A second connection of a requester that already has one to this QP (stripe.h).
    wire::HelloResult result = wire::HelloResult::kNoSuchQp;
    const in_addr_t peerIp = conn->link().sameHost() ? 0 : conn->link().peerAddress().value_or(0);
    if (auto qp = findQp(hello.qpn); qp && peerIp != 0)
      result = qp->responder().acceptStripeFromLoop(conn, hello, peerIp);
    answer(result);
    return;
  }
  in_addr_t peerIp = 0;
  bool peerLocal = false;
  if (conn->link().sameHost()) {
    peerIp = sameHostPeerIp(hello);
  } else {
    peerIp = conn->link().peerAddress().value_or(0);
    peerLocal = (hello.flags & wire::kFlagRingOffer) && offersRings() && isLocalAddress(peerIp);
  }
  // A requester of this host is told to connect again over rings, with a ticket only it has.
  uint64_t ticket = peerLocal ? issueRingTicketFromLoop() : 0;
  if (ticket == 0) peerLocal = false;
  wire::HelloResult result = wire::HelloResult::kNoSuchQp;
  auto qp = findQp(hello.qpn);
  if (qp) result = qp->responder().acceptFromLoop(conn, hello, peerIp, /*adopt=*/!peerLocal);
  if (peerLocal && result == wire::HelloResult::kAccepted) {
    // A requester of this host: it connects again over shared-memory rings.
    reply.aux = static_cast<uint32_t>(wire::HelloResult::kUseRing);
    reply.sharePid = static_cast<uint32_t>(getpid());
    reply.shareCookie = ringNonce_;
    reply.ringTicket = ticket;
    conn->sendHeader(reply);
    conn->closeAfterFlush(/*drain=*/true);
    return;
  }
  if (result == wire::HelloResult::kAccepted && share_) {
    ShareInfo info = share_->info();
    reply.sharePid = info.pid;
    reply.shareFd = info.fd;
    reply.shareCookie = info.cookie;
  }
  // A TCP connection may bring a stripe; the ticket is what it shows (only this connection saw it).
  if (result == wire::HelloResult::kAccepted && !conn->link().sameHost())
    reply.stripeTicket = qp->responder().issueStripeTicketFromLoop();
  answer(result);
}

}  // namespace ferry::soft
