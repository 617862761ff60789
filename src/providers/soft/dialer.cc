// Reaching a queue pair's peer (dialer.h).
#include "providers/soft/dialer.h"

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

void Dialer::begin() {
  started_ = Clock::now();
  delayMs_ = 1;
}

void Dialer::reset() {
  cancelRetry();
  listenerReached_ = false;
  peerReached_ = false;
  peerGone_ = false;
}

Result<std::unique_ptr<Link>> Dialer::dialTcp(in_addr_t localIp, const verbs::Gid& peerGid) {
  in_addr_t ip;
  uint16_t port;
  if (!parseSoftGid(peerGid, &ip, &port))
    return invalidArgument("the destination GID is not a soft device's address");
  auto link = dialTcpLink(localIp, ip, port);
  // A refused or unreachable peer is tried again (it may not be listening yet); a failure of our
  // own (no descriptors left) is worth a warning.
  if (!link.isOk() && link.status().cause() != ECONNREFUSED && link.status().cause() != ENETUNREACH) {
    FERRY_LOG(kWarn, "QP %u: %s", qpn_, link.status().toString().c_str());
  }
  return link;
}

Result<std::unique_ptr<Link>> Dialer::dialRing(uint32_t pid, uint64_t nonce, uint64_t ticket) {
  auto link = dialRingLink(pid, nonce, ticket);
  if (!link.isOk()) stayOnTcp(link.status().message());
  return link;
}

void Dialer::scheduleRetry(bool hasWork, Clock::duration budget, std::function<void()> dial) {
  if (retryTimer_ != 0) return;
  if (peerGone_ && !hasWork) return;
  // Keep trying while work waits, or for a while after RTS (the peer may not be at RTR yet).
  const auto window = std::max<Clock::duration>(budget, std::chrono::seconds(2));
  if (!hasWork && Clock::now() - started_ > window) return;
  retryTimer_ = reactor_.addTimer(Clock::now() + std::chrono::milliseconds(delayMs_), std::move(dial));
  delayMs_ = std::min(delayMs_ * 2, 100);
}

void Dialer::cancelRetry() {
  if (retryTimer_ != 0) reactor_.cancelTimer(retryTimer_);
  retryTimer_ = 0;
}

bool Dialer::markPeerGone(const char* why) {
  if (peerGone_) return false;
  FERRY_LOG(kInfo, "QP %u: the peer is gone: %s", qpn_, why);
  peerGone_ = true;
  return true;
}

void Dialer::stayOnTcp(const std::string& why) {
  FERRY_LOG(kInfo, "QP %u: no shared-memory rings to its peer (TCP instead): %s", qpn_, why.c_str());
  ringRefused_ = true;
}

}  // namespace ferry::soft
