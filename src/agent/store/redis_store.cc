#include "agent/store/redis_store.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <vector>

namespace ferry::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kLeasePrefix = "__ferry_lease/";
constexpr std::string_view kLeaseCounter = "__ferry_lease_next";
// Keys ferry keeps for itself: never listed, never reported to a watch.
constexpr std::string_view kInternalPrefix = "__ferry_lease";
constexpr int kPollIntervalMs = 200;
// A watch pings its events connection after this much silence and reconnects after three times
// as much: a server host that vanished sends no FIN.
constexpr auto kWatchSilence = std::chrono::seconds(5);

timeval toTimeval(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}

std::string leaseRecord(LeaseId lease) { return std::string(kLeasePrefix) + std::to_string(lease); }

// A Redis glob matching the keys that start with prefix.
std::string globOf(std::string_view prefix) {
  std::string glob;
  for (char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') glob.push_back('\\');
    glob.push_back(c);
  }
  glob.push_back('*');
  return glob;
}

bool isInternal(std::string_view key) { return key.substr(0, kInternalPrefix.size()) == kInternalPrefix; }

std::string_view replyText(const redisReply* r) { return std::string_view(r->str, r->len); }

int64_t parseInt(std::string_view s, int64_t fallback) {
  int64_t v = fallback;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() ? v : fallback;
}

// What a keyspace event means for a watch: a key now has a (new) value, a key is gone, or nothing
// a watcher sees (an EXPIRE, a hash command).
enum class Change { kPut, kDelete, kNone };
Change changeOf(std::string_view event) {
  for (std::string_view put :
       {"set", "setrange", "append", "incrby", "incrbyfloat", "rename_to", "restore", "copy_to", "move_to"}) {
    if (event == put) return Change::kPut;
  }
  for (std::string_view del : {"del", "expired", "evicted", "rename_from", "move_from"}) {
    if (event == del) return Change::kDelete;
  }
  return Change::kNone;
}

}  // namespace

void RedisConnection::ReplyDeleter::operator()(redisReply* reply) const { freeReplyObject(reply); }

RedisConnection::~RedisConnection() { close(); }

void RedisConnection::close() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

Status RedisConnection::connect(const StoreUrl& url, std::chrono::milliseconds timeout) {
  close();
  url_ = url.text;
  redisContext* c = redisConnectWithTimeout(url.host.c_str(), url.port, toTimeval(timeout));
  if (c == nullptr) return storeUnavailable(url.text, "cannot allocate a hiredis context");
  if (c->err != 0) {
    std::string why = c->errstr;
    redisFree(c);
    return storeUnavailable(url.text, why);
  }
  if (redisSetTimeout(c, toTimeval(timeout)) != REDIS_OK) {
    redisFree(c);
    return storeUnavailable(url.text, "cannot set the command timeout");
  }
  context_ = c;
  if (url.database != 0) {
    std::string db = std::to_string(url.database);
    auto selected = command({"SELECT", db});
    if (!selected.isOk()) {
      close();
      return selected.status().code() == StatusCode::kUnavailable
                 ? selected.status()
                 : invalidArgument(url.text + ": cannot select database " + db + ": " +
                                   selected.status().message());
    }
  }
  // Watches need keyspace events: K (keyspace channel), and every class (A), which covers
  // generic commands (del), strings (set) and expiry. A server that refuses CONFIG (a managed one)
  // may have them on already; otherwise watches poll.
  auto configured = command({"CONFIG", "SET", "notify-keyspace-events", "KEA"});
  if (!configured.isOk() && configured.status().code() == StatusCode::kUnavailable)
    return configured.status();
  notifications_ = configured.isOk();
  if (!notifications_) {
    auto current = command({"CONFIG", "GET", "notify-keyspace-events"});
    if (current.isOk() && (*current)->type == REDIS_REPLY_ARRAY && (*current)->elements == 2) {
      std::string_view flags = replyText((*current)->element[1]);
      auto has = [&](char f) { return flags.find(f) != std::string_view::npos; };
      notifications_ = has('K') && (has('A') || (has('g') && has('$') && has('x')));
    }
    if (!current.isOk() && current.status().code() == StatusCode::kUnavailable) return current.status();
  }
  return Status::ok();
}

