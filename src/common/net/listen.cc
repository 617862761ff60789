#include "common/net/listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace ferry::net {

Result<Listener> listenTcp(const std::string& host, uint16_t port, const ListenOptions& options) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | (options.resolveNames ? 0 : AI_NUMERICHOST);
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) return invalidArgument("cannot listen on '" + host + "': " + gai_strerror(rc));
  const int type = list->ai_socktype | SOCK_CLOEXEC | (options.nonBlocking ? SOCK_NONBLOCK : 0);
  int fd = socket(list->ai_family, type, list->ai_protocol);
  if (fd < 0) {
    Status st = ioError("cannot listen on " + host + ":" + service + ": socket");
    freeaddrinfo(list);
    return st;
  }
  int one = 1, v6only = options.dualStack ? 0 : 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (list->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  if (bind(fd, list->ai_addr, list->ai_addrlen) != 0 || ::listen(fd, options.backlog) != 0) {
    Status st = ioError("cannot listen on " + host + ":" + service);
    ::close(fd);
    freeaddrinfo(list);
    return st;
  }
  freeaddrinfo(list);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  Listener out;
  out.fd = fd;
  out.ipv6 = bound.ss_family == AF_INET6;
  out.port = ntohs(out.ipv6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                            : reinterpret_cast<sockaddr_in&>(bound).sin_port);
  return out;
}

}  // namespace ferry::net
