// Connector (connector.h): readable and writable operations, moved by their owner.
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
#include "ferry/connect/connector.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "agent/crypto.h"
#include "common/json.h"
#include "common/log.h"
#include "connect/protocol.h"
#include "ferry/endpoint/endpoint.h"

namespace ferry::connect {

namespace ep = ferry::endpoint;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kChannel = "connect";
constexpr uint64_t kMaxExactId = (uint64_t{1} << 53) - 1;
constexpr size_t kMaxPiecesPerBatch = 256;

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Message messageOf(MessageType type, uint64_t id) {
  Message m;
  m.type = type;
  m.id = id;
  return m;
}

const char* kindVerb(OperationKind k) { return k == OperationKind::kRead ? "read" : "write"; }

}  // namespace

const char* operationStatusName(OperationStatus s) {
  switch (s) {
    case OperationStatus::kUninitialized: return "UNINITIALIZED";
    case OperationStatus::kInitialized: return "INITIALIZED";
    case OperationStatus::kInProgress: return "IN_PROGRESS";
    case OperationStatus::kComplete: return "COMPLETE";
    case OperationStatus::kCancelled: return "CANCELLED";
    case OperationStatus::kErrored: return "ERRORED";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// One operation's state, shared by the user's handle and the connector's tables.

struct Operation::State {
  std::weak_ptr<Connector::Impl> connector;
  uint64_t id = 0;
  OperationKind kind = OperationKind::kRead;
  bool passive = false;
  std::shared_ptr<ep::OpState> done = std::make_shared<ep::OpState>(ep::OpKind::kSend);
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
  bool started = false;     // the owner answered STARTED (or DONE)
  Clock::time_point expiryDue;  // its place on the expiry clock (Impl::clockMu)
  bool cancelling = false;  // cancel() waits for the owner to stop
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

  // ---- any thread ----
  uint64_t newIdLocked() {
    std::uniform_int_distribution<uint64_t> dist(1, kMaxExactId);
    for (;;) {
      uint64_t id = dist(rng);
      if (!passive.count(id) && !active.count(id) && !ended.count(id)) return id;
    }
  }

  Status checkBuffers(const std::vector<Buffer>& bufs, bool written, const char* what) const {
    if (bufs.empty()) return invalidArgument(std::string(what) + ": no descriptor");
    if (bufs.size() > kMaxDescriptors) {
      return invalidArgument(std::string(what) + ": " + std::to_string(bufs.size()) + " descriptors (at most " +
                             std::to_string(kMaxDescriptors) + ")");
    }
    for (size_t i = 0; i < bufs.size(); ++i) {
      const Buffer& b = bufs[i];
      std::string which = std::string(what) + ": descriptor " + std::to_string(i);
      if (b.addr == nullptr) return invalidArgument(which + " has a null address");
      if (b.length == 0) return invalidArgument(which + " is empty");
      if (reinterpret_cast<uintptr_t>(b.addr) > UINTPTR_MAX - b.length) return invalidArgument(which + " overflows");
      if (written && b.readOnly) {
        return invalidArgument(which + " is read-only memory, and this operation writes into it");
      }
    }
    return Status::ok();
  }

  // Registers the buffers as private agent regions (never published, never answered to a query).
  Status registerBuffers(const OpPtr& op, ep::RegionOptions base) {
    std::vector<std::string> names;
    for (size_t i = 0; i < op->buffers.size(); ++i) {
      std::string name = "~connect." + std::to_string(op->id) + "." + std::to_string(i);
      ep::RegionOptions o = base;
      o.owner = op->buffers[i].owner;
      o.published = false;
      Status st = agent->registerMemoryRegion(name, op->buffers[i].addr, op->buffers[i].length, o);
      if (!st.isOk()) {
        for (const auto& n : names) (void)agent->unregisterMemoryRegion(n);
        return st;
      }
      names.push_back(std::move(name));
    }
    op->regions = std::move(names);
    return Status::ok();
  }

  // Ends an operation once: revokes its memory, then completes its future. Returns false when it
  // had ended already. Not with mu held.
  bool finish(const OpPtr& op, OperationStatus status, Status why) {
    std::vector<std::string> regions;
    std::shared_ptr<ep::Endpoint> endpoint;
    std::vector<ep::MrHandle> remote;
    std::shared_ptr<agent::PeerConnection> peer;
    uint64_t peerOp = 0;
    bool tellOwner = false, tellPeer = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (op->ended) return false;
      op->ended = true;
      op->status = status;
      op->error = why;
      regions.swap(op->regions);
      endpoint = op->endpoint;
      remote.swap(op->remote);
      peer = op->peer;
      peerOp = op->peerOp;
      if (op->passive) {
        passive.erase(op->id);
        ended[op->id] = Ended{.expires = op->metadata.expires, .status = status};
        tellPeer = peer != nullptr;  // the reader or writer waits for DONE
      } else {
        active.erase(op->id);
        // A reader or writer that stops before the owner answered tells it (the owner stops).
        tellOwner = op->beginSent && status != OperationStatus::kComplete && !op->ownerStopped &&
                    why.code() != StatusCode::kPeerGone;
      }
      if (status == OperationStatus::kComplete) ++stats.completed;
      else if (status == OperationStatus::kCancelled) ++stats.cancelled;
      else ++stats.errored;
    }
    {
      std::lock_guard<std::mutex> lock(clockMu);
      expiries.erase({op->expiryDue, op->id});
    }
    for (const auto& name : regions) (void)agent->unregisterMemoryRegion(name);
    if (endpoint) {
      for (auto h : remote) (void)endpoint->unregisterRemoteMemoryRegion(h);
    }
    if (tellPeer && why.code() != StatusCode::kPeerGone) {
      Message done = messageOf(MessageType::kDone, peerOp);
      done.code = why.code();
      if (status == OperationStatus::kCancelled) {
        done.code = StatusCode::kCancelled;
        done.reason = "the owner cancelled its " + std::string(op->kind == OperationKind::kRead ? "readable" : "writable") +
                      " operation";
      } else if (!why.isOk()) {
        done.reason = why.message();
      }
      (void)peer->sendMessage(kChannel, encodeMessage(done));
    }
    if (tellOwner) {
      Message cancel = messageOf(MessageType::kCancel, op->id);
      cancel.operation = op->metadata.operation;
      (void)peer->sendMessage(kChannel, encodeMessage(cancel));
    }
    op->done->complete(status == OperationStatus::kComplete ? Status::ok() : why, 0, op->bytes.load());
    cv.notify_all();
    return true;
  }

  // Fails every operation with a peer whose connection ended.
  void peerClosed(const std::string& uuid, const Status& why) {
    std::vector<OpPtr> hit;
    {
      std::lock_guard<std::mutex> lock(mu);
      watched.erase(uuid);
      for (auto* table : {&passive, &active}) {
        for (auto& [id, op] : *table) {
          if (op->peerUuid == uuid) hit.push_back(op);
        }
      }
    }
    for (auto& op : hit) {
      std::string who =
          "worker '" + (op->passive ? op->peerAlias + "' (which began it)" : op->metadata.worker + "'");
      finish(op, OperationStatus::kErrored,
             Status(StatusCode::kPeerGone, who + " is gone: " + why.message()));
    }
  }

  // ---- the expiry clock ----
  ~Impl() { stopClock(); }

  void startClock() {
    clock = std::thread([this] { clockLoop(); });
  }

  void stopClock() {
    {
      std::lock_guard<std::mutex> lock(clockMu);
      clockStop = true;
    }
    clockCv.notify_all();
    if (clock.joinable() && clock.get_id() != std::this_thread::get_id()) clock.join();
  }

  // Ends op at `expiresMs` (ms since the epoch, the metadata's clock) plus `slack` unless it has
  // ended or begun by then (expire()).
  void expireAt(const OpPtr& op, int64_t expiresMs, std::chrono::milliseconds slack) {
    auto due = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, expiresMs - nowMs())) + slack;
    bool first;
    {
      std::lock_guard<std::mutex> lock(clockMu);
      op->expiryDue = due;
      auto it = expiries.emplace(std::make_pair(due, op->id), op).first;
      first = it == expiries.begin();
    }
    if (first) clockCv.notify_all();
  }

  // The clock's thread: sleeps until the next expiry, then hands the operations due to the
  // agent's thread (the protocol's).
  void clockLoop() {
    std::unique_lock<std::mutex> lock(clockMu);
    while (!clockStop) {
      if (expiries.empty()) {
        clockCv.wait(lock);
        continue;
      }
      auto due = expiries.begin()->first.first;
      if (Clock::now() < due) {
        clockCv.wait_until(lock, due);
        continue;
      }
      std::vector<std::weak_ptr<Operation::State>> ops;
      while (!expiries.empty() && expiries.begin()->first.first <= Clock::now()) {
        ops.push_back(std::move(expiries.begin()->second));
        expiries.erase(expiries.begin());
      }
      lock.unlock();
      std::weak_ptr<Impl> weak = weak_from_this();
      agent->post([weak, ops = std::move(ops)] {
        auto self = weak.lock();
        if (!self) return;
        for (const auto& w : ops) {
          if (auto op = w.lock()) self->expire(op);
        }
      });
      lock.lock();
    }
  }

  // An operation's metadata expired: it ends ERRORED (kTimedOut) if no peer began it. One that
  // runs goes on: the metadata grants a begin until it expires, not a transfer's end.
  void expire(const OpPtr& op) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (op->ended) return;
      std::string id = std::to_string(op->metadata.operation);
      if (op->passive) {
        if (op->status != OperationStatus::kInitialized) return;
        why = "the metadata of " + std::string(op->kind == OperationKind::kRead ? "readable" : "writable") +
              " operation " + id + " expired (metadata_ttl " + std::to_string(opts.metadataTtl.count()) +
              " ms) before any peer began it";
      } else {
        if (op->started) return;
        why = "the metadata of operation " + id + " of worker '" + op->metadata.worker +
              "' expired before the owner began the " + kindVerb(op->kind) +
              (op->beginSent ? " (it did not answer the BEGIN)" : " (the connection to it was not ready)");
      }
    }
    finish(op, OperationStatus::kErrored, Status(StatusCode::kTimedOut, why));
  }

  // Watches a peer's connection once per connection (mu held).
  void watchLocked(const std::shared_ptr<agent::PeerConnection>& peer, const std::string& uuid) {
    if (uuid.empty() || !watched.insert(uuid).second) return;
    std::weak_ptr<Impl> weak = weak_from_this();
    peer->closed().state()->onDone([weak, uuid](const ep::OpState& d) {
      Status why = d.status();
      if (auto self = weak.lock()) self->agent->post([weak, uuid, why] {
          if (auto s = weak.lock()) s->peerClosed(uuid, why);
        });
    });
  }

  // ---- the loop thread ----
  void onMessage(const std::shared_ptr<agent::PeerConnection>& from, std::string_view body) {
    auto m = decodeMessage(body);
    if (!m.isOk()) {
      FERRY_LOG(kWarn, "connector '%s': refused a message from '%s': %s", agent->alias().c_str(),
                from->peerAlias().c_str(), m.status().toString().c_str());
      std::lock_guard<std::mutex> lock(mu);
      ++stats.refused;
      return;
    }
    switch (m->type) {
      case MessageType::kBegin: onBegin(from, *m); break;
      case MessageType::kStarted: onStarted(from, *m); break;
      case MessageType::kDone: onDone(from, *m); break;
      case MessageType::kCancel: onCancel(from, *m); break;
    }
  }

  void refuse(const std::shared_ptr<agent::PeerConnection>& from, uint64_t id, const Status& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.refused;
    }
    FERRY_LOG(kInfo, "connector '%s': refused a BEGIN from '%s': %s", agent->alias().c_str(),
              from->peerAlias().c_str(), why.toString().c_str());
    Message done = messageOf(MessageType::kDone, id);
    done.code = why.code();
    done.reason = why.message();
    (void)from->sendMessage(kChannel, encodeMessage(done));
  }

  void onBegin(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
    const Metadata& md = m.metadata;
    auto denied = [&](const std::string& why) { refuse(from, m.id, Status(StatusCode::kPermissionDenied, why)); };
    if (!agent::constantTimeEqual(md.tag, agent::hmacSha256Hex(key, canonicalText(md)))) {
      return denied("the metadata's tag does not match: the text was changed, or it is not from worker '" +
                    agent->alias() + "' (this life of it)");
    }
    // Expired first: an operation that no peer began ended at its expiry.
    if (nowMs() > md.expires) {
      return denied("the metadata of operation " + std::to_string(md.operation) + " expired " +
                    std::to_string(nowMs() - md.expires) + " ms ago");
    }
    std::unique_lock<std::mutex> lock(mu);
    auto it = passive.find(md.operation);
    if (it == passive.end()) {
      auto e = ended.find(md.operation);
      lock.unlock();
      if (e != ended.end()) {
        return denied("operation " + std::to_string(md.operation) + " of worker '" + agent->alias() +
                      "' has ended (" + operationStatusName(e->second.status) + "): its metadata was used once already");
      }
      return refuse(from, m.id, notFound("worker '" + agent->alias() + "' has no operation " + std::to_string(md.operation)));
    }
    OpPtr op = it->second;
    if (op->metadata.nonce != md.nonce) {
      lock.unlock();
      return denied("the metadata does not match operation " + std::to_string(md.operation));
    }
    if (op->status != OperationStatus::kInitialized) {
      lock.unlock();
      return refuse(from, m.id, Status(StatusCode::kBusy, "operation " + std::to_string(md.operation) +
                                                              " is already " + operationStatusName(op->status)));
    }
    for (size_t i = 0; i < m.buffers.size(); ++i) {
      if (m.buffers[i].length != op->buffers[i].length) {
        lock.unlock();
        return refuse(from, m.id, invalidArgument("descriptor " + std::to_string(i) + ": " +
                                                      std::to_string(m.buffers[i].length) + " bytes for " +
                                                      std::to_string(op->buffers[i].length)));
      }
    }
    if (Status failed = from->retireIfFailed(); !failed.isOk()) {
      lock.unlock();
      return refuse(from, m.id, failed);  // the peer's next operation wires up anew
    }
    auto endpoint = from->endpoint(agent::OpClass::kRma);
    if (!endpoint) {
      lock.unlock();
      return refuse(from, m.id, Status(StatusCode::kUnavailable, "no connection to the peer's endpoint"));
    }
    std::string prefix = "~connect." + from->peerUuid() + "." + std::to_string(m.id) + ".";
    std::vector<ep::MrHandle> local, remote;
    Status bad;
    for (size_t i = 0; i < m.buffers.size() && bad.isOk(); ++i) {
      json::Value info = json::Value::emptyObject();
      info.set("addr", static_cast<int64_t>(m.buffers[i].addr));
      info.set("length", static_cast<int64_t>(m.buffers[i].length));
      info.set("rkey", static_cast<int64_t>(m.buffers[i].rkey));
      info.set("writable", op->kind == OperationKind::kRead);
      auto r = endpoint->registerRemoteMemoryRegion(prefix + std::to_string(i), json::serialize(info));
      auto l = endpoint->localHandle(op->regions[i]);
      if (!r.isOk()) bad = r.status();
      else remote.push_back(*r);
      if (!l.isOk()) bad = l.status();
      else local.push_back(*l);
    }
    if (!bad.isOk()) {
      lock.unlock();
      for (auto h : remote) (void)endpoint->unregisterRemoteMemoryRegion(h);
      return refuse(from, m.id, bad);
    }
    op->status = OperationStatus::kInProgress;
    op->peer = from;
    op->peerUuid = from->peerUuid();
    op->peerAlias = from->peerAlias();
    op->peerOp = m.id;
    op->endpoint = endpoint;
    op->local = std::move(local);
    op->remote = std::move(remote);
    ++stats.served;
    watchLocked(from, op->peerUuid);
    // Before any DONE (the channel is ordered): the reader or writer stops watching the expiry.
    (void)from->sendMessage(kChannel, encodeMessage(messageOf(MessageType::kStarted, m.id)));
    pumpLocked(op, lock);
  }

  // A batch's failure, naming the peer (a dead reader or writer is most often seen here first: its
  // links close, and the batches in flight fail before the agent reports it gone).
  static Status transferFailed(const OpPtr& op, const Status& st) {
    return Status(st.code(), "the transfer " + std::string(op->kind == OperationKind::kRead ? "to" : "from") +
                                 " worker '" + op->peerAlias + "' failed: " + st.message());
  }

  // Posts batches while the window has room; ends the operation when everything landed.
  void pumpLocked(const OpPtr& op, std::unique_lock<std::mutex>& lock) {
    while (!op->ended && !op->stopping && op->inflight < opts.window &&
           op->cursorDescriptor < op->buffers.size()) {
      std::vector<ep::Assignment> batch;
      uint64_t bytes = 0;
      while (op->cursorDescriptor < op->buffers.size() && bytes < opts.chunkBytes &&
             batch.size() < kMaxPiecesPerBatch) {
        size_t i = op->cursorDescriptor;
        uint64_t n = std::min(op->buffers[i].length - op->cursorOffset, opts.chunkBytes - bytes);
        batch.push_back({.local = op->local[i], .remote = op->remote[i], .localOffset = op->cursorOffset,
                         .remoteOffset = op->cursorOffset, .length = n});
        bytes += n;
        op->cursorOffset += n;
        if (op->cursorOffset == op->buffers[i].length) {
          ++op->cursorDescriptor;
          op->cursorOffset = 0;
        }
      }
      // A readable's owner writes its bytes into the reader's buffers; a writable's reads the
      // writer's into its own.
      auto f = op->kind == OperationKind::kRead ? op->endpoint->write(batch) : op->endpoint->read(batch);
      if (!f.isOk()) {
        lock.unlock();
        finish(op, OperationStatus::kErrored, transferFailed(op, f.status()));
        lock.lock();
        return;
      }
      ++op->inflight;
      std::weak_ptr<Impl> weak = weak_from_this();
      f->state()->onDone([weak, op, bytes](const ep::OpState& d) {
        Status st = d.status();
        if (auto self = weak.lock()) self->agent->post([weak, op, bytes, st] {
            if (auto s = weak.lock()) s->batchDone(op, bytes, st);
          });
      });
    }
    if (!op->ended && op->inflight == 0 && (op->stopping || op->cursorDescriptor == op->buffers.size())) {
      bool stopped = op->stopping, byPeer = op->peerCancelled;
      Status why = op->stopReason;
      if (!stopped) stats.bytesMoved += op->total;
      lock.unlock();
      if (!stopped) {
        finish(op, OperationStatus::kComplete, Status::ok());
      } else if (byPeer) {
        finish(op, OperationStatus::kErrored, why);  // the peer's CANCEL
      } else {
        cv.notify_all();  // our own cancel() waits for this, then finishes the operation
      }
      lock.lock();
    }
  }

  void batchDone(const OpPtr& op, uint64_t bytes, const Status& st) {
    std::unique_lock<std::mutex> lock(mu);
    --op->inflight;
    if (op->ended) {
      lock.unlock();
      cv.notify_all();
      return;
    }
    if (!st.isOk()) {
      lock.unlock();
      finish(op, OperationStatus::kErrored, transferFailed(op, st));
      return;
    }
    op->bytes += bytes;
    pumpLocked(op, lock);
  }

  void onCancel(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
    std::unique_lock<std::mutex> lock(mu);
    auto it = passive.find(m.operation);
    if (it == passive.end()) return;  // ended already: DONE went out
    OpPtr op = it->second;
    if (op->peerOp != m.id || op->peerUuid != from->peerUuid()) return;  // not the peer that began it
    op->stopping = true;
    op->peerCancelled = true;  // pumpLocked ends the operation when its last batch is in
    op->stopReason = Status(StatusCode::kCancelled,
                            "the peer cancelled its " + std::string(kindVerb(op->kind)) + " operation");
    pumpLocked(op, lock);
  }

  void onStarted(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = active.find(m.id);
    if (it == active.end() || it->second->peerUuid != from->peerUuid()) return;
    it->second->started = true;
  }

  void onDone(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
    OpPtr op;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = active.find(m.id);
      if (it == active.end()) return;
      op = it->second;
      if (op->peerUuid != from->peerUuid()) return;  // not from the owner it was sent to
      op->started = true;
      if (op->cancelling && m.code != StatusCode::kOk) {
        op->ownerStopped = true;  // cancel() finishes it
        cv.notify_all();
        return;
      }
      op->ownerStopped = true;
    }
    if (m.code == StatusCode::kOk) {
      op->bytes = op->total;
      finish(op, OperationStatus::kComplete, Status::ok());
    } else {
      finish(op, OperationStatus::kErrored, Status(m.code, "worker '" + op->metadata.worker + "': " + m.reason));
    }
  }

  // An active operation's connection is ready (or failed): send BEGIN.
  void sendBegin(const OpPtr& op, const Status& ready) {
    std::unique_lock<std::mutex> lock(mu);
    if (op->ended) return;
    if (!ready.isOk()) {
      lock.unlock();
      finish(op, OperationStatus::kErrored,
             Status(ready.code(), "could not reach worker '" + op->metadata.worker + "': " + ready.message()));
      return;
    }
    auto endpoint = op->peer->endpoint(agent::OpClass::kRma);
    Message begin = messageOf(MessageType::kBegin, op->id);
    begin.metadata = op->metadata;
    Status bad = endpoint ? Status::ok() : Status(StatusCode::kUnavailable, "no endpoint to the owner");
    for (size_t i = 0; i < op->regions.size() && bad.isOk(); ++i) {
      auto h = endpoint->localHandle(op->regions[i]);
      auto info = h.isOk() ? endpoint->pool()->regionInfo(*h) : Result<std::string>(h.status());
      auto parsed = info.isOk() ? json::parse(*info) : Result<json::Value>(info.status());
      if (!parsed.isOk()) {
        bad = parsed.status();
        break;
      }
      auto num = [&](const char* k) -> uint64_t {
        const json::Value* v = parsed->find(k);
        auto i = v ? v->getInt() : Result<int64_t>(invalidArgument(""));
        return i.isOk() ? static_cast<uint64_t>(*i) : 0;
      };
      begin.buffers.push_back({.addr = num("addr"), .length = num("length"), .rkey = static_cast<uint32_t>(num("rkey"))});
    }
    if (bad.isOk()) {
      op->peerUuid = op->peer->peerUuid();
      bad = op->peer->sendMessage(kChannel, encodeMessage(begin));
    }
    if (!bad.isOk()) {
      lock.unlock();
      finish(op, OperationStatus::kErrored, Status(bad.code(), "could not begin: " + bad.message()));
      return;
    }
    op->beginSent = true;
    watchLocked(op->peer, op->peerUuid);
  }

  void sweepLocked() {
    if (ended.size() < sweepAt) return;
    int64_t now = nowMs();
    for (auto it = ended.begin(); it != ended.end();) {
      it = it->second.expires < now ? ended.erase(it) : std::next(it);
    }
    sweepAt = std::max<size_t>(1024, ended.size() * 2);
  }

  Result<std::shared_ptr<Operation>> create(OperationKind kind, std::vector<Buffer> bufs) {
    const char* what = kind == OperationKind::kRead ? "create_readable" : "create_writable";
    FERRY_RETURN_IF_ERROR(checkBuffers(bufs, kind == OperationKind::kWrite, what));
    auto op = std::make_shared<Operation::State>();
    op->connector = weak_from_this();
    op->kind = kind;
    op->passive = true;
    op->buffers = std::move(bufs);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (shut) return Status(StatusCode::kClosed, std::string(what) + ": the connector was shut down");
      op->id = newIdLocked();
      sweepLocked();
    }
    // The owner's memory is reached by its own device only: no remote access.
    ep::RegionOptions o;
    o.writable = kind == OperationKind::kWrite;
    o.remote = ep::RegionOptions::Remote::kNone;
    FERRY_RETURN_IF_ERROR(registerBuffers(op, o));
    Metadata& md = op->metadata;
    md.kind = kind;
    md.worker = agent->alias();
    md.address = agent->address();
    md.operation = op->id;
    {
      std::lock_guard<std::mutex> lock(mu);
      char raw[16];
      for (int i = 0; i < 16; i += 8) {
        uint64_t v = rng();
        std::memcpy(raw + i, &v, 8);
      }
      md.nonce = agent::hexOf(std::string_view(raw, 16));
    }
    md.expires = nowMs() + opts.metadataTtl.count();
    for (const auto& b : op->buffers) {
      md.descriptors.push_back({.size = b.length, .device = "cpu"});
      op->total += b.length;
    }
    md.tag = agent::hmacSha256Hex(key, canonicalText(md));
    op->metadataText = encodeMetadata(md);
    {
      std::lock_guard<std::mutex> lock(mu);
      op->status = OperationStatus::kInitialized;
      passive[op->id] = op;
      ++stats.created;
    }
    // One millisecond late: the owner accepts a BEGIN until now > expires.
    expireAt(op, md.expires, std::chrono::milliseconds(1));
    return std::make_shared<Operation>(op);
  }

  Result<std::shared_ptr<Operation>> begin(OperationKind kind, std::string_view text, std::vector<Buffer> bufs) {
    const char* what = kind == OperationKind::kRead ? "begin_read" : "begin_write";
    auto decoded = decodeMetadata(text);
    if (!decoded.isOk()) return invalidArgument(std::string(what) + ": " + decoded.status().message());
    Metadata& md = *decoded;
    if (md.kind != kind) {
      return invalidArgument(std::string(what) + ": the metadata is of a " +
                             (md.kind == OperationKind::kRead ? "readable" : "writable") + " operation (use " +
                             (md.kind == OperationKind::kRead ? "begin_read" : "begin_write") + ")");
    }
    FERRY_RETURN_IF_ERROR(checkBuffers(bufs, kind == OperationKind::kRead, what));
    if (bufs.size() != md.descriptors.size()) {
      return invalidArgument(std::string(what) + ": " + std::to_string(bufs.size()) + " local descriptors for " +
                             std::to_string(md.descriptors.size()) + " remote ones");
    }
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (md.descriptors[i].device.rfind("cuda", 0) == 0) {
        return invalidArgument(std::string(what) + ": remote descriptor " + std::to_string(i) + " is on " +
                               md.descriptors[i].device + " (this ferry moves host memory only)");
      }
      if (bufs[i].length != md.descriptors[i].size) {
        return invalidArgument(std::string(what) + ": descriptor " + std::to_string(i) + " has " +
                               std::to_string(bufs[i].length) + " bytes, the remote one " +
                               std::to_string(md.descriptors[i].size));
      }
    }
    if (nowMs() > md.expires) {
      return invalidArgument(std::string(what) + ": the metadata expired " + std::to_string(nowMs() - md.expires) +
                             " ms ago");
    }
    auto owner = agent::WorkerAddress::decode(md.address);
    if (!owner.isOk()) return invalidArgument(std::string(what) + ": the metadata's address: " + owner.status().message());
    if (owner->uuid == agent->workerAddress().uuid) {
      return invalidArgument(std::string(what) + ": the metadata is of this connector's own operation (a connector "
                                                 "moves bytes between workers; use a second Connector)");
    }
    auto op = std::make_shared<Operation::State>();
    op->connector = weak_from_this();
    op->kind = kind;
    op->passive = false;
    op->buffers = std::move(bufs);
    for (const auto& b : op->buffers) op->total += b.length;
    op->metadata = std::move(md);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (shut) return Status(StatusCode::kClosed, std::string(what) + ": the connector was shut down");
      op->id = newIdLocked();
    }
    // Exposed to the owner for this operation only: a read's buffers to be written, a write's to
    // be read.
    ep::RegionOptions o;
    o.writable = kind == OperationKind::kRead;
    o.remote = kind == OperationKind::kRead ? ep::RegionOptions::Remote::kWriteOnly : ep::RegionOptions::Remote::kDefault;
    FERRY_RETURN_IF_ERROR(registerBuffers(op, o));
    // A connection whose endpoint failed (a refused access ends an RC connection both ways) is
    // retired by the agent's lookup, and this operation wires up anew.
    auto conn = agent->connectAddress(op->metadata.address);
    if (!conn.isOk()) {
      for (const auto& n : op->regions) (void)agent->unregisterMemoryRegion(n);
      return invalidArgument(std::string(what) + ": " + conn.status().message());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      op->peer = *conn;
      op->status = OperationStatus::kInProgress;
      active[op->id] = op;
      ++stats.begun;
    }
    // The owner accepts a BEGIN up to the expiry by its own clock, and its STARTED takes one more
    // trip: a reader or writer waits cancelGrace longer for it (as it waits for the answer to a
    // CANCEL).
    expireAt(op, op->metadata.expires, opts.cancelGrace);
    if ((*conn)->isConnected()) {
      sendBegin(op, Status::ok());  // the usual case: BEGIN leaves at once
    } else {
      std::weak_ptr<Impl> weak = weak_from_this();
      (*conn)->ready().state()->onDone([weak, op](const ep::OpState& d) {
        Status st = d.status();
        if (auto self = weak.lock()) self->agent->post([weak, op, st] {
            if (auto s = weak.lock()) s->sendBegin(op, st);
          });
      });
    }
    return std::make_shared<Operation>(op);
  }

  void cancel(const OpPtr& op) {
    std::unique_lock<std::mutex> lock(mu);
    if (op->ended) return;
    auto deadline = Clock::now() + opts.cancelGrace;
    bool mayWait = !agent->onAgentThread();
    if (op->passive) {
      if (op->status == OperationStatus::kInProgress) {
        // Stop our own batches, and let those in flight land (they are ours: they end promptly).
        op->stopping = true;
        op->stopReason = Status(StatusCode::kCancelled, "cancelled");
        if (mayWait) cv.wait_until(lock, deadline, [&] { return op->inflight == 0 || op->ended; });
      }
    } else if (op->beginSent) {
      // Ask the owner to stop moving bytes into or out of our buffers, and wait for it a while.
      op->cancelling = true;
      Message cancel = messageOf(MessageType::kCancel, op->id);
      cancel.operation = op->metadata.operation;
      auto peer = op->peer;
      lock.unlock();
      (void)peer->sendMessage(kChannel, encodeMessage(cancel));
      lock.lock();
      if (mayWait) cv.wait_until(lock, deadline, [&] { return op->ownerStopped || op->ended; });
      op->ownerStopped = true;  // no second CANCEL from finish()
    }
    lock.unlock();
    finish(op, OperationStatus::kCancelled,
           Status(StatusCode::kCancelled, std::string("the ") +
                                              (op->passive ? (op->kind == OperationKind::kRead ? "readable" : "writable")
                                                           : kindVerb(op->kind)) +
                                              " operation was cancelled"));
  }

  void shutdown() {
    std::vector<OpPtr> all;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (shut) return;
      shut = true;
      for (auto* table : {&passive, &active}) {
        for (auto& [id, op] : *table) all.push_back(op);
      }
    }
    stopClock();
    for (auto& op : all) {
      finish(op, OperationStatus::kErrored, Status(StatusCode::kCancelled, "the connector was shut down"));
    }
    agent->onMessage(kChannel, nullptr);
    agent->shutdown();
  }
};

