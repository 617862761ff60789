// What the connector's files share: one operation's state (Operation::State) and the connector's
// implementation (Connector::Impl), whose methods live in the files named at each group below.
//
// Threads: the protocol runs on the agent's thread: its messages arrive there, and batch
// completions (which run under their endpoint's lock) are posted to it. Impl::mu guards every
// operation's state and the tables; it is never held while calling the agent's register/unregister
// (which may wait for a device) or while completing an operation's future. One more thread, the
// expiry clock, sleeps until the next metadata expiry and posts it to the agent's thread.
//
// Every wait ends (docs/connect.md, "Every wait ends"): an operation ends when its transfer ends,
// when its peer's connection ends (closed(): a peer that died or went silent for the agent's
// peerTimeout), when it is cancelled or the connector shuts down, and, for one that no peer began,
// when its metadata expires: an owner's operation still INITIALIZED at `expires`, and a reader's or
// writer's whose owner had not answered STARTED by then (its BEGIN never arrived).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "connect/protocol.h"
#include "ferry/connect/connector.h"
#include "ferry/endpoint/endpoint.h"

namespace ferry::connect {

namespace ep = ferry::endpoint;
using Clock = std::chrono::steady_clock;

inline constexpr const char* kChannel = "connect";
inline constexpr uint64_t kMaxExactId = (uint64_t{1} << 53) - 1;
inline constexpr size_t kMaxPiecesPerBatch = 256;

inline int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline Message messageOf(MessageType type, uint64_t id) {
  Message m;
  m.type = type;
  m.id = id;
  return m;
}

inline const char* kindVerb(OperationKind k) { return k == OperationKind::kRead ? "read" : "write"; }

// ---------------------------------------------------------------------------------------------
// One operation's state, shared by the user's handle and the connector's tables.

struct Operation::State {
  std::weak_ptr<Connector::Impl> connector;
  uint64_t id = 0;
  OperationKind kind = OperationKind::kRead;
  bool passive = false;
  std::shared_ptr<Completion> done = std::make_shared<Completion>();
  std::atomic<uint64_t> bytes{0};

  // ---- guarded by Impl::mu ----
  OperationStatus status = OperationStatus::kUninitialized;
  Status error = Status(StatusCode::kBusy, "the operation is running");
  bool ended = false;
  std::vector<Buffer> buffers;
  std::vector<std::string> regions;  // the agent regions of this operation's buffers
  uint64_t total = 0;                // bytes of all buffers
  Metadata metadata;                 // passive: as issued; active: as received
  std::string metadataText;          // passive
  // The peer: the connection, its uuid, and its operation id (the active side's id, for an owner).
  std::shared_ptr<agent::PeerConnection> peer;
  std::string peerUuid;
  std::string peerAlias;
  uint64_t peerOp = 0;
  // Owner's transfer.
  std::shared_ptr<ep::Endpoint> endpoint;
  std::vector<ep::MrHandle> local, remote;
  size_t cursorDescriptor = 0;
  uint64_t cursorOffset = 0;
  uint32_t inflight = 0;
  bool stopping = false;
  bool peerCancelled = false;
  Status stopReason;
  // Active side.
  bool beginSent = false;
  bool started = false;         // the owner answered STARTED (or DONE)
  Clock::time_point expiryDue;  // its place on the expiry clock (Impl::clockMu)
  bool cancelling = false;      // cancel() waits for the owner to stop
  bool ownerStopped = false;
};

// ---------------------------------------------------------------------------------------------

struct Connector::Impl : std::enable_shared_from_this<Connector::Impl> {
  using OpPtr = std::shared_ptr<Operation::State>;

  ConnectorOptions opts;
  std::shared_ptr<agent::Agent> agent;
  std::string key;  // the tag key: 32 random bytes that never leave this process
  std::string nameSpace;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<uint64_t, OpPtr> passive, active;
  struct Ended {
    int64_t expires = 0;
    OperationStatus status = OperationStatus::kComplete;
  };
  // The expiry clock: operations to end at their metadata's expiry, by (due time, operation id);
  // finish() takes an operation off.
  std::mutex clockMu;
  std::condition_variable clockCv;
  std::map<std::pair<Clock::time_point, uint64_t>, std::weak_ptr<Operation::State>> expiries;
  bool clockStop = false;
  std::thread clock;
  std::unordered_map<uint64_t, Ended> ended;  // passive operations that ended, until their expiry
  size_t sweepAt = 1024;
  std::set<std::string> watched;  // peer uuids whose connection end is watched
  std::mt19937_64 rng{std::random_device{}()};
  ConnectorStats stats;
  bool shut = false;

