#include "ferry/verbs/verbs.h"

#include <algorithm>

#include "common/cuda_driver.h"
#include "ferry/common/shared_memory.h"
#include "ferry/verbs/path.h"
#include "verbs/mapped.h"
#include "verbs/posting.h"

namespace ferry::verbs {

void ChildList::add(std::weak_ptr<Closeable> child) {
  std::lock_guard<std::mutex> lock(mu_);
  // Drop entries of children already gone so long-lived parents do not accumulate them.
  if (children_.size() >= 64 && children_.size() % 64 == 0) {
    children_.erase(std::remove_if(children_.begin(), children_.end(),
                                   [](const std::weak_ptr<Closeable>& c) { return c.expired(); }),
                    children_.end());
  }
  children_.push_back(std::move(child));
}

void ChildList::closeAll() {
  std::vector<std::weak_ptr<Closeable>> children;
  {
    std::lock_guard<std::mutex> lock(mu_);
    children.swap(children_);
  }
  std::vector<std::shared_ptr<Closeable>> live;
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (auto child = it->lock()) live.push_back(std::move(child));
  }
  std::stable_sort(live.begin(), live.end(),
                   [](const auto& a, const auto& b) { return a->closeOrder() < b->closeOrder(); });
  for (auto& child : live) child->close();
}

namespace {
Status emptyHandle(const char* what) {
  return Status(StatusCode::kClosed, std::string(what) + " handle is empty or closed", EBADF);
}
const DeviceInfo kNoDevice{};
}  // namespace

// ---- Context ----
const DeviceInfo& Context::info() const { return impl_ ? impl_->info() : kNoDevice; }
Result<DeviceAttr> Context::queryDevice() const {
  if (!impl_) return emptyHandle("Context");
  return impl_->queryDevice();
}
Result<PortAttr> Context::queryPort(uint8_t portNum) const {
  if (!impl_) return emptyHandle("Context");
  return impl_->queryPort(portNum);
}
Result<Gid> Context::queryGid(uint8_t portNum, int index) const {
  if (!impl_) return emptyHandle("Context");
  return impl_->queryGid(portNum, index);
}
Result<ProtectionDomain> Context::allocPd() {
  if (!impl_) return emptyHandle("Context");
  FERRY_ASSIGN_OR_RETURN(auto pd, impl_->allocPd());
  return ProtectionDomain(std::move(pd));
}
Result<CompletionChannel> Context::createCompChannel() {
  if (!impl_) return emptyHandle("Context");
  FERRY_ASSIGN_OR_RETURN(auto channel, impl_->createCompChannel());
  return CompletionChannel(std::move(channel));
}
Result<CompletionQueue> Context::createCq(const CqInit& init) {
  if (!impl_) return emptyHandle("Context");
  std::shared_ptr<CompChannelImpl> channel;
  if (init.channel != nullptr) {
    if (!init.channel->valid()) return emptyHandle("CompletionChannel");
    channel = init.channel->impl();
  }
  FERRY_ASSIGN_OR_RETURN(auto cq, impl_->createCq(init.cqe, std::move(channel), init.userContext));
  return CompletionQueue(std::move(cq));
}
Result<AsyncEvent> Context::getAsyncEvent(int timeoutMs) {
  if (!impl_) return emptyHandle("Context");
  return impl_->getAsyncEvent(timeoutMs);
}
int Context::asyncFd() const { return impl_ ? impl_->asyncFd() : -1; }

