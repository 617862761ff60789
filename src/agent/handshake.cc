// The wireup state machine (docs/agent.md): REQUEST, REPLY and ACK make a connection's endpoints
// and connect them, with the tie-break when both sides connect at once, retries until the deadline,
// REJECT, and a REQUEST that replaces an earlier connection or life of the peer. The messages'
// codec is wireup.cc; what a stranger may cause before its handshake is guard.cc. Loop thread.
#include <algorithm>
#include <cstdlib>

#include "agent/agent_impl.h"
#include "common/log.h"
#include "endpoint/metadata.h"

namespace ferry::agent {

namespace ep = ferry::endpoint;

namespace {

constexpr int64_t kMaxClockSkewSeconds = 120;

int64_t wallSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string laneText(const LaneSet& lanes) {
  std::string s;
  for (int i = 0; i < kNumOpClasses; ++i) {
    s += std::string(i ? "," : "") + opClassName(static_cast<OpClass>(i)) + "=" +
         laneKindName(lanes.lanes[i].kind);
  }
  return s;
}

}  // namespace

void AgentImpl::armDeadline(const std::shared_ptr<PeerImpl>& peer, std::chrono::milliseconds timeout) {
  peer->deadline = Clock::now() + timeout;
  std::weak_ptr<PeerImpl> weakPeer = peer;
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  peer->deadlineTimer = loop_.addTimer(peer->deadline, [weak, weakPeer, timeout] {
    auto a = weak.lock();
    auto p = weakPeer.lock();
    if (!a || !p) return;
    p->deadlineTimer = 0;
    PeerImpl::State st = p->state();
    if (st == PeerImpl::State::kReady || st == PeerImpl::State::kFailed) return;
    double secs = std::chrono::duration<double>(timeout).count();
    std::string what;
    if (st == PeerImpl::State::kResolving) {
      what = "'" + p->alias() + "' is not registered in " + a->opts_.store +
             (p->lookupError.empty() ? "" : " (" + p->lookupError + ")");
    } else if (st == PeerImpl::State::kRequesting) {
      what = "no REPLY from '" + p->alias() + "' to " + std::to_string(p->tries) +
             " REQUESTs (is it running, reachable, and using the same shared secret?)";
    } else {
      what = "no ACK from '" + p->alias() + "' to " + std::to_string(p->tries) + " REPLYs";
    }
    if (p->retryTimer != 0) a->loop_.cancelTimer(p->retryTimer);
    p->retryTimer = 0;
    a->forget(p);
    char secsText[32];
    snprintf(secsText, sizeof secsText, "%.1f", secs);
    p->fail(Status(StatusCode::kTimedOut,
                   "wireup with '" + p->alias() + "' did not finish within " + secsText + " s: " + what));
  });
}

Result<std::map<std::string, std::shared_ptr<ep::Endpoint>>> AgentImpl::makeEndpoints(const LaneSet& lanes,
                                                                                      size_t numQp) {
  std::map<std::string, std::shared_ptr<ep::Endpoint>> out;
  for (const auto& lane : lanes.lanes) {
    if (out.count(lane.localDevice)) continue;
    std::shared_ptr<ep::MemoryPool> pool;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pools_.find(lane.localDevice);
      if (it != pools_.end()) pool = it->second;
    }
    if (!pool) return Status(StatusCode::kInternal, "agent: no memory pool for device " + lane.localDevice);
    ep::EndpointOptions o;
    o.numQp = numQp;
    o.worker = worker_;
    o.sendDepth = opts_.sendDepth;
    o.recvDepth = opts_.recvDepth;
    o.recvBufferSize = opts_.recvBufferSize;
    // The agent finds dead peers itself (wireup_connection.h); its queue pairs keep the endpoints' transport
    // timeout (FERRY_TRANSPORT_TIMEOUT, 30 s by default), which also outlasts a connection burst
    // where a peer's first SYN is dropped and resent a second or three later.
    // A queue pair that gives up on the peer means the peer is gone, whichever side notices first.
    o.transportFailureIsPeerGone = true;
    auto e = ep::Endpoint::create(pool, std::move(o));
    if (!e.isOk()) return e.status();
    out[lane.localDevice] = *e;
  }
  return out;
}

json::Value AgentImpl::endpointInfos(const PeerImpl& peer) const {
  json::Value infos = json::Value::emptyObject();
  for (const auto& [device, e] : peer.endpoints()) {
    infos.set(device, ep::endpointInfoValue(*e));
  }
  return infos;
}

