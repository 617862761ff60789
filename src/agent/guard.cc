// What a peer that has not proved anything can reach through an agent's wireup listener, and what
// it can cost (docs/security.md):
//   - admission: protected mode (no secret: peers of this host only) and caps on the links held per
//     source and in all (common/net/admission.h);
//   - deadlines: an inbound link that carries no message that decodes for kLinkIdle, or that no
//     peer's wireup authenticated and stays idle that long, is closed;
//   - handshakes: the connections a REQUEST makes before its ACK are capped per link and in all,
//     and each has a short deadline of its own;
//   - links: without a secret, a message that changes a peer's state counts only on the link that
//     peer's wireup authenticated. One on another link is held there while the peer is asked, at
//     its own address, to echo a nonce on the link it uses (a probe); an echo on this link
//     authenticates it and its held lines run, anything else drops them.
// Refusals are logged at a bounded rate.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "agent/agent_impl.h"
#include "agent/crypto.h"
#include "common/log.h"
#include "ferry/common/config.h"

namespace ferry::agent {
namespace {

// An inbound link with no message that decoded (or, unauthenticated, no message at all) this long
// is closed.
constexpr auto kLinkIdle = std::chrono::seconds(10);
constexpr auto kLinkSweepEvery = std::chrono::seconds(1);
// A link of ours that no connection uses any more is closed after this long without a line.
constexpr auto kOrphanLinkIdle = std::chrono::seconds(2);
// Links of ours to agents no connection belongs to (CHALLENGEs, REJECTs) open at once.
constexpr size_t kMaxOrphanLinks = 64;
// Handshakes (REQUESTs answered, not acknowledged yet) held at once per link and in all, and how
// long one waits for its ACK.
constexpr size_t kMaxHandshakesPerLink = 4;
constexpr size_t kMaxHandshakes = 128;
constexpr auto kHandshakeTimeout = std::chrono::milliseconds(10000);
// Lines held on a link while it is probed; beyond them the link is closed.
constexpr size_t kMaxHeldLines = 64;

bool changesPeerState(WireupType t) {
  return t == WireupType::kBye || t == WireupType::kMrQuery || t == WireupType::kMrInfo ||
         t == WireupType::kMessage;
}

}  // namespace

Status AgentImpl::openAdmission() {
  allowRemote_ = opts_.allowRemoteWithoutSecret || config::agentAllowRemote();
  cookieKey_ = randomHex(32);
  admission_ =
      net::Admission::create({.thisHostOnly = protectedMode(), .maxPerSource = 256, .maxTotal = 1024},
                             "agent '" + self_.alias + "'");
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  loop_.post([weak] {
    if (auto a = weak.lock()) a->sweepInboundLinks();
  });
  return Status::ok();
}

void AgentImpl::logRefused(const Status& why) {
  uint64_t held = 0;
  if (!refusalLog_.allow(&held)) return;
  if (held > 0) {
    FERRY_LOG(kWarn, "agent '%s': %s (and %llu refusals not logged since the last line)", self_.alias.c_str(),
              why.message().c_str(), static_cast<unsigned long long>(held));
  } else {
    FERRY_LOG(kWarn, "agent '%s': %s", self_.alias.c_str(), why.message().c_str());
  }
}

void AgentImpl::onAccept(int listenFd) {
  for (;;) {
    int fd = accept4(listenFd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    sockaddr_storage source = net::peerOf(fd);
    auto ticket = admission_->admit(source);
    if (!ticket.isOk() && ticket.status().code() == StatusCode::kResourceExhausted && evictIdlestLink()) {
      ticket = admission_->admit(source);
    }
    if (!ticket.isOk()) {
      {
        std::lock_guard<std::mutex> lock(statsMu_);
        ++stats_.connectionsRefused;
      }
      admission_->logRefusal(ticket.status());
      ::close(fd);
      continue;
    }
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    auto link = WireupConnection::adopt(
        loop_, fd, kMaxWireupLine,
        [weak](WireupConnection& l, std::string_view text) {
          if (auto a = weak.lock()) a->onLine(l, text);
        },
        [weak](WireupConnection& l, const Status& why, bool connected) {
          if (auto a = weak.lock()) a->onLinkClosed(l, why, connected);
        });
    link->ticket = std::move(*ticket);
    link->lastValid = Clock::now();
    link->setDeadPeerTimeout(opts_.peerTimeout);
    inbound_.insert(link);
  }
}

bool AgentImpl::evictIdlestLink() {
  // Links no wireup authenticated, the one silent the longest first: at the caps a new link takes
  // its place, so that idle links cannot lock peers out (a peer's link carries its REQUEST at once).
  std::shared_ptr<WireupConnection> idlest;
  for (const auto& link : inbound_) {
    if (link->authenticated) continue;
    if (!idlest || link->lastValid < idlest->lastValid) idlest = link;
  }
  if (!idlest) return false;
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.connectionsRefused;
  }
  logRefused(resourceExhausted("closed the unauthenticated wireup link from " + idlest->ticket.source() +
                               " silent the longest, to admit a new one (the listener is at its cap)"));
  idlest->close();
  inbound_.erase(idlest);
  return true;
}

void AgentImpl::sweepInboundLinks() {
  if (shutdown_) return;
  auto now = Clock::now();
  std::vector<std::shared_ptr<WireupConnection>> idle;
  for (const auto& link : inbound_) {
    if (!link->authenticated && now - link->lastValid > kLinkIdle) idle.push_back(link);
  }
  for (auto& link : idle) {
    {
      std::lock_guard<std::mutex> lock(statsMu_);
      ++stats_.connectionsRefused;
    }
    logRefused(Status(StatusCode::kTimedOut, "closed an inbound wireup link from " + link->ticket.source() +
                                                 " that carried no wireup for 10 s"));
    link->close();
    inbound_.erase(link);
  }
  // Links of ours to agents no connection belongs to (a REJECT to a stale or refused REQUEST):
  // closed once they have been quiet for a while, so forged REQUESTs cannot pile them up.
  for (auto it = links_.begin(); it != links_.end();) {
    if (now - it->second->lastValid > kOrphanLinkIdle && !findUuid(it->first)) {
      it->second->close();
      it = links_.erase(it);
    } else {
      ++it;
    }
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  linkSweepTimer_ = loop_.addTimer(now + kLinkSweepEvery, [weak] {
    if (auto a = weak.lock()) a->sweepInboundLinks();
  });
}

bool AgentImpl::challengeFirst(const WireupMessage& m, const WorkerAddress& from) {
  // With a secret the REQUEST's MAC authenticated it. Without one, the cookie proves that whoever
  // sent it receives at the address it claims: it went there in the CHALLENGE, and it is this
  // agent's HMAC of the REQUEST's sender, connection and nonce (no state is kept for it).
  if (!secret_.empty()) return false;
  const std::string cookie =
      hmacSha256Hex(cookieKey_, uuidText(m.from) + "/" + std::to_string(m.conn) + "/" + m.nonce)
          .substr(0, 32);
  if (!m.cookie.empty() && constantTimeEqual(m.cookie, cookie)) return false;
  // Each CHALLENGE dials the address the REQUEST claims: the links to agents no connection uses
  // are capped, and at the cap the one quiet the longest makes room (so a flood of forged
  // REQUESTs delays a real initiator's CHALLENGE at most until its next resend).
  closeOrphanLinksAbove(kMaxOrphanLinks - 1);
  WireupMessage challenge = wireupHeader(WireupType::kChallenge, self_.uuid, from.uuid, m.conn);
  challenge.cookie = cookie;
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.challengesSent;
  }
  sendLine(from, encodeWireup(challenge, secret_));
  return true;
}

void AgentImpl::onChallenge(const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer || peer->state() != PeerImpl::State::kRequesting || m.conn != peer->conn || !peer->request)
    return;
  auto remote = peer->remote();
  if (!remote || peer->request->cookie == m.cookie) return;
  peer->request->cookie = m.cookie;
  peer->lastWireup = encodeWireup(*peer->request, secret_);
  sendLine(*remote, peer->lastWireup);
}

