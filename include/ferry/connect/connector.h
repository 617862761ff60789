// Connector: readable and writable operations over serialized metadata (spec 004), on ferry's
// agent. One worker exposes memory as an operation and hands the operation's metadata to another
// over any channel (HTTP, a queue, a file); the other begins a read or a write against it; both
// sides learn when it is over.
//
//   auto c = Connector::start({.workerId = "prefill-0"}).value();
//   auto readable = c->createReadable({{.addr = buf, .length = n}}).value();
//   std::string text = readable->metadata().value();          // to the peer, any channel
//   // the peer:  auto op = c2->beginRead(text, {{.addr = dst, .length = n}}).value();
//   //            op->completion().wait();
//   readable->completion().wait();                             // the owner learns it too
//
// Who moves the bytes: the owner of the readable or writable operation. beginRead()/beginWrite()
// expose the caller's buffers for that one operation (the peer may write into a read's buffers,
// read a write's), and send BEGIN with the metadata over the agent's wireup link to the owner.
// The owner checks the metadata's tag (HMAC-SHA256 under a key that never leaves it), its expiry,
// that the operation is waiting and that the sizes match, then moves the bytes with RDMA WRITE
// (readable) or READ (writable) in chunks, and answers DONE. So:
//   - the passive side's completion is its own transfer's: no message or poll is needed to learn
//     it, and it fires when the bytes are in place on both sides;
//   - metadata carries no memory key, only the operation's id and tag: a changed, truncated,
//     expired or reused text is refused by the owner before any byte moves, and no peer can reach
//     the owner's memory by any other way (its regions are registered without remote access);
//   - a transfer stops at once when either side cancels (see cancel()).
//
// Operations and their status (OperationStatus): a passive operation is INITIALIZED when
// created, IN_PROGRESS once a peer began it; an active one IN_PROGRESS from its begin. Every
// operation ends once: COMPLETE, CANCELLED (this side cancelled it) or ERRORED (the peer
// cancelled, refused, failed or died; error() says which). Each side's buffers stay exposed
// only while the operation runs: they are unregistered (their keys revoked) when it ends.
//
// Every operation ends (docs/connect.md, "Every wait ends"): with its transfer; when its peer is
// gone (kPeerGone naming the worker: a dead process is seen at once, an unreachable host within the
// agent's peerTimeout); when cancelled or shut down; and, if no peer began it by its metadata's
// expiry, then (kTimedOut): an owner's operation still INITIALIZED at `expires`, a reader's or
// writer's that the owner did not answer (STARTED) by `expires` plus cancelGrace. An operation
// that began in time is not ended by the expiry.
//
// Threads: every method may be called from any thread; the protocol runs on the connector's own
// thread and the agent's.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/agent/agent.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/future.h"

namespace ferry::connect {

// What the holder of an operation's metadata may do (spec 004's values).
enum class OperationKind : uint8_t { kRead = 1, kWrite = 2 };

enum class OperationStatus : uint8_t {
  kUninitialized = 0,
  kInitialized = 1,
  kInProgress = 2,
  kComplete = 3,
  kCancelled = 4,
  kErrored = 5,
};
// "UNINITIALIZED", "INITIALIZED", ...
const char* operationStatusName(OperationStatus s);

// Local memory of an operation: host memory only (ferry has no GPU path).
struct Buffer {
  void* addr = nullptr;
  uint64_t length = 0;
  bool readOnly = false;        // memory that must not be written (a Python bytes object)
  std::shared_ptr<void> owner;  // kept alive while the operation may touch the memory
};

struct ConnectorOptions {
  std::string workerId;              // the agent's alias ("" : "connector-<random>")
  std::string store;                 // the agent's discovery store ("" : none; metadata carries the address)
  std::string scope = "default";     // the agent's scope (the connector's namespace)
  std::vector<std::string> devices;  // the agent's devices (empty: every visible one)
  std::string listenHost;            // the agent's wireup listener ("" : every interface)
  std::string secret;                // the agent's shared secret ("" : FERRY_AGENT_SECRET, else none)
  agent::LaneOverrides lanes;        // the agent's lane overrides (empty: FERRY_AGENT_LANES, else its rules)
  // How long a readable or writable operation's metadata may be used (then refused as expired).
  std::chrono::milliseconds metadataTtl{std::chrono::minutes(10)};
  // The wireup deadline of a connection to an owner (begin fails ERRORED after it).
  std::chrono::milliseconds connectTimeout{std::chrono::seconds(30)};
  // How long cancel() waits for a transfer in flight to stop before it revokes the memory anyway;
  // also how long after the metadata's expiry a reader or writer waits for the owner to accept
  // its BEGIN (STARTED) before it ends kTimedOut.
  std::chrono::milliseconds cancelGrace{std::chrono::seconds(2)};
  // Bytes per RDMA batch of a transfer, and batches in flight: large batches keep the copy rate of
  // one big transfer (docs/performance.md, "Connector"); a cancel waits for at most window of them.
  uint64_t chunkBytes = uint64_t{64} << 20;
  uint32_t window = 4;
};

struct ConnectorStats {
  uint64_t created = 0;  // readable and writable operations created
  uint64_t begun = 0;    // reads and writes begun by this side
  uint64_t served = 0;   // transfers this side moved as owner
  uint64_t refused = 0;  // BEGINs refused (tag, expiry, state, sizes, malformed)
  uint64_t completed = 0, cancelled = 0, errored = 0;
  uint64_t bytesMoved = 0;  // bytes this side moved as owner
  uint64_t live = 0;        // operations not ended
};

class Connector;

// One operation: ReadableOperation / WritableOperation (passive) or ReadOperation /
// WriteOperation (active). Dropping the last handle of an operation that has not ended cancels it.
class Operation {
 public:
  struct State;
  explicit Operation(std::shared_ptr<State> state) : state_(std::move(state)) {}
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;
  ~Operation();

