#include "support/raw_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ferry::test {

size_t openFds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

RawSocket::RawSocket(uint16_t port) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

RawSocket::~RawSocket() {
  if (fd_ >= 0) ::close(fd_);
}

bool RawSocket::send(const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool RawSocket::closedWithin(std::chrono::milliseconds within) {
  auto end = std::chrono::steady_clock::now() + within;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (::recv(fd_, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

}  // namespace ferry::test
