// The agent's internals (agent.h is the public surface): AgentImpl owns the wireup listener, the
// links, the store and the memory pools; PeerImpl is one connection's state machine and its queue
// of operations that wait for the wireup.
//
// One file per job: agent.cc (start, shutdown, the Agent façade), peer_registry.cc (connections by
// uuid and alias), discovery.cc (the store: this agent's entry, alias lookup), handshake.cc (the
// wireup state machine), channel.cc (sending wireup lines, dispatching those that arrive),
// guard.cc (what a stranger can reach and cost), liveness.cc (finding dead peers), messages.cc
// (application messages), regions.cc (the region registry and MR_QUERY), peer.cc (PeerImpl and
// PeerConnection). Beneath them: wireup.cc (the codec), link.cc (one TCP link), lanes.cc,
// address.cc, crypto.cc.
//
// Threads: the wireup state machine runs on the agent's reactor thread (loop_); store calls on a
// second reactor (storeLoop_) so that a slow store never delays the wireup. AgentImpl::mu_ guards
// the maps; PeerImpl::mu_ its state and queue. Lock order: AgentImpl::mu_ before PeerImpl::mu_;
// neither is held while calling into the store.
#pragma once

#include <chrono>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "agent/wireup.h"
#include "agent/wireup_connection.h"
#include "common/reactor.h"
#include "ferry/agent/agent.h"
#include "ferry/agent/store.h"
#include "ferry/endpoint/memory_pool.h"
#include "ferry/endpoint/worker.h"

namespace ferry::agent {

using Clock = std::chrono::steady_clock;

// How long a connection that a peer's REQUEST made waits for its ACK (guard.cc): the shorter of
// connectTimeout and a few seconds, so that unfinished handshakes do not hold endpoints for long.
std::chrono::milliseconds handshakeTimeout(std::chrono::milliseconds connectTimeout);

// The first 8 hex digits of a uuid, for log lines (agent.cc).
std::string shortId(const Uuid& uuid);

// An operation as the caller gave it (views of its batch or chunks, valid during the call).
struct OpRequest {
  endpoint::OpKind kind = endpoint::OpKind::kWrite;
  std::span<const NamedAssignment> batch;
  std::span<const NamedChunk> chunks;
  uint32_t imm = 0;
};

// An operation waiting for the wireup (or for a region of the peer to be looked up): its own copy.
struct PendingOp {
  endpoint::OpKind kind = endpoint::OpKind::kWrite;
  std::vector<NamedAssignment> batch;
  std::vector<NamedChunk> chunks;
  uint32_t imm = 0;
  std::shared_ptr<Completion> outer;  // what the caller's future holds

  OpRequest request() const { return {.kind = kind, .batch = batch, .chunks = chunks, .imm = imm}; }
};

class PeerImpl : public std::enable_shared_from_this<PeerImpl> {
 public:
  enum class State : uint8_t { kResolving, kRequesting, kAwaitAck, kReady, kFailed };

  PeerImpl(std::weak_ptr<AgentImpl> agent, std::string alias, size_t numQp);

  // ---- any thread ----
  std::string alias() const;
  State state() const;
  bool retired() const;  // failed or gone: a new PeerImpl takes over on the next use
  Status failure() const;
  std::optional<WorkerAddress> remote() const;
  std::optional<LaneSet> lanes() const;
  std::shared_ptr<endpoint::Endpoint> endpointOf(OpClass c) const;
  const std::shared_ptr<Completion>& readyOp() const { return readyOp_; }
  // Done (with why) when this connection ends: the peer gone, the wireup failed, the agent shut down.
  const std::shared_ptr<Completion>& goneOp() const { return goneOp_; }
  size_t numQp() const { return numQp_; }
  std::shared_ptr<AgentImpl> agentImpl() const { return agent_.lock(); }
  // Retires this connection in favour of `successor` (another one to the same peer): the queued
  // operations move behind it with their futures, and this one's ready future follows its.
  void handOver(const std::shared_ptr<PeerImpl>& successor, const std::string& why);
  // Takes over an operation queued on another connection to the same peer (its future stays).
  void adopt(PendingOp op);
  // When ready and one of the endpoints failed or was shut down (the peer died, or refused an
  // access, which ends an RC connection): retires this connection (the next use wires up anew) and returns
  // kPeerGone with the endpoint's failure. OK otherwise.
  Status retireIfEndpointFailed();
  // The data path: straight to the endpoint once ready (no copy of the batch), else queued.
  Result<std::shared_ptr<Completion>> submit(const OpRequest& request);

