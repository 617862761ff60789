// What the endpoint's files share beside endpoint.h: how work requests are numbered and messages
// cut into fragments, and the types behind Endpoint's private declarations.
//
// Endpoint's jobs, one file each: endpoint.cc (creation, the worker, failure, shutdown, counters),
// regions.cc (local regions through the pool; the table of the peer's regions), connection.cc
// (metadata and connect()), operations.cc (checking and issuing operations), posting.cc (cutting
// them into work requests on the queue pairs), completions.cc (taking the completion queue: by the
// worker or by waiters that poll, send completions, the liveness probe), receives.cc (messages and
// immediates: receives kept posted, fragments matched to recv(), immediates to immRecv()).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "endpoint/metadata.h"
#include "endpoint/op_state.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/endpoint.h"
#include "ferry/verbs/verbs.h"

namespace ferry::endpoint {

// Receive work requests carry this bit in their wrId (send work requests carry their sequence).
inline constexpr uint64_t kRecvWrFlag = uint64_t{1} << 63;
// A message travels as SEND_WITH_IMM fragments; the immediate holds the message number (31 bits)
// and whether the fragment is the message's last.
inline constexpr uint32_t kLastFragment = uint32_t{1} << 31;
inline constexpr uint32_t kMessageSeqMask = kLastFragment - 1;
// A send work request is signaled at least this often (and the last of every post).
inline constexpr uint32_t kSignalEvery = 16;
inline constexpr uint32_t kMaxSendSge = 8;
inline constexpr uint32_t kQpAccess =
    verbs::access::kLocalWrite | verbs::access::kRemoteWrite | verbs::access::kRemoteRead;

// The status a failed work completion gives its operation and the endpoint (completions.cc).
// peerGone: report a queue pair that gave up on the peer, and the work flushed after it, as
// kPeerGone (EndpointOptions::transportFailureIsPeerGone).
Status workCompletionStatus(const verbs::WorkCompletion& wc, size_t qpIndex, const Status& failure,
                            bool peerGone);

// One queue pair of an endpoint with its bookkeeping (endpoint_qp.h).
struct EndpointQp;

// The endpoint's state behind its public handle (Endpoint, endpoint.h): every public call of
// Endpoint is this class's call of the same name. Internal to the endpoint layer: its files and
// the worker use its members directly.
class EndpointImpl final : public Endpoint, public Progressor {
 public:
  EndpointImpl(std::shared_ptr<MemoryPool> pool, EndpointOptions options);
  ~EndpointImpl() override;

  // ---- The public calls (endpoint.h says what each does). ----
  Result<MrHandle> registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                        RegionOptions options);
  Result<MrHandle> registerMemoryRegion(uint64_t key, void* addr, uint64_t length, RegionOptions options);
  Result<MrHandle> registerRemoteMemoryRegion(std::string_view name, std::string_view mrInfoJson);
  Status unregisterRemoteMemoryRegion(MrHandle handle);
  Result<MrHandle> localHandle(std::string_view name) const;
  Result<MrHandle> remoteHandle(std::string_view name) const;
  std::string endpointInfo() const;
  json::Value endpointInfoValue() const;  // what endpointInfo() prints
  std::string mrInfo() const;
  Status connect(std::string_view peerInfo);
  Status connect(const json::Value& peerInfo);  // the same from a parsed value
  // connect()'s work once the peer's metadata is decoded.
  Status connectTo(EndpointMetadata peer);
  // Brings qp to RTS against the peer's published path for it (mu_ held).
  Status establishQp(EndpointQp& qp, verbs::Path peerPath);
  bool connected() const;
  Result<ReadWriteFuture> read(std::span<const Assignment> batch);
  Result<ReadWriteFuture> write(std::span<const Assignment> batch);
  Result<ReadWriteFuture> writeWithImm(std::span<const Assignment> batch, uint32_t immData);
  Result<SendFuture> send(std::span<const Chunk> chunks);
  Result<RecvFuture> recv(std::span<const Chunk> chunks);
  Result<ImmRecvFuture> immRecv();
  void shutdown();
  void shutdown(const Status& why);
  bool isShutdown() const;
  std::shared_ptr<Worker> worker() const;
  Status failure() const;
  EndpointStats stats() const;

  // This endpoint, as the worker and the progressors hold it.
  std::shared_ptr<EndpointImpl> self() { return std::static_pointer_cast<EndpointImpl>(shared_from_this()); }

  struct RemoteRegion {
    std::string name;
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t rkey = 0;
    bool writable = true;
  };
  struct Fragment;
  struct IncomingMessage;
  enum class State : uint8_t { kIdle, kConnected, kFailed, kShutdown };

  Status init();

  // Submission (caller's thread).
  Result<std::shared_ptr<OpState>> resolveTransfers(OpKind kind, std::span<const Assignment> batch);
  Result<std::shared_ptr<OpState>> resolvePieces(OpKind kind, std::span<const Chunk> chunks);
  Status submit(const std::shared_ptr<OpState>& op);

  // Posting (under mu_).
  void pumpLocked();
  bool postTransfersLocked(OpState& op, const std::shared_ptr<OpState>& ref);
  bool postMessageLocked(OpState& op, const std::shared_ptr<OpState>& ref);
  int pickQpLocked();
  void flushLocked();
  void finishIfDoneLocked(const std::shared_ptr<OpState>& op);

