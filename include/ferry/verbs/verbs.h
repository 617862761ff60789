// ferry's verbs interface: an object model of RDMA verbs that runs on every ferry device.
//
// Handles are move-only values over a shared implementation (see provider.h). A default-constructed
// or moved-from handle is empty; its calls return kClosed. Children enroll with their parent:
// closing a Context closes its PDs, CQs and completion channels; closing a PD closes its MRs, QPs and
// SRQs. close() is idempotent, and a handle's destructor closes it. All calls are thread-safe.
//
// Threads and completion: posting calls only enqueue; work is carried out by the device (for ferry's
// software devices, the context's progress thread) and reported through completion queues. A buffer
// named in a work request belongs to the device from postSend()/postRecv() until its completion is
// polled (or, for unsignaled requests, until a later completion of the same QP is polled).
//
// Errors: every call returns a Status or Result. Refusals mirror libibverbs: cause() holds the errno
// libibverbs would set (EINVAL for bad arguments and illegal QP transitions, ENOMEM for a full queue,
// EOPNOTSUPP for what a device does not offer).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/common/status.h"
#include "ferry/verbs/provider.h"
#include "ferry/verbs/types.h"

namespace ferry::verbs {

class ProtectionDomain;
class MemoryRegion;
class CompletionQueue;
class CompletionChannel;
class QueuePair;
class SharedReceiveQueue;
class AddressHandle;
struct Path;

// Base of every handle: move-only ownership of one shared implementation.
template <typename Impl>
class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Handle(Handle&&) noexcept = default;
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      close();
      impl_ = std::move(other.impl_);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { close(); }

  // Releases the object and, first, its children. Idempotent.
  void close() {
    if (impl_) {
      impl_->close();
      impl_.reset();
    }
  }
  bool valid() const { return impl_ != nullptr; }
  // For providers and bindings: the shared implementation (nullptr when empty).
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 protected:
  std::shared_ptr<Impl> impl_;
};

struct CqInit {
  int cqe = 0;                           // at least this many entries
  CompletionChannel* channel = nullptr;  // events go there after reqNotify()
  void* userContext = nullptr;           // returned with each completion-channel event
};

struct QpInit {
  QpType type = QpType::kRc;
  CompletionQueue* sendCq = nullptr;
  CompletionQueue* recvCq = nullptr;
  SharedReceiveQueue* srq = nullptr;  // receives come from the SRQ when set
  QpCap cap;
  bool sqSigAll = false;  // every send WR completes, signaled or not
};

// An opened device.
class Context : public Handle<ContextImpl> {
 public:
  using Handle::Handle;
  // The device this context was opened on.
  const DeviceInfo& info() const;
  // Device limits and capabilities (ibv_query_device).
  Result<DeviceAttr> queryDevice() const;
  // Port state, MTU, link layer, GID table length (ibv_query_port). Ports count from 1.
  Result<PortAttr> queryPort(uint8_t portNum) const;
  // One entry of a port's GID table; kInvalidArgument past its end.
  Result<Gid> queryGid(uint8_t portNum, int index) const;
  Result<ProtectionDomain> allocPd();
  Result<CompletionChannel> createCompChannel();
  // A CQ of at least init.cqe entries; EINVAL above DeviceAttr::maxCqe or below 1.
  Result<CompletionQueue> createCq(const CqInit& init);
  // Waits up to timeoutMs (0: do not wait) for the next async event (QP fatal, CQ error, SRQ
  // limit, port change). kTimedOut when none came.
  Result<AsyncEvent> getAsyncEvent(int timeoutMs);
  // Readable (poll/epoll) while async events are queued.
  int asyncFd() const;
};

class ProtectionDomain : public Handle<PdImpl> {
 public:
  using Handle::Handle;
  // Registers [addr, addr+length) with the given access flags (access::k...). REMOTE_WRITE or
  // REMOTE_ATOMIC without LOCAL_WRITE is refused (EINVAL), as in libibverbs. As ibv_reg_mr pins
  // the pages, they are faulted in, and memory that is not mapped, not mapped writable when any
  // write flag is set (readable otherwise), or a range that wraps past 2^64 is refused (EINVAL).
  // The memory must stay valid until the region is closed; after close() returns no device access
  // touches it again. Memory of a CUDA device (told apart through the driver, where one is found)
  // registers on a device whose DeviceInfo::deviceMemory says how it moves it, and is refused
  // (kNotSupported, naming the device) elsewhere; it is never read as host memory.
  Result<MemoryRegion> registerMemory(void* addr, size_t length, uint32_t access);
  // Allocates length bytes (zero-filled, page-aligned; ferry/common/shared_memory.h) and registers
  // them: the region owns the memory, freed when the region is closed and its last handle is gone.
  // A same-host peer of the software provider maps this memory once and moves WRITE and READ
  // with plain loads and stores instead of a system call per batch. EINVAL for length 0.
  Result<MemoryRegion> allocMr(size_t length, uint32_t access);
  // A QP; EINVAL when its caps exceed the device's or its CQs are missing or of another context.
  Result<QueuePair> createQp(const QpInit& init);
  Result<SharedReceiveQueue> createSrq(const SrqInit& init);
  // An address handle for UD work requests (SendWr::ud.ah = ah.id()). EINVAL for an address the
  // device cannot reach (e.g. a GID of another provider); kNotSupported without UD support.
  Result<AddressHandle> createAh(const AhAttr& attr);

