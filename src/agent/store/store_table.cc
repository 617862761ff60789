#include "agent/store/store_table.h"

namespace ferry::agent {

Status StoreTable::set(std::string_view key, std::string_view value, LeaseId lease,
                       std::vector<StoreEvent>* events) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  FERRY_RETURN_IF_ERROR(checkStoreValue(value));
  if (lease != 0 && leases_.find(lease) == leases_.end()) {
    return notFound("lease " + std::to_string(lease) + " has expired or was never granted");
  }
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    it = entries_.emplace(std::string(key), Entry{}).first;
  } else if (it->second.lease != lease) {
    unbind(it->first, it->second.lease);
  }
  it->second.value.assign(value);
  it->second.lease = lease;
  if (lease != 0) leases_[lease].keys.insert(it->first);
  events->push_back({StoreEvent::Kind::kPut, it->first, it->second.value});
  return Status::ok();
}

Result<std::string> StoreTable::get(std::string_view key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return notFound("no key '" + std::string(key) + "'");
  return it->second.value;
}

std::vector<StoreEntry> StoreTable::list(std::string_view prefix) const {
  std::vector<StoreEntry> out;
  for (auto it = entries_.lower_bound(prefix); it != entries_.end() && keyHasPrefix(it->first, prefix);
       ++it) {
    out.push_back({it->first, it->second.value});
  }
  return out;
}

void StoreTable::erase(std::string_view key, std::vector<StoreEvent>* events) {
  auto it = entries_.find(key);
  if (it != entries_.end()) deleteKey(it, events);
}

Result<LeaseId> StoreTable::grantLease(std::chrono::seconds ttl, Clock::time_point now) {
  if (ttl < std::chrono::seconds(1)) return invalidArgument("a lease lasts at least 1 s");
  LeaseId id = nextLease_++;
  leases_[id] = Lease{ttl, now + ttl, {}};
  return id;
}

Status StoreTable::keepAlive(LeaseId lease, Clock::time_point now) {
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.deadline <= now) {
    return notFound("lease " + std::to_string(lease) + " has expired or was never granted");
  }
  it->second.deadline = now + it->second.ttl;
  return Status::ok();
}

void StoreTable::revokeLease(LeaseId lease, std::vector<StoreEvent>* events) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  std::set<std::string, std::less<>> keys = std::move(it->second.keys);
  leases_.erase(it);
  for (const std::string& key : keys) {
    auto e = entries_.find(key);
    if (e != entries_.end()) {
      e->second.lease = 0;  // the lease is gone already: deleteKey must not look for it
      deleteKey(e, events);
    }
  }
}

void StoreTable::expire(Clock::time_point now, std::vector<StoreEvent>* events) {
  std::vector<LeaseId> due;
  for (const auto& [id, lease] : leases_) {
    if (lease.deadline <= now) due.push_back(id);
  }
  for (LeaseId id : due) revokeLease(id, events);
}

std::optional<StoreTable::Clock::time_point> StoreTable::nextDeadline() const {
  std::optional<Clock::time_point> next;
  for (const auto& [id, lease] : leases_) {
    if (!next || lease.deadline < *next) next = lease.deadline;
  }
  return next;
}

void StoreTable::unbind(const std::string& key, LeaseId lease) {
  if (lease == 0) return;
  auto it = leases_.find(lease);
  if (it != leases_.end()) it->second.keys.erase(key);
}

void StoreTable::deleteKey(std::map<std::string, Entry, std::less<>>::iterator it,
                           std::vector<StoreEvent>* events) {
  unbind(it->first, it->second.lease);
  events->push_back({StoreEvent::Kind::kDelete, it->first, {}});
  entries_.erase(it);
}

}  // namespace ferry::agent
