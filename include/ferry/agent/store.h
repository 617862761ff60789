// Store: the discovery store of the agent layer: a small key-value store with TTL leases and
// watches, behind one interface, chosen by URL.
//
//   auto store = Store::open("ferry://127.0.0.1:4479").value();
//   LeaseId lease = store->grantLease(std::chrono::seconds(10)).value();
//   Status st = store->set("/ferry/default/agents/prefill-0", addressBytes, lease);
//   auto addr = store->get("/ferry/default/agents/prefill-0");   // kNotFound when absent
//   WatchId w = store->watch("/ferry/default/agents/", [](const StoreEvent& e) { ... }).value();
//
// URLs:
//   memory://[name]        in-process: every open() of the same name in one process shares one store
//                          (the default name is "default"); gone with the process.
//   ferry://host:port      ferry's own embedded store, served by `ferry store --port N` (no external
//                          service; the default for one machine).
//   redis://host:port[/db] a Redis server (RESP over TCP, through hiredis).
//   etcd://host:port       an etcd v3 server (its JSON gateway over HTTP, through libcurl).
// An unknown scheme, a missing port or a port out of range: kInvalidArgument naming the URL.
//
// Keys and values: keys are text of 1 to 1024 bytes, valid UTF-8 without control characters
// (anything else: kInvalidArgument; a prefix may also be empty); values are bytes up to 1 MiB.
// Leases: a key set with a lease disappears (watchers see a kDelete) when the lease is not kept
// alive for its TTL; revoking a lease deletes its keys at once.
//
// Availability: every call has a deadline (StoreOptions::timeout); a store that is down or does not
// answer gives kUnavailable (or kTimedOut) with the URL in the message, and a later call tries again:
// a store that comes back is used again without reopening. A store that answers with something
// malformed gives kProtocolError; an error the store itself reports (e.g. a Redis error reply),
// kInternal with its message. Watches survive a restart of the store (they are re-established;
// events missed while it was down may be coalesced into the current state). docs/discovery-store.md
// has the details of each backend and the ferry:// wire protocol.
//
// Threads: every method may be called from any thread. Watch callbacks run on a thread of the
// store (never inside a call of the caller's); a callback must not block for long, and it may not
// call unwatch() of its own watch (it may call everything else).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::agent {

using LeaseId = int64_t;   // 0: no lease
using WatchId = uint64_t;  // 0: no watch

struct StoreOptions {
  // Deadline of one call (connect, request and answer).
  std::chrono::milliseconds timeout{3000};
};

struct StoreEntry {
  std::string key;
  std::string value;
  bool operator==(const StoreEntry&) const = default;
};

struct StoreEvent {
  enum class Kind : uint8_t { kPut, kDelete };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;  // empty for kDelete
};

using WatchCb = std::function<void(const StoreEvent&)>;

class Store {
 public:
  // Opens the store a URL names (see the top of this file). Connecting is lazy for the remote
  // stores: open() checks the URL only, so a store that is down can be opened and used when it
  // comes up. kInvalidArgument for a malformed URL.
  static Result<std::unique_ptr<Store>> open(std::string_view url, StoreOptions options = {});

  virtual ~Store() = default;

  // The URL it was opened with.
  virtual const std::string& url() const = 0;

  // Sets key to value, bound to `lease` (0: no lease; an expired or unknown lease: kNotFound).
  virtual Status set(std::string_view key, std::string_view value, LeaseId lease = 0) = 0;
  // The value of key; kNotFound when absent.
  virtual Result<std::string> get(std::string_view key) = 0;
  // Every entry whose key starts with prefix, sorted by key.
  virtual Result<std::vector<StoreEntry>> list(std::string_view prefix) = 0;
  // Deletes key (absent: OK).
  virtual Status erase(std::string_view key) = 0;

  // A lease of `ttl` (at least one second; shorter: kInvalidArgument).
  virtual Result<LeaseId> grantLease(std::chrono::seconds ttl) = 0;
  // Renews a lease for its full TTL; kNotFound when it has expired (its keys are gone).
  virtual Status keepAlive(LeaseId lease) = 0;
  // Ends a lease and deletes its keys (unknown or expired: OK).
  virtual Status revokeLease(LeaseId lease) = 0;

  // Calls cb for every change of a key that starts with prefix, from now on, until unwatch().
  virtual Result<WatchId> watch(std::string_view prefix, WatchCb cb) = 0;
  // Stops a watch; when it returns, its callback is not running and will not run again.
  virtual void unwatch(WatchId id) = 0;
};

// Checks a key and a value against the limits above (kInvalidArgument naming what is wrong).
Status checkStoreKey(std::string_view key);
Status checkStoreValue(std::string_view value);

}  // namespace ferry::agent