// ---- ProtectionDomain ----
Result<MemoryRegion> ProtectionDomain::registerMemory(void* addr, size_t length, uint32_t access) {
  if (!impl_) return emptyHandle("ProtectionDomain");
  if ((access & ~access::kAll) != 0) return invalidArgument("register memory: unknown access flag bits");
  if ((access & (access::kRemoteWrite | access::kRemoteAtomic)) && !(access & access::kLocalWrite)) {
    return invalidArgument("register memory: REMOTE_WRITE or REMOTE_ATOMIC needs LOCAL_WRITE");
  }
  if (addr == nullptr && length != 0) return invalidArgument("register memory: null address");
  if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr)) {
    return invalidArgument("register memory: range wraps around the address space");
  }
  // GPU memory is never read as host memory: the driver tells it apart (where there is one).
  if (length != 0) {
    if (const MemoryLocation where = cuda::locate(addr); where.onDevice())
      return registerDevice(addr, length, access, where);
  }
  // Like ibv_reg_mr: memory that is not mapped, or not mapped with the access asked for, is refused
  // here, on every provider, rather than faulting at its first use.
  FERRY_RETURN_IF_ERROR(checkMapped(
      addr, length, (access & (access::kLocalWrite | access::kRemoteWrite | access::kRemoteAtomic)) != 0));
  FERRY_ASSIGN_OR_RETURN(auto mr, impl_->registerMemory(addr, length, access));
  return MemoryRegion(std::move(mr));
}
Result<MemoryRegion> ProtectionDomain::registerDevice(void* addr, size_t length, uint32_t access,
                                                      MemoryLocation where) {
  if (cuda::locate(static_cast<const char*>(addr) + length - 1) != where) {
    return invalidArgument("register memory: [" + std::to_string(reinterpret_cast<uintptr_t>(addr)) + ", +" +
                           std::to_string(length) + ") starts in memory of " + where.toString() +
                           " but does not end there");
  }
  auto mr = impl_->registerDeviceMemory(addr, length, access, where);
  if (!mr.isOk()) {
    return Status(mr.status().code(),
                  mr.status().message() + " ([" + std::to_string(reinterpret_cast<uintptr_t>(addr)) + ", +" +
                      std::to_string(length) + ") is memory of " + where.toString() + ")");
  }
  cuda::noteDeviceMemoryRegistered();
  return MemoryRegion(std::move(*mr));
}
Result<MemoryRegion> ProtectionDomain::allocMr(size_t length, uint32_t access) {
  if (!impl_) return emptyHandle("ProtectionDomain");
  if (length == 0) return invalidArgument("alloc MR: length 0");
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<SharedMemory> memory, SharedMemory::allocate(length));
  FERRY_ASSIGN_OR_RETURN(MemoryRegion mr, registerMemory(memory->data(), length, access));
  mr.impl()->holdBacking(std::move(memory));
  return mr;
}
Result<QueuePair> ProtectionDomain::createQp(const QpInit& init) {
  if (!impl_) return emptyHandle("ProtectionDomain");
  if (init.sendCq == nullptr || init.recvCq == nullptr) {
    return invalidArgument("create QP: a send CQ and a receive CQ are required");
  }
  if (!init.sendCq->valid() || !init.recvCq->valid()) return emptyHandle("CompletionQueue");
  QpInitImpl q;
  q.type = init.type;
  q.sendCq = init.sendCq->impl();
  q.recvCq = init.recvCq->impl();
  if (init.srq != nullptr) {
    if (!init.srq->valid()) return emptyHandle("SharedReceiveQueue");
    q.srq = init.srq->impl();
  }
  q.cap = init.cap;
  q.sqSigAll = init.sqSigAll;
  FERRY_ASSIGN_OR_RETURN(auto qp, impl_->createQp(q));
  return QueuePair(std::move(qp));
}
Result<SharedReceiveQueue> ProtectionDomain::createSrq(const SrqInit& init) {
  if (!impl_) return emptyHandle("ProtectionDomain");
  FERRY_ASSIGN_OR_RETURN(auto srq, impl_->createSrq(init));
  return SharedReceiveQueue(std::move(srq));
}

Result<AddressHandle> ProtectionDomain::createAh(const AhAttr& attr) {
  if (!impl_) return emptyHandle("ProtectionDomain");
  FERRY_ASSIGN_OR_RETURN(auto ah, impl_->createAh(attr));
  return AddressHandle(std::move(ah));
}

