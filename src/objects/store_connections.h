// The object store's HTTP connections (store_server.cc): cpp-httplib parses each request and calls
// the store's handlers; this file owns the connection around it, so that no client can hold the
// server's workers or memory for longer than the bounds allow:
//
//   - a worker per connection, grown on demand up to a cap; past the cap a connection is answered
//     503 SlowDown and closed at once (a spare worker does that), so idle connections can never
//     leave a good client unanswered while fewer than the cap exist;
//   - a deadline for each request's line and headers (slowloris), and an idle limit for every wait
//     for bytes after that (body, next request on a kept-alive connection, writes);
//   - a refused request whose body was not read either has it skipped (a small one, so the
//     connection stays usable) or has the connection closed gracefully after the answer.
//
// Everything here runs on the worker thread that serves the connection; a handler reaches its
// connection with StoreConnection::current().
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace ferry::objects {

struct ConnectionLimits {
  size_t maxConnections = 256;
  size_t readyWorkers = 8;
  std::chrono::milliseconds headerTimeout{10000};
  std::chrono::milliseconds idleTimeout{10000};
  size_t maxRequestsPerConnection = 1000;
};

// The connection the calling worker serves. Only its worker uses it.
class StoreConnection : public httplib::Stream {
 public:
  StoreConnection(int fd, const ConnectionLimits& limits);
  // The connection whose request the calling thread handles; nullptr elsewhere.
  static StoreConnection* current();

  // The request's headers were accepted: from now on each wait is bounded by the idle limit only.
  void startBody();
  // The request's body was not read: skip it when it is small (the connection stays usable), else
  // close the connection after the answer. `declared`: its Content-Length.
  void discardBody(uint64_t declared);
  // Closes the connection after this answer.
  void closeAfterResponse() { closeAfter_ = true; }
  bool closeAfter() const { return closeAfter_; }

  // httplib::Stream
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

 private:
  friend class StoreHttpServer;
  // Waits until a request's first byte is there (true), or the idle limit passes, the peer closes
  // or `stopping` says so (false). Starts the header deadline.
  bool awaitRequest(const std::function<bool()>& stopping);
  // Closes the descriptor; after a refusal that left bytes unread, first reads what the peer still
  // sends for a moment, so that the answer is not lost to a reset.
  void close();

  const int fd_;
  const ConnectionLimits& limits_;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  bool closeAfter_ = false;
  bool unread_ = false;
  char buf_[16384];
  size_t pos_ = 0, len_ = 0;
};

// cpp-httplib's server with the connections above. `refuse` writes the whole answer (headers and
// body) to a connection past the cap.
class StoreHttpServer : public httplib::Server {
 public:
  explicit StoreHttpServer(ConnectionLimits limits);
  // Raises the listen backlog (cpp-httplib's is 5); after bind_to_port.
  void widenBacklog();
  size_t connections() const { return active_.load(); }
  std::function<std::string()> busyAnswer;  // the 503 sent past the cap (an S3 error document)

 private:
  bool process_and_close_socket(socket_t sock) override;

  const ConnectionLimits limits_;
  std::atomic<size_t> active_{0};
};

}  // namespace ferry::objects
