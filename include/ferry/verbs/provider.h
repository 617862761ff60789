// The provider interface: what a device backend implements for the verbs layer.
//
// Every public verbs handle (include/ferry/verbs/verbs.h) is a move-only value over one of these
// shared implementations. A provider (src/providers/<name>/) derives from them; nothing above the
// verbs layer ever names a provider. Implementations are thread-safe: any method may be called from
// any thread, and close() may race with other calls (which then return kClosed).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "ferry/common/memory_location.h"
#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::verbs {

// Anything with a close(): closing twice is harmless; a closed object refuses further calls.
class Closeable {
 public:
  virtual ~Closeable() = default;
  virtual void close() = 0;
  // Lower closes first among siblings: queue pairs (0) before the memory they use (1), as when a
  // process exits, so a peer sees its connection go rather than its keys vanish.
  virtual int closeOrder() const { return 1; }
};

// The children of a verbs object, so that closing the parent closes them first (newest first).
class ChildList {
 public:
  void add(std::weak_ptr<Closeable> child);
  // Closes every live child, by closeOrder() and then newest first. Safe to call more than once and
  // concurrently with add().
  void closeAll();

 private:
  std::mutex mu_;
  std::vector<std::weak_ptr<Closeable>> children_;
};

class PdImpl;
class MrImpl;
class CqImpl;
class CompChannelImpl;
class QpImpl;
class SrqImpl;
class AhImpl;

struct CqEvent {
  const void* cqId = nullptr;  // CompletionQueue::id() of the CQ that fired
  void* cqContext = nullptr;   // the userContext given when that CQ was created
};

struct QpInitImpl {
  QpType type = QpType::kRc;
  std::shared_ptr<CqImpl> sendCq;
  std::shared_ptr<CqImpl> recvCq;
  std::shared_ptr<SrqImpl> srq;
  QpCap cap;
  bool sqSigAll = false;
};

struct SrqInit {
  uint32_t maxWr = 0;
  uint32_t maxSge = 1;
  uint32_t srqLimit = 0;  // arm the limit event at once when non-zero
};

class ContextImpl : public Closeable {
 public:
  virtual const DeviceInfo& info() const = 0;
  virtual Result<DeviceAttr> queryDevice() = 0;
  virtual Result<PortAttr> queryPort(uint8_t portNum) = 0;
  virtual Result<Gid> queryGid(uint8_t portNum, int index) = 0;
  // The GID index fillPath() uses when a path asks for index 0 (the default): the one a peer can
  // reach best, e.g. a RoCE v2 GID on a RoCE port. 0 unless the provider knows better.
  virtual int defaultGidIndex(uint8_t portNum) { return 0; }
  virtual Result<std::shared_ptr<PdImpl>> allocPd() = 0;
  virtual Result<std::shared_ptr<CompChannelImpl>> createCompChannel() = 0;
  virtual Result<std::shared_ptr<CqImpl>> createCq(int cqe, std::shared_ptr<CompChannelImpl> channel,
                                                   void* userContext) = 0;
  virtual Result<AsyncEvent> getAsyncEvent(int timeoutMs) = 0;
  virtual int asyncFd() const = 0;
};

class PdImpl : public Closeable {
 public:
  virtual Result<std::shared_ptr<MrImpl>> registerMemory(void* addr, size_t length, uint32_t access) = 0;
  // Memory of a CUDA device (`where`, from the driver). A provider that cannot move such memory
  // keeps this refusal; one that can says how in DeviceInfo::deviceMemory.
  virtual Result<std::shared_ptr<MrImpl>> registerDeviceMemory(void* addr, size_t length, uint32_t access,
                                                               MemoryLocation where) {
    return notSupported("register memory: this device cannot move CUDA device memory");
  }
  virtual Result<std::shared_ptr<QpImpl>> createQp(const QpInitImpl& init) = 0;
  virtual Result<std::shared_ptr<SrqImpl>> createSrq(const SrqInit& init) = 0;
  // An address handle for UD sends (kNotSupported where the provider has no UD QPs).
  virtual Result<std::shared_ptr<AhImpl>> createAh(const AhAttr& attr) = 0;
};

class AhImpl : public Closeable {
 public:
  virtual AhAttr attr() const = 0;
};

class MrImpl : public Closeable {
 public:
  virtual void* addr() const = 0;
  virtual size_t length() const = 0;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
  virtual uint32_t access() const = 0;
  // Where the region's memory lives (registerDeviceMemory: on a device).
  virtual MemoryLocation location() const { return {}; }
  virtual Status reregister(uint32_t flags, const std::shared_ptr<PdImpl>& pd, void* addr, size_t length,
                            uint32_t access) = 0;
  // Memory the region owns (ProtectionDomain::allocMr): freed when the last reference to the
  // region goes, after the provider's own teardown.
  void holdBacking(std::shared_ptr<void> backing) { backing_ = std::move(backing); }

 private:
  std::shared_ptr<void> backing_;
};

class CqImpl : public Closeable {
 public:
  virtual Result<int> poll(std::span<WorkCompletion> out) = 0;
  virtual Status reqNotify(bool solicitedOnly) = 0;
  virtual Status resize(int cqe) = 0;
  virtual int cqe() const = 0;
  virtual void* userContext() const = 0;
};

class CompChannelImpl : public Closeable {
 public:
  virtual int fd() const = 0;
  virtual Result<CqEvent> getEvent(int timeoutMs) = 0;
};

class QpImpl : public Closeable {
 public:
  int closeOrder() const override { return 0; }
  virtual uint32_t qpNum() const = 0;
  virtual QpType type() const = 0;
  virtual Status modify(const QpAttr& attr, uint32_t mask) = 0;
  virtual Result<QpAttr> query() = 0;
  // The capabilities the QP was created with, as query() reports them. QueuePair checks every
  // request against them (posting.h) before it calls postSend or postRecv, which check only what
  // the provider alone knows (the QP's state, a full queue, its message limits).
  virtual QpCap cap() const = 0;
  virtual Status postSend(std::span<const SendWr> wrs, size_t* badIndex) = 0;
  virtual Status postRecv(std::span<const RecvWr> wrs, size_t* badIndex) = 0;
  // UD multicast (QueuePair::attachMcast checked the QP type and the GID first).
  virtual Status attachMcast(const Gid& gid, uint16_t lid) {
    (void)gid, (void)lid;
    return Status(StatusCode::kNotSupported, "attach_mcast: this device has no multicast", EOPNOTSUPP);
  }
  virtual Status detachMcast(const Gid& gid, uint16_t lid) {
    (void)gid, (void)lid;
    return Status(StatusCode::kNotSupported, "detach_mcast: this device has no multicast", EOPNOTSUPP);
  }
};

class SrqImpl : public Closeable {
 public:
  // The SGEs a receive may have, as created; SharedReceiveQueue checks requests against it.
  virtual uint32_t maxSge() const = 0;
  virtual Status postRecv(std::span<const RecvWr> wrs, size_t* badIndex) = 0;
  // Arms the limit event (kSrqLimitReached fires once when fewer than `limit` receives remain).
  virtual Status armLimit(uint32_t limit) = 0;
  virtual Result<SrqInit> query() = 0;
};

}  // namespace ferry::verbs
