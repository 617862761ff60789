// The agent's auxiliary channel (link.h).
#include "agent/link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry::agent {
namespace {

// How long one address may take to accept a connection before the next is tried.
constexpr auto kConnectTimeout = std::chrono::seconds(3);

void applyDeadPeerTimeout(int fd, std::chrono::milliseconds timeout) {
  if (fd < 0 || timeout.count() <= 0) return;
  int one = 1;
  int idle = std::max<int>(1, static_cast<int>(timeout.count() / 3000));
  int interval = std::max<int>(1, static_cast<int>(timeout.count() / 6000));
  int count = 3;
  unsigned int user = static_cast<unsigned int>(timeout.count());
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof user);
}

}  // namespace

void Link::setDeadPeerTimeout(std::chrono::milliseconds timeout) {
  deadPeerTimeout_ = timeout;
  applyDeadPeerTimeout(fd_, timeout);
}

std::shared_ptr<Link> Link::adopt(Reactor& reactor, int fd, size_t maxLine, LineCb onLine, CloseCb onClose) {
  std::shared_ptr<Link> link(new Link(reactor, maxLine, std::move(onLine), std::move(onClose)));
  link->fd_ = fd;
  link->everConnected_ = true;
  link->watch();
  return link;
}

std::shared_ptr<Link> Link::connect(Reactor& reactor, std::vector<ControlEndpoint> targets, size_t maxLine,
                                    LineCb onLine, CloseCb onClose) {
  std::shared_ptr<Link> link(new Link(reactor, maxLine, std::move(onLine), std::move(onClose)));
  link->targets_ = std::move(targets);
  link->connecting_ = true;
  link->lastError_ = Status(StatusCode::kUnavailable, "no wireup address to connect to");
  // Started from the loop, after the caller stored the link (a refusal may end it at once).
  std::weak_ptr<Link> weak = link;
  reactor.post([weak] {
    if (auto l = weak.lock()) l->tryNextTarget();
  });
  return link;
}

Link::~Link() { close(); }

void Link::watch() {
  std::weak_ptr<Link> weak = weak_from_this();
  uint32_t events = EPOLLIN | EPOLLRDHUP | (connecting_ || !out_.empty() ? EPOLLOUT : 0);
  if (registered_) {
    (void)reactor_.modFd(fd_, events);
    return;
  }
  Status st = reactor_.addFd(fd_, events, [weak](uint32_t ev) {
    if (auto l = weak.lock()) l->onEvents(ev);
  });
  registered_ = st.isOk();
  if (!st.isOk()) fail(st);
}

void Link::tryNextTarget() {
  if (!connecting_) return;
  closeSocket();
  while (nextTarget_ < targets_.size()) {
    const ControlEndpoint& t = targets_[nextTarget_++];
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (t.ipv6) {
      auto& a = reinterpret_cast<sockaddr_in6&>(ss);
      a.sin6_family = AF_INET6;
      a.sin6_port = htons(t.port);
      if (inet_pton(AF_INET6, t.ip.c_str(), &a.sin6_addr) != 1) continue;
      len = sizeof a;
    } else {
      auto& a = reinterpret_cast<sockaddr_in&>(ss);
      a.sin_family = AF_INET;
      a.sin_port = htons(t.port);
      if (inet_pton(AF_INET, t.ip.c_str(), &a.sin_addr) != 1) continue;
      len = sizeof a;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      lastError_ = ioError("wireup: socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    applyDeadPeerTimeout(fd, deadPeerTimeout_);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
      lastError_ = Status(
          StatusCode::kUnavailable,
          "wireup: cannot connect to " + t.ip + ":" + std::to_string(t.port) + ": " + std::strerror(errno),
          errno);
      ::close(fd);
      continue;
    }
    fd_ = fd;
    watch();
    std::weak_ptr<Link> weak = weak_from_this();
    connectTimer_ = reactor_.addTimer(Reactor::Clock::now() + kConnectTimeout, [weak, t] {
      if (auto l = weak.lock()) {
        l->connectTimer_ = 0;
        l->lastError_ = Status(StatusCode::kUnavailable,
                               "wireup: no answer from " + t.ip + ":" + std::to_string(t.port), ETIMEDOUT);
        l->tryNextTarget();
      }
    });
    return;
  }
  connecting_ = false;
  fail(lastError_);
}

void Link::onEvents(uint32_t events) {
  auto self = shared_from_this();  // a callback may drop the agent's reference
  if (connecting_) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
      const ControlEndpoint& t = targets_[nextTarget_ - 1];
      lastError_ = Status(StatusCode::kUnavailable,
                          "wireup: cannot connect to " + t.ip + ":" + std::to_string(t.port) + ": " +
                              std::strerror(err ? err : ECONNREFUSED),
                          err ? err : ECONNREFUSED);
      tryNextTarget();
      return;
    }
    if (!(events & EPOLLOUT)) return;
    connecting_ = false;
    everConnected_ = true;
    if (connectTimer_ != 0) {
      reactor_.cancelTimer(connectTimer_);
      connectTimer_ = 0;
    }
    watch();
  }
  if (events & EPOLLOUT) writeSome();
  if (fd_ >= 0 && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) readSome();
}

void Link::readSome() {
  char buf[64 * 1024];
  for (int rounds = 0; rounds < 16 && fd_ >= 0; ++rounds) {
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      size_t start = 0;
      for (;;) {
        size_t nl = in_.find('\n', start);
        if (nl == std::string::npos) break;
        std::string_view line(in_.data() + start, nl - start);
        start = nl + 1;
        if (!line.empty()) onLine_(*this, line);
        if (fd_ < 0) return;  // the callback closed the link
      }
      in_.erase(0, start);
      if (in_.size() > maxLine_) {
        fail(Status(StatusCode::kProtocolError,
                    "wireup: a line longer than " + std::to_string(maxLine_) + " bytes"));
        return;
      }
      continue;
    }
    if (n == 0) {
      fail(Status::ok());
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    fail(Status(StatusCode::kUnavailable, std::string("wireup: connection lost: ") + std::strerror(errno),
                errno));
    return;
  }
}

void Link::send(std::string_view line) {
  out_.append(line);
  out_.push_back('\n');
  if (!connecting_ && fd_ >= 0) writeSome();
}

void Link::writeSome() {
  while (!out_.empty() && fd_ >= 0) {
    ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL);
    if (n > 0) {
      out_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    fail(Status(StatusCode::kUnavailable, std::string("wireup: connection lost: ") + std::strerror(errno),
                errno));
    return;
  }
  if (fd_ >= 0) watch();
}

void Link::closeSocket() {
  if (connectTimer_ != 0) {
    reactor_.cancelTimer(connectTimer_);
    connectTimer_ = 0;
  }
  if (fd_ >= 0) {
    if (registered_) reactor_.removeFd(fd_);
    registered_ = false;
    ::close(fd_);
    fd_ = -1;
  }
}

void Link::fail(const Status& why) {
  bool wasOpen = fd_ >= 0 || connecting_ || !targets_.empty();
  close();
  if (wasOpen && onClose_) {
    auto cb = std::move(onClose_);
    onClose_ = nullptr;
    cb(*this, why, everConnected_);
  }
}

void Link::close() {
  connecting_ = false;
  closeSocket();
  targets_.clear();
}

}  // namespace ferry::agent