// ---------------------------------------------------------------------------------------------
// Operation

Operation::~Operation() {
  if (state_ && !state_->done->done()) cancel();
}

uint64_t Operation::id() const { return state_->id; }
OperationKind Operation::kind() const { return state_->kind; }
bool Operation::passive() const { return state_->passive; }

OperationStatus Operation::status() const {
  auto c = state_->connector.lock();
  if (!c) return state_->done->done() ? (state_->status) : OperationStatus::kErrored;
  std::lock_guard<std::mutex> lock(c->mu);
  return state_->status;
}

Status Operation::error() const {
  auto c = state_->connector.lock();
  if (!c) return state_->done->done() ? state_->done->status() : Status(StatusCode::kCancelled, "the connector is gone");
  std::lock_guard<std::mutex> lock(c->mu);
  if (!state_->ended) return state_->error;
  return state_->status == OperationStatus::kComplete ? Status::ok() : state_->error;
}

ep::Future Operation::completion() const { return ep::Future(state_->done); }

Result<std::string> Operation::metadata() const {
  if (!state_->passive) return invalidArgument("metadata(): only readable and writable operations have metadata");
  return state_->metadataText;
}

uint64_t Operation::bytes() const { return state_->bytes.load(); }

void Operation::cancel() {
  if (auto c = state_->connector.lock()) c->cancel(state_);
}

