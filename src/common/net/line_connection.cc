// A line-framed TCP connection on the reactor (line_connection.h).
#include "common/net/line_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry::net {
namespace {

constexpr size_t kReadChunk = size_t{64} << 10;
constexpr int kReadRounds = 16;  // reads per readiness event, so one busy peer cannot hold the loop

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

// The socket address of a target; false for an address that is not numeric.
bool socketAddress(const LineTarget& t, sockaddr_storage* ss, socklen_t* len) {
  *ss = {};
  if (t.ipv6) {
    auto& a = reinterpret_cast<sockaddr_in6&>(*ss);
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(t.port);
    *len = sizeof a;
    return inet_pton(AF_INET6, t.ip.c_str(), &a.sin6_addr) == 1;
  }
  auto& a = reinterpret_cast<sockaddr_in&>(*ss);
  a.sin_family = AF_INET;
  a.sin_port = htons(t.port);
  *len = sizeof a;
  return inet_pton(AF_INET, t.ip.c_str(), &a.sin_addr) == 1;
}

std::string targetText(const LineTarget& t) { return t.ip + ":" + std::to_string(t.port); }

}  // namespace

void LineFramer::feed(std::string_view bytes) {
  buffer_.erase(0, start_);  // what was handed out goes before more comes
  start_ = 0;
  buffer_.append(bytes);
}

std::optional<std::string_view> LineFramer::next() {
  for (;;) {
    const size_t nl = buffer_.find('\n', start_);
    if (nl == std::string::npos) return std::nullopt;
    std::string_view line(buffer_.data() + start_, nl - start_);
    start_ = nl + 1;
    if (!line.empty() || empty_ == EmptyLines::kHandOut) return line;
  }
}

bool LineFramer::hasLine() const {
  if (empty_ == EmptyLines::kHandOut) return buffer_.find('\n', start_) != std::string::npos;
  // Empty lines are skipped, so a newline counts only after a byte that is not one.
  const size_t first = buffer_.find_first_not_of('\n', start_);
  return first != std::string::npos && buffer_.find('\n', first) != std::string::npos;
}

LineConnection::LineConnection(Reactor& reactor, std::string what, LineLimits limits, LineCb onLine,
                               CloseCb onClose)
    : reactor_(reactor),
      what_(std::move(what)),
      limits_(limits),
      onLine_(std::move(onLine)),
      onClose_(std::move(onClose)),
      in_(limits.maxLine) {}

std::shared_ptr<LineConnection> LineConnection::adopt(Reactor& reactor, int fd, LineLimits limits,
                                                      LineCb onLine, CloseCb onClose) {
  std::shared_ptr<LineConnection> conn(
      new LineConnection(reactor, "connection", limits, std::move(onLine), std::move(onClose)));
  conn->startAccepted(fd);
  return conn;
}

std::shared_ptr<LineConnection> LineConnection::connect(Reactor& reactor, std::vector<LineTarget> targets,
                                                        std::string what, LineLimits limits, LineCb onLine,
                                                        CloseCb onClose) {
  std::shared_ptr<LineConnection> conn(
      new LineConnection(reactor, std::move(what), limits, std::move(onLine), std::move(onClose)));
  conn->startConnecting(std::move(targets));
  return conn;
}

void LineConnection::startAccepted(int fd) {
  fd_ = fd;
  everConnected_ = true;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  watch();
}

void LineConnection::startConnecting(std::vector<LineTarget> targets) {
  targets_ = std::move(targets);
  connecting_ = true;
  lastError_ = Status(StatusCode::kUnavailable, what_ + ": no address to connect to");
  // Started from the loop, after the caller stored the connection (a refusal may end it at once).
  std::weak_ptr<LineConnection> weak = weak_from_this();
  reactor_.post([weak] {
    if (auto c = weak.lock()) c->tryNextTarget();
  });
}

LineConnection::~LineConnection() { close(); }

void LineConnection::setDeadPeerTimeout(std::chrono::milliseconds timeout) {
  deadPeerTimeout_ = timeout;
  applyDeadPeerTimeout(fd_, timeout);
}

