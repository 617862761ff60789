// The agent (agent.h): start-up, the wireup state machine, liveness and the store.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "ferry/common/config.h"
#include "agent/agent_impl.h"
#include "common/net/listen.h"
#include "common/log.h"
#include "ferry/devices.h"
#include "ferry/endpoint/context.h"

namespace ferry::agent {

namespace ep = ferry::endpoint;

namespace {

constexpr auto kResolveRetry = std::chrono::milliseconds(200);
constexpr int64_t kMaxClockSkewSeconds = 120;

int64_t wallSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string shortId(const Uuid& u) { return uuidText(u).substr(0, 8); }

std::string laneText(const LaneSet& lanes) {
  std::string s;
  for (int i = 0; i < kNumOpClasses; ++i) {
    s += std::string(i ? "," : "") + opClassName(static_cast<OpClass>(i)) + "=" + laneKindName(lanes.lanes[i].kind);
  }
  return s;
}

// The interface prefix length of an IPv4 address of this host (32 when not found).
uint8_t prefixLengthOf(const std::string& ip) {
  uint8_t result = 32;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return result;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET || it->ifa_netmask == nullptr) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text, sizeof text);
    if (ip != text) continue;
    uint32_t mask = ntohl(reinterpret_cast<sockaddr_in*>(it->ifa_netmask)->sin_addr.s_addr);
    result = static_cast<uint8_t>(__builtin_popcount(mask));
    break;
  }
  freeifaddrs(list);
  return result;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Start and shutdown

Result<std::shared_ptr<AgentImpl>> AgentImpl::start(AgentOptions options) {
  if (options.alias.size() > kMaxAliasBytes) return invalidArgument("agent: the alias is longer than 256 bytes");
  for (char c : options.alias) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '/' || c == 0x7f) {
      return invalidArgument("agent: the alias '" + options.alias + "' has a '/' or a control character");
    }
  }
  if (options.scope.empty() || options.scope.find('/') != std::string::npos) {
    return invalidArgument("agent: the scope '" + options.scope + "' is empty or has a '/'");
  }
  if (options.connectTimeout.count() <= 0 || options.peerTimeout.count() <= 0 || options.heartbeat.count() < 0 ||
      options.retryInterval.count() <= 0) {
    return invalidArgument("agent: connect_timeout, peer_timeout and the retry interval must be positive, heartbeat "
                           "positive or 0 (off)");
  }
  if (options.leaseTtl.count() < 1) return invalidArgument("agent: the lease TTL must be at least 1 s");
  std::shared_ptr<AgentImpl> impl(new AgentImpl(std::move(options)));
  Status st = impl->init();
  if (!st.isOk()) {
    impl->shutdown();
    return st;
  }
  return impl;
}

Status AgentImpl::init() {
  FERRY_RETURN_IF_ERROR(config::check());
  secret_ = opts_.secret;
  if (secret_.empty()) {
    secret_ = config::agentSecret();
  }
  lanes_ = opts_.lanes;
  if (lanes_.empty()) {
    if (const std::string s = config::agentLanes(); !s.empty()) {
      auto parsed = parseLaneOverrides(s);
      if (!parsed.isOk()) return invalidArgument("FERRY_AGENT_LANES: " + parsed.status().message());
      lanes_ = *parsed;
    }
  }
  // Each connection holds a few descriptors (its wireup link, its queue pairs' sockets or rings):
  // an agent with thousands of peers needs more than the usual soft limit of 1024.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max && files.rlim_cur < 65536) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 65536);
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }
  self_.uuid = newUuid();
  self_.startNs = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  self_.alias = opts_.alias.empty() ? "agent-" + shortId(self_.uuid) : opts_.alias;
  self_.hostId = localHostId();
  if (!opts_.store.empty()) {
    FERRY_ASSIGN_OR_RETURN(store_, Store::open(opts_.store));
  }
  FERRY_RETURN_IF_ERROR(openDevices());
  FERRY_ASSIGN_OR_RETURN(worker_, ep::Worker::create({.id = 0}));
  FERRY_RETURN_IF_ERROR(loop_.start("ferry-agent"));
  loopStarted_ = true;
  FERRY_RETURN_IF_ERROR(listen());
  selfBytes_ = self_.encode();
  if (store_) {
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
      return Status(registered.code(), "agent: registering '" + self_.alias + "' in " + opts_.store + ": " +
                                           registered.message());
    }
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    auto every = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(300), opts_.leaseTtl / 3);
    storeLoop_.post([weak, every] {
      if (auto a = weak.lock()) a->storeLoop_.addTimer(Clock::now() + every, [weak] {
          if (auto b = weak.lock()) b->keepAliveInStore();
        });
    });
  }
  if (opts_.heartbeat.count() > 0) {
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    loop_.post([weak] {
      if (auto a = weak.lock()) a->sweep();
    });
  }
  FERRY_LOG(kInfo, "agent %s started", self_.describe().c_str());
  return Status::ok();
}

