#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <shared_mutex>

#include "common/clock.h"
#include "common/log.h"
#include "ferry/common/config.h"
#include "providers/soft/conn.h"
#include "providers/soft/hello_gate.h"
#include "providers/soft/mcast.h"
#include "providers/soft/qp.h"
#include "providers/soft/ring.h"
#include "providers/soft/soft.h"
#include "providers/soft/ud_qp.h"

namespace ferry::soft {
namespace {

using verbs::AsyncEventType;

uint32_t randomU32() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) {
    v = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count() * 2654435761u);
  }
  return v;
}

int numaNodeOf(const std::string& ifname) {
  std::ifstream f("/sys/class/net/" + ifname + "/device/numa_node");
  int node = -1;
  if (f >> node) return node < 0 ? -1 : node;
  return -1;
}

}  // namespace

uint64_t randomTicket() {
  uint64_t ticket = 0;
  if (getrandom(&ticket, sizeof ticket, 0) != sizeof ticket) return 0;
  return ticket;
}

// ---------------------------------------------------------------------------------------------
// Devices and GIDs.

verbs::Gid makeSoftGid(in_addr_t ipv4, uint16_t port) {
  verbs::Gid gid;
  gid.raw[8] = static_cast<uint8_t>(port >> 8);
  gid.raw[9] = static_cast<uint8_t>(port);
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  std::memcpy(gid.raw.data() + 12, &ipv4, 4);
  return gid;
}

bool parseSoftGid(const verbs::Gid& gid, in_addr_t* ipv4, uint16_t* port) {
  for (int i = 0; i < 8; ++i) {
    if (gid.raw[i] != 0) return false;
  }
  if (gid.raw[10] != 0xff || gid.raw[11] != 0xff) return false;
  *port = static_cast<uint16_t>((gid.raw[8] << 8) | gid.raw[9]);
  std::memcpy(ipv4, gid.raw.data() + 12, 4);
  return *port != 0 && *ipv4 != 0;
}

std::vector<SoftDeviceInfo> listSoftDevices() {
  std::vector<SoftDeviceInfo> devices;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return devices;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    std::string name = std::string("soft_") + it->ifa_name;
    bool seen = std::any_of(devices.begin(), devices.end(),
                            [&](const SoftDeviceInfo& d) { return d.info.name == name; });
    if (seen) continue;  // one device per interface (its first address)
    SoftDeviceInfo d;
    d.ipv4 = reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &d.ipv4, text, sizeof text);
    d.info.name = name;
    d.info.provider = "soft";
    d.info.transport = "tcp";
    d.info.netdev = it->ifa_name;
    d.info.address = text;
    d.info.guid = (static_cast<uint64_t>(0xfe44) << 48) | ntohl(d.ipv4);
    d.info.numaNode = numaNodeOf(it->ifa_name);
    d.info.addressedByContext = true;
    d.info.deviceMemory = "staged";  // CUDA memory through host buffers (region_copy.h)
    d.info.ports = 1;
    devices.push_back(std::move(d));
  }
  freeifaddrs(list);
  // Loopback first: the device every host has.
  std::stable_sort(devices.begin(), devices.end(), [](const SoftDeviceInfo& a, const SoftDeviceInfo& b) {
    return (a.info.netdev == "lo") > (b.info.netdev == "lo");
  });
  return devices;
}

bool probeSoft(std::string* reason) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (reason) *reason = std::string("cannot create a TCP socket: ") + std::strerror(errno);
    return false;
  }
  ::close(fd);
  return true;
}

Result<std::shared_ptr<verbs::ContextImpl>> openSoftDevice(const std::string& name) {
  for (auto& d : listSoftDevices()) {
    if (d.info.name != name) continue;
    auto ctx = std::make_shared<SoftContext>(d);
    FERRY_RETURN_IF_ERROR(ctx->start());
    return std::shared_ptr<verbs::ContextImpl>(std::move(ctx));
  }
  return notFound("no software device named " + name);
}

// ---------------------------------------------------------------------------------------------
// Context: the listener, the progress loop, the QP table.

