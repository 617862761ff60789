// The software provider ("soft"): a userspace RDMA device over TCP.
//
// Each Context owns a progress thread (a Reactor) and a TCP listener on its device's address. A
// GID names the context: the device's IPv4 address in its last four bytes and the listener port in
// bytes 8-9. An RC QP opens one TCP connection to its peer's listener for the requests it sends
// (the "requester" connection) and serves the requests of its peer on the connection the peer
// opened (the "responder" connection). Frames are described in wire.h and docs/wire-protocol.md.
//
// Threads: public calls validate and enqueue under small locks; all protocol work runs on the
// reactor thread. Registered memory is touched only by the reactor thread while it holds the
// context's memory lock shared, after checking that the region is still registered; deregistration
// takes that lock exclusively, so once it returns no access can touch the region again.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/event_queue.h"
#include "common/inline_vec.h"
#include "common/reactor.h"
#include "ferry/common/config.h"
#include "ferry/verbs/provider.h"
#include "providers/soft/same_host/share.h"
#include "providers/soft/wire.h"

namespace ferry::soft {

// The device's limits, as queryDevice() reports them: every object a context creates is checked
// against them.
inline constexpr int kMaxQp = 1 << 16;
inline constexpr int kMaxWr = 1 << 15;
inline constexpr int kMaxSge = 32;
inline constexpr int kMaxCqe = 1 << 22;
inline constexpr int kMaxRdAtomic = 16;
inline constexpr uint32_t kMaxInline = 512;

class SoftContext;
class SoftPd;
class SoftCq;
class SoftQp;
class RcResponder;
class SoftSrq;
class Conn;
class HelloGate;
class SoftUdQp;
class SoftAh;

// ---- devices ----
struct SoftDeviceInfo {
  verbs::DeviceInfo info;
  in_addr_t ipv4 = 0;  // network byte order
};
// The software devices of this host: one per up IPv4 interface (soft_lo, soft_eth0, ...).
std::vector<SoftDeviceInfo> listSoftDevices();
// Whether the provider works here (it needs only TCP sockets); reason when it does not.
bool probeSoft(std::string* reason);
Result<std::shared_ptr<verbs::ContextImpl>> openSoftDevice(const std::string& name);

// A GID of a soft context: port in bytes 8-9 (big-endian), ffff in 10-11, IPv4 in 12-15.
verbs::Gid makeSoftGid(in_addr_t ipv4, uint16_t port);
bool parseSoftGid(const verbs::Gid& gid, in_addr_t* ipv4, uint16_t* port);
// A one-time ticket (ring and stripe connections show one that went only to their peer): 64 random
// bits from the kernel's generator. 0 means no ticket: the generator failed (or, once in 2^64,
// drew 0), and the connection it was for is not offered.
uint64_t randomTicket();
// How many ACKs a responder of this process left to the next run of its loop because an
// application's poll took their requests (SoftContext::deferAckFromLoop): what tests read.
uint64_t acksDeferred();
// How many polls of an application returned with the frames of one link while other links of
// its device were left for the next poll (SoftContext::attendFromLoop): what tests read.
uint64_t linkPollsCutShort();
// How many bytes of payloads of 16 KiB or more (the ones read straight into place) a TCP
// connection of this process read into its staging buffer first and copied from there: what the
// read that took their header brought along. What tests read.
uint64_t largePayloadBytesStaged();

// ---- registered memory ----
// One registration. Immutable but for `revoked`, which changes under the context's memory lock.
struct MrEntry {
  uint8_t* addr = nullptr;
  size_t length = 0;
  uint32_t access = 0;
  uint32_t key = 0;
  const void* pd = nullptr;
  bool revoked = false;
  // Host memory, or a CUDA device's: never touched in place then (region_copy.h).
  MemoryLocation location;
};

// A piece of a message in registered memory (or, with entry == nullptr, in ferry's own buffer).
struct Segment {
  uint8_t* ptr = nullptr;
  size_t length = 0;
  std::shared_ptr<MrEntry> entry;
};
// A request's or a frame's pieces, and a request's scatter/gather list: one or two almost always,
// kept without a heap allocation (InlineVec).
using Segments = InlineVec<Segment, 2>;
using Sges = InlineVec<verbs::Sge, 2>;

// ---- work requests as the QP keeps them ----
struct SendWqe {
  uint64_t wrId = 0;
  verbs::WrOpcode opcode = verbs::WrOpcode::kSend;
  uint32_t flags = 0;
  bool signaled = false;
  Sges sges;
  std::vector<uint8_t> inlineData;
  uint64_t length = 0;
  uint32_t immData = 0;
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  uint64_t compareAdd = 0;
  uint64_t swap = 0;
  bool placed = false;  // WRITE_WITH_IMM whose data the same-host path already copied
  // Reactor state.
  uint32_t seq = 0;
  bool responded = false;     // READ/atomic response arrived
  bool striped = false;       // a WRITE whose second part went on the QP's stripe, or a READ
                              // whose response's second part comes back on it
  bool stripeLanded = false;  // a striped READ: that second part landed
  verbs::WcStatus error = verbs::WcStatus::kSuccess;  // set when the WR failed locally or remotely
  int rnrLeft = -1;                                   // RNR retries left (-1: not sent yet)
  Segments local;                                     // resolved local SGEs
};

struct RecvWqe {
  uint64_t wrId = 0;
  Sges sges;
};

// ---- objects ----
class SoftContext final : public verbs::ContextImpl, public std::enable_shared_from_this<SoftContext> {
 public:
  SoftContext(SoftDeviceInfo device);
  ~SoftContext() override;
  Status start();
  // start()'s steps: the TCP listener and the UDP socket on one port (returned); the same-host ring
  // listener (left out, with a warning, where it cannot open); the progress thread and what it
  // watches.
  Result<uint16_t> bindSockets();
  void openRingListener();
  Status startReactor();

