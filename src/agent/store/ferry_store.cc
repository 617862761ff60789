#include "agent/store/ferry_store.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include "agent/store/ferry_store_server.h"
#include "common/base64.h"

namespace ferry::agent {
namespace {

using Clock = std::chrono::steady_clock;
using Type = StoreRequest::Type;

// The pause between a watch's reconnect attempts (each waits at most kWatchConnectTimeout).
constexpr auto kWatchRetryPause = std::chrono::milliseconds(200);

double secondsLeft(Clock::time_point deadline) {
  double left = std::chrono::duration<double>(deadline - Clock::now()).count();
  return std::max(left, 0.001);
}

Status badReply(const std::string& why) {
  return Status(StatusCode::kProtocolError, "malformed reply: " + why);
}

// The status a "failure" reply carries; only the codes a server gives for a request count.
Status failureOf(const std::string& url, const json::Value& reply) {
  FERRY_ASSIGN_OR_RETURN(std::string code, controlFields(reply).text("code", 32));
  FERRY_ASSIGN_OR_RETURN(std::string message, controlFields(reply).text("message", 4096));
  for (StatusCode c : {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kResourceExhausted,
                       StatusCode::kInternal}) {
    if (code == statusCodeName(c)) return Status(c, url + ": " + message);
  }
  return badReply("unknown status code '" + code + "'");
}

// The entries of an "entries" or "watching" reply, appended to *out; whether more lines follow.
Result<bool> entriesOf(const json::Value& reply, std::string_view prefix, std::vector<StoreEntry>* out) {
  const json::Value* entries = reply.find("entries");
  if (entries == nullptr || entries->array() == nullptr) return badReply("no 'entries' array");
  for (const json::Value& e : *entries->array()) {
    if (!e.isObject() || e.object()->size() != 2) return badReply("an entry is not {key, value}");
    FERRY_ASSIGN_OR_RETURN(std::string key, controlFields(e).text("key", 1024));
    FERRY_ASSIGN_OR_RETURN(std::string text, controlFields(e).text("value", kMaxStoreValueText));
    auto value = decodeBase64(text);
    if (!checkStoreKey(key).isOk() || !keyHasPrefix(key, prefix) || !value.isOk()) {
      return badReply("an entry with a bad key or value");
    }
    if (!out->empty() && out->back().key >= key) return badReply("entries out of order");
    out->push_back({std::move(key), std::move(*value)});
  }
  return controlFields(reply).boolean("more");
}

// A pushed event of a watch of prefix.
Result<StoreEvent> eventOf(const json::Value& message, std::string_view prefix) {
  FERRY_ASSIGN_OR_RETURN(std::string kind, controlFields(message).text("kind", 16));
  StoreEvent event;
  FERRY_ASSIGN_OR_RETURN(event.key, controlFields(message).text("key", 1024));
  if (!checkStoreKey(event.key).isOk() || !keyHasPrefix(event.key, prefix)) {
    return badReply("an event for a key outside the watch");
  }
  if (kind == "put") {
    FERRY_ASSIGN_OR_RETURN(std::string text, controlFields(message).text("value", kMaxStoreValueText));
    auto value = decodeBase64(text);
    if (!value.isOk()) return badReply("an event with a bad value");
    event.value = std::move(*value);
  } else if (kind == "delete") {
    event.kind = StoreEvent::Kind::kDelete;
  } else {
    return badReply("an event of unknown kind '" + kind + "'");
  }
  return event;
}

Status checkReplyId(const json::Value& reply, int64_t id) {
  const json::Value* got = reply.find("id");
  if (got == nullptr || !got->isInt() || *got->getInt() != id) return badReply("a reply to another request");
  return Status::ok();
}

// Connects a watch: a fresh connection, the watch request, the snapshot of the prefix.
Status openWatchChannel(const StoreUrl& url, Clock::duration timeout, const std::string& prefix,
                        ControlChannel* ch, std::vector<StoreEntry>* snapshot) {
  auto deadline = Clock::now() + timeout;
  auto connected = ControlChannel::connect(url.host, url.port, secondsLeft(deadline), storeProtocol());
  if (!connected.isOk()) return storeUnavailable(url.text, connected.status().message());
  *ch = std::move(*connected);
  StoreRequest request{.type = Type::kWatch, .id = 1, .key = prefix};
  Status st = ch->send("watch", storeRequestBody(request), secondsLeft(deadline));
  if (!st.isOk()) return storeUnavailable(url.text, st.message());
  snapshot->clear();
  while (true) {
    auto reply = ch->expect("watching", secondsLeft(deadline));
    if (!reply.isOk()) return storeUnavailable(url.text, reply.status().message());
    FERRY_RETURN_IF_ERROR(checkReplyId(*reply, 1));
    FERRY_ASSIGN_OR_RETURN(bool more, entriesOf(*reply, prefix, snapshot));
    if (!more) return Status::ok();
  }
}

}  // namespace

struct FerryStore::Watch {
  std::string prefix;
  WatchCb cb;
  WatchMirror mirror;  // touched by the watch's thread only (and by watch() before it starts)
  std::thread thread;
  std::atomic<bool> stop{false};
  std::mutex mu;  // guards fd against unwatch()'s shutdown
  std::condition_variable cv;
  int fd = -1;
};

Result<std::unique_ptr<Store>> openFerryStore(const StoreUrl& url, const StoreOptions& options) {
  return std::unique_ptr<Store>(new FerryStore(url, options));
}

FerryStore::FerryStore(StoreUrl url, StoreOptions options) : url_(std::move(url)), options_(options) {}

FerryStore::~FerryStore() {
  std::vector<WatchId> ids;
  {
    std::lock_guard<std::mutex> lock(watchMu_);
    for (const auto& [id, w] : watches_) ids.push_back(id);
  }
  for (WatchId id : ids) unwatch(id);
}

Status FerryStore::call(StoreRequest& request, std::vector<json::Value>* replies) {
  std::lock_guard<std::mutex> lock(mu_);
  auto deadline = Clock::now() + options_.timeout;
  for (int attempt = 0;; ++attempt) {
    bool reused = channel_.fd() >= 0;
    if (!reused) {
      auto ch = ControlChannel::connect(url_.host, url_.port, secondsLeft(deadline), storeProtocol());
      if (!ch.isOk()) return storeUnavailable(url_.text, ch.status().message());
      channel_ = std::move(*ch);
    }
    request.id = nextRequest_++;
    replies->clear();
    Status st =
        channel_.send(storeRequestTypeName(request.type), storeRequestBody(request), secondsLeft(deadline));
    bool answered = false;
    while (st.isOk()) {
      auto reply = channel_.receive(secondsLeft(deadline));
      if (!reply.isOk()) {
        st = reply.status();
        break;
      }
      answered = true;
      st = checkReplyId(*reply, request.id);
      if (!st.isOk()) break;
      std::string type(*reply->find("type")->getString());
      if (type == "failure") {
        Status failure = failureOf(url_.text, *reply);
        if (failure.code() != StatusCode::kProtocolError) return failure;
        st = failure;
        break;
      }
      bool entries = request.type == Type::kList;
      std::string_view want = entries                             ? "entries"
                              : request.type == Type::kGet        ? "value"
                              : request.type == Type::kGrantLease ? "lease"
                                                                  : "ok";
      if (type != want) {
        st = badReply("'" + type + "' in reply to '" + storeRequestTypeName(request.type) + "'");
        break;
      }
      replies->push_back(std::move(*reply));
      if (!entries) return Status::ok();
      auto more = replies->back().find("more");
      if (more == nullptr || !more->isBool()) {
        st = badReply("no 'more'");
        break;
      }
      if (!*more->getBool()) return Status::ok();
    }
    // The connection is unusable now: whatever came (or did not) next would be out of step.
    channel_.close();
    if (st.code() == StatusCode::kProtocolError) return Status(st.code(), url_.text + ": " + st.message());
    // A connection kept from an earlier call finds out only now that the server restarted in
    // between: send the request once more on a fresh one.
    if (reused && attempt == 0 && !answered && st.code() == StatusCode::kUnavailable &&
        Clock::now() < deadline) {
      continue;
    }
    return storeUnavailable(url_.text, st.message());
  }
}

Status FerryStore::set(std::string_view key, std::string_view value, LeaseId lease) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  FERRY_RETURN_IF_ERROR(checkStoreValue(value));
  if (lease < 0) return notFound("lease " + std::to_string(lease) + " was never granted");
  StoreRequest request{
      .type = Type::kSet, .key = std::string(key), .value = std::string(value), .lease = lease};
  std::vector<json::Value> replies;
  return call(request, &replies);
}