  // ---- the agent's loop thread ----
  // Fails every queued operation, the ready future and the endpoints with why, and retires.
  void fail(const Status& why);
  // Called when the peer answered a region query (info: JSON per device, or nullopt for none).
  void regionAnswered(const std::string& name, const std::optional<std::string>& info);

  // Wireup state (loop thread only, except where guarded by mu_).
  uint64_t conn = 0;                     // our REQUEST's number (initiator)
  uint64_t remoteConn = 0;               // the peer's REQUEST we answered (responder)
  uint64_t ignoredConn = 0;              // a REQUEST of the peer superseded by the tie-break
  std::string nonce;                     // ours (request or reply)
  std::string peerNonce;                 // the peer's, to echo
  std::string lastWireup;                // the last REQUEST or REPLY, resent until answered
  std::optional<WireupMessage> request;  // our REQUEST (initiator), to echo a challenge's cookie
  WireupType lastWireupType = WireupType::kRequest;
  int tries = 0;
  Reactor::TimerId retryTimer = 0;
  Reactor::TimerId deadlineTimer = 0;
  Clock::time_point deadline;
  Clock::time_point lastHeard;
  Clock::time_point lastPing;
  std::string lookupError;   // why the alias could not be resolved yet
  std::string addressBytes;  // set when connected by address
  // The inbound link the peer's wireup authenticated (its REPLY or ACK came on it, or it echoed a
  // probe): without a secret, messages that change this connection's state count only there.
  std::weak_ptr<WireupConnection> authLink;
  std::weak_ptr<WireupConnection> origin;  // the inbound link whose REQUEST made this connection (responder)
  std::string probeNonce;                  // the probe in flight (empty: none)
  Clock::time_point probeSent;
  Reactor::TimerId probeTimer = 0;
  bool probeMissed = false;  // the last probe went unanswered for peerTimeout
  uint64_t queryId = 0;      // the region query in flight (0: none)
  std::string queryName;

  // Set on the loop thread under mu_.
  void setRemote(WorkerAddress address, LaneSet lanes);
  void setEndpoints(std::map<std::string, std::shared_ptr<endpoint::Endpoint>> byDevice);
  // Whether there is exactly one endpoint per local device the lanes use.
  bool endpointsMatchLanes() const;
  const std::map<std::string, std::shared_ptr<endpoint::Endpoint>>& endpoints() const { return endpoints_; }
  void setState(State s);
  // Ready: replays the queue in order on the endpoints.
  void becomeReady();

 private:
  // Retires this connection after its endpoint failed with `failed`; returns kPeerGone saying so.
  Status retireAfter(const Status& failed);
  // Points each operation class at the endpoint of its lane's device (mu_ held).
  void bindClassesLocked();
  // Posts what can be posted from the front of the queue (mu_ held).
  void drainLocked();
  // Resolves names against ep; returns nullopt with *missing set when a remote name is unknown.
  Result<std::shared_ptr<Completion>> postLocked(const OpRequest& op, std::string* missing);
  // Queues an operation behind the wireup or a region lookup (mu_ held).
  std::shared_ptr<Completion> enqueueLocked(PendingOp op);