  const verbs::DeviceInfo& info() const override { return device_.info; }
  Result<verbs::DeviceAttr> queryDevice() override;
  Result<verbs::PortAttr> queryPort(uint8_t portNum) override;
  Result<verbs::Gid> queryGid(uint8_t portNum, int index) override;
  Result<std::shared_ptr<verbs::PdImpl>> allocPd() override;
  Result<std::shared_ptr<verbs::CompChannelImpl>> createCompChannel() override;
  Result<std::shared_ptr<verbs::CqImpl>> createCq(int cqe, std::shared_ptr<verbs::CompChannelImpl> channel,
                                                  void* userContext) override;
  Result<verbs::AsyncEvent> getAsyncEvent(int timeoutMs) override;
  int asyncFd() const override { return asyncEvents_.fd(); }
  void close() override;

  bool closed() const { return closed_.load(); }
  Reactor& reactor() { return reactor_; }
  // The stripe thread (stripe.h): started on first use (loop only); null when it cannot start.
  Reactor* stripeReactorFromLoop();
  // For tests: this context behaves from now on as one whose stripe thread could not start (its QPs
  // open no stripes, and stripes it accepts are read on its progress thread). Refused once the thread
  // runs.
  Status withoutStripeThreadForTests();
  // FERRY_SOFT_CALLER_PROGRESS: whether posts and empty CQ polls run the loop on the caller's
  // thread when the progress thread is not running it.
  bool callerProgress() const { return callerProgress_; }
  // Rings the application polls (FERRY_SOFT_ATTEND_US). While it polls this device's CQs, the
  // context tells the producers of its rings not to wake its progress thread, and its polls take
  // their frames (a reactor poller); the thread runs that poller when the lease runs out
  // (Reactor::attendUntil), and so takes what is left.
  // A connection whose link the polls may take (Link::pollable: rings) joins when it attaches and
  // leaves when it detaches (loop only).
  void addAttendedLinkFromLoop(const std::shared_ptr<Conn>& conn);
  // An empty poll's run of the loop on the caller's thread (false when the thread runs it). With
  // vouches (the CQ is not armed), it renews the lease.
  bool progressFromPoll(bool vouches);
  // A thread about to sleep on a completion channel's fd sleeps on the loop's fds as well, and runs
  // the loop when they are ready (Reactor::waitHere, for one lease of attendNs_).
  Reactor::WaitHere waitFromChannel(int channelFd, int timeoutMs);
  void removeAttendedLinkFromLoop(const Conn* conn);
  // A responder's ACK, when the run is an application's poll under the lease: it is sent at the
  // start of the next run's pollers (the application's next poll of any of this device's CQs or
  // its next post's run, or the thread when the lease ends, as for a ring's frames), so the poll
  // that took the request returns first. False (send it now) in the thread's runs and without a
  // lease. Loop only.
  bool deferAckFromLoop(const std::weak_ptr<RcResponder>& responder);
  // The application is about to sleep (it arms a CQ): the lease ends now, the producers wake the
  // progress thread again, and what they left meanwhile is taken. Any thread.
  void stopAttending();
  std::shared_mutex& memMu() { return memMu_; }
  const verbs::Gid& gid() const { return gid_; }
  in_addr_t ipv4() const { return device_.ipv4; }
  // Queues an async event; past kMaxAsyncEvents unread ones, new events are dropped (and logged).
  void raiseAsync(verbs::AsyncEvent event);
  static constexpr size_t kMaxAsyncEvents = 4096;