Result<std::string> FerryStore::get(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  StoreRequest request{.type = Type::kGet, .key = std::string(key)};
  std::vector<json::Value> replies;
  FERRY_RETURN_IF_ERROR(call(request, &replies));
  auto text = controlFields(replies[0]).text("value", kMaxStoreValueText);
  auto value = text.isOk() ? decodeBase64(*text) : Result<std::string>(text.status());
  if (!value.isOk())
    return Status(StatusCode::kProtocolError, url_.text + ": malformed reply: " + value.status().message());
  return value;
}

Result<std::vector<StoreEntry>> FerryStore::list(std::string_view prefix) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  StoreRequest request{.type = Type::kList, .key = std::string(prefix)};
  std::vector<json::Value> replies;
  FERRY_RETURN_IF_ERROR(call(request, &replies));
  std::vector<StoreEntry> entries;
  for (const json::Value& reply : replies) {
    auto more = entriesOf(reply, prefix, &entries);
    if (!more.isOk()) return Status(more.status().code(), url_.text + ": " + more.status().message());
  }
  return entries;
}

Status FerryStore::erase(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  StoreRequest request{.type = Type::kErase, .key = std::string(key)};
  std::vector<json::Value> replies;
  return call(request, &replies);
}

Result<LeaseId> FerryStore::grantLease(std::chrono::seconds ttl) {
  if (ttl < std::chrono::seconds(1) || ttl.count() > kMaxLeaseTtlSeconds) {
    return invalidArgument("a lease lasts from 1 s to " + std::to_string(kMaxLeaseTtlSeconds) + " s");
  }
  StoreRequest request{.type = Type::kGrantLease, .ttlSeconds = ttl.count()};
  std::vector<json::Value> replies;
  FERRY_RETURN_IF_ERROR(call(request, &replies));
  auto lease = controlFields(replies[0]).integer("lease", 1, INT64_MAX);
  if (!lease.isOk()) return Status(StatusCode::kProtocolError, url_.text + ": " + lease.status().message());
  return *lease;
}

