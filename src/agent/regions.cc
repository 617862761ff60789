// The agent's region registry: memory regions registered by name on every device's pool, their
// length published in the store (never their keys, docs/security.md), and their keys given to a
// connected peer that asks (MR_QUERY, answered by MR_INFO), for get_mr_info and for operations
// that name a peer's region the connection has not looked up yet.
#include <future>

#include "agent/agent_impl.h"

namespace ferry::agent {

namespace ep = ferry::endpoint;

std::string AgentImpl::regionInfoJson(const std::string& name) const {
  json::Value out = json::Value::emptyObject();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [device, pool] : pools_) {
    auto parsed = json::parse(pool->mrInfo());
    if (!parsed.isOk()) continue;
    if (const json::Value* entry = parsed->find(name)) out.set(device, *entry);
  }
  return out.object()->empty() ? std::string() : json::serialize(out);
}

std::string AgentImpl::publishedRegionJson(const std::string& name) const {
  // What anyone who reads the store may know: that the region exists, and its size. Never its
  // address or keys, which grant access (docs/security.md).
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(name);
  if (it == regions_.end()) return {};
  json::Value out = json::Value::emptyObject();
  out.set("length", static_cast<int64_t>(it->second.length));
  return json::serialize(out);
}

Result<std::map<std::string, ep::RegionView>> AgentImpl::regionKeys(std::string_view name) const {
  std::map<std::string, ep::RegionView> out;
  std::lock_guard<std::mutex> lock(mu_);
  if (!regions_.count(std::string(name)))
    return notFound("no local memory region named '" + std::string(name) + "'");
  for (const auto& [device, pool] : pools_) {
    auto h = pool->handleOf(name);
    if (!h.isOk()) continue;
    auto view = pool->find(*h);
    if (view.isOk()) out[device] = *view;
  }
  if (out.empty()) return notFound("region '" + std::string(name) + "' is registered on no device");
  return out;
}

void AgentImpl::onMrQuery(const WireupMessage& m) {
  auto peer = findUuid(m.from);
  if (!peer) return;
  auto remote = peer->remote();
  if (!remote) return;
  WireupMessage r = wireupHeader(WireupType::kMrInfo, self_.uuid, m.from);
  r.name = m.name;
  r.query = m.query;
  std::string info = regionInfoJson(m.name);
  if (!info.empty()) r.info = info;
  sendLine(*remote, encodeWireup(r, secret_));
}

void AgentImpl::onMrInfo(const WireupMessage& m) {
  auto waiter = infoWaiters_.find(m.query);
  if (waiter != infoWaiters_.end()) {  // get_mr_info's question
    waiter->second->set_value(m.info);
    infoWaiters_.erase(waiter);
    return;
  }
  auto peer = findUuid(m.from);
  if (peer) peer->regionAnswered(m.name, m.info);
}

void AgentImpl::queryRegion(const std::shared_ptr<PeerImpl>& peer, const std::string& name) {
  auto remote = peer->remote();
  if (!remote) return;
  WireupMessage q = wireupHeader(WireupType::kMrQuery, self_.uuid, remote->uuid);
  q.name = name;
  q.query = nextQuery_++;
  sendLine(*remote, encodeWireup(q, secret_));
}

Status AgentImpl::registerRegion(std::string_view name, void* addr, uint64_t length,
                                 ep::RegionOptions options) {
  if (shutdown_) return closedError("register_memory_region: the agent was shut down");
  if (name.empty() || name.size() > 512 || name.find('/') != std::string_view::npos) {
    return invalidArgument("register_memory_region: the name is empty, longer than 512 bytes or has a '/'");
  }
  std::vector<std::pair<std::string, std::shared_ptr<ep::MemoryPool>>> pools;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [device, pool] : pools_) pools.emplace_back(device, pool);
    if (regions_.count(std::string(name))) {
      // Again under the same name: replaced (the pools refuse another range under a live name).
      for (auto& [device, pool] : pools) (void)pool->unregisterMemoryRegion(name);
    }
  }
  std::vector<std::shared_ptr<ep::MemoryPool>> done;
  for (auto& [device, pool] : pools) {
    auto h = pool->registerMemoryRegion(name, addr, length, options);
    if (!h.isOk()) {
      for (auto& p : done) (void)p->unregisterMemoryRegion(name);
      std::lock_guard<std::mutex> lock(mu_);
      regions_.erase(std::string(name));
      return Status(
          h.status().code(),
          "register_memory_region '" + std::string(name) + "' on " + device + ": " + h.status().message(),
          h.status().cause());
    }
    done.push_back(pool);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    regions_[std::string(name)] = Region{.addr = addr, .length = length, .options = options};
  }
  if (store_ && options.published) {
    std::string info = publishedRegionJson(std::string(name));
    std::string key = storeKey("regions", self_.alias + "/" + std::string(name));
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    storeLoop_.post([weak, key, info] {
      if (auto a = weak.lock()) (void)a->store_->set(key, info, a->lease_);
    });
  }
  return Status::ok();
}