  // Memory keys (called by SoftMr under an exclusive memMu_).
  uint32_t newKeyLocked();
  void addMrLocked(const std::shared_ptr<MrEntry>& entry) { mrs_[entry->key] = entry; }
  void removeMrLocked(uint32_t key) { mrs_.erase(key); }
  // Under a shared memMu_: the live region for key that belongs to pd, allows `need`, and holds
  // [addr, addr+len). nullptr otherwise.
  // With anyRange, only the key and PD are checked.
  std::shared_ptr<MrEntry> findMrLocked(uint32_t key, const void* pd, uint64_t addr, uint64_t len,
                                        uint32_t need, bool anyRange = false) const;
  // The same without taking a reference (a post's check on the same-host path): valid while the
  // memory lock is held.
  const MrEntry* findMrEntryLocked(uint32_t key, const void* pd, uint64_t addr, uint64_t len,
                                   uint32_t need) const;

  // QP table (RC and UD QPs share the number space).
  Result<uint32_t> addQp(const std::shared_ptr<SoftQp>& qp);
  Result<uint32_t> addUdQp(const std::shared_ptr<SoftUdQp>& qp);
  // The UDP socket is data for the callers' runs (Reactor::FdUse) while a UD QP reads it.
  void updateUdpFdUseFromLoop();
  void removeQp(uint32_t qpn);
  std::shared_ptr<SoftQp> findQp(uint32_t qpn);
  std::shared_ptr<SoftUdQp> findUdQp(uint32_t qpn);
  // The UDP socket for UD datagrams, bound to the same address and port as the listener.
  int udpFd() const { return udpFd_; }

  // The shared-memory rings (ring.h): whether this context accepts them (its listener is up), and
  // the nonce of the listener's abstract name.
  bool offersRings() const { return ringListenFd_ >= 0; }
  uint64_t ringNonce() const { return ringNonce_; }

  // The same-host path (share.h): the table this context publishes (nullptr when it offers
  // none), and the mapped table of a peer context, shared by the QPs that reach it.
  ShareTable* share() const { return share_.get(); }
  Result<std::shared_ptr<SharePeer>> sharePeer(const ShareInfo& info);
  // The second copying thread for large same-host requests of this context's QPs.
  CopyHelper& copyHelper() { return copyHelper_; }

 private:
  Result<uint32_t> allocQpnLocked();
  void onAcceptFromLoop();
  void onRingAcceptFromLoop();
  // The setup message of an accepted ring connection (true when done: adopted or refused).
  bool onRingSetupFromLoop(int fd);
  // A new ticket for a kUseRing reply (0 when none can be given: the table is full of live
  // tickets, or no random bytes), and the listener's check of one (each admits once, in time).
  uint64_t issueRingTicketFromLoop();
  bool admitRingTicketFromLoop(uint64_t ticket);
  // A new connection waits for its hello (dropped if none comes in time).
  void awaitHelloFromLoop(const std::shared_ptr<Conn>& conn);
  void onDatagramsFromLoop();
  // The attended rings (loop only): a caller's poll renews the lease and takes what the rings hold.
  bool attendFromLoop(bool vouches);
  // Whether a link held frames. firstOnly: stop at the first link that held some (a caller's
  // poll), the next such poll starting at the link after it.
  bool pollAttendedLinksFromLoop(bool firstOnly = false);
  void endLeaseFromLoop();
  void sendDeferredAcksFromLoop();
  void onHelloFromLoop(const std::shared_ptr<Conn>& conn, const wire::FrameHeader& hello);

  SoftDeviceInfo device_;
  Reactor reactor_;
  Reactor stripeReactor_;
  enum class StripeThread {
    kNotStarted,
    kRunning,
    kFailed
  } stripeThread_ = StripeThread::kNotStarted;  // loop only
  const bool callerProgress_ = config::softCallerProgress();
  const int64_t attendNs_ = callerProgress_ ? config::softAttendUs() * 1000 : 0;
  std::vector<std::weak_ptr<Conn>> attendedLinks_;  // loop only
  std::vector<std::shared_ptr<Conn>> linksPolled_;  // loop only: the links one poll goes through
  size_t linksPollStart_ = 0;  // loop only: where a caller's next poll of the links starts
  std::vector<std::weak_ptr<RcResponder>>
      deferredAcks_;  // loop only: responders whose ACK waits for the next run
  std::vector<std::weak_ptr<RcResponder>> acksSending_;  // loop only: the list being sent
  // steadyNs() until which the lease holds, 0 when ended; written in the loop only.
  std::atomic<int64_t> attendedUntilNs_{0};
  int listenFd_ = -1;
  int udpFd_ = -1;
  int ringListenFd_ = -1;  // AF_UNIX SOCK_SEQPACKET, abstract name ringListenerName(pid, ringNonce_)
  uint64_t ringNonce_ = 0;
  std::unordered_map<int, Reactor::TimerId> pendingRingSockets_;  // accepted, setup not read yet
  // One-time tickets given in kUseRing hello replies (reactor only): ticket -> when it expires.
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> ringTickets_;
  verbs::Gid gid_;
  std::atomic<bool> closed_{false};
  verbs::ChildList children_;
  EventQueue<verbs::AsyncEvent> asyncEvents_;