Status AgentImpl::connectEndpoints(PeerImpl& peer, const json::Value& theirs) {
  auto lanes = peer.lanes();
  if (!lanes) return Status(StatusCode::kInternal, "agent: no lanes");
  for (const auto& [device, e] : peer.endpoints()) {
    const Lane* lane = nullptr;
    for (const auto& l : lanes->lanes) {
      if (l.localDevice == device) lane = &l;
    }
    const json::Value* info = lane ? theirs.find(lane->remoteDevice) : nullptr;
    if (info == nullptr) {
      return Status(StatusCode::kProtocolError, "the peer sent no endpoint for its device " +
                                                    (lane ? lane->remoteDevice : std::string("?")));
    }
    FERRY_RETURN_IF_ERROR(ep::connectFromValue(*e, *info));
  }
  return Status::ok();
}

void AgentImpl::startWireup(const std::shared_ptr<PeerImpl>& peer) {
  if (peer->state() == PeerImpl::State::kFailed) return;
  auto remote = peer->remote();
  auto lanes = peer->lanes();
  if (!remote || !lanes) return;
  auto endpoints = makeEndpoints(*lanes, peer->numQp());
  if (!endpoints.isOk()) {
    forget(peer);
    peer->fail(endpoints.status());
    return;
  }
  peer->setEndpoints(std::move(*endpoints));
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer->conn = nextConn_++;
  }
  peer->nonce = newNonce();
  WireupMessage m = wireupHeader(WireupType::kRequest, self_.uuid, remote->uuid, peer->conn);
  m.fromAddress = selfBytes_;
  m.numQp = static_cast<uint32_t>(peer->numQp());
  m.lanes = laneText(*lanes);
  m.endpoints = endpointInfos(*peer);
  m.nonce = peer->nonce;
  m.time = wallSeconds();
  peer->lastWireup = encodeWireup(m, secret_);
  peer->request = m;  // sent again with the responder's cookie when it challenges (guard.cc)
  peer->lastWireupType = WireupType::kRequest;
  peer->setState(PeerImpl::State::kRequesting);
  peer->tries = 1;
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.requestsSent;
  }
  sendLine(*remote, peer->lastWireup);
  armRetry(peer);
}

void AgentImpl::armRetry(const std::shared_ptr<PeerImpl>& peer) {
  if (peer->retryTimer != 0) loop_.cancelTimer(peer->retryTimer);
  auto wait = opts_.retryInterval * (1 << std::min(peer->tries - 1, 3));
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  std::weak_ptr<PeerImpl> weakPeer = peer;
  peer->retryTimer = loop_.addTimer(Clock::now() + wait, [weak, weakPeer] {
    auto a = weak.lock();
    auto p = weakPeer.lock();
    if (!a || !p) return;
    p->retryTimer = 0;
    PeerImpl::State st = p->state();
    if (st != PeerImpl::State::kRequesting && st != PeerImpl::State::kAwaitAck) return;
    auto remote = p->remote();
    if (!remote) return;
    ++p->tries;
    {
      std::lock_guard<std::mutex> lock(a->statsMu_);
      ++a->stats_.retries;
    }
    a->sendLine(*remote, p->lastWireup);
    a->armRetry(p);
  });
}

void AgentImpl::onRequest(WireupConnection& link, const WireupMessage& m, const WorkerAddress& from) {
  if (!requestIsFresh(m, from)) return;
  uint64_t abandoned = 0;
  std::shared_ptr<PeerImpl> peer = peerForRequest(link, m, from, &abandoned);
  if (peer) answerRequest(std::move(peer), m, from, abandoned);
}