Result<RedisConnection::Reply> RedisConnection::command(std::initializer_list<std::string_view> args) {
  if (context_ == nullptr) return storeUnavailable(url_, "not connected");
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lengths.push_back(a.size());
  }
  Reply reply(static_cast<redisReply*>(
      redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
  if (!reply) {
    // hiredis marks the context broken after an I/O error or a timeout: it cannot be reused.
    std::string why = context_->errstr[0] != '\0' ? context_->errstr : "connection lost";
    close();
    return storeUnavailable(url_, why);
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    std::string message(replyText(reply.get()));
    StatusCode code =
        message.rfind("WRONGTYPE", 0) == 0 ? StatusCode::kInvalidArgument : StatusCode::kInternal;
    return Status(code, url_ + ": redis: " + message);
  }
  return reply;
}

Result<std::vector<StoreEntry>> redisList(RedisConnection& connection, std::string_view prefix) {
  std::string glob = globOf(prefix);
  std::set<std::string> keys;
  std::string cursor = "0";
  do {
    FERRY_ASSIGN_OR_RETURN(auto reply, connection.command({"SCAN", cursor, "MATCH", glob, "COUNT", "1000"}));
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[1]->type != REDIS_REPLY_ARRAY) {
      return Status(StatusCode::kProtocolError, connection.url() + ": an unexpected SCAN reply");
    }
    cursor.assign(replyText(reply->element[0]));
    for (size_t i = 0; i < reply->element[1]->elements; ++i) {
      std::string_view key = replyText(reply->element[1]->element[i]);
      if (!isInternal(key) && keyHasPrefix(key, prefix)) keys.emplace(key);
    }
  } while (cursor != "0");
  std::vector<StoreEntry> entries;
  for (const std::string& key : keys) {
    FERRY_ASSIGN_OR_RETURN(auto reply, connection.command({"GET", key}));
    // Gone since the SCAN, or not a string (not one of ours): not listed.
    if (reply->type == REDIS_REPLY_STRING) entries.push_back({key, std::string(replyText(reply.get()))});
  }
  return entries;
}

struct RedisStore::Watch {
  std::string prefix;
  WatchCb cb;
  WatchMirror mirror;
  RedisConnection events;    // PSUBSCRIBEd (notification mode)
  RedisConnection commands;  // GETs for put events; SCANs (polling mode)
  bool polling = false;
  std::map<std::string, std::string> polled;  // polling mode: what the last scan saw
  Clock::time_point lastHeard;
  int stopFd = -1;  // an eventfd: unwatch() writes it
  std::atomic<bool> stop{false};
  std::thread thread;
  ~Watch() {
    if (stopFd >= 0) ::close(stopFd);
  }
};

Result<std::unique_ptr<Store>> openRedisStore(const StoreUrl& url, const StoreOptions& options) {
  return std::unique_ptr<Store>(new RedisStore(url, options));
}

RedisStore::RedisStore(StoreUrl url, StoreOptions options) : url_(std::move(url)), options_(options) {}

RedisStore::~RedisStore() {
  std::vector<WatchId> ids;
  {
    std::lock_guard<std::mutex> lock(watchMu_);
    for (const auto& [id, w] : watches_) ids.push_back(id);
  }
  for (WatchId id : ids) unwatch(id);
}

Result<RedisConnection::Reply> RedisStore::command(std::initializer_list<std::string_view> args) {
  for (int attempt = 0;; ++attempt) {
    bool reused = connection_.connected();
    if (!reused) FERRY_RETURN_IF_ERROR(connection_.connect(url_, options_.timeout));
    auto reply = connection_.command(args);
    // A connection kept from an earlier call finds out only now that the server restarted.
    if (!reply.isOk() && reply.status().code() == StatusCode::kUnavailable && reused && attempt == 0)
      continue;
    return reply;
  }
}

void RedisStore::untrackLocked(const std::string& key) {
  auto it = keyLease_.find(key);
  if (it == keyLease_.end()) return;
  auto lease = leaseKeys_.find(it->second);
  if (lease != leaseKeys_.end()) lease->second.erase(key);
  keyLease_.erase(it);
}

Status RedisStore::set(std::string_view key, std::string_view value, LeaseId lease) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  FERRY_RETURN_IF_ERROR(checkStoreValue(value));
  std::lock_guard<std::mutex> lock(mu_);
  std::string k(key);
  if (lease == 0) {
    FERRY_RETURN_IF_ERROR(command({"SET", k, value}).status());
    untrackLocked(k);
    return Status::ok();
  }
  // The key expires with the lease: it lives for the lease's remaining time.
  FERRY_ASSIGN_OR_RETURN(auto left, command({"PTTL", leaseRecord(lease)}));
  if (left->type != REDIS_REPLY_INTEGER || left->integer <= 0) {
    return notFound("lease " + std::to_string(lease) + " has expired or was never granted");
  }
  FERRY_RETURN_IF_ERROR(command({"SET", k, value, "PX", std::to_string(left->integer)}).status());
  untrackLocked(k);
  leaseKeys_[lease].insert(k);
  keyLease_[k] = lease;
  return Status::ok();
}

Result<std::string> RedisStore::get(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_ASSIGN_OR_RETURN(auto reply, command({"GET", key}));
  if (reply->type != REDIS_REPLY_STRING) return notFound("no key '" + std::string(key) + "'");
  return std::string(replyText(reply.get()));
}