AhAttr AddressHandle::attr() const { return impl_ ? impl_->attr() : AhAttr{}; }

// ---- MemoryRegion ----
void* MemoryRegion::addr() const { return impl_ ? impl_->addr() : nullptr; }
size_t MemoryRegion::length() const { return impl_ ? impl_->length() : 0; }
uint32_t MemoryRegion::lkey() const { return impl_ ? impl_->lkey() : 0; }
uint32_t MemoryRegion::rkey() const { return impl_ ? impl_->rkey() : 0; }
uint32_t MemoryRegion::access() const { return impl_ ? impl_->access() : 0; }
MemoryLocation MemoryRegion::location() const { return impl_ ? impl_->location() : MemoryLocation{}; }
Sge MemoryRegion::sge(size_t offset, size_t length) const {
  size_t total = this->length();
  if (offset > total) offset = total;
  if (length == 0 || length > total - offset) length = total - offset;
  return Sge{.addr = reinterpret_cast<uintptr_t>(addr()) + offset,
             .length = static_cast<uint32_t>(std::min<size_t>(length, UINT32_MAX)),
             .lkey = lkey()};
}
Status MemoryRegion::reregister(uint32_t flags, ProtectionDomain* pd, void* addr, size_t length,
                                uint32_t access) {
  if (!impl_) return emptyHandle("MemoryRegion");
  if (flags == 0 || (flags & ~(rereg::kChangeTranslation | rereg::kChangePd | rereg::kChangeAccess))) {
    return invalidArgument("reregister: flags must name what changes");
  }
  std::shared_ptr<PdImpl> newPd;
  if (flags & rereg::kChangePd) {
    if (pd == nullptr || !pd->valid()) return invalidArgument("reregister: kChangePd needs a valid PD");
    newPd = pd->impl();
  }
  if (flags & rereg::kChangeAccess) {
    if ((access & ~access::kAll) != 0) return invalidArgument("reregister: unknown access flag bits");
    if ((access & (access::kRemoteWrite | access::kRemoteAtomic)) && !(access & access::kLocalWrite)) {
      return invalidArgument("reregister: REMOTE_WRITE or REMOTE_ATOMIC needs LOCAL_WRITE");
    }
  }
  if ((flags & rereg::kChangeTranslation) && addr == nullptr && length != 0) {
    return invalidArgument("reregister: null address");
  }
  if ((flags & rereg::kChangeTranslation) && length != 0 && cuda::locate(addr) != impl_->location()) {
    return notSupported("reregister: the new range is in " + cuda::locate(addr).toString() +
                        " memory, the region's in " + impl_->location().toString() +
                        " memory (register it as a region of its own)");
  }
  return impl_->reregister(flags, newPd, addr, length, access);
}

// ---- CompletionQueue ----
Result<int> CompletionQueue::poll(std::span<WorkCompletion> out) {
  if (!impl_) return emptyHandle("CompletionQueue");
  return impl_->poll(out);
}
Status CompletionQueue::reqNotify(bool solicitedOnly) {
  if (!impl_) return emptyHandle("CompletionQueue");
  return impl_->reqNotify(solicitedOnly);
}
Status CompletionQueue::resize(int cqe) {
  if (!impl_) return emptyHandle("CompletionQueue");
  return impl_->resize(cqe);
}
int CompletionQueue::cqe() const { return impl_ ? impl_->cqe() : 0; }

// ---- CompletionChannel ----
int CompletionChannel::fd() const { return impl_ ? impl_->fd() : -1; }
Result<CqEvent> CompletionChannel::getEvent(int timeoutMs) {
  if (!impl_) return emptyHandle("CompletionChannel");
  if (timeoutMs < 0) return invalidArgument("getEvent: a wait needs a timeout (>= 0 ms)");
  return impl_->getEvent(timeoutMs);
}