Status AgentImpl::openDevices() {
  FERRY_ASSIGN_OR_RETURN(std::vector<verbs::DeviceInfo> devices, listDevices());
  for (const auto& info : devices) {
    if (!opts_.devices.empty() &&
        std::find(opts_.devices.begin(), opts_.devices.end(), info.name) == opts_.devices.end()) {
      continue;
    }
    auto context = ep::RdmaContext::open({.deviceName = info.name, .ibPort = 1, .linkType = ""});
    if (!context.isOk()) {
      FERRY_LOG(kWarn, "agent: device %s left out: %s", info.name.c_str(), context.status().toString().c_str());
      continue;
    }
    DeviceAddress d;
    d.name = info.name;
    if (info.provider == "soft") {
      d.kind = DeviceAddress::Kind::kSoft;
      d.ip = info.address;
      d.prefixLength = prefixLengthOf(info.address);
    } else {
      d.kind = DeviceAddress::Kind::kRdma;
      const verbs::PortAttr& port = (*context)->portAttr();
      d.port = 1;
      d.lid = port.lid;
      d.linkLayer = port.linkLayer == verbs::LinkLayer::kInfiniband ? 1 : 2;
      auto gid = (*context)->verbs().queryGid(1, 0);
      if (gid.isOk()) std::copy(gid->raw.begin(), gid->raw.end(), d.gid.begin());
    }
    auto pool = ep::MemoryPool::create(*context);
    if (!pool.isOk()) {
      FERRY_LOG(kWarn, "agent: device %s left out: %s", info.name.c_str(), pool.status().toString().c_str());
      continue;
    }
    pools_[info.name] = *pool;
    self_.devices.push_back(std::move(d));
  }
  if (self_.devices.empty()) {
    return notFound(opts_.devices.empty() ? "agent: no usable device (ferry info lists them)"
                                          : "agent: none of the devices asked for is usable (ferry info lists them)");
  }
  return Status::ok();
}

namespace {

// Every address of this host a peer may use to reach `port`: IPv4 ones first, loopback first of
// each family; IPv6 ones when the listener is IPv6 (link-local ones need an interface: left out).
std::vector<ControlEndpoint> hostAddresses(uint16_t port, bool v6) {
  std::vector<ControlEndpoint> v4s, v6s;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
      char text[INET6_ADDRSTRLEN] = {};
      if (it->ifa_addr->sa_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, text, sizeof text);
        ControlEndpoint c{.ipv6 = false, .ip = text, .port = port};
        if (std::string(text).rfind("127.", 0) == 0) v4s.insert(v4s.begin(), c); else v4s.push_back(c);
      } else if (it->ifa_addr->sa_family == AF_INET6 && v6) {
        const in6_addr& a6 = reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr;
        if (IN6_IS_ADDR_LINKLOCAL(&a6)) continue;
        inet_ntop(AF_INET6, &a6, text, sizeof text);
        ControlEndpoint c{.ipv6 = true, .ip = text, .port = port};
        if (IN6_IS_ADDR_LOOPBACK(&a6)) v6s.insert(v6s.begin(), c); else v6s.push_back(c);
      }
    }
    freeifaddrs(list);
  }
  v4s.insert(v4s.end(), v6s.begin(), v6s.end());
  if (v4s.empty()) v4s.push_back({.ipv6 = false, .ip = "127.0.0.1", .port = port});
  return v4s;
}

}  // namespace