  // ---- connector.cc: the connector's life, its messages, how an operation ends ----
  ~Impl();
  uint64_t newIdLocked();
  Status checkBuffers(const std::vector<Buffer>& bufs, bool written, const char* what) const;
  // Registers the buffers as private agent regions (never published, never answered to a query).
  Status registerBuffers(const OpPtr& op, ep::RegionOptions base);
  // Ends an operation once: revokes its memory, then completes its future. Returns false when it
  // had ended already. Not with mu held.
  bool finish(const OpPtr& op, OperationStatus status, Status why);
  // Fails every operation with a peer whose connection ended.
  void peerClosed(const std::string& uuid, const Status& why);
  // Watches a peer's connection once per connection (mu held).
  void watchLocked(const std::shared_ptr<agent::PeerConnection>& peer, const std::string& uuid);
  // On the agent's thread, as are the handlers it calls (onBegin, onStarted, onDone, onCancel).
  void onMessage(const std::shared_ptr<agent::PeerConnection>& from, std::string_view body);
  void shutdown();

  // ---- owner_operations.cc: create_readable / create_writable, a peer's BEGIN and CANCEL ----
  Result<std::shared_ptr<Operation>> create(OperationKind kind, std::vector<Buffer> bufs);
  void sweepLocked();
  void refuse(const std::shared_ptr<agent::PeerConnection>& from, uint64_t id, const Status& why);
  void onBegin(const std::shared_ptr<agent::PeerConnection>& from, const Message& m);
  Status checkBeginTag(const Metadata& md) const;
  Result<OpPtr> beginTargetLocked(const std::shared_ptr<agent::PeerConnection>& from, const Message& m);
  Status exposePeerBuffersLocked(const OpPtr& op, const std::shared_ptr<agent::PeerConnection>& from,
                                 const Message& m, const std::shared_ptr<ep::Endpoint>& endpoint,
                                 std::vector<ep::MrHandle>& local, std::vector<ep::MrHandle>& remote);
  void onCancel(const std::shared_ptr<agent::PeerConnection>& from, const Message& m);

  // ---- chunk_pump.cc: the owner's transfer, in batches within the window ----
  // A batch's failure, naming the peer (a dead reader or writer is most often seen here first: its
  // links close, and the batches in flight fail before the agent reports it gone).
  static Status transferFailed(const OpPtr& op, const Status& st);
  // Posts batches while the window has room; ends the operation when everything landed.
  void pumpLocked(const OpPtr& op, std::unique_lock<std::mutex>& lock);
  void batchDone(const OpPtr& op, uint64_t bytes, const Status& st);

  // ---- begin_operations.cc: begin_read and begin_write (reader and writer side) ----
  Result<std::shared_ptr<Operation>> begin(OperationKind kind, std::string_view text,
                                           std::vector<Buffer> bufs);
  Status checkBeginMetadata(const char* what, OperationKind kind, const Metadata& md,
                            const std::vector<Buffer>& bufs) const;
  void sendBeginWhenReady(const OpPtr& op, const std::shared_ptr<agent::PeerConnection>& conn);
  // An active operation's connection is ready (or failed): send BEGIN.
  void sendBegin(const OpPtr& op, const Status& ready);
  void onStarted(const std::shared_ptr<agent::PeerConnection>& from, const Message& m);
  void onDone(const std::shared_ptr<agent::PeerConnection>& from, const Message& m);

  // ---- expiry.cc: the expiry clock, and what a metadata expiry ends ----
  void startClock();
  void stopClock();
  // Ends op at `expiresMs` (ms since the epoch, the metadata's clock) plus `slack` unless it has
  // ended or begun by then (expire()).
  void expireAt(const OpPtr& op, int64_t expiresMs, std::chrono::milliseconds slack);
  // The clock's thread: sleeps until the next expiry, then hands the operations due to the
  // agent's thread (the protocol's).
  void clockLoop();
  // An operation's metadata expired: it ends ERRORED (kTimedOut) if no peer began it. One that
  // runs goes on: the metadata grants a begin until it expires, not a transfer's end.
  void expire(const OpPtr& op);

  // ---- cancel.cc: cancelling an operation, on either side ----
  void cancel(const OpPtr& op);
};

}  // namespace ferry::connect