  std::weak_ptr<AgentImpl> agent_;
  const std::string alias_;
  const size_t numQp_;
  mutable std::mutex mu_;
  State state_ = State::kResolving;
  Status failure_;
  std::optional<WorkerAddress> remote_;
  std::optional<LaneSet> lanes_;
  std::map<std::string, std::shared_ptr<endpoint::Endpoint>> endpoints_;  // by local device
  std::shared_ptr<endpoint::Endpoint> byClass_[kNumOpClasses];
  std::deque<PendingOp> queue_;
  std::shared_ptr<Completion> readyOp_;
  std::shared_ptr<Completion> goneOp_;
};

class AgentImpl : public std::enable_shared_from_this<AgentImpl> {
 public:
  // ---- agent.cc: start, shutdown, counters ----
  static Result<std::shared_ptr<AgentImpl>> start(AgentOptions options);
  ~AgentImpl();
  void shutdown();
  AgentStats stats() const;

  const AgentOptions& options() const { return opts_; }
  const WorkerAddress& self() const { return self_; }
  const std::string& selfBytes() const { return selfBytes_; }

  // ---- peer_registry.cc ----
  Result<std::shared_ptr<PeerImpl>> peerByAlias(std::string_view alias, size_t numQp, bool create);
  Result<std::shared_ptr<PeerImpl>> peerByAddress(std::string_view bytes, size_t numQp);
  std::shared_ptr<PeerImpl> findAlias(std::string_view alias) const;
  std::vector<std::string> peerAliases() const;
  // For PeerImpl (any thread): an endpoint failed; forget the peer so the next use wires anew.
  void retire(const std::shared_ptr<PeerImpl>& peer);

  // ---- regions.cc ----
  Status registerRegion(std::string_view name, void* addr, uint64_t length, endpoint::RegionOptions options);
  Result<std::map<std::string, endpoint::RegionView>> regionKeys(std::string_view name) const;
  Status unregisterRegion(std::string_view name);
  // A local region's range check (for bad input refused before the wireup).
  Status checkLocalRange(const RegionRef& ref, uint64_t offset, uint64_t length, bool forWrite) const;
  Result<std::string> getMrInfo(std::string_view alias, std::string_view name);
  // For PeerImpl (loop thread): ask the peer for a region's metadata.
  void queryRegion(const std::shared_ptr<PeerImpl>& peer, const std::string& name);

  // ---- discovery.cc ----
  Result<std::vector<std::string>> listAgents();

  // ---- liveness.cc ----
  void disconnect(const std::shared_ptr<PeerImpl>& peer, const std::string& reason);

  // ---- messages.cc ----
  void setMessageHandler(std::string channel, Agent::MessageHandler handler);
  // Any thread: sends an upper layer's message to a connected peer (in order with the wireup).
  void sendMessage(const WorkerAddress& to, std::string_view channel, std::string_view body);

  Reactor& loop() { return loop_; }
  std::mutex& statsMu() { return statsMu_; }
  AgentStats& mutableStats() { return stats_; }

 private:
  explicit AgentImpl(AgentOptions options) : opts_(std::move(options)) {}

  // ---- agent.cc ----
  Status init();
  Status openDevices();
  Status listen();
  // Protected mode: listens on ::1 too, on `port`; advertised when it could.
  void listenLoopback6(uint16_t port);

  // ---- discovery.cc (the store thread, but for joinStore and startResolve) ----
  // From init(): starts the store thread, registers this agent before start() returns and keeps
  // its lease alive.
  Status joinStore();
  void registerInStore();
  void keepAliveInStore();
  std::string storeKey(std::string_view kind, std::string_view name) const;
  // Loop thread: looks the peer's alias up (again until the deadline), then wires up.
  void startResolve(const std::shared_ptr<PeerImpl>& peer);

  // ---- peer_registry.cc ----
  std::shared_ptr<PeerImpl> findUuid(const Uuid& uuid) const;
  void forget(const std::shared_ptr<PeerImpl>& peer);