  mutable std::shared_mutex memMu_;
  std::unordered_map<uint32_t, std::shared_ptr<MrEntry>> mrs_;
  uint32_t keyGeneration_ = 0;

  std::mutex qpMu_;
  std::unordered_map<uint32_t, std::weak_ptr<SoftQp>> qps_;
  std::unordered_map<uint32_t, std::weak_ptr<SoftUdQp>> udQps_;
  uint32_t nextQpn_ = 0;

  // Accepted connections that have not said hello yet (reactor only).
  std::unordered_map<Conn*, std::shared_ptr<Conn>> pendingConns_;
  std::unique_ptr<HelloGate> gate_;

  std::unique_ptr<ShareTable> share_;
  CopyHelper copyHelper_;
  std::mutex peersMu_;
  std::vector<std::weak_ptr<SharePeer>> peers_;
};

class SoftPd final : public verbs::PdImpl, public std::enable_shared_from_this<SoftPd> {
 public:
  explicit SoftPd(std::shared_ptr<SoftContext> ctx) : ctx_(std::move(ctx)) {}
  Result<std::shared_ptr<verbs::MrImpl>> registerMemory(void* addr, size_t length, uint32_t access) override;
  // Device memory is staged through host buffers (region_copy.h) and kept out of the share table:
  // a same-host peer cannot reach it through this process's address space.
  Result<std::shared_ptr<verbs::MrImpl>> registerDeviceMemory(void* addr, size_t length, uint32_t access,
                                                              MemoryLocation where) override;
  Result<std::shared_ptr<verbs::QpImpl>> createQp(const verbs::QpInitImpl& init) override;
  Result<std::shared_ptr<verbs::SrqImpl>> createSrq(const verbs::SrqInit& init) override;
  Result<std::shared_ptr<verbs::AhImpl>> createAh(const verbs::AhAttr& attr) override;
  void close() override;
  bool closed() const { return closed_.load(); }
  const std::shared_ptr<SoftContext>& ctx() const { return ctx_; }
  // The live address handle of this PD with that id (AddressHandle::id()), or nullptr.
  std::shared_ptr<SoftAh> findAh(const void* id);

 private:
  Result<std::shared_ptr<verbs::MrImpl>> registerAt(void* addr, size_t length, uint32_t access,
                                                    MemoryLocation where);

  std::shared_ptr<SoftContext> ctx_;
  std::atomic<bool> closed_{false};
  verbs::ChildList children_;
  std::mutex ahMu_;
  std::unordered_map<const void*, std::weak_ptr<SoftAh>> ahs_;
};

// An address handle: a soft GID (address and port of a peer context) plus the attributes given.
class SoftAh final : public verbs::AhImpl {
 public:
  SoftAh(const void* pd, verbs::AhAttr attr, in_addr_t ipv4, uint16_t port, bool multicast = false)
      : pd_(pd), attr_(attr), ipv4_(ipv4), port_(port), multicast_(multicast) {}
  verbs::AhAttr attr() const override { return attr_; }
  void close() override { closed_ = true; }
  bool closed() const { return closed_.load(); }
  const void* pd() const { return pd_; }
  in_addr_t ipv4() const { return ipv4_; }
  uint16_t port() const { return port_; }
  // A multicast group's GID (attr().dgid): sends go to its members (mcast.h).
  bool multicast() const { return multicast_; }

 private:
  const void* pd_;
  verbs::AhAttr attr_;
  in_addr_t ipv4_;
  uint16_t port_;
  bool multicast_;
  std::atomic<bool> closed_{false};
};

class SoftMr final : public verbs::MrImpl {
 public:
  SoftMr(std::shared_ptr<SoftContext> ctx, std::shared_ptr<MrEntry> entry)
      : ctx_(std::move(ctx)), entry_(std::move(entry)) {}
  void* addr() const override;
  size_t length() const override;
  uint32_t lkey() const override;
  uint32_t rkey() const override;
  uint32_t access() const override;
  MemoryLocation location() const override;
  Status reregister(uint32_t flags, const std::shared_ptr<verbs::PdImpl>& pd, void* addr, size_t length,
                    uint32_t access) override;
  void close() override;

