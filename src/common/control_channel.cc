// A blocking JSON-lines control connection (see control_channel.h).
#include "common/control_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "common/net/listen.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadlineAfter(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

// Milliseconds left until deadline, for poll() (at least 0).
int msLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

std::string addressText(const sockaddr_storage& ss) {
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, text, sizeof text);
  } else if (ss.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(ss);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) {
      inet_ntop(AF_INET, &in6.sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    }
  }
  return text;
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string typeOf(const json::Value& message) {
  const json::Value* type = message.find("type");
  auto text = type ? type->getString() : Result<std::string_view>(invalidArgument(""));
  return text.isOk() ? std::string(*text) : std::string("?");
}

// One line from the peer as a message of `protocol`, checked as receive() promises (control_channel.h).
Result<json::Value> decodeControlLine(std::string_view line, const ControlProtocol& protocol) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  auto parsed = json::parse(line);
  if (!parsed.isOk()) {
    return Status(StatusCode::kProtocolError,
                  "malformed control message (" + parsed.status().message() + ")");
  }
  json::Value message = std::move(*parsed);
  if (!message.isObject()) {
    return Status(StatusCode::kProtocolError, "malformed control message: not a JSON object");
  }
  const json::Value* version = message.find(protocol.tag);
  if (version == nullptr) {
    return Status(StatusCode::kProtocolError, "malformed control message: no \"" + protocol.tag +
                                                  "\" version field (does the peer speak " + protocol.tag +
                                                  "?)");
  }
  auto v = version->getInt();
  if (!v.isOk() || *v != protocol.version) {
    return Status(StatusCode::kProtocolError, "the peer speaks " + protocol.tag + " protocol version " +
                                                  json::serialize(*version) + "; this ferry speaks " +
                                                  std::to_string(protocol.version));
  }
  const json::Value* type = message.find("type");
  if (type == nullptr || !type->isString()) {
    return Status(StatusCode::kProtocolError, "malformed control message: no \"type\" string");
  }
  if (*type->getString() == "error") {
    auto text = controlFields(message).text("message", 4096);
    return Status(StatusCode::kUnavailable,
                  "the peer gave up: " + (text.isOk() ? *text : std::string("(no message)")));
  }
  return message;
}

}  // namespace

ControlChannel::ControlChannel(ControlChannel&& other) noexcept
    : fd_(other.fd_), protocol_(std::move(other.protocol_)), in_(std::move(other.in_)) {
  other.fd_ = -1;
}

ControlChannel& ControlChannel::operator=(ControlChannel&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    protocol_ = std::move(other.protocol_);
    in_ = std::move(other.in_);
    other.fd_ = -1;
  }
  return *this;
}

ControlChannel::~ControlChannel() { close(); }

void ControlChannel::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<ControlChannel> ControlChannel::connect(const std::string& host, uint16_t port, double timeoutSec,
                                               ControlProtocol protocol) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    return Status(StatusCode::kNotFound, "cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  auto deadline = deadlineAfter(timeoutSec);
  Status last(StatusCode::kUnavailable, "no address for '" + host + "'");
  // A server that is still starting refuses; try again until the deadline.
  while (true) {
    for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        last = ioError("socket");
        continue;
      }
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
        last = ioError("cannot connect to " + host + ":" + service);
        ::close(fd);
        continue;
      }
      pollfd p{fd, POLLOUT, 0};
      int n = poll(&p, 1, msLeft(deadline));
      int err = 0;
      socklen_t len = sizeof err;
      if (n == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (n != 1 || err != 0) {
        last = n == 1 ? ioError("cannot connect to " + host + ":" + service, err)
                      : Status(StatusCode::kTimedOut, "no answer from " + host + ":" + service);
        ::close(fd);
        continue;
      }
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      setNoDelay(fd);
      freeaddrinfo(list);
      return ControlChannel(fd, std::move(protocol));
    }
    if (Clock::now() >= deadline) break;
    usleep(100 * 1000);
  }
  freeaddrinfo(list);
  return Status(last.code(),
                last.message() + " (gave up after " + std::to_string(static_cast<int>(timeoutSec)) + " s)",
                last.cause());
}

