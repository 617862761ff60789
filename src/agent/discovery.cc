// The agent in the discovery store (store.h, docs/discovery-store.md): its registration under a
// lease kept alive on the store thread, renewed when the store forgot it, an alias looked up until
// the peer registers, and list_agents. Store calls run on storeLoop_, never on the wireup thread.
#include <algorithm>

#include "agent/agent_impl.h"
#include "common/log.h"

namespace ferry::agent {

namespace {

constexpr auto kResolveRetry = std::chrono::milliseconds(200);

}  // namespace

std::string AgentImpl::storeKey(std::string_view kind, std::string_view name) const {
  return "/ferry/" + opts_.scope + "/" + std::string(kind) + "/" + std::string(name);
}

Status AgentImpl::joinStore() {
  FERRY_RETURN_IF_ERROR(storeLoop_.start("ferry-agent-st"));
  storeLoopStarted_ = true;
  // Registered before start() returns, so a peer that looks this agent up right after finds it.
  Status registered;
  Status posted = storeLoop_.runSync([&] {
    auto lease = store_->grantLease(opts_.leaseTtl);
    if (!lease.isOk()) {
      registered = lease.status();
      return;
    }
    lease_ = *lease;
    registered = store_->set(storeKey("agents", self_.alias), selfBytes_, lease_);
  });
  if (!posted.isOk()) return posted;
  if (!registered.isOk()) {
    return Status(registered.code(),
                  "agent: registering '" + self_.alias + "' in " + opts_.store + ": " + registered.message());
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  auto every = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(300), opts_.leaseTtl / 3);
  storeLoop_.post([weak, every] {
    if (auto a = weak.lock())
      a->storeLoop_.addTimer(Clock::now() + every, [weak] {
        if (auto b = weak.lock()) b->keepAliveInStore();
      });
  });
  return Status::ok();
}

void AgentImpl::keepAliveInStore() {
  if (shutdown_) return;
  Status st = store_->keepAlive(lease_);
  if (st.code() == StatusCode::kNotFound) {
    // The lease ran out (the store restarted, or was unreachable for a whole TTL): register anew.
    registerInStore();
  } else if (!st.isOk()) {
    FERRY_LOG(kWarn, "agent '%s': store %s: %s", self_.alias.c_str(), opts_.store.c_str(),
              st.toString().c_str());
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  auto every = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(300), opts_.leaseTtl / 3);
  storeLoop_.addTimer(Clock::now() + every, [weak] {
    if (auto a = weak.lock()) a->keepAliveInStore();
  });
}

void AgentImpl::registerInStore() {
  auto lease = store_->grantLease(opts_.leaseTtl);
  if (!lease.isOk()) return;
  lease_ = *lease;
  (void)store_->set(storeKey("agents", self_.alias), selfBytes_, lease_);
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [name, r] : regions_) names.push_back(name);
  }
  for (auto& name : names) {
    std::string info = publishedRegionJson(name);
    if (!info.empty()) (void)store_->set(storeKey("regions", self_.alias + "/" + name), info, lease_);
  }
}

void AgentImpl::startResolve(const std::shared_ptr<PeerImpl>& peer) {
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  std::weak_ptr<PeerImpl> weakPeer = peer;
  storeLoop_.post([weak, weakPeer] {
    auto a = weak.lock();
    auto p = weakPeer.lock();
    if (!a || !p || p->state() != PeerImpl::State::kResolving) return;
    auto value = a->store_->get(a->storeKey("agents", p->alias()));
    std::optional<WorkerAddress> found;
    std::string error;
    if (value.isOk()) {
      auto decoded = WorkerAddress::decode(*value);
      if (decoded.isOk()) {
        found = *decoded;
      } else {
        error = "its entry is not a worker address: " + decoded.status().message();
      }
    } else if (value.status().code() != StatusCode::kNotFound) {
      error = value.status().message();
    }
    if (!found) {
      // Not there yet (it may start later): look again until the deadline.
      a->loop_.post([a, p, error] {
        p->lookupError = error;
        if (p->state() != PeerImpl::State::kResolving) return;
        std::weak_ptr<AgentImpl> w = a;
        std::weak_ptr<PeerImpl> wp = p;
        a->loop_.addTimer(Clock::now() + kResolveRetry, [w, wp] {
          auto a2 = w.lock();
          auto p2 = wp.lock();
          if (a2 && p2) a2->startResolve(p2);
        });
      });
      return;
    }
    a->loop_.post([a, p, address = std::move(*found)] {
      if (p->state() != PeerImpl::State::kResolving) return;
      auto lanes = selectLanes(a->self_, address, a->lanes_);
      if (!lanes.isOk()) {
        a->forget(p);
        p->fail(lanes.status());
        return;
      }
      p->setRemote(address, *lanes);
      {
        std::lock_guard<std::mutex> lock(a->mu_);
        auto it = a->byUuid_.find(address.uuid);
        if (it != a->byUuid_.end() && it->second != p && !it->second->retired()) {
          // The peer reached us first (its REQUEST made a reply endpoint): use that one.
          std::shared_ptr<PeerImpl> live = it->second;
          a->byAlias_[p->alias()] = live;
          p->handOver(live, "superseded by the connection the peer made");
          return;
        }
        a->byUuid_[address.uuid] = p;
      }
      a->startWireup(p);
    });
  });
}

Result<std::vector<std::string>> AgentImpl::listAgents() {
  if (!store_) return Status(StatusCode::kUnavailable, "list_agents: this agent has no store");
  Result<std::vector<StoreEntry>> entries = Status(StatusCode::kInternal, "");
  std::string prefix = storeKey("agents", "");
  Status ran = storeLoop_.runSync([&] { entries = store_->list(prefix); });
  if (!ran.isOk()) return ran;
  if (!entries.isOk()) return entries.status();
  std::vector<std::string> out;
  for (const auto& e : *entries) out.push_back(e.key.substr(prefix.size()));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ferry::agent