void LineConnection::watch() {
  // EPOLLOUT only while connecting or while the socket is full: a change of interest is a syscall.
  const uint32_t events = EPOLLIN | EPOLLRDHUP | (connecting_ || !out_.empty() ? uint32_t{EPOLLOUT} : 0u);
  if (registered_) {
    if (events != watched_) (void)reactor_.modFd(fd_, events);
    watched_ = events;
    return;
  }
  std::weak_ptr<LineConnection> weak = weak_from_this();
  Status st = reactor_.addFd(fd_, events, [weak](uint32_t ev) {
    if (auto c = weak.lock()) c->onEvents(ev);
  });
  registered_ = st.isOk();
  watched_ = events;
  if (!st.isOk()) fail(st);
}

void LineConnection::tryNextTarget() {
  if (!connecting_) return;
  closeSocket();
  while (nextTarget_ < targets_.size()) {
    const LineTarget& t = targets_[nextTarget_++];
    sockaddr_storage ss;
    socklen_t len = 0;
    if (!socketAddress(t, &ss, &len)) continue;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      lastError_ = ioError(what_ + ": socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    applyDeadPeerTimeout(fd, deadPeerTimeout_);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
      lastError_ =
          Status(StatusCode::kUnavailable,
                 what_ + ": cannot connect to " + targetText(t) + ": " + std::strerror(errno), errno);
      ::close(fd);
      continue;
    }
    fd_ = fd;
    watch();
    std::weak_ptr<LineConnection> weak = weak_from_this();
    connectTimer_ = reactor_.addTimer(Reactor::Clock::now() + kConnectTimeout, [weak, t] {
      if (auto c = weak.lock()) {
        c->connectTimer_ = 0;
        c->lastError_ =
            Status(StatusCode::kUnavailable, c->what_ + ": no answer from " + targetText(t), ETIMEDOUT);
        c->tryNextTarget();
      }
    });
    return;
  }
  connecting_ = false;
  fail(lastError_);
}

void LineConnection::onEvents(uint32_t events) {
  auto self = shared_from_this();  // a callback may drop its owner's reference
  if (connecting_) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
      const int why = err ? err : ECONNREFUSED;
      lastError_ = Status(
          StatusCode::kUnavailable,
          what_ + ": cannot connect to " + targetText(targets_[nextTarget_ - 1]) + ": " + std::strerror(why),
          why);
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

void LineConnection::readSome() {
  char buf[kReadChunk];
  for (int rounds = 0; rounds < kReadRounds && fd_ >= 0; ++rounds) {
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n > 0) {
      in_.feed(std::string_view(buf, static_cast<size_t>(n)));
      while (auto line = in_.next()) {
        onLine_(*this, *line);
        if (fd_ < 0) return;  // the callback closed the connection
      }
      if (in_.overLimit()) {
        fail(Status(StatusCode::kProtocolError,
                    what_ + ": a line longer than " + std::to_string(limits_.maxLine) + " bytes"));
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
    fail(Status(StatusCode::kUnavailable, what_ + ": connection lost: " + std::strerror(errno), errno));
    return;
  }
}

void LineConnection::send(std::string_view line) {
  if (!open()) return;
  out_.append(line);
  out_.push_back('\n');
  if (!connecting_) writeSome();
}

void LineConnection::writeSome() {
  while (!out_.empty() && fd_ >= 0) {
    ssize_t n = ::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    fail(Status(StatusCode::kUnavailable, what_ + ": connection lost: " + std::strerror(errno), errno));
    return;
  }
  if (fd_ < 0) return;
  if (out_.size() > limits_.maxPendingOutput) {
    fail(Status(
        StatusCode::kResourceExhausted,
        what_ + ": the peer left more than " + std::to_string(limits_.maxPendingOutput) + " bytes unread"));
    return;
  }
  watch();
}

void LineConnection::closeSocket() {
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

void LineConnection::fail(const Status& why) {
  const bool wasOpen = fd_ >= 0 || connecting_ || !targets_.empty();
  if (why.code() == StatusCode::kProtocolError && farewell_ && fd_ >= 0 && !connecting_) {
    closeWith(farewell_(why));
  } else {
    close();
  }
  if (wasOpen && onClose_) {
    auto cb = std::move(onClose_);
    onClose_ = nullptr;
    cb(*this, why, everConnected_);
  }
}

void LineConnection::closeWith(std::string_view line) {
  if (fd_ >= 0 && !connecting_ && !line.empty()) {
    // Behind what is queued, so the line arrives whole; what the socket does not take now is lost.
    out_.append(line);
    out_.push_back('\n');
    (void)::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  close();
}

void LineConnection::close() {
  connecting_ = false;
  closeSocket();
  targets_.clear();
  out_.clear();
}

}  // namespace ferry::net
