// StoreTable: the keys, values and leases of a store that ferry keeps itself: the memory:// store
// and the ferry:// server hold one each. Not thread-safe: its owner serialises the calls (a mutex
// for memory://, the reactor thread for the server).
//
// Changes report what watchers must see as StoreEvents appended to `events`, in the order they
// happened; the owner hands them to the watches whose prefix matches. Time is passed in, so the
// owner decides when leases expire (lazily, on a timer, or both).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/store/store_backend.h"
#include "ferry/agent/store.h"

namespace ferry::agent {

class StoreTable {
 public:
  using Clock = std::chrono::steady_clock;

  // Sets key (checked with checkStoreKey/checkStoreValue: kInvalidArgument) bound to lease
  // (0: none; unknown or expired: kNotFound). Nothing changes on an error.
  Status set(std::string_view key, std::string_view value, LeaseId lease, std::vector<StoreEvent>* events);
  // kNotFound when absent.
  Result<std::string> get(std::string_view key) const;
  // Sorted by key.
  std::vector<StoreEntry> list(std::string_view prefix) const;
  // Absent: nothing happens.
  void erase(std::string_view key, std::vector<StoreEvent>* events);

  // A new lease that ends at now + ttl unless kept alive (ttl >= 1 s, else kInvalidArgument).
  Result<LeaseId> grantLease(std::chrono::seconds ttl, Clock::time_point now);
  // kNotFound when the lease is unknown (or expired and already swept).
  Status keepAlive(LeaseId lease, Clock::time_point now);
  // Deletes the lease's keys; unknown: nothing happens.
  void revokeLease(LeaseId lease, std::vector<StoreEvent>* events);
  // Ends every lease whose deadline is at or before now, deleting its keys.
  void expire(Clock::time_point now, std::vector<StoreEvent>* events);
  // The earliest lease deadline, if any lease is live.
  std::optional<Clock::time_point> nextDeadline() const;

 private:
  struct Entry {
    std::string value;
    LeaseId lease = 0;
  };
  struct Lease {
    std::chrono::seconds ttl{0};
    Clock::time_point deadline;
    std::set<std::string, std::less<>> keys;
  };

  void unbind(const std::string& key, LeaseId lease);
  void deleteKey(std::map<std::string, Entry, std::less<>>::iterator it, std::vector<StoreEvent>* events);

  std::map<std::string, Entry, std::less<>> entries_;
  std::map<LeaseId, Lease> leases_;
  LeaseId nextLease_ = 1;
};

}  // namespace ferry::agent
