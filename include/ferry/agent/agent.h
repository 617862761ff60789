// Agent: ferry's connection-establishment layer (the wireup of spec 002). A user names a peer and
// writes to it; the agent finds the peer, connects the devices both sides share, and keeps that
// working across a peer's death and restart.
//
//   auto agent = Agent::start({.alias = "prefill-0", .store = "ferry://127.0.0.1:4479"}).value();
//   agent->registerMemoryRegion("kv", buf, size);
//   auto peer = agent->connect("decode-0").value();     // returns at once: never blocks
//   auto f = peer->write({{.local = "kv", .remote = "kv", .length = 4096}}).value();  // queued
//   Status st = f.wait(std::chrono::seconds(30));        // replayed once the wireup finished
//
// Endpoints usable at once. connect() (by alias through the store, or by the peer's address())
// returns a PeerConnection immediately. Until the wireup finished it is a stub: READ, WRITE,
// WRITE_WITH_IMM, SEND and RECV go to its pending queue, in order, and are replayed in that order
// on the real endpoints when the wireup finished; their futures (the Endpoint API's) complete
// normally. ready() / waitReady() report the wireup; it has a deadline (connectTimeout) after which
// the pending operations fail with kTimedOut naming the peer and what was missing.
//
// Wireup (docs/agent.md): the auxiliary transport is a TCP listener per agent. The initiator
// creates its endpoints on the chosen lanes and sends REQUEST (its address, uuid, connection
// number, endpoint metadata); the responder creates (or reuses) its endpoint for that peer,
// connects it, and answers REPLY with its own metadata; the initiator connects and sends ACK,
// after which the responder uses the connection too. A REQUEST from an unknown peer creates the
// endpoint for replies: that peer can be written to back without connect(). When both sides connect
// at once, the REQUEST of the agent with the smaller uuid wins and the other's is abandoned, so
// each pair ends with one connection per lane. REQUEST, REPLY and ACK are retried until answered.
//
// Lanes: see lanes.h. One Endpoint per distinct local device among the lanes (normally one).
//
// Reconnection: every start has a new uuid (its generation). A peer whose process died (its kernel
// closed the wireup links and its listener refuses), whose host is unreachable for peerTimeout (TCP
// keepalive on the wireup links), that says goodbye, whose endpoint fails, or (with a heartbeat)
// that is silent for peerTimeout, is gone: every pending operation fails with kPeerGone, on every
// device. The next operation for that alias looks it up again and
// wires up anew; a restarted peer (new uuid) gets a new connection, and nothing addressed to its
// previous life (messages carry both uuids) reaches it.
//
// Access: with a shared secret (AgentOptions::secret or FERRY_AGENT_SECRET) every wireup message
// carries an HMAC-SHA256: REQUEST is authenticated with a nonce and a time stamp (replays refused),
// REPLY answers the initiator's nonce with one of its own, ACK answers that: a mutual challenge.
// Without a secret the agent is in protected mode: it listens on loopback and accepts peers of
// this host only, refusing others with a line that says why (allowRemoteWithoutSecret or
// FERRY_AGENT_ALLOW_REMOTE=1 opens it, unauthenticated). Either way, inbound links are capped per
// source and in all, a link that has not carried a wireup within a few seconds is closed, the
// handshakes not finished are capped, and messages that change a peer's state (bye, a restart,
// region queries, upper layers' messages) count only on the link that peer's wireup authenticated
// (docs/security.md).
//
// Discovery (with a store): the agent registers its address under /ferry/<scope>/agents/<alias>
// with a lease it keeps alive, and each region under /ferry/<scope>/regions/<alias>/<name>. The
// store is never in the data path: when it goes down existing connections keep working, and
// lookups fail with kUnavailable until it is back.
//
// Threads: every method may be called from any thread. The wireup runs on the agent's own thread;
// store calls on a second one. Futures complete as the Endpoint API's do, or on the agent's thread
// for operations that were queued.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/agent/address.h"
#include "ferry/agent/lanes.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/endpoint.h"
#include "ferry/endpoint/future.h"
#include "ferry/endpoint/memory_pool.h"

