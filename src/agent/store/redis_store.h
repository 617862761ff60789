// redis://host:port[/db]: the discovery store on a Redis server, through hiredis (RESP over TCP).
//
// Keys and values are Redis strings. Leases are not a Redis notion, so they are built from keys:
// a lease is a record "__ferry_lease/<id>" (its TTL in milliseconds, expiring with the lease; ids
// from INCR "__ferry_lease_next"); a key set under a lease is SET with PX the lease's remaining
// time, and this handle remembers which keys it set under each lease so keepAlive() can PEXPIRE
// them with the record and revokeLease() can DEL them. keepAlive() of a lease this handle did not
// set keys under renews the record only. list() and watches never show the "__ferry_lease" keys.
//
// Calls: one connection per handle, one command at a time, redisConnectWithTimeout and
// redisSetTimeout giving every call the deadline StoreOptions::timeout; a broken connection is
// replaced on the next call (and a command on a reused connection that turns out dead is sent once
// more). Watches: keyspace notifications (CONFIG SET notify-keyspace-events KEA when connecting,
// best effort) on a connection of each watch's own, PSUBSCRIBEd to the prefix; where the server
// refuses CONFIG and notifications are off, the watch polls the prefix with SCAN every 200 ms.
// Either way the watch re-establishes itself after a server restart and converges (WatchMirror).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "agent/store/store_backend.h"

struct redisContext;
struct redisReply;

namespace ferry::agent {

// One hiredis connection with deadlines (internal to the Redis backend).
class RedisConnection {
 public:
  struct ReplyDeleter {
    void operator()(redisReply* reply) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  RedisConnection() = default;
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Connects, sets the command timeout, SELECTs the database and turns keyspace notifications on
  // (best effort). kUnavailable naming the URL when the server cannot be reached.
  Status connect(const StoreUrl& url, std::chrono::milliseconds timeout);
  bool connected() const { return context_ != nullptr; }
  void close();
  // Runs one command (binary-safe arguments). kUnavailable when the connection broke (it is closed
  // then); an error reply is kInternal with Redis's message, or kInvalidArgument for WRONGTYPE.
  Result<Reply> command(std::initializer_list<std::string_view> args);
  // Whether keyspace notifications for keys, strings, generic commands and expiry are on.
  bool notificationsOn() const { return notifications_; }
  redisContext* context() { return context_; }
  const std::string& url() const { return url_; }

 private:
  redisContext* context_ = nullptr;
  std::string url_;
  bool notifications_ = false;
};

class RedisStore final : public Store {
 public:
  RedisStore(StoreUrl url, StoreOptions options);
  ~RedisStore() override;

  const std::string& url() const override { return url_.text; }
  Status set(std::string_view key, std::string_view value, LeaseId lease) override;
  Result<std::string> get(std::string_view key) override;
  Result<std::vector<StoreEntry>> list(std::string_view prefix) override;
  Status erase(std::string_view key) override;
  Result<LeaseId> grantLease(std::chrono::seconds ttl) override;
  Status keepAlive(LeaseId lease) override;
  Status revokeLease(LeaseId lease) override;
  Result<WatchId> watch(std::string_view prefix, WatchCb cb) override;
  void unwatch(WatchId id) override;

 private:
  struct Watch;

  // Runs a command on this handle's connection, connecting first when needed; a reused connection
  // that turns out broken is replaced and the command sent once more.
  Result<RedisConnection::Reply> command(std::initializer_list<std::string_view> args);
  // Forgets that key was set under a lease by this handle.
  void untrackLocked(const std::string& key);
  // Connects a watch's two connections (events, commands) and takes a snapshot of its prefix.
  Status connectWatch(Watch* w, std::vector<StoreEntry>* snapshot);
  void runWatch(Watch* w);
  // Handles what the events connection has delivered; false when it broke.
  bool readNotifications(Watch* w);
  bool pollPrefix(Watch* w);
  // Waits up to ms for the stop signal; true when the watch is stopped.
  bool stopRequested(Watch* w, int ms);

  const StoreUrl url_;
  const StoreOptions options_;

  std::mutex mu_;  // one command at a time on connection_, and the lease bookkeeping
  RedisConnection connection_;
  std::map<LeaseId, std::set<std::string>> leaseKeys_;
  std::map<std::string, LeaseId> keyLease_;

  std::mutex watchMu_;
  std::map<WatchId, std::unique_ptr<Watch>> watches_;
  WatchId nextWatch_ = 1;
};

// The entries under prefix on one connection: SCAN MATCH, then MGET; sorted by key; the
// "__ferry_lease" keys left out.
Result<std::vector<StoreEntry>> redisList(RedisConnection& connection, std::string_view prefix);

}  // namespace ferry::agent
