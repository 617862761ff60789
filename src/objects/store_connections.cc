#include "objects/store_connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::objects {
namespace {

using Clock = std::chrono::steady_clock;

thread_local StoreConnection* tCurrent = nullptr;

// Bodies of refused requests up to this size are read and dropped, so that the connection can
// carry the next request; larger ones close it.
constexpr uint64_t kSkippableBody = 256 << 10;
// A closing connection that left bytes unread reads what still comes for at most this long.
constexpr std::chrono::milliseconds kLinger{500};
constexpr size_t kLingerBytes = 1 << 20;
// Workers beyond maxConnections: they answer connections past the cap, so that a refusal never
// waits behind the connections it refuses.
constexpr size_t kSpareWorkers = 4;

std::string addressText(const sockaddr_storage& a, int& port) {
  char text[INET6_ADDRSTRLEN] = "";
  port = -1;
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    port = ntohs(v6->sin6_port);
  }
  return text;
}

// Milliseconds to wait for the next byte: the idle limit, or less when a deadline comes first
// (0: it has passed).
int waitMs(Clock::time_point deadline, std::chrono::milliseconds idle) {
  auto wait = idle;
  if (deadline != Clock::time_point::max()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    wait = std::min(wait, std::max(left, std::chrono::milliseconds(0)));
  }
  return static_cast<int>(wait.count());
}

// Workers grown on demand up to a cap; a job waits only while every worker is busy and the cap is
// reached (never the case for the connections the cap admits, see kSpareWorkers).
class ConnectionWorkers : public httplib::TaskQueue {
 public:
  ConnectionWorkers(size_t ready, size_t max) : max_(std::max(max, ready)) {
    for (size_t i = 0; i < ready; ++i) spawn();
  }
  ~ConnectionWorkers() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
      if (idle_ < jobs_.size() && threads_.size() < max_) spawn();
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();  // threads_ no longer changes: enqueue() is not called now
  }

 private:
  void spawn() {  // under mu_
    threads_.emplace_back([this] { work(); });
  }

  void work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        --idle_;
        if (jobs_.empty()) return;  // stopping
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

StoreConnection::StoreConnection(int fd, const ConnectionLimits& limits) : fd_(fd), limits_(limits) {}

StoreConnection* StoreConnection::current() { return tCurrent; }

void StoreConnection::startBody() { deadline_ = Clock::time_point::max(); }

void StoreConnection::discardBody(uint64_t declared) {
  if (declared == 0) return;
  if (declared > kSkippableBody) {
    closeAfter_ = true;
    unread_ = true;
    return;
  }
  char scratch[4096];
  for (uint64_t left = declared; left > 0;) {
    ssize_t n = read(scratch, static_cast<size_t>(std::min<uint64_t>(left, sizeof scratch)));
    if (n <= 0) {
      closeAfter_ = true;
      return;
    }
    left -= static_cast<uint64_t>(n);
  }
}

bool StoreConnection::is_readable() const {
  if (pos_ < len_) return true;
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

bool StoreConnection::is_writable() const {
  pollfd p{fd_, POLLOUT, 0};
  return ::poll(&p, 1, 0) > 0;
}

ssize_t StoreConnection::read(char* ptr, size_t size) {
  if (pos_ == len_) {
    pollfd p{fd_, POLLIN, 0};
    int wait = waitMs(deadline_, limits_.idleTimeout);
    if (wait <= 0 || ::poll(&p, 1, wait) <= 0) {
      closeAfter_ = true;  // a deadline passed: this connection is done
      return -1;
    }
    ssize_t n = ::recv(fd_, buf_, sizeof buf_, 0);
    if (n <= 0) {
      closeAfter_ = true;
      return n < 0 ? -1 : 0;
    }
    pos_ = 0;
    len_ = static_cast<size_t>(n);
  }
  size_t n = std::min(size, len_ - pos_);
  std::memcpy(ptr, buf_ + pos_, n);
  pos_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t StoreConnection::write(const char* ptr, size_t size) {
  pollfd p{fd_, POLLOUT, 0};
  if (::poll(&p, 1, static_cast<int>(limits_.idleTimeout.count())) <= 0) {
    closeAfter_ = true;
    return -1;
  }
  ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
  if (n < 0) closeAfter_ = true;
  return n;
}

void StoreConnection::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) a.ss_family = AF_UNSPEC;
  ip = addressText(a, port);
}

void StoreConnection::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) a.ss_family = AF_UNSPEC;
  ip = addressText(a, port);
}

bool StoreConnection::awaitRequest(const std::function<bool()>& stopping) {
  deadline_ = Clock::time_point::max();
  if (pos_ == len_) {
    // In slices, so that stop() does not wait for an idle connection's limit.
    const auto until = Clock::now() + limits_.idleTimeout;
    for (;;) {
      if (stopping()) return false;
      pollfd p{fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, std::min(100, waitMs(until, limits_.idleTimeout)));
      if (rc > 0) break;
      if (rc < 0 || Clock::now() >= until) return false;
    }
  }
  deadline_ = Clock::now() + limits_.headerTimeout;
  return true;
}

void StoreConnection::close() {
  if (unread_) {
    ::shutdown(fd_, SHUT_WR);
    const auto until = Clock::now() + kLinger;
    size_t drained = 0;
    char scratch[16384];
    while (drained < kLingerBytes) {
      pollfd p{fd_, POLLIN, 0};
      int wait = waitMs(until, kLinger);
      if (wait <= 0 || ::poll(&p, 1, wait) <= 0) break;
      ssize_t n = ::recv(fd_, scratch, sizeof scratch, 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
  }
  ::shutdown(fd_, SHUT_RDWR);
  ::close(fd_);
}

StoreHttpServer::StoreHttpServer(ConnectionLimits limits) : limits_(limits) {
  const size_t ready = std::min(limits_.readyWorkers, limits_.maxConnections);
  const size_t max = limits_.maxConnections + kSpareWorkers;
  new_task_queue = [ready, max] { return new ConnectionWorkers(ready, max); };
}

void StoreHttpServer::widenBacklog() {
  if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, 1024);
}

bool StoreHttpServer::process_and_close_socket(socket_t sock) {
  StoreConnection conn(sock, limits_);
  const size_t held = ++active_;
  if (held > limits_.maxConnections) {
    // Past the cap: an answer, and no request read (its bytes are drained while closing).
    const std::string answer = busyAnswer ? busyAnswer() : std::string();
    std::string head =
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\nContent-Length: " +
        std::to_string(answer.size()) + "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n";
    conn.write(head.data(), head.size());
    conn.write(answer.data(), answer.size());
    conn.unread_ = true;
    conn.close();
    --active_;
    return false;
  }
  tCurrent = &conn;
  auto stopping = [this] { return svr_sock_ == INVALID_SOCKET; };
  bool ok = true;
  for (size_t served = 0; served < limits_.maxRequestsPerConnection; ++served) {
    if (!conn.awaitRequest(stopping)) break;
    bool peerClosing = false;
    const bool last = served + 1 == limits_.maxRequestsPerConnection;
    ok = process_request(conn, last, peerClosing, nullptr);
    if (!ok || peerClosing || conn.closeAfter()) break;
  }
  tCurrent = nullptr;
  conn.close();
  --active_;
  return ok;
}

}  // namespace ferry::objects
