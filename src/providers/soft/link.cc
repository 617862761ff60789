// Link: what every link does with its one socket (link.h).
#include "providers/soft/link.h"

#include <sys/socket.h>
#include <unistd.h>

namespace ferry::soft {

Link::~Link() {
  if (fd_ >= 0) ::close(fd_);
}

void Link::close() {
  detach();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Link::shutdownWrite() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

}  // namespace ferry::soft