void AgentImpl::closeOrphanLinksAbove(size_t keep) {
  std::vector<std::map<Uuid, std::shared_ptr<WireupConnection>>::iterator> orphans;
  for (auto it = links_.begin(); it != links_.end(); ++it) {
    if (!findUuid(it->first)) orphans.push_back(it);
  }
  if (orphans.size() <= keep) return;
  std::sort(orphans.begin(), orphans.end(),
            [](const auto& x, const auto& y) { return x->second->lastValid < y->second->lastValid; });
  const size_t excess = orphans.size() - keep;
  logRefused(resourceExhausted(
      "closed " + std::to_string(excess) + " link(s) to unknown agents quiet the longest (" +
      std::to_string(orphans.size()) + " open, the cap is " + std::to_string(kMaxOrphanLinks) + ")"));
  for (size_t i = 0; i < excess; ++i) {
    orphans[i]->second->close();
    links_.erase(orphans[i]);
  }
}

bool AgentImpl::admitHandshake(WireupConnection& link, const WorkerAddress& from) {
  size_t onLink = 0, all = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [uuid, p] : byUuid_) {
      if (p->state() != PeerImpl::State::kAwaitAck || p->origin.expired()) continue;
      ++all;
      if (p->origin.lock().get() == &link) ++onLink;
    }
  }
  if (onLink < kMaxHandshakesPerLink && all < kMaxHandshakes) return true;
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.messagesRefused;
  }
  logRefused(resourceExhausted(
      "refused a REQUEST from '" + from.alias +
      "': " + (onLink >= kMaxHandshakesPerLink ? "its link holds " : "the agent holds ") +
      std::to_string(onLink >= kMaxHandshakesPerLink ? onLink : all) + " handshakes not finished, the cap"));
  return false;
}