Status ControlChannel::send(std::string_view type, const json::Value& message, double timeoutSec) {
  if (fd_ < 0) return closedError("the control connection is closed");
  json::Value full = json::Value::emptyObject();
  full.set(protocol_.tag, protocol_.version);
  full.set("type", std::string(type));
  if (const json::Object* members = message.object()) {
    for (const auto& [key, value] : *members) full.set(key, value);
  }
  std::string line = json::serialize(full);
  line.push_back('\n');
  auto deadline = deadlineAfter(timeoutSec);
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      if (poll(&p, 1, msLeft(deadline)) != 1) {
        return Status(StatusCode::kTimedOut, "the peer did not take a control message within " +
                                                 std::to_string(static_cast<int>(timeoutSec)) + " s");
      }
      continue;
    }
    return Status(StatusCode::kUnavailable, "the peer closed the control connection", errno);
  }
  return Status::ok();
}

void ControlChannel::sendError(const std::string& message) {
  json::Value body = json::Value::emptyObject();
  body.set("message", message);
  (void)send("error", body, 2);
}

bool ControlChannel::readable(int timeoutMs) {
  if (in_.hasLine()) return true;
  pollfd p{fd_, POLLIN, 0};
  return poll(&p, 1, timeoutMs) == 1;
}

Result<json::Value> ControlChannel::receive(double timeoutSec) {
  if (fd_ < 0) return closedError("the control connection is closed");
  auto deadline = deadlineAfter(timeoutSec);
  std::optional<std::string_view> line;
  while (!(line = in_.next())) {
    if (in_.overLimit()) {
      return Status(StatusCode::kProtocolError, "malformed control message: a line longer than " +
                                                    std::to_string(in_.maxLine()) + " bytes");
    }
    pollfd p{fd_, POLLIN, 0};
    int n = poll(&p, 1, msLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      return Status(StatusCode::kTimedOut, "no control message from the peer within " +
                                               std::to_string(static_cast<int>(std::ceil(timeoutSec))) +
                                               " s");
    }
    char chunk[65536];
    ssize_t got = ::read(fd_, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return Status(StatusCode::kUnavailable, in_.unfinished() == 0
                                                  ? "the peer closed the control connection"
                                                  : "the peer closed the control connection "
                                                    "in the middle of a message");
    }
    in_.feed(std::string_view(chunk, static_cast<size_t>(got)));
  }
  // Decoded before the next feed(), while the framer's view of the line is still valid.
  return decodeControlLine(*line, protocol_);
}

Result<json::Value> ControlChannel::expect(std::string_view type, double timeoutSec) {
  auto message = receive(timeoutSec);
  if (!message.isOk()) return message;
  std::string got = typeOf(*message);
  if (got != type) {
    return Status(StatusCode::kProtocolError,
                  "unexpected control message '" + got + "' (expected '" + std::string(type) + "')");
  }
  return message;
}

std::string ControlChannel::localAddress() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return addressText(ss);
}

std::string ControlChannel::peerAddress() const {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  return addressText(ss);
}

ControlListener::ControlListener(ControlListener&& other) noexcept
    : fd_(other.fd_), port_(other.port_), protocol_(std::move(other.protocol_)) {
  other.fd_ = -1;
}

ControlListener::~ControlListener() {
  if (fd_ >= 0) ::close(fd_);
}

Result<ControlListener> ControlListener::listen(const std::string& address, uint16_t port,
                                                ControlProtocol protocol) {
  FERRY_ASSIGN_OR_RETURN(net::Listener l,
                         net::listenTcp(address, port, {.backlog = 4, .nonBlocking = false}));
  ControlListener listener;
  listener.fd_ = l.fd;
  listener.protocol_ = std::move(protocol);
  listener.port_ = l.port;
  return listener;
}

Result<ControlChannel> ControlListener::accept(double timeoutSec) {
  auto deadline = deadlineAfter(timeoutSec < 0 ? 0 : timeoutSec);
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    int n = poll(&p, 1, timeoutSec < 0 ? -1 : msLeft(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ioError("poll");
    if (n == 0) return Status(StatusCode::kTimedOut, "no client came");
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return ioError("accept");
    }
    setNoDelay(fd);
    return ControlChannel(fd, protocol_);
  }
}

json::Fields controlFields(const json::Value& message) {
  return json::Fields(message, {.code = StatusCode::kProtocolError,
                                .prefix = "control message '" + typeOf(message) + "': ",
                                .names = json::FieldErrors::Names::kFieldWord});
}

}  // namespace ferry
