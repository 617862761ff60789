// Endpoint: ferry's implementation of the Endpoint API (spec 000): one connection to one peer made
// of num_qp reliable-connected queue pairs, with its memory pool, remote regions and futures.
//
//   auto ep = Endpoint::create(ContextOptions{.deviceName = "soft_lo"}, {.numQp = 2}).value();
//   MrHandle kv = ep->registerMemoryRegion("kv", buf, size).value();
//   std::string mine = ep->endpointInfo();          // give to the peer, out of band
//   Status st = ep->connect(peersInfo);             // both sides call connect()
//   MrHandle remoteKv = ep->remoteHandle("kv").value();  // connect() recorded the peer's regions
//   std::vector<Assignment> batch{{.local = kv, .remote = remoteKv, .length = 4096}};
//   auto f = ep->read(batch);
//   if (f.isOk()) st = f->wait(std::chrono::seconds(5));
//
// Endpoints, memory pools, contexts and workers are shared objects (std::shared_ptr): several
// endpoints share one pool, context or worker, and each lives as long as its last holder. Futures
// hold only their operation's state.
//
// Metadata: endpointInfo() is a versioned JSON object ({"ferry_endpoint": 1, ...}): the device,
// num_qp, one verbs Path per queue pair, the receive-buffer size, and "mr_info" with every region
// of the pool. connect() checks all of the peer's metadata before it changes anything: malformed
// metadata is refused with kInvalidArgument and leaves the endpoint as it was.
//
// Transfers: a batch's ranges are split into work requests of at most maxWorkRequestBytes and,
// with several queue pairs, striped over all of them. At most sendDepth work requests are
// outstanding per queue pair; the rest of a batch waits in its operation (no queue grows with the
// batch beyond the batch itself) and is posted as completions free room. Operations are posted in
// the order they were issued.
//
// Messages: send() and recv() are matched by their order (the n-th send() of one side fills the
// n-th recv() of the other). Receives are kept posted from a pool of receive buffers registered
// once, so a peer never waits for a receive; a message that arrives before its recv() is kept
// (copied aside up to maxUnexpectedBytes, beyond that in its receive buffers, which then throttles
// the peer) and handed to the recv() when it comes. A message longer than its recv()'s buffers
// fails that recv() with kInvalidArgument (never truncated silently). Immediates of
// writeWithImm() are delivered to immRecv() exactly once and in the peer's order, also when they
// arrive before immRecv() is called.
//
// Errors: calls return kInvalidArgument for bad input (unknown handle or name, a range outside its
// region, a read-only region as destination) before anything is posted; kUnavailable before
// connect() and after the connection failed; kClosed after shutdown(). A work completion error
// (e.g. RETRY_EXC_ERR when the peer died) fails the operation and the endpoint: every pending and
// later operation fails with it (create a new endpoint to reconnect).
//
// Threads: every method may be called from any thread at once. Completions are processed on the
// endpoint's Worker thread (worker.h); posting happens on the calling thread and, for work that
// waited for queue space, on the worker thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ferry/common/metrics.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/assignment.h"
#include "ferry/endpoint/context.h"
#include "ferry/endpoint/future.h"
#include "ferry/endpoint/memory_pool.h"
#include "ferry/endpoint/worker.h"
#include "ferry/verbs/path.h"
#include "ferry/verbs/verbs.h"

namespace ferry::endpoint {

struct EndpointOptions {
  size_t numQp = 1;                          // queue pairs (1 .. 64); both peers need the same
  std::shared_ptr<Worker> worker = nullptr;  // nullptr: a worker of its own
  uint32_t sendDepth = 256;                  // outstanding work requests per queue pair
  uint32_t recvDepth = 32;                   // receive buffers kept posted per queue pair
  uint32_t recvBufferSize = 64 * 1024;       // bytes per receive buffer (a message fragment)
  uint64_t maxWorkRequestBytes = 4u << 20;   // largest piece of a range in one work request
  uint64_t minStripeBytes = 256u << 10;      // ranges above this are striped over the queue pairs
  uint64_t maxUnexpectedBytes = 64u << 20;   // message bytes kept aside for recv()s not yet issued
  // Transport timeout of each try (4.096 us * 2^ackTimeout; 8 tries): how long work waits for a
  // peer that makes no progress (paused by SIGSTOP or a debugger, unreachable, or not connected
  // yet) before it fails with RETRY_EXC_ERR. 0: the smallest value whose 8 tries cover
  // FERRY_TRANSPORT_TIMEOUT (default 30 s, so 20: 34 s). A peer whose process dies or whose
  // connection drops fails work at once, whatever this is.
  uint8_t ackTimeout = 0;
  // The GID table entry the queue pairs use (RoCE NICs list one per address and RoCE version).
  uint8_t gidIndex = 0;
  // Report a queue pair that gave up on the peer (RETRY_EXC_ERR), and everything that fails with it,
  // as kPeerGone instead of kWorkCompletionError (the agent's endpoints: a dead peer is one error).
  bool transportFailureIsPeerGone = false;
};

// Counters, for tests and tuning.
struct EndpointStats {
  // Per kind of operation (opKindNames() order): completed, bytes, errors by status, latency.
  std::vector<OpMetrics> operations;
  struct QueuePair {              // one of the endpoint's queue pairs
    uint64_t workRequests = 0;    // send-queue work requests posted
    uint64_t bytes = 0;           // payload bytes posted (READ, WRITE, SEND)
    uint32_t maxOutstanding = 0;  // most send work requests outstanding at once
    uint32_t receivesPosted = 0;  // receive buffers posted now
  };
  std::vector<QueuePair> qps;
  uint64_t operationsQueued = 0;  // operations accepted and not fully posted
  uint64_t unexpectedBytes = 0;   // message bytes kept for recv()s not issued yet
  uint64_t immediatesQueued = 0;  // immediates that arrived before their immRecv()
  uint64_t workerWakeups = 0;     // times the worker thread took this endpoint's completions
};

// The smallest QP timeout exponent (1..31) whose `tries` tries of 4.096 us * 2^exponent each last
// at least `seconds`: what EndpointOptions::ackTimeout 0 becomes.
uint8_t ackTimeoutCovering(int seconds, int tries = 8);

class EndpointImpl;

class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  // The document's three constructor forms: on a device (an RdmaContext opened for it, shared
  // with other endpoints of the same device and port), on a context (with a pool of its own), or
  // on a memory pool (sharing the pool's regions with the pool's other endpoints).
  static Result<std::shared_ptr<Endpoint>> create(const ContextOptions& device, EndpointOptions options = {});
  static Result<std::shared_ptr<Endpoint>> create(std::shared_ptr<RdmaContext> context,
                                                  EndpointOptions options = {});
  static Result<std::shared_ptr<Endpoint>> create(std::shared_ptr<MemoryPool> pool,
                                                  EndpointOptions options = {});

  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  // shutdown().
  virtual ~Endpoint();