Status FerryStore::keepAlive(LeaseId lease) {
  if (lease <= 0) return notFound("lease " + std::to_string(lease) + " was never granted");
  StoreRequest request{.type = Type::kKeepAlive, .lease = lease};
  std::vector<json::Value> replies;
  return call(request, &replies);
}

Status FerryStore::revokeLease(LeaseId lease) {
  if (lease <= 0) return Status::ok();
  StoreRequest request{.type = Type::kRevokeLease, .lease = lease};
  std::vector<json::Value> replies;
  return call(request, &replies);
}

Result<WatchId> FerryStore::watch(std::string_view prefix, WatchCb cb) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  if (!cb) return invalidArgument("watch needs a callback");
  auto w = std::make_unique<Watch>();
  w->prefix.assign(prefix);
  w->cb = std::move(cb);
  ControlChannel ch;
  std::vector<StoreEntry> snapshot;
  FERRY_RETURN_IF_ERROR(openWatchChannel(url_, options_.timeout, w->prefix, &ch, &snapshot));
  w->mirror.reset(snapshot);
  w->fd = ch.fd();
  Watch* raw = w.get();
  // The thread owns the channel; unwatch() reaches it only through shutdown() of raw->fd.
  raw->thread = std::thread([this, raw, ch = std::move(ch)]() mutable { runWatch(raw, std::move(ch)); });
  std::lock_guard<std::mutex> lock(watchMu_);
  WatchId id = nextWatch_++;
  watches_[id] = std::move(w);
  return id;
}

void FerryStore::runWatch(Watch* w, ControlChannel ch) {
  const double silence = std::chrono::duration<double>(3 * kWatchPingInterval).count();
  while (true) {
    while (true) {
      auto message = ch.receive(silence);
      if (w->stop) return;
      if (!message.isOk()) break;
      std::string type(*message->find("type")->getString());
      if (type == "ping") continue;
      auto event = type == "event" ? eventOf(*message, w->prefix) : Result<StoreEvent>(badReply(type));
      if (!event.isOk()) break;
      w->mirror.note(*event);
      w->cb(*event);
    }
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->fd = -1;
    }
    ch.close();
    std::vector<StoreEntry> snapshot;
    if (!reconnectWatch(w, &ch, &snapshot)) return;
    for (const StoreEvent& event : w->mirror.resync(snapshot)) {
      if (w->stop) return;
      w->cb(event);
    }
  }
}

bool FerryStore::reconnectWatch(Watch* w, ControlChannel* ch, std::vector<StoreEntry>* snapshot) {
  while (!w->stop) {
    ControlChannel fresh;
    Status st = openWatchChannel(url_, std::min<Clock::duration>(options_.timeout, kWatchConnectTimeout),
                                 w->prefix, &fresh, snapshot);
    std::unique_lock<std::mutex> lock(w->mu);
    if (w->stop) return false;
    if (st.isOk()) {
      w->fd = fresh.fd();
      *ch = std::move(fresh);
      return true;
    }
    w->cv.wait_for(lock, kWatchRetryPause, [&] { return w->stop.load(); });
  }
  return false;
}

void FerryStore::unwatch(WatchId id) {
  std::unique_ptr<Watch> w;
  {
    std::lock_guard<std::mutex> lock(watchMu_);
    auto it = watches_.find(id);
    if (it == watches_.end()) return;
    w = std::move(it->second);
    watches_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->stop = true;
    // Wakes the thread out of its blocking read; it sees stop and ends without another callback.
    if (w->fd >= 0) ::shutdown(w->fd, SHUT_RDWR);
  }
  w->cv.notify_all();
  if (w->thread.joinable()) w->thread.join();
}

}  // namespace ferry::agent