SoftContext::SoftContext(SoftDeviceInfo device) : device_(std::move(device)) {
  nextQpn_ = (randomU32() & 0x7fffff) | 0x10;
}

SoftContext::~SoftContext() {
  close();
  if (listenFd_ >= 0) ::close(listenFd_);
  if (udpFd_ >= 0) ::close(udpFd_);
}

Status SoftContext::start() {
  if (!asyncEvents_.valid()) return ioError("eventfd for async events");
  FERRY_ASSIGN_OR_RETURN(const uint16_t port, bindSockets());
  gid_ = makeSoftGid(device_.ipv4, port);
  if (sameHostRingsAllowed()) openRingListener();
  if (sameHostAllowed()) {
    auto table = ShareTable::create();
    if (table.isOk()) {
      share_ = std::move(*table);
    } else {
      FERRY_LOG(kWarn, "%s: no same-host path: %s", device_.info.name.c_str(),
                table.status().toString().c_str());
    }
  }
  FERRY_RETURN_IF_ERROR(startReactor());
  FERRY_LOG(kInfo, "%s: context listening on %s:%u", device_.info.name.c_str(), device_.info.address.c_str(),
            static_cast<unsigned>(port));
  return Status::ok();
}

Result<uint16_t> SoftContext::bindSockets() {
  // A TCP listener and a UDP socket on one address and port: the GID names both.
  sockaddr_in addr{};
  for (int attempt = 0;; ++attempt) {
    listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listenFd_ < 0) return ioError("socket");
    addr = sockaddr_in{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = device_.ipv4;
    if (::bind(listenFd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      return ioError("bind to " + device_.info.address);
    }
    // The kernel's largest queue: a process with hundreds of endpoints accepts their connections in
    // a burst, and a full queue drops SYNs whose resend (after 1 s, then 3 s) can outlast a queue
    // pair's transport timeout.
    if (::listen(listenFd_, SOMAXCONN) != 0) return ioError("listen");
    socklen_t len = sizeof addr;
    getsockname(listenFd_, reinterpret_cast<sockaddr*>(&addr), &len);
    udpFd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (udpFd_ < 0) return ioError("socket(UDP)");
    if (::bind(udpFd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) break;
    int err = errno;
    ::close(udpFd_);
    ::close(listenFd_);
    udpFd_ = listenFd_ = -1;
    if (err != EADDRINUSE || attempt == 64) return ioError("bind UDP to " + device_.info.address, err);
  }
  return static_cast<uint16_t>(ntohs(addr.sin_port));
}

void SoftContext::openRingListener() {
  // The ring listener: an abstract AF_UNIX name no other process can guess, given only to peers
  // whose TCP hello this context answers.
  ringNonce_ = (uint64_t{randomU32()} << 32) | randomU32();
  sockaddr_un un;
  socklen_t unLen = ringListenerAddress(static_cast<uint32_t>(getpid()), ringNonce_, &un);
  ringListenFd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (ringListenFd_ < 0 || ::bind(ringListenFd_, reinterpret_cast<sockaddr*>(&un), unLen) != 0 ||
      ::listen(ringListenFd_, SOMAXCONN) != 0) {
    FERRY_LOG(kWarn, "%s: no shared-memory rings (same-host traffic uses TCP): %s", device_.info.name.c_str(),
              std::strerror(errno));
    if (ringListenFd_ >= 0) ::close(ringListenFd_);
    ringListenFd_ = -1;
  }
}

Status SoftContext::startReactor() {
  FERRY_RETURN_IF_ERROR(reactor_.start("ferry-" + device_.info.name));
  gate_ = std::make_unique<HelloGate>();
  gate_->hello = [this](const std::shared_ptr<Conn>& conn, const wire::FrameHeader& h) {
    onHelloFromLoop(conn, h);
  };
  gate_->forget = [this](Conn* conn) { pendingConns_.erase(conn); };
  Status added;
  FERRY_RETURN_IF_ERROR(reactor_.runSync([&] {
    // A connection can wait a few of the callers' runs to be accepted; datagrams can too until a
    // UD QP reads them (updateUdpFdUseFromLoop).
    using Use = Reactor::FdUse;
    added = reactor_.addFd(
        listenFd_, EPOLLIN, [this](uint32_t) { onAcceptFromLoop(); }, Use::kControl);
    if (added.isOk()) {
      added = reactor_.addFd(
          udpFd_, EPOLLIN, [this](uint32_t) { onDatagramsFromLoop(); }, Use::kControl);
    }
    if (added.isOk() && ringListenFd_ >= 0) {
      added = reactor_.addFd(
          ringListenFd_, EPOLLIN, [this](uint32_t) { onRingAcceptFromLoop(); }, Use::kControl);
    }
    if (attendNs_ > 0) reactor_.addPoller([this](bool vouches) { return attendFromLoop(vouches); });
  }));
  return added;
}

void SoftContext::close() {
  if (closed_.exchange(true)) return;
  children_.closeAll();
  (void)reactor_.runSync([this] {
    for (auto& [ptr, conn] : pendingConns_) conn->close(Status::ok(), true);
    pendingConns_.clear();
    if (listenFd_ >= 0) {
      reactor_.removeFd(listenFd_);
      ::close(listenFd_);
      listenFd_ = -1;
    }
    if (udpFd_ >= 0) {
      reactor_.removeFd(udpFd_);
      ::close(udpFd_);
      udpFd_ = -1;
    }
    if (ringListenFd_ >= 0) {
      reactor_.removeFd(ringListenFd_);
      ::close(ringListenFd_);
      ringListenFd_ = -1;
    }
    for (auto& [fd, timer] : pendingRingSockets_) {
      reactor_.removeFd(fd);
      reactor_.cancelTimer(timer);
      ::close(fd);
    }
    pendingRingSockets_.clear();
  });
  reactor_.stop();
  stripeReactor_.stop();  // after the stripes' closes the QPs posted to it
}

Reactor* SoftContext::stripeReactorFromLoop() {
  FERRY_ON_LOOP(reactor_);
  if (stripeThread_ == StripeThread::kNotStarted) {
    Status st = stripeReactor_.start("ferry-stripe");
    stripeThread_ = st.isOk() ? StripeThread::kRunning : StripeThread::kFailed;
    if (!st.isOk())
      FERRY_LOG(kWarn, "%s: no stripe thread: %s", device_.info.name.c_str(), st.toString().c_str());
  }
  return stripeThread_ == StripeThread::kRunning ? &stripeReactor_ : nullptr;
}

Status SoftContext::withoutStripeThreadForTests() {
  Status st;
  FERRY_RETURN_IF_ERROR(reactor_.runSync([&] {
    if (stripeThread_ == StripeThread::kRunning) {
      st = Status(StatusCode::kBusy, "the stripe thread already runs");
    } else {
      stripeThread_ = StripeThread::kFailed;
    }
  }));
  return st;
}

// ---------------------------------------------------------------------------------------------
// Rings the application polls. A lease says until when the application vouches that it polls;
// producers on this host do not wake the progress thread before then (RingPair::attend), and the
// progress thread does not wake for the sockets either (Reactor::attendUntil): the polls take both.
// Each caller's poll (a reactor poller) renews it when half of it is gone and takes what the rings
// hold; when the polls stop coming, the thread runs the poller at the lease's end and takes what
// producers left unannounced; arming a CQ ends the lease at once.

// Only a poll of a CQ that is not armed vouches that the application goes on polling (one after
// arming is the last before a sleep).
bool SoftContext::progressFromPoll(bool vouches) { return reactor_.progressOnce(vouches); }

Reactor::WaitHere SoftContext::waitFromChannel(int channelFd, int timeoutMs) {
  if (attendNs_ == 0) return Reactor::WaitHere::kRefused;
  return reactor_.waitHere(channelFd, timeoutMs, std::chrono::nanoseconds(attendNs_));
}

void SoftContext::addAttendedLinkFromLoop(const std::shared_ptr<Conn>& conn) {
  FERRY_ON_LOOP(reactor_);
  attendedLinks_.push_back(conn);
  if (const int64_t until = attendedUntilNs_.load(); until != 0) conn->attend(until);
}

void SoftContext::removeAttendedLinkFromLoop(const Conn* conn) {
  FERRY_ON_LOOP(reactor_);
  std::erase_if(attendedLinks_, [conn](const std::weak_ptr<Conn>& w) {
    auto c = w.lock();
    return !c || c.get() == conn;
  });
}

namespace {
std::atomic<uint64_t> deferredAckCount{0};
std::atomic<uint64_t> linkPollsCutShortCount{0};
}  // namespace

uint64_t acksDeferred() { return deferredAckCount.load(std::memory_order_relaxed); }
uint64_t linkPollsCutShort() { return linkPollsCutShortCount.load(std::memory_order_relaxed); }

bool SoftContext::deferAckFromLoop(const std::weak_ptr<RcResponder>& responder) {
  FERRY_ON_LOOP(reactor_);
  // In a caller's run (a poll, or a wait: the next one sends the ACK first, after what the
  // application sent in reply), under a lease the thread sleeps quiet on and has yet to sweep: its
  // end's run of the pollers sends the ACK if no caller's run comes first.
  if (attendNs_ == 0 || !reactor_.inCallersRun() || !reactor_.leaseSweepAhead()) return false;
  deferredAcks_.push_back(responder);
  deferredAckCount.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void SoftContext::sendDeferredAcksFromLoop() {
  FERRY_ON_LOOP(reactor_);
  // Swapped out first: sending may close a connection, and its QP's callbacks may defer again.
  acksSending_.swap(deferredAcks_);
  for (const auto& w : acksSending_) {
    if (auto responder = w.lock()) responder->sendDeferredAckFromLoop();
  }
  acksSending_.clear();
}

bool SoftContext::attendFromLoop(bool vouches) {
  FERRY_ON_LOOP(reactor_);
  if (!deferredAcks_.empty()) sendDeferredAcksFromLoop();
  if (vouches) {
    // The run's clock: the lease it gives ends no later than one measured now would, and the
    // timers this run looks at after the fds share the reading.
    const int64_t now = reactor_.runNowNs();
    if (attendedUntilNs_.load() - now < attendNs_ / 2) {
      // One reading for the rings and the thread (steadyNs() is the reactor's clock): a
      // producer that saw the lease hold wrote its frame before the lease's end, and the thread
      // wakes no sooner than that end to run this poller, so it finds the frame.
      const int64_t until = now + attendNs_;
      attendedUntilNs_.store(until);
      reactor_.attendUntil(Reactor::Clock::time_point(std::chrono::nanoseconds(until)));
      for (const auto& w : attendedLinks_) {
        if (auto c = w.lock()) c->attend(until);
      }
    }
  }
  // A caller's poll returns with the first link's frames: what it takes there is, in a ping-pong,
  // the request its application waits for, and the ACK that the peer wrote on another link right
  // after that request can wait for the next poll, made while the peer waits for the reply. The
  // next poll starts at the link after it, so that a busy link starves none behind it. The
  // thread's runs (a lease's end) take from every link.
  return pollAttendedLinksFromLoop(reactor_.inCallersRun());
}

bool SoftContext::pollAttendedLinksFromLoop(bool firstOnly) {
  FERRY_ON_LOOP(reactor_);
  // A snapshot: taking a ring's frames may close connections (and so change the list).
  linksPolled_.clear();
  const size_t count = attendedLinks_.size();
  const size_t start = firstOnly && count > 0 ? linksPollStart_ % count : 0;
  for (size_t i = 0; i < count; ++i) {
    if (auto c = attendedLinks_[(start + i) % count].lock()) linksPolled_.push_back(std::move(c));
  }
  bool found = false;
  for (size_t i = 0; i < linksPolled_.size(); ++i) {
    if (!linksPolled_[i]->pollInput()) continue;
    found = true;
    if (firstOnly) {
      linksPollStart_ = start + i + 1;  // the links' own order, give or take a link that went
      if (i + 1 < linksPolled_.size()) linkPollsCutShortCount.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  linksPolled_.clear();
  return found;
}

void SoftContext::endLeaseFromLoop() {
  FERRY_ON_LOOP(reactor_);
  if (!deferredAcks_.empty()) sendDeferredAcksFromLoop();
  attendedUntilNs_.store(0);
  reactor_.attendUntil(Reactor::Clock::time_point());
  // First the producers are told (a sequentially consistent store in each ring), then the rings are
  // read: a producer that still saw the lease wrote before this read, and one that did not wakes us.
  for (const auto& w : attendedLinks_) {
    if (auto c = w.lock()) c->attend(0);
  }
  (void)pollAttendedLinksFromLoop();
}

void SoftContext::stopAttending() {
  // A lease that ran out needs no end: the thread took what it left when it did.
  if (attendedUntilNs_.load() <= steadyNs()) return;
  auto end = [this] { endLeaseFromLoop(); };
  if (!reactor_.runHere(end)) reactor_.post(end);
}

void SoftContext::onDatagramsFromLoop() {
  FERRY_ON_LOOP(reactor_);
  uint8_t buf[wire::kMaxHeaderLen + wire::kMaxDatagram];
  for (int i = 0; i < 64; ++i) {
    sockaddr_in from{};
    socklen_t fromLen = sizeof from;
    ssize_t n =
        ::recvfrom(udpFd_, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &fromLen);
    if (n < 0) return;
    // A malformed datagram is dropped; it never affects anyone else's traffic.
    auto headerLen = wire::peekHeaderLen(std::span<const uint8_t>(buf, static_cast<size_t>(n)));
    if (!headerLen.isOk() || *headerLen > static_cast<size_t>(n)) continue;
    wire::FrameHeader h;
    if (!wire::decodeHeader(std::span<const uint8_t>(buf, *headerLen), &h).isOk()) continue;
    if (h.type != wire::FrameType::kDatagram || *headerLen + h.payloadLen != static_cast<size_t>(n)) continue;
    in_addr_t ip;
    uint16_t port;
    verbs::Gid src;
    src.raw = h.srcGid;
    if (!parseSoftGid(src, &ip, &port) || ip != from.sin_addr.s_addr || port != ntohs(from.sin_port))
      continue;
    if (auto qp = findUdQp(h.qpn)) qp->onDatagramFromLoop(h, buf + *headerLen);
  }
}

Result<verbs::DeviceAttr> SoftContext::queryDevice() {
  if (closed_) return closedError("query device: the context is closed");
  verbs::DeviceAttr a;
  a.fwVer = "ferry-soft 1";
  a.nodeGuid = device_.info.guid;
  a.sysImageGuid = device_.info.guid;
  a.maxMrSize = uint64_t{1} << 46;
  a.pageSizeCap = 4096;
  a.vendorId = 0xfe44;
  a.vendorPartId = 1;
  a.hwVer = 1;
  a.maxQp = kMaxQp;
  a.maxQpWr = kMaxWr;
  a.maxSge = kMaxSge;
  a.maxSgeRd = kMaxSge;
  a.maxCq = kMaxQp;
  a.maxCqe = kMaxCqe;
  a.maxMr = 1 << 20;
  a.maxPd = kMaxQp;
  a.maxQpRdAtom = kMaxRdAtomic;
  a.maxQpInitRdAtom = kMaxRdAtomic;
  a.maxSrq = kMaxQp;
  a.maxSrqWr = kMaxWr;
  a.maxSrqSge = kMaxSge;
  a.maxPkeys = 1;
  a.physPortCnt = 1;
  a.maxInlineData = kMaxInline;
  a.atomicCap = 1;
  // 4.096 us * 2^10 = 4 ms: the progress thread acknowledges well within it.
  a.localCaAckDelay = 10;
  return a;
}

Result<verbs::PortAttr> SoftContext::queryPort(uint8_t portNum) {
  if (closed_) return closedError("query port: the context is closed");
  if (portNum != 1) return invalidArgument("query port: the device has one port (1)");
  verbs::PortAttr p;
  p.state = verbs::PortState::kActive;
  p.maxMtu = verbs::Mtu::k4096;
  p.activeMtu = verbs::Mtu::k4096;
  p.gidTblLen = 1;
  p.maxMsgSz = wire::kMaxMessage;
  p.pkeyTblLen = 1;
  p.linkLayer = verbs::LinkLayer::kEthernet;
  return p;
}

Result<verbs::Gid> SoftContext::queryGid(uint8_t portNum, int index) {
  if (closed_) return closedError("query GID: the context is closed");
  if (portNum != 1) return invalidArgument("query GID: the device has one port (1)");
  if (index != 0) return invalidArgument("query GID: index beyond the GID table (1 entry)");
  return gid_;
}

Result<std::shared_ptr<verbs::PdImpl>> SoftContext::allocPd() {
  if (closed_) return closedError("alloc PD: the context is closed");
  auto pd = std::make_shared<SoftPd>(shared_from_this());
  children_.add(pd);
  return std::shared_ptr<verbs::PdImpl>(pd);
}

Result<std::shared_ptr<verbs::CompChannelImpl>> SoftContext::createCompChannel() {
  if (closed_) return closedError("create completion channel: the context is closed");
  auto channel = std::make_shared<SoftCompChannel>(weak_from_this());
  if (channel->fd() < 0) return ioError("eventfd");
  children_.add(channel);
  return std::shared_ptr<verbs::CompChannelImpl>(channel);
}

Result<std::shared_ptr<verbs::CqImpl>> SoftContext::createCq(int cqe,
                                                             std::shared_ptr<verbs::CompChannelImpl> channel,
                                                             void* userContext) {
  if (closed_) return closedError("create CQ: the context is closed");
  if (cqe < 1 || cqe > kMaxCqe)
    return invalidArgument("create CQ: cqe must be 1.." + std::to_string(kMaxCqe));
  std::shared_ptr<SoftCompChannel> soft;
  if (channel) {
    soft = std::dynamic_pointer_cast<SoftCompChannel>(channel);
    if (!soft) return invalidArgument("create CQ: the completion channel belongs to another provider");
  }
  auto cq = std::make_shared<SoftCq>(shared_from_this(), cqe, std::move(soft), userContext);
  children_.add(cq);
  return std::shared_ptr<verbs::CqImpl>(cq);
}

void SoftContext::raiseAsync(verbs::AsyncEvent event) {
  if (asyncEvents_.size() >= kMaxAsyncEvents) {
    FERRY_LOG(kWarn, "%s: %zu async events unread; dropping %s", device_.info.name.c_str(), kMaxAsyncEvents,
              verbs::asyncEventName(event.type));
    return;
  }
  asyncEvents_.push(event);
}

Result<verbs::AsyncEvent> SoftContext::getAsyncEvent(int timeoutMs) {
  if (closed_) return closedError("get async event: the context is closed");
  if (timeoutMs < 0) return invalidArgument("get async event: a wait needs a timeout (>= 0 ms)");
  return asyncEvents_.take(timeoutMs);
}

uint32_t SoftContext::newKeyLocked() {
  // 24 unguessable bits and an 8-bit generation: a key from an earlier registration never matches.
  // Where it can, the key is one whose record slot in the same-host table is free.
  for (int attempt = 0;; ++attempt) {
    uint32_t key = (randomU32() & 0xffffff00u) | (++keyGeneration_ & 0xff);
    if (key == 0 || mrs_.find(key) != mrs_.end()) continue;
    if (!share_ || attempt >= 64 || share_->keyFits(key)) return key;
  }
}

Result<std::shared_ptr<SharePeer>> SoftContext::sharePeer(const ShareInfo& info) {
  std::lock_guard<std::mutex> lock(peersMu_);
  std::erase_if(peers_, [](const std::weak_ptr<SharePeer>& w) { return w.expired(); });
  for (const auto& weak : peers_) {
    auto peer = weak.lock();
    if (peer && peer->info().pid == info.pid && peer->info().fd == info.fd &&
        peer->info().cookie == info.cookie && peer->alive()) {
      return peer;
    }
  }
  auto opened = SharePeer::open(info);
  if (!opened.isOk()) return opened.status();
  peers_.push_back(*opened);
  return opened;
}

namespace {

// The region mrs holds for key, when it belongs to pd, allows need and (unless anyRange) holds
// [addr, addr+len); else null.
const std::shared_ptr<MrEntry>* matchMr(const std::unordered_map<uint32_t, std::shared_ptr<MrEntry>>& mrs,
                                        uint32_t key, const void* pd, uint64_t addr, uint64_t len,
                                        uint32_t need, bool anyRange) {
  auto it = mrs.find(key);
  if (it == mrs.end()) return nullptr;
  const auto& e = it->second;
  if (e->revoked || e->pd != pd || (e->access & need) != need) return nullptr;
  if (anyRange) return &e;
  uint64_t begin = reinterpret_cast<uintptr_t>(e->addr);
  if (addr < begin || addr + len < addr || addr + len > begin + e->length) return nullptr;
  return &e;
}

}  // namespace

std::shared_ptr<MrEntry> SoftContext::findMrLocked(uint32_t key, const void* pd, uint64_t addr, uint64_t len,
                                                   uint32_t need, bool anyRange) const {
  const auto* e = matchMr(mrs_, key, pd, addr, len, need, anyRange);
  return e ? *e : nullptr;
}

const MrEntry* SoftContext::findMrEntryLocked(uint32_t key, const void* pd, uint64_t addr, uint64_t len,
                                              uint32_t need) const {
  const auto* e = matchMr(mrs_, key, pd, addr, len, need, /*anyRange=*/false);
  return e ? e->get() : nullptr;
}

Result<uint32_t> SoftContext::allocQpnLocked() {
  if (qps_.size() + udQps_.size() >= static_cast<size_t>(kMaxQp))
    return resourceExhausted("create QP: too many QPs");
  for (;;) {
    uint32_t qpn = nextQpn_++ & 0xffffff;
    if (qpn < 2 || qps_.count(qpn) || udQps_.count(qpn)) continue;
    return qpn;
  }
}

Result<uint32_t> SoftContext::addQp(const std::shared_ptr<SoftQp>& qp) {
  std::lock_guard<std::mutex> lock(qpMu_);
  FERRY_ASSIGN_OR_RETURN(uint32_t qpn, allocQpnLocked());
  qps_[qpn] = qp;
  return qpn;
}

Result<uint32_t> SoftContext::addUdQp(const std::shared_ptr<SoftUdQp>& qp) {
  uint32_t qpn = 0;
  {
    std::lock_guard<std::mutex> lock(qpMu_);
    FERRY_ASSIGN_OR_RETURN(qpn, allocQpnLocked());
    udQps_[qpn] = qp;
  }
  (void)reactor_.runSync([this] { updateUdpFdUseFromLoop(); });  // a stopped loop reads nothing
  return qpn;
}

void SoftContext::removeQp(uint32_t qpn) {
  bool wasUd = false;
  {
    std::lock_guard<std::mutex> lock(qpMu_);
    qps_.erase(qpn);
    wasUd = udQps_.erase(qpn) > 0;
  }
  if (wasUd) (void)reactor_.runSync([this] { updateUdpFdUseFromLoop(); });
}

void SoftContext::updateUdpFdUseFromLoop() {
  FERRY_ON_LOOP(reactor_);
  // Looked up when it runs, not when asked: calls from several threads may run in any order.
  bool reading = false;
  {
    std::lock_guard<std::mutex> lock(qpMu_);
    reading = !udQps_.empty();
  }
  if (udpFd_ >= 0) reactor_.setFdUse(udpFd_, reading ? Reactor::FdUse::kData : Reactor::FdUse::kControl);
}

std::shared_ptr<SoftUdQp> SoftContext::findUdQp(uint32_t qpn) {
  std::lock_guard<std::mutex> lock(qpMu_);
  auto it = udQps_.find(qpn);
  return it == udQps_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<SoftQp> SoftContext::findQp(uint32_t qpn) {
  std::lock_guard<std::mutex> lock(qpMu_);
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second.lock();
}

}  // namespace ferry::soft