  // A new operation of this endpoint: tracked in its metrics, progressed by its waiters.
  std::shared_ptr<OpState> newOp(OpKind kind);
  // Progressor: a waiting thread takes the completions there are (unless another thread is at it).
  void progressOnce() override;
  // Progressor: while waiters poll, and for FERRY_WAIT_LEASE_US after one stopped with its
  // operation done, the worker leaves the CQ unarmed (the pollers take its completions, and an
  // armed CQ would wake the worker for each); a waiter that sleeps, or a callback that waits,
  // has it armed again at once.
  void pollBegins() override;
  void pollEnds(bool operationDone) override;
  void watchBegins(bool mayBlock) override;
  void watchEnds() override;
  // Whether the worker leaves the CQ unarmed now (pollers attend to it). `nowNs`: steadyNs().
  bool pollersAttend(int64_t nowNs) const;
  // When the worker must look at an endpoint whose CQ it left unarmed (steadyNs()), or nullopt
  // when the CQ is armed.
  std::optional<int64_t> unarmedDueNs(int64_t nowNs) const;
  // Under mu_: arms the CQ left unarmed (and takes what came meanwhile).
  void rearmLocked();
  // How drainCompletionsLocked() takes the CQ: until it is empty; until it is empty and armed
  // (armed, then polled once more); or, as a shutdown begins, only the successful completions
  // already there, in a bounded number of rounds, so that what completed is delivered first.
  enum class Drain { kTake, kTakeAndArm, kSuccessesBeforeShutdown };
  // Takes the CQ's completions as `mode` says; false when the endpoint failed or was shut down
  // meanwhile.
  bool drainCompletionsLocked(Drain mode);

  // Worker side (worker thread, or the caller of Worker::addEndpoint).
  Status moveToWorker(std::shared_ptr<Worker> worker);
  void progressFromWorker();
  void probeFromWorker();
  bool wantsProbe() const { return wantsProbe_.load(std::memory_order_relaxed); }
  void updateProbeLocked();
  void handleCompletionLocked(const verbs::WorkCompletion& wc);
  void handleSendCompletionLocked(EndpointQp& qp, const verbs::WorkCompletion& wc);
  void handleRecvCompletionLocked(EndpointQp& qp, const verbs::WorkCompletion& wc);
  void deliverFragmentLocked(uint64_t seq, bool last, const uint8_t* data, uint32_t length, uint32_t buffer);
  void copyIntoRecvLocked(OpState& op, const uint8_t* data, uint64_t length);
  void finishRecvLocked(const std::shared_ptr<OpState>& op);
  void matchImmediatesLocked();
  void repostLocked(uint32_t buffer);
  void failLocked(const Status& why);
  Status notUsableLocked() const;

  const EndpointOptions options_;
  const std::shared_ptr<MemoryPool> pool_;
  const std::shared_ptr<RdmaContext> context_;
  std::shared_ptr<Worker> worker_;
  const std::shared_ptr<Metrics> metrics_ = std::make_shared<Metrics>(opKindNames());

  // Set once by create(): the endpoint itself, as the progressor of its operations.
  std::weak_ptr<Progressor> self_;
  // Set once by init(): never change afterwards.
  verbs::CompletionChannel channel_;
  verbs::CompletionQueue cq_;
  std::vector<std::unique_ptr<EndpointQp>> qps_;
  std::unique_ptr<uint8_t[], void (*)(void*)> recvSlab_{nullptr, nullptr};
  verbs::MemoryRegion recvMr_;
  uint32_t maxSendSge_ = 1;

  mutable std::mutex mu_;
  State state_ = State::kIdle;
  Status failure_;
  uint32_t peerRecvBufferSize_ = 0;
  std::deque<std::shared_ptr<OpState>> queue_;                // accepted, not fully posted, in issue order
  size_t rr_ = 0;                                             // next queue pair to try for a transfer piece
  uint64_t sendSeq_ = 0;                                      // next message number of send()
  uint64_t recvSeq_ = 0;                                      // next message number of recv()
  std::map<uint64_t, std::shared_ptr<OpState>> recvWaiting_;  // recv()s whose message is not complete
  std::map<uint64_t, IncomingMessage> incoming_;              // messages ahead of their recv()
  uint64_t unexpectedBytes_ = 0;
  std::deque<std::shared_ptr<OpState>> immWaiting_;
  std::deque<uint32_t> immArrived_;
  std::atomic<bool> wantsProbe_{false};  // a recv()/immRecv() waits on a connected endpoint
  // The CQ's arming (see pollBegins()). Written under mu_ (unarmed_) or by waiters (the rest).
  std::atomic<bool> unarmed_{false};      // the worker left the CQ unarmed: pollers take it
  std::atomic<int> pollers_{0};           // waiters inside their poll
  std::atomic<int> watchers_{0};          // sleeping waiters and callbacks that need the worker
  std::atomic<int64_t> leaseUntilNs_{0};  // pollers vouch for the CQ until then (steadyNs())
  bool peerSeen_ = false;  // the peer answered once: probing it cannot fail a peer still connecting
  uint64_t workerWakeups_ = 0;

  mutable std::shared_mutex remoteMu_;
  std::unordered_map<MrHandle, RemoteRegion> remotes_;
  std::unordered_map<std::string, MrHandle> remoteNames_;
  MrHandle nextRemote_ = MrHandle{1} << 32;
  // Records a peer region under remoteMu_ (held exclusively): a name seen before keeps its handle,
  // else the peer's own handle when free here, else a fresh one. Returns the handle.
  MrHandle recordRemoteLocked(RemoteRegion region, std::optional<MrHandle> wanted);
};

struct EndpointImpl::Fragment {
  std::vector<uint8_t> copy;  // the bytes, copied aside
  int64_t buffer = -1;        // or the receive buffer still holding them
  uint32_t length = 0;
};

struct EndpointImpl::IncomingMessage {
  std::deque<Fragment> fragments;
  bool complete = false;
};

}  // namespace ferry::endpoint