// ---- QueuePair ----
uint32_t QueuePair::qpNum() const { return impl_ ? impl_->qpNum() : 0; }
QpType QueuePair::type() const { return impl_ ? impl_->type() : QpType::kRc; }
Status QueuePair::modify(const QpAttr& attr, uint32_t mask) {
  if (!impl_) return emptyHandle("QueuePair");
  return impl_->modify(attr, mask);
}
Result<QpAttr> QueuePair::query() const {
  if (!impl_) return emptyHandle("QueuePair");
  return impl_->query();
}
namespace {

// Hands wrs to the provider up to the first request `fine` refuses, then returns that request's
// refusal (`check` words it) with *badIndex at it: the requests before it are posted, as with any
// refusal (a provider's own refusal among them comes first).
template <typename Wr, typename Fine, typename Check, typename Post>
Status postChecked(std::span<const Wr> wrs, size_t* badIndex, Fine fine, Check check, Post post) {
  for (size_t i = 0; i < wrs.size(); ++i) {
    if (fine(wrs[i])) continue;
    Status refusal = check(wrs[i]);
    if (i > 0) {
      size_t inner = 0;
      if (Status st = post(wrs.first(i), &inner); !st.isOk()) {
        if (badIndex) *badIndex = inner;
        return st;
      }
    }
    if (badIndex) *badIndex = i;
    return refusal;
  }
  return post(wrs, badIndex);
}

}  // namespace

Status QueuePair::postSend(std::span<const SendWr> wrs, size_t* badIndex) {
  if (!impl_) {
    if (badIndex) *badIndex = 0;
    return emptyHandle("QueuePair");
  }
  const QpType type = impl_->type();
  const QpCap cap = impl_->cap();
  return postChecked(
      wrs, badIndex, [&](const SendWr& wr) { return sendWrFault(type, cap, wr) == SendWrFault::kNone; },
      [&](const SendWr& wr) { return checkSendWr(type, cap, wr); },
      [&](std::span<const SendWr> some, size_t* bad) { return impl_->postSend(some, bad); });
}
Status QueuePair::postRecv(std::span<const RecvWr> wrs, size_t* badIndex) {
  if (!impl_) {
    if (badIndex) *badIndex = 0;
    return emptyHandle("QueuePair");
  }
  const uint32_t maxSge = impl_->cap().maxRecvSge;
  return postChecked(
      wrs, badIndex, [&](const RecvWr& wr) { return recvWrFits(maxSge, wr); },
      [&](const RecvWr& wr) { return checkRecvWr(maxSge, wr, "post recv"); },
      [&](std::span<const RecvWr> some, size_t* bad) { return impl_->postRecv(some, bad); });
}

namespace {
Status checkMcast(const char* what, QpType type, const Gid& gid) {
  if (type != QpType::kUd) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(what) + ": only UD queue pairs join multicast groups", EINVAL);
  }
  if (gid.raw[0] != 0xff) {
    return Status(StatusCode::kInvalidArgument, std::string(what) + ": not a multicast GID (ff00::/8)",
                  EINVAL);
  }
  return Status::ok();
}
}  // namespace

Status QueuePair::attachMcast(const Gid& gid, uint16_t lid) {
  if (!impl_) return emptyHandle("QueuePair");
  FERRY_RETURN_IF_ERROR(checkMcast("attach_mcast", impl_->type(), gid));
  return impl_->attachMcast(gid, lid);
}

Status QueuePair::detachMcast(const Gid& gid, uint16_t lid) {
  if (!impl_) return emptyHandle("QueuePair");
  FERRY_RETURN_IF_ERROR(checkMcast("detach_mcast", impl_->type(), gid));
  return impl_->detachMcast(gid, lid);
}