// ---------------------------------------------------------------------------------------------
// Connector

Result<std::shared_ptr<Connector>> Connector::start(ConnectorOptions options) {
  if (options.chunkBytes < 4096 || options.chunkBytes > (uint64_t{1} << 30)) {
    return invalidArgument("Connector: chunk_bytes must be in [4 KiB, 1 GiB]");
  }
  if (options.window < 1 || options.window > 256) return invalidArgument("Connector: window must be in [1, 256]");
  if (options.metadataTtl.count() <= 0) return invalidArgument("Connector: the metadata TTL must be positive");
  if (options.cancelGrace.count() < 0) return invalidArgument("Connector: cancel_grace must not be negative");
  auto impl = std::make_shared<Impl>();
  impl->opts = options;
  agent::AgentOptions a;
  a.alias = options.workerId.empty() ? "connector-" + agent::randomHex(4) : options.workerId;
  a.store = options.store;
  a.scope = options.scope;
  a.devices = options.devices;
  a.listenHost = options.listenHost;
  a.secret = options.secret;
  a.lanes = options.lanes;
  a.connectTimeout = options.connectTimeout;
  FERRY_ASSIGN_OR_RETURN(impl->agent, agent::Agent::start(std::move(a)));
  impl->nameSpace = options.scope;
  impl->key = agent::randomHex(32);
  impl->startClock();
  std::weak_ptr<Impl> weak = impl;
  impl->agent->onMessage(kChannel, [weak](std::shared_ptr<agent::PeerConnection> from, std::string_view body) {
    if (auto self = weak.lock()) self->onMessage(from, body);
  });
  return std::make_shared<Connector>(impl);
}