  // ---- channel.cc (loop thread) ----
  void onLine(WireupConnection& link, std::string_view line);
  // onLine's steps: a request addressed to an earlier life of this agent rejected as stale, and a
  // decoded message for this agent handed to its handler.
  void rejectStale(const WireupMessage& m);
  void dispatch(WireupConnection& link, const WireupMessage& m);
  void onPing(const WireupMessage& m);  // answered with a pong over the peer's connection
  void sendLine(const WorkerAddress& to, const std::string& line);

  // ---- handshake.cc: the wireup state machine (loop thread) ----
  void startWireup(const std::shared_ptr<PeerImpl>& peer);
  void armRetry(const std::shared_ptr<PeerImpl>& peer);
  void armDeadline(const std::shared_ptr<PeerImpl>& peer, std::chrono::milliseconds timeout);
  void armDeadline(const std::shared_ptr<PeerImpl>& peer) { armDeadline(peer, opts_.connectTimeout); }
  void onRequest(WireupConnection& link, const WireupMessage& m, const WorkerAddress& from);
  // With a secret: false for a REQUEST whose clock is too far off or whose nonce was seen (a
  // replay; a resend of one we answered passes, for the duplicate rule).
  bool requestIsFresh(const WireupMessage& m, const WorkerAddress& from);
  // The connection a REQUEST is for (found, taken over from a pending connect, or new within the
  // caps), or nullptr when it is dropped or already answered; *abandoned: our REQUEST it supersedes.
  std::shared_ptr<PeerImpl> peerForRequest(WireupConnection& link, const WireupMessage& m,
                                           const WorkerAddress& from, uint64_t* abandoned);
  // peerForRequest for a uuid no connection has: the pending connect to its alias (which this
  // REQUEST locates), else a new connection within the caps, each registered under the uuid and
  // the alias; nullptr when the REQUEST is dropped (an older life, or a connected one not known
  // to be gone).
  std::shared_ptr<PeerImpl> peerForNewUuid(WireupConnection& link, const WireupMessage& m,
                                           const WorkerAddress& from);
  // Connects `peer`'s endpoints to the REQUEST's and answers REPLY (or REJECT).
  void answerRequest(std::shared_ptr<PeerImpl> peer, const WireupMessage& m, const WorkerAddress& from,
                     uint64_t abandoned);
  void onReply(WireupConnection& link, const WireupMessage& m);
  void onAck(WireupConnection& link, const WireupMessage& m);
  void onReject(const WireupMessage& m);
  Result<std::map<std::string, std::shared_ptr<endpoint::Endpoint>>> makeEndpoints(const LaneSet& lanes,
                                                                                   size_t numQp);
  Status connectEndpoints(PeerImpl& peer, const json::Value& theirs);
  json::Value endpointInfos(const PeerImpl& peer) const;

  // ---- guard.cc: what an unauthenticated peer can reach, and what it can cost (loop thread) ----
  void onAccept(int listenFd);
  Status openAdmission();
  void sweepInboundLinks();
  // Closes the unauthenticated inbound link silent the longest; false when there is none.
  bool evictIdlestLink();
  // Whether `m`, from a known peer, may change that peer's state when it came on `link`; false: it
  // was held (or dropped) and the link is being probed.
  bool acceptOnLink(WireupConnection& link, const std::shared_ptr<PeerImpl>& peer, const WireupMessage& m,
                    std::string_view line);
  // Without a secret, whether a REQUEST for a new connection of a connected peer came on the link
  // its wireup authenticated; false: the link is being probed.
  bool onAuthenticLink(WireupConnection& link, const std::shared_ptr<PeerImpl>& peer);
  // Whether a connected life of `from`'s alias may be replaced by `from`: with a secret, or once
  // it is gone or failed a probe; false: it is being asked whether it is alive.
  bool earlierLifeGone(const std::shared_ptr<PeerImpl>& earlier, const WorkerAddress& from);
  // Sends a ping with a nonce to the peer; a pong that echoes it authenticates the link it comes on.
  void probe(const std::shared_ptr<PeerImpl>& peer, const char* why);
  void onPong(WireupConnection& link, const WireupMessage& m);
  // Without a secret, a REQUEST from an agent this one does not know makes nothing until it echoes
  // a cookie: true when `m` carries none (or a wrong one) and was answered with a CHALLENGE.
  bool challengeFirst(const WireupMessage& m, const WorkerAddress& from);
  // Closes the links to agents no connection belongs to that are quiet the longest, beyond `keep`.
  void closeOrphanLinksAbove(size_t keep);
  // A CHALLENGE to our REQUEST: sent again with its cookie.
  void onChallenge(const WireupMessage& m);
  // Whether one more REQUEST may make a connection now (the caps on handshakes not finished).
  bool admitHandshake(WireupConnection& link, const WorkerAddress& from);
  // Marks `link` as the one `peer`'s wireup authenticated (an inbound link; ours need nothing).
  void authenticate(WireupConnection& link, PeerImpl& peer);
  void logRefused(const Status& why);
  bool protectedMode() const { return secret_.empty() && !allowRemote_; }

