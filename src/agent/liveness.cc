// Liveness: how the agent learns that a peer is gone (no answer to heartbeats for peerTimeout, a
// wireup link that closes, a goodbye, a local disconnect) and what follows (peerGone: the
// connection fails and is forgotten, its link closed). Loop thread.
#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "agent/agent_impl.h"
#include "common/log.h"

namespace ferry::agent {

void AgentImpl::onLinkClosed(WireupConnection& link, const Status& why, bool connected) {
  std::shared_ptr<WireupConnection> keep;
  for (auto it = inbound_.begin(); it != inbound_.end(); ++it) {
    if (it->get() == &link) {
      keep = *it;
      inbound_.erase(it);
      break;
    }
  }
  bool outgoing = false;
  if (link.hasOwner) {
    auto it = links_.find(link.owner);
    if (it != links_.end() && it->second.get() == &link) {
      keep = it->second;
      links_.erase(it);
      outgoing = true;
    }
  }
  if (!link.hasOwner || shutdown_) return;
  auto peer = findUuid(link.owner);
  if (!peer) return;
  PeerImpl::State st = peer->state();
  // An address is one life of one agent: when every listener of it refuses, that life is over
  // (an address exists only once its agent listens), and waiting for the deadline would only
  // delay the error. For a peer named by alias the address is the one its store entry holds: the
  // operation fails at once, and the next one looks the alias up again (a restarted life
  // registers its new address).
  if (st == PeerImpl::State::kRequesting && outgoing && !connected && why.cause() == ECONNREFUSED) {
    peerGone(peer, peer->addressBytes.empty()
                       ? "no agent listens at the address registered for '" + peer->alias() + "' (" +
                             why.message() + ")"
                       : "no agent listens at its address any more (" + why.message() + ")");
    return;
  }
  if (st != PeerImpl::State::kReady && st != PeerImpl::State::kAwaitAck) return;  // wireup retries
  if (outgoing && !connected) {
    peerGone(peer, "its wireup listener refuses connections (" + why.message() + ")");
    return;
  }
  // A connection dropped: ask the peer right away (a fresh connection that is refused says it is
  // gone; an answer says it is alive).
  auto remote = peer->remote();
  if (remote) {
    peer->lastPing = Clock::now();
    sendLine(*remote, encodeWireup(wireupHeader(WireupType::kPing, self_.uuid, remote->uuid), secret_));
  }
}

void AgentImpl::sweep() {
  if (shutdown_) return;
  auto now = Clock::now();
  std::vector<std::shared_ptr<PeerImpl>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [uuid, p] : byUuid_) peers.push_back(p);
  }
  for (auto& p : peers) {
    PeerImpl::State st = p->state();
    if (st != PeerImpl::State::kReady && st != PeerImpl::State::kAwaitAck) continue;
    if (now - p->lastHeard > opts_.peerTimeout) {
      double secs = std::chrono::duration<double>(now - p->lastHeard).count();
      char text[64];
      snprintf(text, sizeof text, "no answer for %.1f s", secs);
      peerGone(p, text);
      continue;
    }
    if (now - p->lastHeard >= opts_.heartbeat && now - p->lastPing >= opts_.heartbeat) {
      p->lastPing = now;
      auto remote = p->remote();
      if (remote)
        sendLine(*remote, encodeWireup(wireupHeader(WireupType::kPing, self_.uuid, remote->uuid), secret_));
    }
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  auto every = std::min<std::chrono::milliseconds>(opts_.heartbeat, opts_.peerTimeout / 4);
  sweepTimer_ =
      loop_.addTimer(now + std::max<std::chrono::milliseconds>(every, std::chrono::milliseconds(20)), [weak] {
        if (auto a = weak.lock()) a->sweep();
      });
}

void AgentImpl::disconnect(const std::shared_ptr<PeerImpl>& peer, const std::string& reason) {
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  loop_.post([weak, peer, reason] {
    auto a = weak.lock();
    if (!a) return;
    auto remote = peer->remote();
    if (remote && peer->state() != PeerImpl::State::kResolving && !peer->retired()) {
      WireupMessage bye = wireupHeader(WireupType::kBye, a->self_.uuid, remote->uuid);
      bye.reason = reason;
      a->sendLine(*remote, encodeWireup(bye, a->secret_));
    }
    a->peerGone(peer, "closed here (" + reason + ")");
  });
}

void AgentImpl::peerGone(const std::shared_ptr<PeerImpl>& peer, const std::string& why) {
  if (peer->retired()) {
    forget(peer);
    return;
  }
  auto remote = peer->remote();
  std::string who = "'" + peer->alias() + "'" + (remote ? " (" + shortId(remote->uuid) + ")" : std::string());
  // A goodbye is news, not trouble.
  if (why.rfind("it shut down", 0) == 0 || why.rfind("closed here", 0) == 0) {
    FERRY_LOG(kInfo, "agent '%s': peer %s is gone: %s", self_.alias.c_str(), who.c_str(), why.c_str());
  } else {
    FERRY_LOG(kWarn, "agent '%s': peer %s is gone: %s", self_.alias.c_str(), who.c_str(), why.c_str());
  }
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.peersGone;
  }
  forget(peer);
  if (peer->retryTimer != 0) loop_.cancelTimer(peer->retryTimer);
  if (peer->deadlineTimer != 0) loop_.cancelTimer(peer->deadlineTimer);
  peer->retryTimer = peer->deadlineTimer = 0;
  if (remote) {
    auto it = links_.find(remote->uuid);
    if (it != links_.end()) {
      it->second->close();
      links_.erase(it);
    }
  }
  peer->fail(Status(StatusCode::kPeerGone, "peer " + who + " is gone: " + why));
}

}  // namespace ferry::agent