bool AgentImpl::requestIsFresh(const WireupMessage& m, const WorkerAddress& from) {
  if (secret_.empty()) return true;
  // A REQUEST is authenticated by its MAC; a copy of it replayed later is refused by its nonce and
  // time stamp.
  int64_t now = wallSeconds();
  if (std::llabs(now - m.time) > kMaxClockSkewSeconds) {
    logRefused(Status(StatusCode::kPermissionDenied, "refused a REQUEST from '" + from.alias +
                                                         "': its clock is " + std::to_string(m.time - now) +
                                                         " s off"));
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto cutoff = Clock::now() - std::chrono::seconds(2 * kMaxClockSkewSeconds);
  for (auto it = seenNonces_.begin(); it != seenNonces_.end();)
    it = it->second < cutoff ? seenNonces_.erase(it) : std::next(it);
  auto [it, fresh] = seenNonces_.emplace(m.nonce, Clock::now());
  if (fresh) return true;
  // A resend of a REQUEST we answered is answered again by the duplicate rule; any other copy is a
  // replay.
  auto p = byUuid_.find(m.from);
  return p != byUuid_.end() && p->second->remoteConn == m.conn;
}

std::shared_ptr<PeerImpl> AgentImpl::peerForRequest(WireupConnection& link, const WireupMessage& m,
                                                    const WorkerAddress& from, uint64_t* abandoned) {
  std::shared_ptr<PeerImpl> peer = findUuid(from.uuid);
  if (!peer && challengeFirst(m, from)) return nullptr;  // nothing is made for it before it echoes a cookie
  if (peer) {
    PeerImpl::State st = peer->state();
    if ((st == PeerImpl::State::kAwaitAck || st == PeerImpl::State::kReady) && peer->remoteConn == m.conn) {
      sendLine(from, peer->lastWireup);  // our REPLY was lost: again
      return nullptr;
    }
    if (peer->ignoredConn == m.conn) return nullptr;
    if (st == PeerImpl::State::kRequesting) {
      if (self_.uuid < from.uuid) {
        // Both sides connect at once: the smaller uuid's REQUEST wins; the peer will answer ours.
        peer->ignoredConn = m.conn;
        std::lock_guard<std::mutex> lock(statsMu_);
        ++stats_.duplicatesDropped;
        return nullptr;
      }
      // We lose: our REQUEST is abandoned, our endpoints answer the peer's.
      *abandoned = peer->conn;
      if (peer->retryTimer != 0) loop_.cancelTimer(peer->retryTimer);
      peer->retryTimer = 0;
      {
        std::lock_guard<std::mutex> lock(statsMu_);
        ++stats_.duplicatesDropped;
      }
      if (peer->numQp() != m.numQp) {
        // Our endpoints have another queue-pair count: the peer's choice wins, ours are rebuilt.
        peer->setEndpoints({});
      }
    } else if (st == PeerImpl::State::kReady || st == PeerImpl::State::kAwaitAck) {
      if (m.conn < peer->remoteConn) return nullptr;  // an old, delayed REQUEST
      // The peer wires up anew (its side of our connection failed): this one is over, once the
      // REQUEST is known to be the peer's (without a secret: it came on the peer's link).
      if (!onAuthenticLink(link, peer)) return nullptr;  // its next resend, once the link is known, counts
      peerGone(peer, "it connected again");
      peer = nullptr;
    }
  }
  if (!peer) return peerForNewUuid(link, m, from);
  return peer;
}

std::shared_ptr<PeerImpl> AgentImpl::peerForNewUuid(WireupConnection& link, const WireupMessage& m,
                                                    const WorkerAddress& from) {
  std::shared_ptr<PeerImpl> peer;
  std::shared_ptr<PeerImpl> byAlias = findAlias(from.alias);
  if (byAlias && !byAlias->retired()) {
    auto known = byAlias->remote();
    if (!known) {
      peer = byAlias;  // we were still looking it up: this REQUEST tells us where it is
    } else if (known->uuid != from.uuid) {
      if (from.startNs < known->startNs) return nullptr;    // from an older life than the one we know
      if (!earlierLifeGone(byAlias, from)) return nullptr;  // resent until answered: counts once it is
      peerGone(byAlias, "it restarted");
    }
  }
  if (!peer && !admitHandshake(link, from)) return nullptr;
  if (!peer) {
    peer = std::make_shared<PeerImpl>(weak_from_this(), from.alias, m.numQp);
    peer->origin = link.self();
    armDeadline(peer, handshakeTimeout(opts_.connectTimeout));
  }
  std::lock_guard<std::mutex> lock(mu_);
  byUuid_[from.uuid] = peer;
  byAlias_[from.alias] = peer;
  return peer;
}

void AgentImpl::answerRequest(std::shared_ptr<PeerImpl> peer, const WireupMessage& m,
                              const WorkerAddress& from, uint64_t abandoned) {
  // The initiator's lane choice is followed (both sides computed it; a configured override on its
  // side is honoured here too).
  LaneOverrides theirs;
  auto parsedLanes = parseLaneOverrides(m.lanes);
  if (parsedLanes.isOk()) theirs = *parsedLanes;
  auto lanes = selectLanes(self_, from, theirs);
  auto reject = [&](const Status& why) {
    WireupMessage r = wireupHeader(WireupType::kReject, self_.uuid, from.uuid, m.conn);
    r.reason = why.message();
    sendLine(from, encodeWireup(r, secret_));
    forget(peer);
    peer->fail(why);
  };
  if (!lanes.isOk()) return reject(lanes.status());
  peer->setRemote(from, *lanes);
  if (!peer->endpointsMatchLanes() || peer->numQp() != m.numQp) {
    if (peer->numQp() != m.numQp) {
      // A peer connecting with another qp_num than our own pending connect: its choice is used.
      auto replacement = std::make_shared<PeerImpl>(weak_from_this(), from.alias, m.numQp);
      replacement->setRemote(from, *lanes);
      replacement->deadline = peer->deadline;
      {
        std::lock_guard<std::mutex> lock(mu_);
        byUuid_[from.uuid] = replacement;
        byAlias_[from.alias] = replacement;
      }
      peer->handOver(replacement, "superseded by the peer's connection");
      peer = replacement;
      armDeadline(peer);
    }
    auto endpoints = makeEndpoints(*lanes, m.numQp);
    if (!endpoints.isOk()) return reject(endpoints.status());
    peer->setEndpoints(std::move(*endpoints));
  }
  Status connected = connectEndpoints(*peer, m.endpoints);
  if (!connected.isOk()) return reject(connected);
  peer->remoteConn = m.conn;
  peer->nonce = newNonce();
  WireupMessage r = wireupHeader(WireupType::kReply, self_.uuid, from.uuid, m.conn);
  r.fromAddress = selfBytes_;
  r.endpoints = endpointInfos(*peer);
  r.nonce = peer->nonce;
  r.echo = m.nonce;
  r.abandoned = abandoned;
  peer->lastWireup = encodeWireup(r, secret_);
  peer->lastWireupType = WireupType::kReply;
  peer->setState(PeerImpl::State::kAwaitAck);
  peer->tries = 1;
  peer->lastHeard = Clock::now();
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.repliesSent;
  }
  sendLine(from, peer->lastWireup);
  armRetry(peer);
}