namespace ferry::agent {

struct AgentOptions {
  std::string alias;              // how peers name this agent ("" : "agent-<uuid prefix>")
  std::string store;              // discovery store URL (store.h); "" : none (peers by address only)
  std::string scope = "default";  // agents see only the agents of their scope in the store
  // Devices to offer (names as listDevices() gives them); empty: every visible device.
  std::vector<std::string> devices;
  // The wireup listener's address; "" : loopback (127.0.0.1) for an agent without a secret, which
  // serves this host only (docs/security.md), else every interface (IPv4 and IPv6).
  std::string listenHost;
  uint16_t listenPort = 0;                          // 0: the kernel picks one
  std::chrono::milliseconds connectTimeout{30000};  // the wireup's deadline
  std::chrono::milliseconds peerTimeout{5000};      // silence after which a peer is gone
  // How often a connected peer that said nothing is asked whether it is there (0: never). Off by
  // default: the kernel finds dead processes and hosts on the wireup links at no cost (link.h), and
  // a peer that is only paused (a debugger, SIGSTOP) keeps its connections. With a heartbeat, a peer
  // silent for peerTimeout is gone even when its kernel still answers (a hung process).
  std::chrono::milliseconds heartbeat{0};
  std::chrono::milliseconds retryInterval{250};  // first resend of an unanswered wireup message
  std::chrono::seconds leaseTtl{10};             // the store lease of the agent's entries
  std::string secret;                            // "" : FERRY_AGENT_SECRET, else none
  // Without a secret, serve peers of other hosts too (unauthenticated): the explicit opt-out of
  // protected mode; also FERRY_AGENT_ALLOW_REMOTE=1. docs/security.md says what it opens.
  bool allowRemoteWithoutSecret = false;
  LaneOverrides lanes;  // empty: FERRY_AGENT_LANES, else the rules of lanes.h
  // Endpoint options of the agent's endpoints (numQp is set per connection).
  uint32_t sendDepth = 256;
  uint32_t recvDepth = 16;
  uint32_t recvBufferSize = 64 * 1024;
  // Test hook: drop outgoing wireup messages of a type ("request", "reply", "ack"): the first
  // N of each are not sent, as if the network lost them.
  std::map<std::string, int> dropFirst;
};

// A region on either side: by name, or by the Endpoint API's integer handle.
using RegionRef = std::variant<std::string, endpoint::MrHandle>;

// One range of a READ / WRITE / WRITE_WITH_IMM: offsets named by side (local first).
struct NamedAssignment {
  RegionRef local;
  RegionRef remote;
  uint64_t localOffset = 0;
  uint64_t remoteOffset = 0;
  uint64_t length = 0;
};

// One piece of a SEND / RECV message.
struct NamedChunk {
  RegionRef region;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class Agent;
class AgentImpl;
class PeerImpl;

// The endpoint to one peer (UCP's ep): usable at once, wired up in the background.
class PeerConnection {
 public:
  // The peer's alias (its address's alias when connected by address).
  std::string peerAlias() const;
  // Whether the wireup finished and the peer has not gone since.
  bool isConnected() const;
  // Waits up to timeout for the current wireup (one that failed is reported as failed; the next
  // operation starts a new one): OK when connected; the wireup's error when it failed
  // (kTimedOut at its deadline, kUnavailable/kPermissionDenied when refused, kPeerGone); kTimedOut
  // when the wait ran out first (the wireup goes on).
  Status waitReady(std::chrono::milliseconds timeout) const;
  // When this connection is ready but one of its endpoints failed or was shut down (the peer died,
  // or refused an access, which ends an RC connection): retires it at once and returns kPeerGone
  // with the endpoint's failure. OK when the connection is sound or not ready. Callers that use
  // endpoint() directly need not call it: the next connect to the same peer, and the operations
  // below, retire such a connection themselves and wire up anew.
  Status retireIfFailed();
  // The wireup as a future of the Endpoint API (done when connected or failed).
  endpoint::Future ready() const;
  // Done when this connection ends, with why: the peer gone (kPeerGone), the wireup failed, or the
  // agent shut down (kCancelled). A later operation on this PeerConnection wires up anew; its end
  // is reported by a new closed() future.
  endpoint::Future closed() const;
  // The endpoint of an operation class (nullptr before the wireup finished).
  std::shared_ptr<endpoint::Endpoint> endpoint(OpClass c = OpClass::kRma) const;
  // The lanes (kUnavailable before the peer's address is known).
  Result<LaneSet> lanes() const;
  // The peer's uuid as hex ("" before its address is known).
  std::string peerUuid() const;

  // The Endpoint API's operations with regions named (see endpoint.h for their semantics). Bad
  // input known before the wireup (an unknown local region, a range outside it) is refused at
  // once; a remote region that the peer does not have fails the operation with kNotFound.
  Result<endpoint::ReadWriteFuture> read(std::span<const NamedAssignment> batch);
  Result<endpoint::ReadWriteFuture> write(std::span<const NamedAssignment> batch);
  Result<endpoint::ReadWriteFuture> writeWithImm(std::span<const NamedAssignment> batch, uint32_t immData);
  Result<endpoint::SendFuture> send(std::span<const NamedChunk> chunks);
  Result<endpoint::RecvFuture> recv(std::span<const NamedChunk> chunks);
  Result<endpoint::ImmRecvFuture> immRecv();

  // A message for an upper layer (ferry's connector) over the wireup link: delivered in order,
  // once, to the handler the peer set for `channel` (Agent::onMessage), authenticated like the
  // wireup when there is a shared secret; at most about 4 MiB. Never blocks. kUnavailable until
  // the wireup finished (wait for ready()); kInvalidArgument for an empty or over-long channel.
  Status sendMessage(std::string_view channel, std::string_view body);

  explicit PeerConnection(std::shared_ptr<PeerImpl> impl) : impl_(std::move(impl)) {}
  // The live state behind this connection: after the peer was gone (or the wireup failed) and an
  // operation asks for it, a new wireup to the same alias (or address) takes its place.
  std::shared_ptr<PeerImpl> impl() const;
  // The state as it is, without starting a new wireup.
  std::shared_ptr<PeerImpl> currentImpl() const;

