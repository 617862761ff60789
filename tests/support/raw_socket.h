// For tests that act as a hostile or bare client of a listener on loopback: a TCP connection that
// sends what no ferry client would, whether the server closed it, and how many descriptors this
// process holds (the servers under test run in it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry::test {

// The number of open descriptors of this process (/proc/self/fd).
size_t openFds();

// A blocking TCP connection to 127.0.0.1:port; closed with the object.
class RawSocket {
 public:
  explicit RawSocket(uint16_t port);
  ~RawSocket();
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;
  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // Sends all of `bytes`; false when the connection refused them.
  bool send(const std::string& bytes);
  // Whether the server closed the connection within `within` (what it sent before is read and
  // dropped).
  bool closedWithin(std::chrono::milliseconds within);

 private:
  int fd_ = -1;
};

}  // namespace ferry::test
