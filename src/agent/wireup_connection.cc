// The agent's auxiliary channel (wireup_connection.h).
#include "agent/wireup_connection.h"

#include <utility>

namespace ferry::agent {

WireupConnection::WireupConnection(Reactor& reactor, size_t maxLine, LineCb onLine, CloseCb onClose)
    : net::LineConnection(
          reactor, "wireup", net::LineLimits{.maxLine = maxLine, .maxPendingOutput = kMaxPendingOutput},
          // The connection calls back with itself, which is this WireupConnection.
          [cb = std::move(onLine)](net::LineConnection& c, std::string_view line) {
            cb(static_cast<WireupConnection&>(c), line);
          },
          [cb = std::move(onClose)](net::LineConnection& c, const Status& why, bool connected) {
            if (cb) cb(static_cast<WireupConnection&>(c), why, connected);
          }) {}

std::shared_ptr<WireupConnection> WireupConnection::adopt(Reactor& reactor, int fd, size_t maxLine,
                                                          LineCb onLine, CloseCb onClose) {
  std::shared_ptr<WireupConnection> link(
      new WireupConnection(reactor, maxLine, std::move(onLine), std::move(onClose)));
  link->startAccepted(fd);
  return link;
}

std::shared_ptr<WireupConnection> WireupConnection::connect(Reactor& reactor,
                                                            std::vector<ControlEndpoint> targets,
                                                            size_t maxLine, LineCb onLine, CloseCb onClose) {
  std::shared_ptr<WireupConnection> link(
      new WireupConnection(reactor, maxLine, std::move(onLine), std::move(onClose)));
  std::vector<net::LineTarget> to;
  to.reserve(targets.size());
  for (auto& t : targets) to.push_back({.ipv6 = t.ipv6, .ip = std::move(t.ip), .port = t.port});
  link->startConnecting(std::move(to));
  return link;
}

}  // namespace ferry::agent
