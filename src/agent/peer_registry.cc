// The agent's registry of connections (AgentImpl::byUuid_, byAlias_): finding a peer's connection
// by uuid or alias, making one on first use (by alias through the store, or by address), and
// forgetting one that ended so that the next use wires up anew. Any thread, under AgentImpl::mu_.
#include "agent/agent_impl.h"

namespace ferry::agent {

std::shared_ptr<PeerImpl> AgentImpl::findUuid(const Uuid& uuid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byUuid_.find(uuid);
  return it == byUuid_.end() ? nullptr : it->second;
}

std::shared_ptr<PeerImpl> AgentImpl::findAlias(std::string_view alias) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byAlias_.find(std::string(alias));
  return it == byAlias_.end() ? nullptr : it->second;
}

std::vector<std::string> AgentImpl::peerAliases() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (auto& [alias, p] : byAlias_) out.push_back(alias);
  return out;
}

void AgentImpl::forget(const std::shared_ptr<PeerImpl>& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = byUuid_.begin(); it != byUuid_.end();)
    it = it->second == peer ? byUuid_.erase(it) : std::next(it);
  for (auto it = byAlias_.begin(); it != byAlias_.end();)
    it = it->second == peer ? byAlias_.erase(it) : std::next(it);
}

Result<std::shared_ptr<PeerImpl>> AgentImpl::peerByAlias(std::string_view alias, size_t numQp, bool create) {
  if (shutdown_) return closedError("agent: shut down");
  if (alias.empty() || alias.size() > kMaxAliasBytes)
    return invalidArgument("connect: the alias is empty or too long");
  if (alias == self_.alias)
    return invalidArgument("connect: '" + std::string(alias) + "' is this agent itself");
  if (numQp < 1 || numQp > 64) return invalidArgument("connect: qp_num must be 1 .. 64");
  // A connection whose endpoint failed (the peer died, or refused an access, which ends an RC
  // connection) is retired here, so that the lookup wires up anew instead of handing it back.
  if (auto old = findAlias(alias)) (void)old->retireIfEndpointFailed();
  std::shared_ptr<PeerImpl> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = byAlias_.find(std::string(alias));
    if (it != byAlias_.end() && !it->second->retired()) return it->second;
    if (!create) return notFound("no connection to '" + std::string(alias) + "'");
    if (!store_) {
      return invalidArgument(
          "connect: '" + std::string(alias) +
          "' is not connected and this agent has no store to look it up (connect by address)");
    }
    peer = std::make_shared<PeerImpl>(weak_from_this(), std::string(alias), numQp);
    byAlias_[std::string(alias)] = peer;
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  loop_.post([weak, peer] {
    if (auto a = weak.lock()) {
      a->armDeadline(peer);
      a->startResolve(peer);
    }
  });
  return peer;
}

Result<std::shared_ptr<PeerImpl>> AgentImpl::peerByAddress(std::string_view bytes, size_t numQp) {
  if (shutdown_) return closedError("agent: shut down");
  if (numQp < 1 || numQp > 64) return invalidArgument("connect: qp_num must be 1 .. 64");
  auto decoded = WorkerAddress::decode(bytes);
  if (!decoded.isOk()) return invalidArgument("connect: " + decoded.status().message());
  if (decoded->uuid == self_.uuid) return invalidArgument("connect: that is this agent's own address");
  FERRY_ASSIGN_OR_RETURN(LaneSet lanes, selectLanes(self_, *decoded, lanes_));
  if (auto old = findUuid(decoded->uuid)) (void)old->retireIfEndpointFailed();  // as peerByAlias
  std::shared_ptr<PeerImpl> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = byUuid_.find(decoded->uuid);
    if (it != byUuid_.end() && !it->second->retired()) return it->second;
    peer = std::make_shared<PeerImpl>(weak_from_this(), decoded->alias, numQp);
    peer->addressBytes = std::string(bytes);
    peer->setRemote(*decoded, lanes);
    byUuid_[decoded->uuid] = peer;
    auto alias = byAlias_.find(decoded->alias);
    if (alias == byAlias_.end() || alias->second->retired()) byAlias_[decoded->alias] = peer;
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  loop_.post([weak, peer] {
    if (auto a = weak.lock()) {
      a->armDeadline(peer);
      a->startWireup(peer);
    }
  });
  return peer;
}

void AgentImpl::retire(const std::shared_ptr<PeerImpl>& peer) {
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  forget(peer);
  loop_.post([weak, peer] {
    if (auto a = weak.lock()) a->peerGone(peer, "its connection failed");
  });
}

}  // namespace ferry::agent