 private:
  std::shared_ptr<SoftContext> ctx_;
  mutable std::mutex mu_;
  std::shared_ptr<MrEntry> entry_;  // nullptr once closed
};

class SoftCompChannel final : public verbs::CompChannelImpl {
 public:
  explicit SoftCompChannel(std::weak_ptr<SoftContext> ctx) : ctx_(std::move(ctx)) {}
  int fd() const override { return events_.fd(); }
  // Waits for an event. With progress in the caller, the waiting thread sleeps on its context's
  // connections too and takes their frames itself (Reactor::waitHere), for one lease
  // (FERRY_SOFT_ATTEND_US); then it leaves them to the progress thread and sleeps on the channel
  // alone. A frame that completes a request then wakes one thread, not the progress thread and
  // then the application's.
  Result<verbs::CqEvent> getEvent(int timeoutMs) override;
  void close() override { closed_ = true; }
  void notify(verbs::CqEvent event) {
    if (!closed_) events_.push(event);
  }

 private:
  std::weak_ptr<SoftContext> ctx_;
  std::atomic<bool> closed_{false};
  EventQueue<verbs::CqEvent> events_;
};

class SoftCq final : public verbs::CqImpl {
 public:
  SoftCq(std::shared_ptr<SoftContext> ctx, int cqe, std::shared_ptr<SoftCompChannel> channel,
         void* userContext)
      : ctx_(std::move(ctx)), capacity_(cqe), channel_(std::move(channel)), userContext_(userContext) {}
  Result<int> poll(std::span<verbs::WorkCompletion> out) override;
  Status reqNotify(bool solicitedOnly) override;
  Status resize(int cqe) override;
  int cqe() const override;
  void* userContext() const override { return userContext_; }
  void close() override { closed_ = true; }
  bool closed() const { return closed_.load(); }
  const SoftContext* context() const { return ctx_.get(); }
  // Adds a completion (reactor thread). solicited: a receive of a solicited message.
  void push(const verbs::WorkCompletion& wc, bool solicited);
  // The same for a send whose send-queue slots (its own and those of the unsignaled sends before
  // it) are given back when the completion is polled: `slots` is subtracted from *held then, as a
  // NIC's driver frees send-queue entries when it polls their completion.
  void push(const verbs::WorkCompletion& wc, bool solicited, std::shared_ptr<std::atomic<uint32_t>> held,
            uint32_t slots);

 private:
  struct Entry {
    verbs::WorkCompletion wc;
    std::shared_ptr<std::atomic<uint32_t>> held;  // the send queue's count of held slots, or null
    uint32_t slots = 0;
  };
  std::shared_ptr<SoftContext> ctx_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;
  int capacity_;
  bool overflowed_ = false;
  // Written under mu_, read without it by a poll: whether entries_ holds completions or the CQ
  // overflowed (a poll that finds neither takes no lock), and whether it is armed (0 not armed, 1
  // next completion, 2 next solicited or error completion).
  std::atomic<bool> maybeReady_{false};
  std::atomic<int> armed_{0};
  std::shared_ptr<SoftCompChannel> channel_;
  void* userContext_;
  std::atomic<bool> closed_{false};
};

class SoftSrq final : public verbs::SrqImpl {
 public:
  SoftSrq(std::shared_ptr<SoftContext> ctx, const void* pd, verbs::SrqInit init)
      : ctx_(std::move(ctx)), pd_(pd), init_(init) {}
  // Without mu_: maxSge is set once; armLimit() writes only init_.srqLimit.
  uint32_t maxSge() const override { return init_.maxSge; }
  Status postRecv(std::span<const verbs::RecvWr> wrs, size_t* badIndex) override;
  Status armLimit(uint32_t limit) override;
  Result<verbs::SrqInit> query() override;
  void close() override { closed_ = true; }
  const void* pd() const { return pd_; }
  // Takes the oldest receive (reactor thread); false when none is posted.
  bool take(RecvWqe* out);
  // Puts back a receive that a message failed to fill (reactor thread).
  void giveBack(RecvWqe wqe);

 private:
  std::shared_ptr<SoftContext> ctx_;
  const void* pd_;
  std::mutex mu_;
  verbs::SrqInit init_;
  bool limitArmed_ = false;
  std::deque<RecvWqe> queue_;
  std::atomic<bool> closed_{false};
};

}  // namespace ferry::soft