Status AgentImpl::listen() {
  FERRY_RETURN_IF_ERROR(openAdmission());
  // Protected mode (no secret) serves this host only, so it listens where only this host reaches.
  std::string host = opts_.listenHost.empty() && protectedMode() ? std::string("127.0.0.1") : opts_.listenHost;
  in6_addr host6{};
  in_addr host4{};
  bool hostIs4 = !host.empty() && inet_pton(AF_INET, host.c_str(), &host4) == 1;
  bool hostIs6 = !host.empty() && inet_pton(AF_INET6, host.c_str(), &host6) == 1;
  if (!host.empty() && !hostIs4 && !hostIs6) return invalidArgument("agent: listen host '" + host + "' is not an IP address");
  // No host: every address, IPv6 and IPv4 on one socket where the host has IPv6, else IPv4 alone.
  const net::ListenOptions options{.backlog = SOMAXCONN, .nonBlocking = true, .dualStack = host.empty()};
  auto listener = net::listenTcp(host.empty() ? "::" : host, opts_.listenPort, options);
  if (!listener.isOk() && host.empty()) listener = net::listenTcp("0.0.0.0", opts_.listenPort, options);
  if (!listener.isOk()) return Status(listener.status().code(), "agent: " + listener.status().message(), listener.status().cause());
  const bool v6 = listener->ipv6;
  const uint16_t port = listener->port;
  listenFd_ = listener->fd;
  // The addresses a peer may use: the one asked for, else every address of this host (loopback
  // first; IPv6 link-local ones need an interface and are left out).
  if (!host.empty()) {
    self_.control.push_back({.ipv6 = hostIs6, .ip = host, .port = port});
    if (opts_.listenHost.empty()) listenLoopback6(port);  // protected mode: ::1 too, where it exists
  } else {
    self_.control = hostAddresses(port, v6);
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  Status added;
  Status ran = loop_.runSync([&] {
    for (int lfd : {listenFd_, listenFd6_}) {
      if (lfd < 0 || !added.isOk()) continue;
      added = loop_.addFd(lfd, EPOLLIN, [weak, lfd](uint32_t) {
        if (auto a = weak.lock()) a->onAccept(lfd);
      });
    }
  });
  return ran.isOk() ? added : ran;
}

void AgentImpl::listenLoopback6(uint16_t port) {
  auto listener = net::listenTcp("::1", port, {.backlog = SOMAXCONN, .nonBlocking = true});
  if (!listener.isOk()) return;  // no IPv6 loopback here, or its port is taken: IPv4 loopback alone
  listenFd6_ = listener->fd;
  self_.control.push_back({.ipv6 = true, .ip = "::1", .port = port});
}

AgentImpl::~AgentImpl() { shutdown(); }

void AgentImpl::shutdown() {
  if (shutdown_.exchange(true)) return;
  // Goodbye to every peer we talk to, then stop the wireup thread.
  std::vector<std::shared_ptr<PeerImpl>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [uuid, p] : byUuid_) peers.push_back(p);
    for (auto& [alias, p] : byAlias_) peers.push_back(p);
    byUuid_.clear();
    byAlias_.clear();
  }
  if (loopStarted_) (void)loop_.runSync([&] {
    for (auto& p : peers) {
      auto remote = p->remote();
      if (remote && p->state() != PeerImpl::State::kResolving) {
        WireupMessage bye = wireupHeader(WireupType::kBye, self_.uuid, remote->uuid);
        bye.reason = "the agent shut down";
        sendLine(*remote, encodeWireup(bye, secret_));
      }
    }
    // Give the goodbyes a moment to leave (the sockets are ours: nothing else waits for them).
    for (auto& [uuid, link] : links_) link->close();
    links_.clear();
    for (auto& link : inbound_) link->close();
    inbound_.clear();
    if (listenFd_ >= 0) loop_.removeFd(listenFd_);
    if (listenFd6_ >= 0) loop_.removeFd(listenFd6_);
  });
  loop_.stop();
  if (listenFd_ >= 0) ::close(listenFd_);
  if (listenFd6_ >= 0) ::close(listenFd6_);
  listenFd_ = listenFd6_ = -1;
  const Status cancelled(StatusCode::kCancelled, "the agent was shut down");
  for (auto& p : peers) p->fail(cancelled);
  if (storeLoopStarted_) {
    (void)storeLoop_.runSync([&] {
      if (lease_ != 0) (void)store_->revokeLease(lease_);
    });
    storeLoop_.stop();
  }
  if (worker_) worker_->stop();
  std::lock_guard<std::mutex> lock(mu_);
  pools_.clear();
}