Status AgentImpl::unregisterRegion(std::string_view name) {
  std::vector<std::shared_ptr<ep::MemoryPool>> pools;
  bool published = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(std::string(name));
    if (it == regions_.end()) {
      return notFound("unregister_memory_region: no region named '" + std::string(name) + "'");
    }
    published = it->second.options.published;
    regions_.erase(it);
    for (auto& [device, pool] : pools_) pools.push_back(pool);
  }
  for (auto& pool : pools) (void)pool->unregisterMemoryRegion(name);
  if (store_ && published) {
    std::string key = storeKey("regions", self_.alias + "/" + std::string(name));
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    storeLoop_.post([weak, key] {
      if (auto a = weak.lock()) (void)a->store_->erase(key);
    });
  }
  return Status::ok();
}

Status AgentImpl::checkLocalRange(const RegionRef& ref, uint64_t offset, uint64_t length,
                                  bool forWrite) const {
  const auto* name = std::get_if<std::string>(&ref);
  if (name == nullptr) return Status::ok();  // a handle: the endpoint checks it
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(*name);
  if (it == regions_.end()) return notFound("no local memory region named '" + *name + "'");
  if (offset > it->second.length || length > it->second.length - offset) {
    return invalidArgument("[" + std::to_string(offset) + ", +" + std::to_string(length) +
                           ") is outside region '" + *name + "' of " + std::to_string(it->second.length) +
                           " bytes");
  }
  if (forWrite && !it->second.options.writable) return invalidArgument("region '" + *name + "' is read-only");
  return Status::ok();
}

Result<std::string> AgentImpl::getMrInfo(std::string_view alias, std::string_view name) {
  // A region's keys are never in the store (docs/security.md): the peer is asked over the link
  // its wireup authenticated, connecting first when it is not connected yet.
  std::shared_ptr<PeerImpl> peer = findAlias(alias);
  if (!peer || peer->retired()) {
    if (!store_) {
      return Status(StatusCode::kUnavailable,
                    "get_mr_info: '" + std::string(alias) +
                        "' is not connected and this agent has no store to look it up");
    }
    FERRY_ASSIGN_OR_RETURN(peer, peerByAlias(alias, 1, /*create=*/true));
  }
  auto deadline = Clock::now() + opts_.connectTimeout;
  FERRY_RETURN_IF_ERROR(peer->readyOp()->waitUntil(deadline));
  auto answer = std::make_shared<std::promise<std::optional<std::string>>>();
  auto answered = answer->get_future();
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  loop_.post([weak, peer, name = std::string(name), answer] {
    auto a = weak.lock();
    if (!a) return;
    auto remote = peer->remote();
    if (!remote) {
      answer->set_value(std::nullopt);
      return;
    }
    WireupMessage q = wireupHeader(WireupType::kMrQuery, a->self_.uuid, remote->uuid);
    q.name = name;
    q.query = a->nextQuery_++;
    a->infoWaiters_[q.query] = answer;
    a->sendLine(*remote, encodeWireup(q, a->secret_));
  });
  if (answered.wait_until(deadline) != std::future_status::ready) {
    return Status(StatusCode::kTimedOut, "get_mr_info: '" + std::string(alias) +
                                             "' did not answer for region '" + std::string(name) + "'");
  }
  std::optional<std::string> info = answered.get();
  if (!info) {
    return notFound("agent '" + std::string(alias) + "' has no memory region named '" + std::string(name) +
                    "'");
  }
  auto parsed = json::parse(*info);
  if (!parsed.isOk() || !parsed->isObject() || parsed->object()->empty()) {
    return Status(StatusCode::kProtocolError, "get_mr_info: the peer's answer is malformed");
  }
  auto lanes = peer->lanes();
  if (lanes) {
    if (const json::Value* entry = parsed->find(lanes->of(OpClass::kRma).remoteDevice))
      return json::serialize(*entry);
  }
  return json::serialize(parsed->object()->front().second);
}

}  // namespace ferry::agent