  uint64_t id() const;
  OperationKind kind() const;  // READ for readable and read operations, WRITE for the others
  bool passive() const;        // readable or writable
  OperationStatus status() const;
  // Why it was cancelled or errored (OK otherwise; kBusy while it runs).
  Status error() const;
  // Done when the operation ended: OK when COMPLETE, else error() (kTimedOut at the metadata's
  // expiry for one no peer began, kPeerGone when the peer is gone, ...). Awaitable from Python.
  endpoint::Future completion() const;
  // A passive operation's metadata (JSON text, RdmaMetadata's form); kInvalidArgument for an
  // active operation.
  Result<std::string> metadata() const;
  // Bytes moved so far (by this side as owner, or for this side).
  uint64_t bytes() const;
  // Cancels an operation that has not ended (nothing otherwise). When cancel() returns, this
  // side's memory is no longer reachable by the peer and no transfer touches it any more; the
  // status is CANCELLED, and the peer's operation ends ERRORED with kCancelled. A transfer in
  // flight is stopped: an owner stops its own batches; a reader or writer asks the owner to stop
  // and waits up to cancelGrace for it before revoking its buffers regardless.
  void cancel();

 private:
  std::shared_ptr<State> state_;
};

class Connector : public std::enable_shared_from_this<Connector> {
 public:
  struct Impl;
  // Starts the connector's agent (and its thread). Errors as Agent::start's.
  static Result<std::shared_ptr<Connector>> start(ConnectorOptions options);
  explicit Connector(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;
  ~Connector();  // shutdown()

  // Ends every operation not ended (ERRORED, kCancelled) and shuts the agent down. Idempotent.
  void shutdown();

  // Exposes local memory to be read (createReadable) or written (createWritable) by the holder
  // of the returned operation's metadata. kInvalidArgument for no buffer, more than 65,536, an
  // empty or null one, or read-only memory made writable; registration errors as the device gives.
  Result<std::shared_ptr<Operation>> createReadable(std::vector<Buffer> local);
  Result<std::shared_ptr<Operation>> createWritable(std::vector<Buffer> local);
  // Begins moving the bytes of a peer's readable operation into `local` (beginRead) or of `local`
  // into a peer's writable operation (beginWrite). Returns at once (the wireup to the owner, if
  // needed, goes on in the background); the operation is IN_PROGRESS. kInvalidArgument, before
  // anything moves, for malformed metadata, metadata of the other kind, a different number of
  // buffers or a size that differs from its descriptor's, read-only memory to read into, or
  // expired metadata.
  Result<std::shared_ptr<Operation>> beginRead(std::string_view remoteMetadata, std::vector<Buffer> local);
  Result<std::shared_ptr<Operation>> beginWrite(std::vector<Buffer> local, std::string_view remoteMetadata);

  const std::string& name() const;       // the worker id (the agent's alias)
  const std::string& nameSpace() const;  // the agent's scope
  const std::shared_ptr<agent::Agent>& agent() const;
  ConnectorStats stats() const;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ferry::connect
