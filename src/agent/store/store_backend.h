// What the store backends (memory, ferry, redis, etcd: one folder, one file pair each) share: the
// parsed URL, the status a store that cannot be reached gives, and the bookkeeping that lets a
// re-established watch converge. Internal to src/agent/store/.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/agent/store.h"

namespace ferry::agent {

// How long a store's watch waits for one connection attempt to its server, so that unwatch() of a
// watch whose server is down returns soon.
inline constexpr auto kWatchConnectTimeout = std::chrono::milliseconds(1000);

// A store URL taken apart (see include/ferry/agent/store.h for the forms).
struct StoreUrl {
  std::string text;    // as given to Store::open
  std::string scheme;  // "memory", "ferry", "redis", "etcd"
  std::string host;    // remote stores: a name or an address (an IPv6 address without brackets)
  uint16_t port = 0;   // remote stores
  std::string name;    // memory://: the store's name ("default" when empty)
  int database = 0;    // redis://: the database number after the slash
};

// kInvalidArgument naming the URL for an unknown scheme, a missing or bad port, or anything after
// the authority the scheme does not take.
Result<StoreUrl> parseStoreUrl(std::string_view url);

// Whether key is one a watch or list of prefix sees.
inline bool keyHasPrefix(std::string_view key, std::string_view prefix) {
  return key.substr(0, prefix.size()) == prefix;
}

// kUnavailable "store URL is unavailable: why": what every call gives when the store cannot be
// reached or does not answer in time.
Status storeUnavailable(const std::string& url, const std::string& why);

// The keys a watch has reported as present. When a watch is re-established after the store went
// away, resync() turns the store's current entries under the prefix into the events that bring the
// watcher there: a put for each entry, a delete for each key that vanished meanwhile.
class WatchMirror {
 public:
  // Records what the watcher has been told (call for every event delivered).
  void note(const StoreEvent& event);
  // Starts from `current` without reporting it (the state when the watch was created).
  void reset(const std::vector<StoreEntry>& current);
  // The events to deliver after a reconnect; records them.
  std::vector<StoreEvent> resync(const std::vector<StoreEntry>& current);

 private:
  std::set<std::string, std::less<>> keys_;
};

// The backends' constructors, one per scheme (each defined in its own <scheme>_store.cc). The URL
// has been parsed and checked; connecting is lazy.
Result<std::unique_ptr<Store>> openMemoryStore(const StoreUrl& url, const StoreOptions& options);
Result<std::unique_ptr<Store>> openFerryStore(const StoreUrl& url, const StoreOptions& options);
Result<std::unique_ptr<Store>> openRedisStore(const StoreUrl& url, const StoreOptions& options);
Result<std::unique_ptr<Store>> openEtcdStore(const StoreUrl& url, const StoreOptions& options);

}  // namespace ferry::agent
