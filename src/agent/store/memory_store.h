// memory://[name]: a store inside this process. Every open() of one name shares one StoreTable
// (a MemorySpace), which lives as long as the process; each handle has its own watches.
//
// Leases expire lazily (every call first sweeps the leases that are due) and, while a handle has a
// watch, on that handle's dispatch thread, which sleeps until the next lease deadline, so watchers
// see expiry deletes on time even when nobody calls.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "agent/store/store_backend.h"
#include "agent/store/store_table.h"

namespace ferry::agent {

class MemoryStore;

// The table of one name and the handles watching it.
struct MemorySpace {
  std::mutex mu;  // ordered before every MemoryStore::mu_
  StoreTable table;
  std::vector<MemoryStore*> watchers;  // handles with at least one watch
};

class MemoryStore final : public Store {
 public:
  MemoryStore(std::string url, std::shared_ptr<MemorySpace> space);
  ~MemoryStore() override;

  const std::string& url() const override { return url_; }
  Status set(std::string_view key, std::string_view value, LeaseId lease) override;
  Result<std::string> get(std::string_view key) override;
  Result<std::vector<StoreEntry>> list(std::string_view prefix) override;
  Status erase(std::string_view key) override;
  Result<LeaseId> grantLease(std::chrono::seconds ttl) override;
  Status keepAlive(LeaseId lease) override;
  Status revokeLease(LeaseId lease) override;
  Result<WatchId> watch(std::string_view prefix, WatchCb cb) override;
  void unwatch(WatchId id) override;

  // Queues the events for this handle's matching watches (called with the space's mutex held).
  void deliver(const std::vector<StoreEvent>& events);
  // Wakes the dispatch thread to recompute its sleep (a lease with an earlier deadline exists).
  void wake();

 private:
  struct Watch {
    std::string prefix;
    WatchCb cb;
  };

  // Sweeps due leases and hands every event to the space's watchers; with space->mu held.
  void publishLocked(std::vector<StoreEvent>& events);
  void dispatchLoop();

  const std::string url_;
  const std::shared_ptr<MemorySpace> space_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<WatchId, Watch> watches_;
  std::deque<std::pair<WatchId, StoreEvent>> queue_;
  WatchId nextWatch_ = 1;
  WatchId running_ = 0;  // the watch whose callback runs now
  bool stop_ = false;
  bool subscribed_ = false;
  std::thread dispatcher_;
};

}  // namespace ferry::agent
