#include "agent/store/memory_store.h"

namespace ferry::agent {
namespace {

using Clock = StoreTable::Clock;

// The spaces live as long as the process (memory://NAME is shared by name, not by handle), so the
// map is never destroyed: no static destructor can run while another thread still uses a space.
std::shared_ptr<MemorySpace> spaceNamed(const std::string& name) {
  static std::mutex mu;
  static auto* spaces = new std::map<std::string, std::shared_ptr<MemorySpace>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& space = (*spaces)[name];
  if (!space) space = std::make_shared<MemorySpace>();
  return space;
}

// The longest a dispatch thread sleeps without looking at the leases again, in case a wake-up
// raced with its sleep.
constexpr auto kMaxSleep = std::chrono::seconds(1);

}  // namespace

Result<std::unique_ptr<Store>> openMemoryStore(const StoreUrl& url, const StoreOptions& options) {
  return std::unique_ptr<Store>(new MemoryStore(url.text, spaceNamed(url.name)));
}

MemoryStore::MemoryStore(std::string url, std::shared_ptr<MemorySpace> space)
    : url_(std::move(url)), space_(std::move(space)) {}

MemoryStore::~MemoryStore() {
  {
    std::lock_guard<std::mutex> lock(space_->mu);
    auto& w = space_->watchers;
    w.erase(std::remove(w.begin(), w.end(), this), w.end());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
}

void MemoryStore::publishLocked(std::vector<StoreEvent>& events) {
  space_->table.expire(Clock::now(), &events);
  if (events.empty()) return;
  for (MemoryStore* handle : space_->watchers) handle->deliver(events);
}

Status MemoryStore::set(std::string_view key, std::string_view value, LeaseId lease) {
  std::lock_guard<std::mutex> lock(space_->mu);
  std::vector<StoreEvent> events;
  space_->table.expire(Clock::now(), &events);
  Status st = space_->table.set(key, value, lease, &events);
  publishLocked(events);
  return st;
}

Result<std::string> MemoryStore::get(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  std::lock_guard<std::mutex> lock(space_->mu);
  std::vector<StoreEvent> events;
  publishLocked(events);
  return space_->table.get(key);
}

Result<std::vector<StoreEntry>> MemoryStore::list(std::string_view prefix) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  std::lock_guard<std::mutex> lock(space_->mu);
  std::vector<StoreEvent> events;
  publishLocked(events);
  return space_->table.list(prefix);
}

Status MemoryStore::erase(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  std::lock_guard<std::mutex> lock(space_->mu);
  std::vector<StoreEvent> events;
  space_->table.erase(key, &events);
  publishLocked(events);
  return Status::ok();
}

Result<LeaseId> MemoryStore::grantLease(std::chrono::seconds ttl) {
  std::lock_guard<std::mutex> lock(space_->mu);
  auto lease = space_->table.grantLease(ttl, Clock::now());
  // The new deadline may be earlier than the one the dispatch threads sleep towards.
  if (lease.isOk()) {
    for (MemoryStore* handle : space_->watchers) handle->wake();
  }
  return lease;
}

Status MemoryStore::keepAlive(LeaseId lease) {
  std::lock_guard<std::mutex> lock(space_->mu);
  std::vector<StoreEvent> events;
  publishLocked(events);
  return space_->table.keepAlive(lease, Clock::now());
}

Status MemoryStore::revokeLease(LeaseId lease) {
  std::lock_guard<std::mutex> lock(space_->mu);
  std::vector<StoreEvent> events;
  space_->table.revokeLease(lease, &events);
  publishLocked(events);
  return Status::ok();
}

Result<WatchId> MemoryStore::watch(std::string_view prefix, WatchCb cb) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  if (!cb) return invalidArgument("watch needs a callback");
  // The space's mutex first (its order), so no change can slip between registering and watching.
  std::lock_guard<std::mutex> spaceLock(space_->mu);
  std::lock_guard<std::mutex> lock(mu_);
  if (!subscribed_) {
    space_->watchers.push_back(this);
    subscribed_ = true;
    dispatcher_ = std::thread([this] { dispatchLoop(); });
  }
  WatchId id = nextWatch_++;
  watches_[id] = Watch{std::string(prefix), std::move(cb)};
  return id;
}

void MemoryStore::unwatch(WatchId id) {
  std::unique_lock<std::mutex> lock(mu_);
  watches_.erase(id);
  // Another watch's callback may unwatch this one: it runs on the dispatch thread, so this one is
  // not running then and waiting would deadlock.
  if (std::this_thread::get_id() == dispatcher_.get_id()) return;
  cv_.wait(lock, [&] { return running_ != id; });
}

void MemoryStore::deliver(const std::vector<StoreEvent>& events) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const StoreEvent& e : events) {
      for (const auto& [id, w] : watches_) {
        if (keyHasPrefix(e.key, w.prefix)) queue_.emplace_back(id, e);
      }
    }
  }
  cv_.notify_all();
}

void MemoryStore::wake() { cv_.notify_all(); }

void MemoryStore::dispatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!queue_.empty()) {
      auto [id, event] = std::move(queue_.front());
      queue_.pop_front();
      auto it = watches_.find(id);
      if (it == watches_.end()) continue;
      WatchCb cb = it->second.cb;
      running_ = id;
      lock.unlock();
      cb(event);
      lock.lock();
      running_ = 0;
      cv_.notify_all();
      continue;
    }
    // Nothing queued: sweep the leases that are due (their deletes come back through deliver())
    // and sleep until the next deadline. The space's mutex comes before ours, so drop ours first.
    lock.unlock();
    Clock::time_point wakeAt = Clock::now() + kMaxSleep;
    {
      std::lock_guard<std::mutex> spaceLock(space_->mu);
      std::vector<StoreEvent> events;
      publishLocked(events);
      auto next = space_->table.nextDeadline();
      if (next && *next < wakeAt) wakeAt = *next;
    }
    lock.lock();
    if (stop_ || !queue_.empty()) continue;
    cv_.wait_until(lock, wakeAt);
  }
}

}  // namespace ferry::agent
