// Opening a TCP listener, written once for every listener ferry opens (the agent's wireup
// listener, `ferry store`, the control channel of the benchmarks): the address is a numeric IPv4
// or IPv6 address (or a name getaddrinfo resolves, where allowed), the socket is close-on-exec,
// non-blocking when asked, SO_REUSEADDR (a restarted server takes its port back at once), and the
// port the kernel picked is read back. Who may connect is decided by admission.h, not here.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/common/status.h"

namespace ferry::net {

struct ListenOptions {
  int backlog = 128;
  bool nonBlocking = true;
  // Resolve host names too (getaddrinfo without AI_NUMERICHOST); else a numeric address only.
  bool resolveNames = false;
  // An IPv6 socket also takes IPv4 peers (IPV6_V6ONLY off): for the wildcard address "::".
  bool dualStack = false;
};

// A listening socket: its descriptor (the caller closes it) and what it is bound to.
struct Listener {
  int fd = -1;
  uint16_t port = 0;  // the port bound (the kernel's choice for port 0)
  bool ipv6 = false;
};

// Listens on host:port. kInvalidArgument for a host that is not an address (or does not resolve);
// kIoError (with errno) when the socket cannot be bound or listen, naming host and port.
Result<Listener> listenTcp(const std::string& host, uint16_t port, const ListenOptions& options = {});

}  // namespace ferry::net