Result<std::vector<StoreEntry>> RedisStore::list(std::string_view prefix) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  std::lock_guard<std::mutex> lock(mu_);
  if (!connection_.connected()) FERRY_RETURN_IF_ERROR(connection_.connect(url_, options_.timeout));
  auto entries = redisList(connection_, prefix);
  if (!entries.isOk() && entries.status().code() == StatusCode::kUnavailable) {
    // Once more on a fresh connection, as command() does.
    FERRY_RETURN_IF_ERROR(connection_.connect(url_, options_.timeout));
    entries = redisList(connection_, prefix);
  }
  return entries;
}

Status RedisStore::erase(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_RETURN_IF_ERROR(command({"DEL", key}).status());
  untrackLocked(std::string(key));
  return Status::ok();
}

Result<LeaseId> RedisStore::grantLease(std::chrono::seconds ttl) {
  if (ttl < std::chrono::seconds(1)) return invalidArgument("a lease lasts at least 1 s");
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_ASSIGN_OR_RETURN(auto id, command({"INCR", kLeaseCounter}));
  if (id->type != REDIS_REPLY_INTEGER || id->integer <= 0) {
    return Status(StatusCode::kProtocolError, url_.text + ": an unexpected INCR reply");
  }
  std::string ms = std::to_string(std::chrono::milliseconds(ttl).count());
  FERRY_RETURN_IF_ERROR(command({"SET", leaseRecord(id->integer), ms, "PX", ms}).status());
  return LeaseId{id->integer};
}

Status RedisStore::keepAlive(LeaseId lease) {
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_ASSIGN_OR_RETURN(auto record, command({"GET", leaseRecord(lease)}));
  int64_t ttlMs = record->type == REDIS_REPLY_STRING ? parseInt(replyText(record.get()), 0) : 0;
  if (ttlMs <= 0) return notFound("lease " + std::to_string(lease) + " has expired or was never granted");
  std::string ms = std::to_string(ttlMs);
  FERRY_RETURN_IF_ERROR(command({"PEXPIRE", leaseRecord(lease), ms}).status());
  auto keys = leaseKeys_.find(lease);
  if (keys == leaseKeys_.end()) return Status::ok();
  for (const std::string& key : keys->second) {
    FERRY_RETURN_IF_ERROR(command({"PEXPIRE", key, ms}).status());
  }
  return Status::ok();
}

Status RedisStore::revokeLease(LeaseId lease) {
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_RETURN_IF_ERROR(command({"DEL", leaseRecord(lease)}).status());
  auto keys = leaseKeys_.find(lease);
  if (keys == leaseKeys_.end()) return Status::ok();
  for (const std::string& key : keys->second) {
    FERRY_RETURN_IF_ERROR(command({"DEL", key}).status());
    keyLease_.erase(key);
  }
  leaseKeys_.erase(keys);
  return Status::ok();
}

Status RedisStore::connectWatch(Watch* w, std::vector<StoreEntry>* snapshot) {
  auto timeout = std::min<std::chrono::milliseconds>(options_.timeout, kWatchConnectTimeout);
  FERRY_RETURN_IF_ERROR(w->commands.connect(url_, timeout));
  w->polling = !w->commands.notificationsOn();
  if (!w->polling) {
    FERRY_RETURN_IF_ERROR(w->events.connect(url_, timeout));
    std::string channel = "__keyspace@" + std::to_string(url_.database) + "__:" + globOf(w->prefix);
    FERRY_ASSIGN_OR_RETURN(auto subscribed, w->events.command({"PSUBSCRIBE", channel}));
    (void)subscribed;
  }
  // After subscribing: a change from now on is either in the snapshot or an event (or both).
  FERRY_ASSIGN_OR_RETURN(*snapshot, redisList(w->commands, w->prefix));
  w->lastHeard = Clock::now();
  if (w->polling) {
    w->polled.clear();
    for (const StoreEntry& e : *snapshot) w->polled[e.key] = e.value;
  }
  return Status::ok();
}

Result<WatchId> RedisStore::watch(std::string_view prefix, WatchCb cb) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  if (!cb) return invalidArgument("watch needs a callback");
  auto w = std::make_unique<Watch>();
  w->prefix.assign(prefix);
  w->cb = std::move(cb);
  w->stopFd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->stopFd < 0) return ioError("eventfd");
  std::vector<StoreEntry> snapshot;
  FERRY_RETURN_IF_ERROR(connectWatch(w.get(), &snapshot));
  w->mirror.reset(snapshot);
  Watch* raw = w.get();
  raw->thread = std::thread([this, raw] { runWatch(raw); });
  std::lock_guard<std::mutex> lock(watchMu_);
  WatchId id = nextWatch_++;
  watches_[id] = std::move(w);
  return id;
}