void AgentImpl::onReply(WireupConnection& link, const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer) return;
  PeerImpl::State st = peer->state();
  auto remote = peer->remote();
  if (!remote) return;
  if (m.conn != peer->conn) return;  // for a REQUEST we abandoned, or an older one
  if (st == PeerImpl::State::kReady) {
    // Our ACK was lost: again.
    WireupMessage ack = wireupHeader(WireupType::kAck, self_.uuid, m.from, m.conn);
    ack.echo = m.nonce;
    sendLine(*remote, encodeWireup(ack, secret_));
    return;
  }
  if (st != PeerImpl::State::kRequesting) return;
  if (m.echo != peer->nonce) {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.messagesRefused;
    return;  // not an answer to our challenge
  }
  Status connected = connectEndpoints(*peer, m.endpoints);
  if (!connected.isOk()) {
    forget(peer);
    peer->fail(connected);
    return;
  }
  authenticate(link, *peer);  // it answered our nonce, which went to its own address
  if (m.abandoned != 0) peer->ignoredConn = m.abandoned;
  if (peer->retryTimer != 0) loop_.cancelTimer(peer->retryTimer);
  peer->retryTimer = 0;
  WireupMessage ack = wireupHeader(WireupType::kAck, self_.uuid, m.from, m.conn);
  ack.echo = m.nonce;
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.acksSent;
  }
  sendLine(*remote, encodeWireup(ack, secret_));
  peer->lastHeard = Clock::now();
  if (peer->deadlineTimer != 0) loop_.cancelTimer(peer->deadlineTimer);
  peer->deadlineTimer = 0;
  peer->becomeReady();
  FERRY_LOG(kInfo, "agent '%s': connected to '%s' (%s)", self_.alias.c_str(), remote->alias.c_str(),
            laneText(*peer->lanes()).c_str());
}

void AgentImpl::onAck(WireupConnection& link, const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer || peer->state() != PeerImpl::State::kAwaitAck || m.conn != peer->remoteConn) return;
  if (m.echo != peer->nonce) {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++stats_.messagesRefused;
    return;
  }
  authenticate(link, *peer);  // it answered our REPLY's nonce, which went to its own address
  if (peer->retryTimer != 0) loop_.cancelTimer(peer->retryTimer);
  peer->retryTimer = 0;
  if (peer->deadlineTimer != 0) loop_.cancelTimer(peer->deadlineTimer);
  peer->deadlineTimer = 0;
  peer->becomeReady();
}

void AgentImpl::onReject(const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer) {
    // A REJECT from a peer we only know by an address of an earlier life: find it by its conn.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [uuid, p] : byUuid_) {
      if (p->conn == m.conn && p->state() == PeerImpl::State::kRequesting) peer = p;
    }
  }
  if (!peer || peer->conn != m.conn || peer->state() != PeerImpl::State::kRequesting) return;
  forget(peer);
  bool stale = m.reason.rfind("stale", 0) == 0;
  peer->fail(Status(stale ? StatusCode::kPeerGone : StatusCode::kUnavailable,
                    "agent '" + peer->alias() + "' refused the connection: " + m.reason));
}

}  // namespace ferry::agent