std::chrono::milliseconds handshakeTimeout(std::chrono::milliseconds connectTimeout) {
  return std::min(connectTimeout, std::chrono::duration_cast<std::chrono::milliseconds>(kHandshakeTimeout));
}

bool AgentImpl::acceptOnLink(WireupConnection& link, const std::shared_ptr<PeerImpl>& peer,
                             const WireupMessage& m, std::string_view line) {
  // With a secret every line carries its own MAC: any link is as good as another.
  if (!secret_.empty() || !changesPeerState(m.type)) return true;
  if (peer->authLink.lock().get() == &link) return true;
  // Lines on a link of ours (one we dialed) come from whoever we dialed at the peer's own address.
  auto out = links_.find(peer->remote() ? peer->remote()->uuid : Uuid{});
  if (out != links_.end() && out->second.get() == &link) return true;
  if (link.held.size() >= kMaxHeldLines) {
    logRefused(resourceExhausted("closed a wireup link that claims to be '" + peer->alias() +
                                 "': " + std::to_string(kMaxHeldLines) +
                                 " lines held while it did not echo its probe"));
    link.close();
    return false;
  }
  link.held.emplace_back(line);
  if (peer->probeNonce.empty()) probe(peer, "a message on a link its wireup did not authenticate");
  return false;
}

bool AgentImpl::onAuthenticLink(WireupConnection& link, const std::shared_ptr<PeerImpl>& peer) {
  if (!secret_.empty()) return true;
  auto auth = peer->authLink.lock();
  if (!auth || auth.get() == &link) return true;
  probe(peer, "a REQUEST for a new connection on another link");
  return false;
}

bool AgentImpl::earlierLifeGone(const std::shared_ptr<PeerImpl>& earlier, const WorkerAddress& from) {
  // A dead process closed its links, so it is found gone at once; one that still holds its link
  // is asked, and the new life's REQUEST (resent until answered) counts once the earlier one did
  // not answer within peerTimeout.
  if (!secret_.empty() || earlier->state() != PeerImpl::State::kReady) return true;
  auto held = earlier->authLink.lock();
  if (!held || !held->open() || earlier->probeMissed) return true;
  if (earlier->probeNonce.empty()) probe(earlier, "a REQUEST from another life of its alias");
  logRefused(Status(StatusCode::kPermissionDenied,
                    "held a REQUEST from another life of '" + from.alias +
                        "' while its connected life holds its link (it is asked whether it is alive)"));
  return false;
}

void AgentImpl::probe(const std::shared_ptr<PeerImpl>& peer, const char* why) {
  auto remote = peer->remote();
  if (!remote || !peer->probeNonce.empty()) return;
  FERRY_LOG(kDebug, "agent '%s': probing '%s' (%s)", self_.alias.c_str(), peer->alias().c_str(), why);
  peer->probeNonce = newNonce();
  peer->probeSent = Clock::now();
  WireupMessage ping = wireupHeader(WireupType::kPing, self_.uuid, remote->uuid);
  ping.nonce = peer->probeNonce;
  sendLine(*remote, encodeWireup(ping, secret_));
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  std::weak_ptr<PeerImpl> weakPeer = peer;
  peer->probeTimer = loop_.addTimer(Clock::now() + opts_.peerTimeout, [weak, weakPeer] {
    auto a = weak.lock();
    auto p = weakPeer.lock();
    if (!a || !p) return;
    p->probeTimer = 0;
    if (p->probeNonce.empty()) return;
    // Unanswered: the lines held for this peer on other links go; the peer itself is not judged by
    // a probe someone else provoked (its liveness is the links' and the heartbeat's).
    p->probeNonce.clear();
    p->probeMissed = true;
    for (auto& link : a->inbound_) {
      if (link->hasOwner && p->remote() && link->owner == p->remote()->uuid && !link->authenticated) {
        link->held.clear();
      }
    }
  });
}

void AgentImpl::authenticate(WireupConnection& link, PeerImpl& peer) {
  for (const auto& in : inbound_) {
    if (in.get() != &link) continue;
    in->authenticated = true;
    peer.authLink = in;
    return;
  }
}

void AgentImpl::onPong(WireupConnection& link, const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer || m.echo.empty() || m.echo != peer->probeNonce) return;
  peer->probeNonce.clear();
  peer->probeMissed = false;
  if (peer->probeTimer != 0) loop_.cancelTimer(peer->probeTimer);
  peer->probeTimer = 0;
  // The peer, asked at its own address, answered on this link: it is the peer's.
  for (const auto& in : inbound_) {
    if (in.get() != &link) continue;
    in->authenticated = true;
    peer->authLink = in;
    std::vector<std::string> held;
    held.swap(in->held);
    auto keep = in;
    for (const auto& line : held) {
      if (!keep->open()) break;
      onLine(*keep, line);
    }
    return;
  }
}

}  // namespace ferry::agent
