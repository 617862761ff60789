// Application messages (Agent::onMessage, PeerConnection::sendMessage): an upper layer's message
// travels as a wireup MESSAGE on the auxiliary channel, in order with the wireup, and is handed to
// the handler of its channel once its peer is connected.
#include "agent/agent_impl.h"
#include "common/log.h"

namespace ferry::agent {

void AgentImpl::onMessage(const WireupMessage& m) {
  auto peer = findUuid(m.from);
  std::shared_ptr<Agent::MessageHandler> handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handlers_.find(m.channel);
    if (it != handlers_.end()) handler = it->second;
  }
  if (!peer || peer->state() != PeerImpl::State::kReady || !handler) {
    FERRY_LOG(kDebug, "agent '%s': dropped a '%s' message (%s)", self_.alias.c_str(), m.channel.c_str(),
              handler ? "the peer is not connected" : "no handler");
    return;
  }
  (*handler)(std::make_shared<PeerConnection>(peer), m.body);
}

void AgentImpl::setMessageHandler(std::string channel, Agent::MessageHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  if (handler) {
    handlers_[std::move(channel)] = std::make_shared<Agent::MessageHandler>(std::move(handler));
  } else {
    handlers_.erase(channel);
  }
}

void AgentImpl::sendMessage(const WorkerAddress& to, std::string_view channel, std::string_view body) {
  WireupMessage m = wireupHeader(WireupType::kMessage, self_.uuid, to.uuid);
  m.channel = std::string(channel);
  m.body = std::string(body);
  std::string line = encodeWireup(m, secret_);
  if (loop_.inLoop()) {
    sendLine(to, line);
    return;
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  loop_.post([weak, to, line = std::move(line)] {
    if (auto a = weak.lock()) a->sendLine(to, line);
  });
}

}  // namespace ferry::agent
