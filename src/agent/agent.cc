// The agent's start and shutdown, and the public façade (agent.h): opening the devices, the wireup
// listener and the threads; saying goodbye to every peer and stopping them. The other jobs of
// AgentImpl have files of their own (agent_impl.h lists them).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "agent/agent_impl.h"
#include "common/log.h"
#include "common/net/listen.h"
#include "ferry/common/config.h"
#include "ferry/devices.h"
#include "ferry/endpoint/context.h"

namespace ferry::agent {

namespace ep = ferry::endpoint;

std::string shortId(const Uuid& u) { return uuidText(u).substr(0, 8); }

namespace {

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
  if (options.alias.size() > kMaxAliasBytes)
    return invalidArgument("agent: the alias is longer than 256 bytes");
  for (char c : options.alias) {
    if (static_cast<unsigned char>(c) < 0x20 || c == '/' || c == 0x7f) {
      return invalidArgument("agent: the alias '" + options.alias + "' has a '/' or a control character");
    }
  }
  if (options.scope.empty() || options.scope.find('/') != std::string::npos) {
    return invalidArgument("agent: the scope '" + options.scope + "' is empty or has a '/'");
  }
  if (options.connectTimeout.count() <= 0 || options.peerTimeout.count() <= 0 ||
      options.heartbeat.count() < 0 || options.retryInterval.count() <= 0) {
    return invalidArgument(
        "agent: connect_timeout, peer_timeout and the retry interval must be positive, heartbeat "
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
  self_.startNs = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count());
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
    FERRY_RETURN_IF_ERROR(joinStore());
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
      FERRY_LOG(kWarn, "agent: device %s left out: %s", info.name.c_str(),
                context.status().toString().c_str());
      continue;
    }
    DeviceAddress d;
    d.name = info.name;
    if (info.addressedByContext) {  // the device's IP address, and a port the context listens on
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
    return notFound(opts_.devices.empty()
                        ? "agent: no usable device (ferry info lists them)"
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
        if (std::string(text).rfind("127.", 0) == 0)
          v4s.insert(v4s.begin(), c);
        else
          v4s.push_back(c);
      } else if (it->ifa_addr->sa_family == AF_INET6 && v6) {
        const in6_addr& a6 = reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr;
        if (IN6_IS_ADDR_LINKLOCAL(&a6)) continue;
        inet_ntop(AF_INET6, &a6, text, sizeof text);
        ControlEndpoint c{.ipv6 = true, .ip = text, .port = port};
        if (IN6_IS_ADDR_LOOPBACK(&a6))
          v6s.insert(v6s.begin(), c);
        else
          v6s.push_back(c);
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
  std::string host =
      opts_.listenHost.empty() && protectedMode() ? std::string("127.0.0.1") : opts_.listenHost;
  in6_addr host6{};
  in_addr host4{};
  bool hostIs4 = !host.empty() && inet_pton(AF_INET, host.c_str(), &host4) == 1;
  bool hostIs6 = !host.empty() && inet_pton(AF_INET6, host.c_str(), &host6) == 1;
  if (!host.empty() && !hostIs4 && !hostIs6)
    return invalidArgument("agent: listen host '" + host + "' is not an IP address");
  // No host: every address, IPv6 and IPv4 on one socket where the host has IPv6, else IPv4 alone.
  const net::ListenOptions options{.backlog = SOMAXCONN, .nonBlocking = true, .dualStack = host.empty()};
  auto listener = net::listenTcp(host.empty() ? "::" : host, opts_.listenPort, options);
  if (!listener.isOk() && host.empty()) listener = net::listenTcp("0.0.0.0", opts_.listenPort, options);
  if (!listener.isOk())
    return Status(listener.status().code(), "agent: " + listener.status().message(),
                  listener.status().cause());
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
  if (loopStarted_)
    (void)loop_.runSync([&] {
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

Status Agent::registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                   ep::RegionOptions options) {
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
  if (!l)
    return Status(StatusCode::kUnavailable,
                  "the address of '" + std::string(peerAlias) + "' is not known yet");
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