  // ---- liveness.cc (loop thread) ----
  void onLinkClosed(WireupConnection& link, const Status& why, bool connected);
  void sweep();
  void peerGone(const std::shared_ptr<PeerImpl>& peer, const std::string& why);

  // ---- messages.cc (loop thread) ----
  void onMessage(const WireupMessage& m);

  // ---- regions.cc ----
  void onMrQuery(const WireupMessage& m);
  void onMrInfo(const WireupMessage& m);
  std::string regionInfoJson(const std::string& name) const;
  // A region's store entry: its length only.
  std::string publishedRegionJson(const std::string& name) const;

  const AgentOptions opts_;
  std::string secret_;
  bool allowRemote_ = false;
  std::string cookieKey_;  // this life's key of the wireup cookies (guard.cc)
  std::shared_ptr<net::Admission> admission_;
  net::LogLimiter refusalLog_;
  LaneOverrides lanes_;
  WorkerAddress self_;
  std::string selfBytes_;
  Reactor loop_;
  Reactor storeLoop_;
  std::unique_ptr<Store> store_;
  LeaseId lease_ = 0;
  int listenFd_ = -1;
  int listenFd6_ = -1;  // protected mode: the ::1 listener beside 127.0.0.1
  std::shared_ptr<endpoint::Worker> worker_;
  std::atomic<bool> shutdown_{false};
  bool loopStarted_ = false;
  bool storeLoopStarted_ = false;

  mutable std::mutex mu_;
  std::map<Uuid, std::shared_ptr<PeerImpl>> byUuid_;
  std::map<std::string, std::shared_ptr<PeerImpl>> byAlias_;
  struct Region {
    void* addr = nullptr;
    uint64_t length = 0;
    endpoint::RegionOptions options;
  };
  std::map<std::string, Region> regions_;
  std::map<std::string, std::shared_ptr<Agent::MessageHandler>> handlers_;  // by channel
  std::map<std::string, std::shared_ptr<endpoint::MemoryPool>> pools_;      // by device
  mutable std::mutex statsMu_;  // a leaf lock: taken under any other
  AgentStats stats_;
  uint64_t nextConn_ = 1;
  uint64_t nextQuery_ = 1;
  std::map<std::string, Clock::time_point> seenNonces_;  // REQUEST nonces (replay refusal)

  // Loop thread only.
  std::map<Uuid, std::shared_ptr<WireupConnection>> links_;  // outgoing, by peer uuid
  std::set<std::shared_ptr<WireupConnection>> inbound_;
  std::map<std::string, int> dropped_;  // test hook counters
  // get_mr_info's questions in flight, by query number.
  std::map<uint64_t, std::shared_ptr<std::promise<std::optional<std::string>>>> infoWaiters_;
  Reactor::TimerId sweepTimer_ = 0;
  Reactor::TimerId linkSweepTimer_ = 0;
};

}  // namespace ferry::agent