 private:
  Result<MemoryRegion> registerDevice(void* addr, size_t length, uint32_t access, MemoryLocation where);
};

// Where a UD datagram goes (ibv_ah). Lives until closed or its PD is closed.
class AddressHandle : public Handle<AhImpl> {
 public:
  using Handle::Handle;
  AhAttr attr() const;
  const void* id() const { return impl_.get(); }
};

class MemoryRegion : public Handle<MrImpl> {
 public:
  using Handle::Handle;
  void* addr() const;
  size_t length() const;
  uint32_t lkey() const;
  uint32_t rkey() const;
  uint32_t access() const;
  // Host memory, or the CUDA device the region's memory is on.
  MemoryLocation location() const;
  // An SGE over [offset, offset+length) of this region (length 0: to the end).
  Sge sge(size_t offset = 0, size_t length = 0) const;
  // ibv_rereg_mr: flags (rereg::k...) say what changes. The keys change too, so keys handed out
  // before fail from the next remote access on. pd may be nullptr unless kChangePd is set. A new
  // translation stays where the region is (host memory, or the same CUDA device): kNotSupported
  // otherwise (register the other memory as a region of its own).
  Status reregister(uint32_t flags, ProtectionDomain* pd, void* addr, size_t length, uint32_t access);
};

class CompletionQueue : public Handle<CqImpl> {
 public:
  using Handle::Handle;
  // Moves up to out.size() completions into out; returns how many (0 when empty). A CQ that
  // overflowed returns kIoError (cause EOVERFLOW) from then on.
  Result<int> poll(std::span<WorkCompletion> out);
  // Arms the completion channel for the next completion (solicitedOnly: the next solicited or
  // error completion). One event per arming (edge): poll, re-arm, poll again to close the race.
  Status reqNotify(bool solicitedOnly = false);
  // Resizes to at least cqe entries; EINVAL below the completions it holds or above the maximum.
  Status resize(int cqe);
  int cqe() const;
  // Identity used in CqEvent::cqId and AsyncEvent::cqId.
  const void* id() const { return impl_.get(); }
};

class CompletionChannel : public Handle<CompChannelImpl> {
 public:
  using Handle::Handle;
  // Readable while events are queued; works with poll, select and epoll.
  int fd() const;
  // Waits up to timeoutMs (0: do not wait, <0: refused) for one CQ event and consumes it.
  Result<CqEvent> getEvent(int timeoutMs);
};

class QueuePair : public Handle<QpImpl> {
 public:
  using Handle::Handle;
  uint32_t qpNum() const;
  QpType type() const;
  // ibv_modify_qp: attributes named by mask (qp_attr_mask::k...). Illegal transitions, missing
  // required attributes or attributes not allowed in the transition are refused with EINVAL.
  Status modify(const QpAttr& attr, uint32_t mask);
  Result<QpAttr> query() const;
  // INIT -> RTR -> RTS from a path (see path.h); accessFlags become qp_access_flags.
  Status establish(const Path& path, uint32_t accessFlags);
  // Posts in order; stops at the first refused request, whose index goes to *badIndex (the ones
  // before it stay posted). EINVAL: wrong state, too many SGEs, inline too large; ENOMEM: full.
  Status postSend(std::span<const SendWr> wrs, size_t* badIndex = nullptr);
  Status postSend(const SendWr& wr) { return postSend(std::span<const SendWr>(&wr, 1)); }
  Status postRecv(std::span<const RecvWr> wrs, size_t* badIndex = nullptr);
  Status postRecv(const RecvWr& wr) { return postRecv(std::span<const RecvWr>(&wr, 1)); }
  // ibv_attach_mcast / ibv_detach_mcast: a UD QP receives the sends to the multicast group gid
  // (ff00::/8; lid is the group's LID, 0 on RoCE-style and software devices). EINVAL for another
  // QP type or a GID that is not multicast, and for detaching a group the QP is not attached to.
  Status attachMcast(const Gid& gid, uint16_t lid);
  Status detachMcast(const Gid& gid, uint16_t lid);
};

class SharedReceiveQueue : public Handle<SrqImpl> {
 public:
  using Handle::Handle;
  Status postRecv(std::span<const RecvWr> wrs, size_t* badIndex = nullptr);
  Status postRecv(const RecvWr& wr) { return postRecv(std::span<const RecvWr>(&wr, 1)); }
  Status armLimit(uint32_t limit);
  Result<SrqInit> query() const;
  const void* id() const { return impl_.get(); }
};

}  // namespace ferry::verbs