Status QueuePair::establish(const Path& path, uint32_t accessFlags) {
  if (!impl_) return emptyHandle("QueuePair");
  namespace m = qp_attr_mask;
  FERRY_ASSIGN_OR_RETURN(QpAttr current, impl_->query());
  QpAttr attr;
  // From RESET, or from INIT (receives were posted first): INIT -> INIT sets the path's values.
  if (type() == QpType::kUd) {
    if (current.state == QpState::kReset || current.state == QpState::kInit) {
      attr.state = QpState::kInit;
      attr.pkeyIndex = path.pkeyIndex;
      attr.portNum = path.portNum;
      attr.qkey = path.qkey;
      FERRY_RETURN_IF_ERROR(impl_->modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kQkey));
    }
    attr.state = QpState::kRtr;
    FERRY_RETURN_IF_ERROR(impl_->modify(attr, m::kState));
    attr.state = QpState::kRts;
    attr.sqPsn = path.sqpsn;
    return impl_->modify(attr, m::kState | m::kSqPsn);
  }
  if (current.state != QpState::kReset && current.state != QpState::kInit) {
    return invalidArgument(std::string("establish: the QP is in ") + qpStateName(current.state) +
                           ", not RESET or INIT");
  }
  {
    attr.state = QpState::kInit;
    attr.pkeyIndex = path.pkeyIndex;
    attr.portNum = path.portNum;
    attr.qpAccessFlags = accessFlags;
    FERRY_RETURN_IF_ERROR(impl_->modify(attr, m::kState | m::kPkeyIndex | m::kPort | m::kAccessFlags));
  }
  attr = QpAttr{};
  attr.state = QpState::kRtr;
  attr.ahAttr = path.ahAttr();
  attr.pathMtu = path.mtu;
  attr.destQpNum = path.dqpn;
  attr.rqPsn = path.dqpsn;
  attr.maxDestRdAtomic = path.drdatomic;
  attr.minRnrTimer = path.minRnrTimer;
  attr.qpAccessFlags = accessFlags;
  const bool uc = type() == QpType::kUc;  // no acknowledgements: no READ/atomic, RNR or retry settings
  FERRY_RETURN_IF_ERROR(impl_->modify(attr, m::kState | m::kAv | m::kPathMtu | m::kDestQpn | m::kRqPsn |
                                                m::kAccessFlags |
                                                (uc ? 0u : m::kMaxDestRdAtomic | m::kMinRnrTimer)));
  attr = QpAttr{};
  attr.state = QpState::kRts;
  attr.sqPsn = path.sqpsn;
  if (uc) return impl_->modify(attr, m::kState | m::kSqPsn);
  attr.maxRdAtomic = path.srdatomic;
  attr.retryCnt = path.retries;
  attr.rnrRetry = path.rnrRetries;
  attr.timeout = path.packetLifeTime;
  return impl_->modify(attr,
                       m::kState | m::kSqPsn | m::kMaxQpRdAtomic | m::kRetryCnt | m::kRnrRetry | m::kTimeout);
}

// ---- SharedReceiveQueue ----
Status SharedReceiveQueue::postRecv(std::span<const RecvWr> wrs, size_t* badIndex) {
  if (!impl_) {
    if (badIndex) *badIndex = 0;
    return emptyHandle("SharedReceiveQueue");
  }
  const uint32_t maxSge = impl_->maxSge();
  return postChecked(
      wrs, badIndex, [&](const RecvWr& wr) { return recvWrFits(maxSge, wr); },
      [&](const RecvWr& wr) { return checkRecvWr(maxSge, wr, "post SRQ recv"); },
      [&](std::span<const RecvWr> some, size_t* bad) { return impl_->postRecv(some, bad); });
}
Status SharedReceiveQueue::armLimit(uint32_t limit) {
  if (!impl_) return emptyHandle("SharedReceiveQueue");
  return impl_->armLimit(limit);
}
Result<SrqInit> SharedReceiveQueue::query() const {
  if (!impl_) return emptyHandle("SharedReceiveQueue");
  return impl_->query();
}

}  // namespace ferry::verbs
