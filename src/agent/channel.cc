// The agent's auxiliary channel seen from the agent (a WireupConnection is one of its
// connections, wireup_connection.h): sending a line to a peer over the connection to it, dialled
// on first use, and handing each line that arrives, once decoded and checked, to the job that owns
// its type. Loop thread.
#include "agent/agent_impl.h"
#include "common/log.h"

namespace ferry::agent {

void AgentImpl::sendLine(const WorkerAddress& to, const std::string& line) {
  // The test hook: lose the first N messages of a type.
  if (!opts_.dropFirst.empty()) {
    auto parsed = json::parse(line);
    const json::Value* type = parsed.isOk() ? parsed->find("type") : nullptr;
    auto name = type ? type->getString() : Result<std::string_view>(invalidArgument(""));
    if (name.isOk()) {
      auto want = opts_.dropFirst.find(std::string(*name));
      if (want != opts_.dropFirst.end() && dropped_[want->first] < want->second) {
        ++dropped_[want->first];
        FERRY_LOG(kDebug, "agent: test hook dropped a %s", want->first.c_str());
        return;
      }
    }
  }
  auto& link = links_[to.uuid];
  if (link) link->lastValid = Clock::now();  // for the sweep of links no connection uses (guard.cc)
  if (!link || !link->open()) {
    // Same host: loopback first. Another host: never loopback (it would reach this host).
    std::vector<ControlEndpoint> targets;
    bool sameHost = !to.hostId.empty() && to.hostId == self_.hostId;
    for (const auto& c : to.control) {
      bool loop = c.ip.rfind("127.", 0) == 0 || c.ip == "::1";
      if (loop && sameHost)
        targets.insert(targets.begin(), c);
      else if (!loop)
        targets.push_back(c);
    }
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    link = WireupConnection::connect(
        loop_, std::move(targets), kMaxWireupLine,
        [weak](WireupConnection& l, std::string_view text) {
          if (auto a = weak.lock()) a->onLine(l, text);
        },
        [weak](WireupConnection& l, const Status& why, bool connected) {
          if (auto a = weak.lock()) a->onLinkClosed(l, why, connected);
        });
    link->owner = to.uuid;
    link->hasOwner = true;
    link->setDeadPeerTimeout(opts_.peerTimeout);
    link->lastValid = Clock::now();
  }
  link->send(line);
}

void AgentImpl::onLine(WireupConnection& link, std::string_view line) {
  auto decoded = decodeWireup(line, secret_);
  if (!decoded.isOk()) {
    {
      std::lock_guard<std::mutex> lock(statsMu_);
      ++stats_.messagesRefused;
    }
    logRefused(Status(decoded.status().code(), "refused a wireup message: " + decoded.status().toString()));
    // A peer that sends garbage loses its connection; others are not affected.
    if (decoded.status().code() == StatusCode::kProtocolError) link.close();
    return;
  }
  const WireupMessage& m = *decoded;
  link.lastValid = Clock::now();
  if (!link.hasOwner) {
    link.owner = m.from;
    link.hasOwner = true;
  }
  if (m.to != self_.uuid) return rejectStale(m);
  if (auto peer = findUuid(m.from)) {
    if (!acceptOnLink(link, peer, m, line)) return;
    peer->lastHeard = Clock::now();
  }
  dispatch(link, m);
}

void AgentImpl::rejectStale(const WireupMessage& m) {
  // Addressed to an earlier life of this agent (or to another agent on a reused port).
  if (m.type != WireupType::kRequest) return;
  auto from = WorkerAddress::decode(m.fromAddress);
  if (!from.isOk()) return;
  WireupMessage r = wireupHeader(WireupType::kReject, self_.uuid, m.from, m.conn);
  r.reason = "stale: agent '" + self_.alias + "' restarted (it is " + uuidText(self_.uuid) + " now)";
  sendLine(*from, encodeWireup(r, secret_));
}

void AgentImpl::dispatch(WireupConnection& link, const WireupMessage& m) {
  switch (m.type) {
    case WireupType::kRequest: {
      auto from = WorkerAddress::decode(m.fromAddress);
      if (!from.isOk() || from->uuid != m.from) {
        std::lock_guard<std::mutex> lock(statsMu_);
        ++stats_.messagesRefused;
        return;
      }
      onRequest(link, m, *from);
      break;
    }
    case WireupType::kReply: onReply(link, m); break;
    case WireupType::kAck: onAck(link, m); break;
    case WireupType::kReject: onReject(m); break;
    case WireupType::kPing: onPing(m); break;
    case WireupType::kPong: onPong(link, m); break;
    case WireupType::kMrQuery: onMrQuery(m); break;
    case WireupType::kMrInfo: onMrInfo(m); break;
    case WireupType::kBye: {
      if (auto peer = findUuid(m.from)) peerGone(peer, "it shut down (" + m.reason + ")");
      break;
    }
    case WireupType::kMessage: onMessage(m); break;
    case WireupType::kChallenge: onChallenge(m); break;
  }
}

void AgentImpl::onPing(const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer) return;
  auto remote = peer->remote();
  if (!remote) return;
  WireupMessage pong = wireupHeader(WireupType::kPong, self_.uuid, m.from);
  pong.echo = m.nonce;
  sendLine(*remote, encodeWireup(pong, secret_));
}

}  // namespace ferry::agent