  // ---- memory ----
  // Register local memory in the endpoint's pool (see MemoryPool).
  Result<MrHandle> registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                        RegionOptions options = {});
  Result<MrHandle> registerMemoryRegion(uint64_t key, void* addr, uint64_t length,
                                        RegionOptions options = {});
  // Records a region of the peer from its mr_info entry ({"addr", "length", "rkey"[, "handle"]},
  // JSON text) under `name`. The handle is the peer's handle for it when the entry has one that is
  // free here, else a new one. Registering a name again replaces its entry (same handle).
  // kInvalidArgument for a malformed entry (nothing changes).
  Result<MrHandle> registerRemoteMemoryRegion(std::string_view name, std::string_view mrInfoJson);
  // Forgets a remote region (operations posted before keep what they resolved). kNotFound when
  // no remote region has that handle.
  Status unregisterRemoteMemoryRegion(MrHandle handle);
  // The handle of a local region's name / of a remote region's name (kNotFound when none).
  Result<MrHandle> localHandle(std::string_view name) const;
  Result<MrHandle> remoteHandle(std::string_view name) const;

  // ---- metadata and connection ----
  // This side's metadata (JSON text; see the top of this file). Stable for the endpoint's life
  // except for "mr_info", which lists the pool's regions at the time of the call.
  std::string endpointInfo() const;
  // The pool's regions (MemoryPool::mrInfo()).
  std::string mrInfo() const;
  // Connects to the peer described by peerInfo (its endpointInfo()). Both sides call it, in any
  // order. Also records every region of the peer's "mr_info" under its name. kInvalidArgument for
  // malformed metadata or a different num_qp (nothing changes); kInvalidArgument when already
  // connected; kClosed after shutdown(). Returns when the queue pairs are ready to send (the
  // first operations may wait for the peer's connect()).
  Status connect(std::string_view peerInfo);
  bool connected() const;

  // ---- one-sided ----
  // Moves every range of the batch; one future for all. The batch is copied (resolved) before
  // the call returns. Errors before anything is posted: see the top of this file.
  Result<ReadWriteFuture> read(std::span<const Assignment> batch);
  Result<ReadWriteFuture> write(std::span<const Assignment> batch);
  // write() followed by the immediate, which the peer's immRecv() receives once every byte of the
  // batch is in place there.
  Result<ReadWriteFuture> writeWithImm(std::span<const Assignment> batch, uint32_t immData);

  // ---- two-sided ----
  // Sends the chunks, gathered in order, as one message.
  Result<SendFuture> send(std::span<const Chunk> chunks);
  // Receives the next message into the chunks (scattered in order). Allowed before connect().
  Result<RecvFuture> recv(std::span<const Chunk> chunks);
  // The next immediate of the peer's writeWithImm() (allowed before connect()).
  Result<ImmRecvFuture> immRecv();

  // Fails every pending operation with kCancelled (after the queue pairs stopped touching memory)
  // and releases the queue pairs and receive buffers. Idempotent; prompt (no wait for the peer).
  void shutdown();
  // The same, failing the pending operations with `why` instead (e.g. the agent's kPeerGone when
  // it learned that the peer died; `why` must not be OK).
  void shutdown(const Status& why);
  bool isShutdown() const;

  // ---- introspection ----
  size_t numQp() const;
  const EndpointOptions& options() const;
  const std::shared_ptr<MemoryPool>& pool() const;
  const std::shared_ptr<RdmaContext>& context() const;
  std::shared_ptr<Worker> worker() const;
  // The status that failed the endpoint (OK while it works).
  Status failure() const;
  EndpointStats stats() const;

 protected:
  // Only EndpointImpl, the endpoint's state (src/endpoint), derives from it: create() makes one.
  Endpoint() = default;

 private:
  friend class EndpointImpl;
  EndpointImpl& impl();
  const EndpointImpl& impl() const;
};

}  // namespace ferry::endpoint
