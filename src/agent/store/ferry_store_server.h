// StoreServer: ferry's own discovery store, the server behind ferry://host:port (`ferry store`
// runs one in the foreground; tests and tools may embed one). It keeps a StoreTable in memory:
// keys, values, leases with TTLs (expiry deletes the keys and tells the watchers) and watches.
// Nothing is persisted: a restarted server starts empty, and its clients' agents register again.
//
// Wire protocol (docs/discovery-store.md has every message and field): JSON lines over TCP, each
// an object {"ferry_store": 1, "type": ..., ...}; a request carries "id" and gets replies with the
// same id, in order. Values are base64 (they are bytes). A watch is a connection of its own on
// which the server pushes events. The server reads every line with decodeStoreRequest, which is
// strict; a connection that sends anything else (or a line over kMaxStoreLine) is told why in one
// "error" line and dropped; nothing else changes.
//
// Threads: one reactor thread (epoll) serves every connection and owns the table; start() and
// stop() may be called from any thread (not from a watch callback of a client in this process
// that talks to this server, which would wait for itself).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/control_channel.h"
#include "common/json.h"
#include "ferry/agent/store.h"

namespace ferry::agent {

inline constexpr int kStoreProtocolVersion = 1;
// The longest line either side accepts: a value of 1 MiB is 1.4 MiB in base64.
inline constexpr size_t kMaxStoreLine = size_t{2} << 20;
// Base64 text of the largest value (1 MiB).
inline constexpr size_t kMaxStoreValueText = ((size_t{1} << 20) + 2) / 3 * 4;
// Connections served at once; more are told so and closed.
inline constexpr size_t kMaxStoreConnections = 1024;
// Bytes a connection may have waiting to be sent before the server gives up on it (a watcher that
// does not read, a client that does not collect its replies). A dropped watcher re-establishes
// its watch and converges.
inline constexpr size_t kMaxStorePendingOutput = size_t{64} << 20;
// The longest lease a client may ask for (about 68 years).
inline constexpr int64_t kMaxLeaseTtlSeconds = int64_t{1} << 31;
// How often the server pings a watch connection; a watcher that hears nothing for three intervals
// treats the connection as dead and re-establishes it.
inline constexpr std::chrono::seconds kWatchPingInterval{5};

// {"ferry_store", 1, kMaxStoreLine}, for ControlChannel.
ControlProtocol storeProtocol();

// One request as the server understands it.
struct StoreRequest {
  enum class Type : uint8_t { kSet, kGet, kList, kErase, kGrantLease, kKeepAlive, kRevokeLease, kWatch };
  Type type = Type::kGet;
  int64_t id = 0;          // 1 .. 2^53, echoed in the replies
  std::string key{};       // set, get, erase: the key; list, watch: the prefix (may be empty)
  std::string value{};     // set: the bytes (base64 on the wire)
  LeaseId lease = 0;       // set (0: none), keepalive, revoke
  int64_t ttlSeconds = 0;  // grant: 1 .. kMaxLeaseTtlSeconds
  bool operator==(const StoreRequest&) const = default;
};

// The wire name of a request type: "set", "get", "list", "erase", "grant", "keepalive", "revoke",
// "watch".
const char* storeRequestTypeName(StoreRequest::Type type);

// Decodes one line a client sent (without its newline). Strict: a JSON object with exactly the
// members the type takes, "ferry_store" equal to kStoreProtocolVersion, each field of its kind and
// within its limits (keys checked with checkStoreKey, values with strict base64 and
// checkStoreValue). kProtocolError saying what is wrong for anything else. Pure: no state.
Result<StoreRequest> decodeStoreRequest(std::string_view line);

// The members of a request besides "ferry_store" and "type" (which ControlChannel::send adds);
// decodeStoreRequest reads back exactly this.
json::Value storeRequestBody(const StoreRequest& request);

// How long a connection may hold the server without a whole request: one that sent none within
// kStoreFirstRequestTimeout of connecting, or none for kStoreIdleTimeout since its last (a watch
// excepted), is closed.
inline constexpr std::chrono::seconds kStoreFirstRequestTimeout{10};
inline constexpr std::chrono::seconds kStoreIdleTimeout{60};

struct StoreServerOptions {
  // Serve clients of other hosts too. Off (protected mode): a client of another host is told why
  // in one "error" line and closed; also FERRY_AGENT_ALLOW_REMOTE=1. The store has no
  // authentication: docs/security.md says what opening it exposes.
  bool allowRemote = false;
};

class StoreServer {
 public:
  StoreServer();
  ~StoreServer();  // stop()
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Listens on host:port (port 0: the kernel picks one; see port()) and starts serving. Returns
  // when the socket listens, so a client may connect at once. kInvalidArgument for a host that
  // does not resolve, kIoError when the port cannot be bound (e.g. in use), kBusy when started.
  // When kMaxStoreConnections are held, a new client takes the place of the one that has been
  // idle the longest (a watch excepted), so that idle connections cannot lock clients out.
  Status start(const std::string& host, uint16_t port, StoreServerOptions options = {});
  // The port it listens on; 0 when not started.
  uint16_t port() const;
  // Closes every connection and the listening socket, and forgets every key, lease and watch.
  // Idempotent; start() may be called again afterwards (the same port is free again at once).
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::agent