std::string AgentImpl::storeKey(std::string_view kind, std::string_view name) const {
  return "/ferry/" + opts_.scope + "/" + std::string(kind) + "/" + std::string(name);
}

void AgentImpl::keepAliveInStore() {
  if (shutdown_) return;
  Status st = store_->keepAlive(lease_);
  if (st.code() == StatusCode::kNotFound) {
    // The lease ran out (the store restarted, or was unreachable for a whole TTL): register anew.
    registerInStore();
  } else if (!st.isOk()) {
    FERRY_LOG(kWarn, "agent '%s': store %s: %s", self_.alias.c_str(), opts_.store.c_str(), st.toString().c_str());
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

// ---------------------------------------------------------------------------------------------
// Peers: lookup and creation (any thread)

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
  for (auto it = byUuid_.begin(); it != byUuid_.end();) it = it->second == peer ? byUuid_.erase(it) : std::next(it);
  for (auto it = byAlias_.begin(); it != byAlias_.end();) it = it->second == peer ? byAlias_.erase(it) : std::next(it);
}

Result<std::shared_ptr<PeerImpl>> AgentImpl::peerByAlias(std::string_view alias, size_t numQp, bool create) {
  if (shutdown_) return closedError("agent: shut down");
  if (alias.empty() || alias.size() > kMaxAliasBytes) return invalidArgument("connect: the alias is empty or too long");
  if (alias == self_.alias) return invalidArgument("connect: '" + std::string(alias) + "' is this agent itself");
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
      return invalidArgument("connect: '" + std::string(alias) +
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

// ---------------------------------------------------------------------------------------------
// Wireup (loop thread)

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
    p->fail(Status(StatusCode::kTimedOut, "wireup with '" + p->alias() + "' did not finish within " + secsText +
                                              " s: " + what));
  });
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
    // The agent finds dead peers itself (link.h); its queue pairs keep the endpoints' transport
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
    auto parsed = json::parse(e->endpointInfo());
    if (parsed.isOk()) infos.set(device, std::move(*parsed));
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
      return Status(StatusCode::kProtocolError,
                    "the peer sent no endpoint for its device " + (lane ? lane->remoteDevice : std::string("?")));
    }
    FERRY_RETURN_IF_ERROR(e->connect(json::serialize(*info)));
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
      if (loop && sameHost) targets.insert(targets.begin(), c);
      else if (!loop) targets.push_back(c);
    }
    std::weak_ptr<AgentImpl> weak = weak_from_this();
    link = Link::connect(
        loop_, std::move(targets), kMaxWireupLine,
        [weak](Link& l, std::string_view text) {
          if (auto a = weak.lock()) a->onLine(l, text);
        },
        [weak](Link& l, const Status& why, bool connected) {
          if (auto a = weak.lock()) a->onLinkClosed(l, why, connected);
        });
    link->owner = to.uuid;
    link->hasOwner = true;
    link->setDeadPeerTimeout(opts_.peerTimeout);
    link->lastValid = Clock::now();
  }
  link->send(line);
}