 private:
  mutable std::mutex mu_;
  mutable std::shared_ptr<PeerImpl> impl_;
};

struct AgentStats {
  uint64_t requestsSent = 0, repliesSent = 0, acksSent = 0;
  uint64_t retries = 0;            // wireup messages sent again
  uint64_t duplicatesDropped = 0;  // connections abandoned by the simultaneous-connect tie-break
  uint64_t peersGone = 0;
  uint64_t operationsQueued = 0;  // operations that waited for a wireup
  uint64_t messagesRefused = 0;   // malformed or unauthenticated wireup messages
  // Inbound wireup links refused or closed: another host's peer in protected mode, a source or the
  // listener at its cap, a link idle or without a wireup for 10 s (docs/security.md).
  uint64_t connectionsRefused = 0;
  // CHALLENGEs sent: REQUESTs of unknown agents, without a secret, that made nothing until they
  // echoed the cookie (docs/agent.md).
  uint64_t challengesSent = 0;
};

class Agent {
 public:
  // Starts an agent: opens the devices, listens for wireup, registers in the store (when one is
  // given). kInvalidArgument for bad options (an alias too long, a malformed store URL or lane
  // override); kUnavailable when the store cannot be reached; kNotFound when no device is usable.
  static Result<std::shared_ptr<Agent>> start(AgentOptions options);

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  ~Agent();  // shutdown()

  // Says goodbye to every peer, fails pending operations with kCancelled, revokes the store lease.
  // Idempotent.
  void shutdown();

  // The worker address (address.h), as bytes.
  std::string address() const;
  const WorkerAddress& workerAddress() const;
  const std::string& alias() const;

  // The connection to a peer named by alias (looked up in the store; an alias that has not
  // registered yet is waited for until the wireup deadline), or by its address() bytes. Returns
  // the existing connection when there is a live one. Never blocks on the network.
  Result<std::shared_ptr<PeerConnection>> connect(std::string_view alias, size_t numQp = 1);
  Result<std::shared_ptr<PeerConnection>> connectAddress(std::string_view address, size_t numQp = 1);
  // Closes a connection from this side: says goodbye to the peer (which drops its side) and fails
  // what is pending on it with kPeerGone naming `reason`. The next operation on that peer wires up
  // anew. For layers that bound how many connections they keep (ferry's object server).
  void disconnect(const std::shared_ptr<PeerConnection>& connection, std::string_view reason);
  // The live connection to alias, else a new one (operations on a peer connect on first use).
  Result<std::shared_ptr<PeerConnection>> peer(std::string_view alias);

  // Memory: registered on every device the agent uses (and on devices opened later), published in
  // the store by name and length only (never its address or keys). Registering a name again with another
  // range replaces it (peers see the new one when they look it up again).
  Status registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                              endpoint::RegionOptions options = {});
  Status unregisterMemoryRegion(std::string_view name);
  // A region of this agent as each of its devices registered it (published or not): device name
  // to the region's address, length and keys. A layer that hands a region's keys to a peer itself
  // (ferry's object descriptors) reads them here. kNotFound for a name not registered.
  Result<std::map<std::string, endpoint::RegionView>> regionKeys(std::string_view name) const;
  // A peer's region as mr_info JSON ({"addr","length","rkey","handle"}) on the rma lane's device,
  // asked of the peer over the link its wireup authenticated (connecting first, by the store, when
  // it is not connected): the store never holds a region's keys. Blocks up to connectTimeout; not
  // from the agent's thread. kNotFound when the peer has no such region; kTimedOut when it does
  // not answer; the wireup's error when it cannot be connected; kUnavailable without a connection
  // or a store to find one.
  Result<std::string> getMrInfo(std::string_view peerAlias, std::string_view name);
  // The aliases registered in the store under this agent's scope (this agent too), sorted.
  Result<std::vector<std::string>> listAgents();
  // The lanes to a peer (wired up or not); kNotFound for a peer never connected.
  Result<LaneSet> lanes(std::string_view peerAlias);
  // The aliases of the peers with a connection (live or wiring).
  std::vector<std::string> peers() const;
  AgentStats stats() const;

  // Upper layers' messages (PeerConnection::sendMessage): handler runs on the agent's thread for
  // each message of `channel` from a connected peer, with that peer's connection; it must not
  // block. Messages of a channel without a handler, or from a peer not connected, are dropped.
  // Setting a handler again replaces it; an empty function removes it.
  using MessageHandler = std::function<void(std::shared_ptr<PeerConnection> from, std::string_view body)>;
  void onMessage(std::string channel, MessageHandler handler);
  // Runs fn on the agent's thread, in order with its messages (for upper layers whose work follows
  // a completion: the thread that completes an operation must not post more on its endpoint).
  // fn must not block. Dropped after shutdown().
  void post(std::function<void()> fn);
  // Whether the caller runs on the agent's thread.
  bool onAgentThread() const;

  explicit Agent(std::shared_ptr<AgentImpl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<AgentImpl>& impl() const { return impl_; }

 private:
  std::shared_ptr<AgentImpl> impl_;
};

}  // namespace ferry::agent