bool RedisStore::stopRequested(Watch* w, int ms) {
  pollfd p{w->stopFd, POLLIN, 0};
  if (!w->stop) poll(&p, 1, ms);
  return w->stop;
}

void RedisStore::runWatch(Watch* w) {
  while (!w->stop) {
    bool alive = w->polling ? pollPrefix(w) : readNotifications(w);
    if (alive || w->stop) continue;
    // The server went away: connect again until it is back (or the watch ends), then converge.
    w->events.close();
    w->commands.close();
    std::vector<StoreEntry> snapshot;
    while (!connectWatch(w, &snapshot).isOk()) {
      if (stopRequested(w, kPollIntervalMs)) return;
    }
    for (const StoreEvent& event : w->mirror.resync(snapshot)) {
      if (w->stop) return;
      w->cb(event);
    }
  }
}

bool RedisStore::readNotifications(Watch* w) {
  redisContext* c = w->events.context();
  pollfd fds[2] = {{c->fd, POLLIN, 0}, {w->stopFd, POLLIN, 0}};
  int n = poll(fds, 2, static_cast<int>(std::chrono::milliseconds(kWatchSilence).count()));
  if (w->stop) return true;
  if (n == 0) {
    if (Clock::now() - w->lastHeard > 3 * kWatchSilence) return false;
    // Silence: a PING (allowed while subscribed) proves the server is still there.
    int done = 0;
    if (redisAppendCommand(c, "PING") != REDIS_OK) return false;
    while (!done) {
      if (redisBufferWrite(c, &done) != REDIS_OK) return false;
    }
    return true;
  }
  if (n < 0) return errno == EINTR;
  if (redisBufferRead(c) != REDIS_OK) return false;
  w->lastHeard = Clock::now();
  void* raw = nullptr;
  while (redisGetReplyFromReader(c, &raw) == REDIS_OK && raw != nullptr) {
    RedisConnection::Reply reply(static_cast<redisReply*>(raw));
    raw = nullptr;
    // ["pmessage", pattern, "__keyspace@N__:key", event]; anything else (the PING's pong).
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 4 ||
        replyText(reply->element[0]) != "pmessage")
      continue;
    std::string_view channel = replyText(reply->element[2]);
    size_t colon = channel.find(':');
    if (colon == std::string_view::npos) continue;
    std::string key(channel.substr(colon + 1));
    Change change = changeOf(replyText(reply->element[3]));
    if (change == Change::kNone || isInternal(key) || !keyHasPrefix(key, w->prefix) ||
        !checkStoreKey(key).isOk()) {
      continue;
    }
    StoreEvent event{StoreEvent::Kind::kDelete, key, {}};
    if (change == Change::kPut) {
      auto value = w->commands.command({"GET", key});
      if (!value.isOk()) return false;
      // Deleted again meanwhile (its own event follows), or not a string: nothing to report.
      if ((*value)->type != REDIS_REPLY_STRING) continue;
      event = {StoreEvent::Kind::kPut, key, std::string(replyText(value->get()))};
    }
    if (w->stop) return true;
    w->mirror.note(event);
    w->cb(event);
  }
  return c->err == 0;
}

bool RedisStore::pollPrefix(Watch* w) {
  if (stopRequested(w, kPollIntervalMs)) return true;
  auto entries = redisList(w->commands, w->prefix);
  if (!entries.isOk()) return false;
  std::map<std::string, std::string> now;
  for (StoreEntry& e : *entries) now.emplace(std::move(e.key), std::move(e.value));
  std::vector<StoreEvent> events;
  for (const auto& [key, value] : w->polled) {
    if (now.find(key) == now.end()) events.push_back({StoreEvent::Kind::kDelete, key, {}});
  }
  for (const auto& [key, value] : now) {
    auto before = w->polled.find(key);
    if (before == w->polled.end() || before->second != value)
      events.push_back({StoreEvent::Kind::kPut, key, value});
  }
  w->polled = std::move(now);
  for (const StoreEvent& event : events) {
    if (w->stop) return true;
    w->mirror.note(event);
    w->cb(event);
  }
  return true;
}

void RedisStore::unwatch(WatchId id) {
  std::unique_ptr<Watch> w;
  {
    std::lock_guard<std::mutex> lock(watchMu_);
    auto it = watches_.find(id);
    if (it == watches_.end()) return;
    w = std::move(it->second);
    watches_.erase(it);
  }
  w->stop = true;
  uint64_t one = 1;
  (void)!::write(w->stopFd, &one, sizeof one);
  if (w->thread.joinable()) w->thread.join();
}

}  // namespace ferry::agent