void AgentImpl::onLinkClosed(Link& link, const Status& why, bool connected) {
  std::shared_ptr<Link> keep;
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

void AgentImpl::onLine(Link& link, std::string_view line) {
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
  if (m.to != self_.uuid) {
    // Addressed to an earlier life of this agent (or to another agent on a reused port).
    if (m.type == WireupType::kRequest) {
      auto from = WorkerAddress::decode(m.fromAddress);
      if (from.isOk()) {
        WireupMessage r = wireupHeader(WireupType::kReject, self_.uuid, m.from, m.conn);
        r.reason = "stale: agent '" + self_.alias + "' restarted (it is " + uuidText(self_.uuid) + " now)";
        sendLine(*from, encodeWireup(r, secret_));
      }
    }
    return;
  }
  if (auto peer = findUuid(m.from)) {
    if (!acceptOnLink(link, peer, m, line)) return;
    peer->lastHeard = Clock::now();
  }
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
    case WireupType::kPing: {
      auto peer = findUuid(m.from);
      if (!peer) return;
      auto remote = peer->remote();
      if (remote) {
        WireupMessage pong = wireupHeader(WireupType::kPong, self_.uuid, m.from);
        pong.echo = m.nonce;
        sendLine(*remote, encodeWireup(pong, secret_));
      }
      break;
    }
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

void AgentImpl::onRequest(Link& link, const WireupMessage& m, const WorkerAddress& from) {
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
    logRefused(Status(StatusCode::kPermissionDenied, "refused a REQUEST from '" + from.alias + "': its clock is " +
                                                         std::to_string(m.time - now) + " s off"));
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto cutoff = Clock::now() - std::chrono::seconds(2 * kMaxClockSkewSeconds);
  for (auto it = seenNonces_.begin(); it != seenNonces_.end();) it = it->second < cutoff ? seenNonces_.erase(it) : std::next(it);
  auto [it, fresh] = seenNonces_.emplace(m.nonce, Clock::now());
  if (fresh) return true;
  // A resend of a REQUEST we answered is answered again by the duplicate rule; any other copy is a
  // replay.
  auto p = byUuid_.find(m.from);
  return p != byUuid_.end() && p->second->remoteConn == m.conn;
}

std::shared_ptr<PeerImpl> AgentImpl::peerForRequest(Link& link, const WireupMessage& m, const WorkerAddress& from,
                                                    uint64_t* abandoned) {
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
  if (!peer) {
    std::shared_ptr<PeerImpl> byAlias = findAlias(from.alias);
    if (byAlias && !byAlias->retired()) {
      auto known = byAlias->remote();
      if (!known) {
        peer = byAlias;  // we were still looking it up: this REQUEST tells us where it is
      } else if (known->uuid != from.uuid) {
        if (from.startNs < known->startNs) return nullptr;  // from an older life than the one we know
        if (!earlierLifeGone(byAlias, from)) return nullptr;  // resent until answered: counts once it is
        peerGone(byAlias, "it restarted");
      }
    }
    if (!peer && !admitHandshake(link, from)) return nullptr;
    if (!peer) {
      peer = std::make_shared<PeerImpl>(weak_from_this(), from.alias, m.numQp);
      peer->origin = link.shared_from_this();
      armDeadline(peer, handshakeTimeout(opts_.connectTimeout));
    }
    std::lock_guard<std::mutex> lock(mu_);
    byUuid_[from.uuid] = peer;
    byAlias_[from.alias] = peer;
  }
  return peer;
}

void AgentImpl::answerRequest(std::shared_ptr<PeerImpl> peer, const WireupMessage& m, const WorkerAddress& from,
                              uint64_t abandoned) {
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

void AgentImpl::onReply(Link& link, const WireupMessage& m) {
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

void AgentImpl::onAck(Link& link, const WireupMessage& m) {
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
  if (!regions_.count(std::string(name))) return notFound("no local memory region named '" + std::string(name) + "'");
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
      if (remote) sendLine(*remote, encodeWireup(wireupHeader(WireupType::kPing, self_.uuid, remote->uuid), secret_));
    }
  }
  std::weak_ptr<AgentImpl> weak = weak_from_this();
  auto every = std::min<std::chrono::milliseconds>(opts_.heartbeat, opts_.peerTimeout / 4);
  sweepTimer_ = loop_.addTimer(now + std::max<std::chrono::milliseconds>(every, std::chrono::milliseconds(20)), [weak] {
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

// ---------------------------------------------------------------------------------------------
// Memory and the store (caller's thread)

Status AgentImpl::registerRegion(std::string_view name, void* addr, uint64_t length, ep::RegionOptions options) {
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
      return Status(h.status().code(), "register_memory_region '" + std::string(name) + "' on " + device + ": " +
                                           h.status().message(), h.status().cause());
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

Status AgentImpl::checkLocalRange(const RegionRef& ref, uint64_t offset, uint64_t length, bool forWrite) const {
  const auto* name = std::get_if<std::string>(&ref);
  if (name == nullptr) return Status::ok();  // a handle: the endpoint checks it
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(*name);
  if (it == regions_.end()) return notFound("no local memory region named '" + *name + "'");
  if (offset > it->second.length || length > it->second.length - offset) {
    return invalidArgument("[" + std::to_string(offset) + ", +" + std::to_string(length) + ") is outside region '" +
                           *name + "' of " + std::to_string(it->second.length) + " bytes");
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
      return Status(StatusCode::kUnavailable, "get_mr_info: '" + std::string(alias) +
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
    return Status(StatusCode::kTimedOut, "get_mr_info: '" + std::string(alias) + "' did not answer for region '" +
                                             std::string(name) + "'");
  }
  std::optional<std::string> info = answered.get();
  if (!info) {
    return notFound("agent '" + std::string(alias) + "' has no memory region named '" + std::string(name) + "'");
  }
  auto parsed = json::parse(*info);
  if (!parsed.isOk() || !parsed->isObject() || parsed->object()->empty()) {
    return Status(StatusCode::kProtocolError, "get_mr_info: the peer's answer is malformed");
  }
  auto lanes = peer->lanes();
  if (lanes) {
    if (const json::Value* entry = parsed->find(lanes->of(OpClass::kRma).remoteDevice)) return json::serialize(*entry);
  }
  return json::serialize(parsed->object()->front().second);
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

AgentStats AgentImpl::stats() const {
  std::lock_guard<std::mutex> lock(statsMu_);
  return stats_;
}

// ---------------------------------------------------------------------------------------------
// Agent (the public façade)

Result<std::shared_ptr<Agent>> Agent::start(AgentOptions options) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<AgentImpl> impl, AgentImpl::start(std::move(options)));
  return std::make_shared<Agent>(std::move(impl));
}

Agent::~Agent() { shutdown(); }
void Agent::shutdown() { impl_->shutdown(); }
std::string Agent::address() const { return impl_->selfBytes(); }
const WorkerAddress& Agent::workerAddress() const { return impl_->self(); }
const std::string& Agent::alias() const { return impl_->self().alias; }

Result<std::shared_ptr<PeerConnection>> Agent::connect(std::string_view alias, size_t numQp) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<PeerImpl> p, impl_->peerByAlias(alias, numQp, true));
  return std::make_shared<PeerConnection>(std::move(p));
}

Result<std::shared_ptr<PeerConnection>> Agent::connectAddress(std::string_view address, size_t numQp) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<PeerImpl> p, impl_->peerByAddress(address, numQp));
  return std::make_shared<PeerConnection>(std::move(p));
}

void Agent::disconnect(const std::shared_ptr<PeerConnection>& connection, std::string_view reason) {
  if (!connection) return;
  if (auto p = connection->currentImpl()) impl_->disconnect(p, std::string(reason));
}

Result<std::shared_ptr<PeerConnection>> Agent::peer(std::string_view alias) {
  if (auto p = impl_->findAlias(alias); p && !p->retired() && p->retireIfEndpointFailed().isOk()) {
    return std::make_shared<PeerConnection>(p);
  }
  return connect(alias, 1);
}

Status Agent::registerMemoryRegion(std::string_view name, void* addr, uint64_t length, ep::RegionOptions options) {
  return impl_->registerRegion(name, addr, length, std::move(options));
}

Status Agent::unregisterMemoryRegion(std::string_view name) { return impl_->unregisterRegion(name); }

Result<std::map<std::string, ep::RegionView>> Agent::regionKeys(std::string_view name) const {
  return impl_->regionKeys(name);
}

Result<std::string> Agent::getMrInfo(std::string_view peerAlias, std::string_view name) {
  return impl_->getMrInfo(peerAlias, name);
}

Result<std::vector<std::string>> Agent::listAgents() { return impl_->listAgents(); }

Result<LaneSet> Agent::lanes(std::string_view peerAlias) {
  auto p = impl_->findAlias(peerAlias);
  if (!p) return notFound("no connection to '" + std::string(peerAlias) + "'");
  auto l = p->lanes();
  if (!l) return Status(StatusCode::kUnavailable, "the address of '" + std::string(peerAlias) + "' is not known yet");
  return *l;
}

std::vector<std::string> Agent::peers() const { return impl_->peerAliases(); }
AgentStats Agent::stats() const { return impl_->stats(); }
void Agent::post(std::function<void()> fn) { impl_->loop().post(std::move(fn)); }
bool Agent::onAgentThread() const { return impl_->loop().inLoop(); }
void Agent::onMessage(std::string channel, MessageHandler handler) {
  impl_->setMessageHandler(std::move(channel), std::move(handler));
}

}  // namespace ferry::agent