Connector::~Connector() { shutdown(); }
void Connector::shutdown() { impl_->shutdown(); }

Result<std::shared_ptr<Operation>> Connector::createReadable(std::vector<Buffer> local) {
  return impl_->create(OperationKind::kRead, std::move(local));
}
Result<std::shared_ptr<Operation>> Connector::createWritable(std::vector<Buffer> local) {
  return impl_->create(OperationKind::kWrite, std::move(local));
}
Result<std::shared_ptr<Operation>> Connector::beginRead(std::string_view remoteMetadata, std::vector<Buffer> local) {
  return impl_->begin(OperationKind::kRead, remoteMetadata, std::move(local));
}
Result<std::shared_ptr<Operation>> Connector::beginWrite(std::vector<Buffer> local, std::string_view remoteMetadata) {
  return impl_->begin(OperationKind::kWrite, remoteMetadata, std::move(local));
}

const std::string& Connector::name() const { return impl_->agent->alias(); }
const std::string& Connector::nameSpace() const { return impl_->nameSpace; }
const std::shared_ptr<agent::Agent>& Connector::agent() const { return impl_->agent; }

ConnectorStats Connector::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ConnectorStats s = impl_->stats;
  s.created = impl_->stats.created;
  s.live = impl_->passive.size() + impl_->active.size();
  return s;
}

}  // namespace ferry::connect
