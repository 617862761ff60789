#include "agent/store/etcd_store.h"

#include <curl/curl.h>

#include <algorithm>
#include <condition_variable>

#include "common/base64.h"
#include "common/log.h"
#include "common/net/line_connection.h"

namespace ferry::agent {
namespace {

using Clock = std::chrono::steady_clock;

// The most an answer (or one line of a watch stream) may hold before it is refused: a list of
// many 1 MiB values is large, an endless one is hostile.
constexpr size_t kMaxResponseBytes = size_t{256} << 20;
constexpr int kWatchRetryPauseMs = 200;

void initCurlOnce() {
  // curl_global_init is not thread-safe; every handle is made after this.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t appendBody(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  if (body->size() + size * count > kMaxResponseBytes) return 0;  // aborts the transfer
  body->append(data, size * count);
  return size * count;
}

// The first key after every key that starts with prefix ("\0" meaning "to the end", as etcd reads
// range_end).
std::string prefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

json::Value rangeOf(std::string_view prefix) {
  json::Value body = json::Value::emptyObject();
  body.set("key", encodeBase64(prefix.empty() ? std::string_view("\0", 1) : prefix));
  body.set("range_end", encodeBase64(prefixEnd(prefix)));
  return body;
}

}  // namespace

EtcdHttp::EtcdHttp(const StoreUrl& url) : url_(url.text) {
  initCurlOnce();
  std::string host = url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host;
  base_ = "http://" + host + ":" + std::to_string(url.port);
  curl_ = curl_easy_init();
}

EtcdHttp::~EtcdHttp() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

Result<json::Value> EtcdHttp::post(const std::string& path, const json::Value& body,
                                   std::chrono::milliseconds timeout) {
  CURL* curl = static_cast<CURL*>(curl_);
  if (curl == nullptr) return resourceExhausted("cannot make a libcurl handle");
  std::string request = json::serialize(body);
  std::string answer;
  std::string target = base_ + path;
  char error[CURL_ERROR_SIZE] = {};
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_reset(curl);  // keeps the connection cache: the next request reuses the connection
  curl_easy_setopt(curl, CURLOPT_URL, target.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, appendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM for timeouts: this is a library
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http");
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) return storeUnavailable(url_, error[0] != '\0' ? error : curl_easy_strerror(rc));
  long httpCode = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &httpCode);
  auto parsed = json::parse(answer);
  if (!parsed.isOk() || !parsed->isObject()) {
    return Status(StatusCode::kProtocolError, url_ + ": etcd answered HTTP " + std::to_string(httpCode) +
                                                  " with a body that is not a JSON object");
  }
  if (httpCode != 200 || parsed->find("error") != nullptr) return decodeEtcdError(*parsed, httpCode, url_);
  return std::move(*parsed);
}

Result<EtcdSnapshot> etcdRange(EtcdHttp& http, std::string_view prefix, std::chrono::milliseconds timeout) {
  FERRY_ASSIGN_OR_RETURN(json::Value answer, http.post("/v3/kv/range", rangeOf(prefix), timeout));
  return decodeEtcdRange(answer, prefix, http.url());
}

struct EtcdStore::Watch {
  std::string prefix;
  WatchCb cb;
  WatchMirror mirror;
  std::atomic<bool> stop{false};
  std::mutex mu;  // guards multi against unwatch()'s wake-up
  std::condition_variable cv;
  CURLM* multi = nullptr;  // the stream in progress
  std::thread thread;
};

Result<std::unique_ptr<Store>> openEtcdStore(const StoreUrl& url, const StoreOptions& options) {
  initCurlOnce();
  return std::unique_ptr<Store>(new EtcdStore(url, options));
}

EtcdStore::EtcdStore(StoreUrl url, StoreOptions options)
    : url_(std::move(url)), options_(options), http_(url_) {}

EtcdStore::~EtcdStore() {
  std::vector<WatchId> ids;
  {
    std::lock_guard<std::mutex> lock(watchMu_);
    for (const auto& [id, w] : watches_) ids.push_back(id);
  }
  for (WatchId id : ids) unwatch(id);
}

Result<json::Value> EtcdStore::post(const std::string& path, const json::Value& body) {
  std::lock_guard<std::mutex> lock(mu_);
  return http_.post(path, body, options_.timeout);
}

Status EtcdStore::set(std::string_view key, std::string_view value, LeaseId lease) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  FERRY_RETURN_IF_ERROR(checkStoreValue(value));
  if (lease < 0) return notFound("lease " + std::to_string(lease) + " was never granted");
  json::Value body = json::Value::emptyObject();
  body.set("key", encodeBase64(key));
  body.set("value", encodeBase64(value));
  if (lease != 0) body.set("lease", std::to_string(lease));
  auto answer = post("/v3/kv/put", body);
  if (!answer.isOk() && answer.status().code() == StatusCode::kNotFound) {
    return notFound("lease " + std::to_string(lease) + " has expired or was never granted");
  }
  return answer.status();
}

Result<std::string> EtcdStore::get(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  json::Value body = json::Value::emptyObject();
  body.set("key", encodeBase64(key));
  FERRY_ASSIGN_OR_RETURN(json::Value answer, post("/v3/kv/range", body));
  FERRY_ASSIGN_OR_RETURN(std::vector<StoreEntry> kvs, decodeEtcdKvs(answer, url_.text));
  if (kvs.empty()) return notFound("no key '" + std::string(key) + "'");
  return std::move(kvs.front().value);
}

Result<std::vector<StoreEntry>> EtcdStore::list(std::string_view prefix) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_ASSIGN_OR_RETURN(EtcdSnapshot snapshot, etcdRange(http_, prefix, options_.timeout));
  return std::move(snapshot.entries);
}

Status EtcdStore::erase(std::string_view key) {
  FERRY_RETURN_IF_ERROR(checkStoreKey(key));
  json::Value body = json::Value::emptyObject();
  body.set("key", encodeBase64(key));
  return post("/v3/kv/deleterange", body).status();
}

Result<LeaseId> EtcdStore::grantLease(std::chrono::seconds ttl) {
  if (ttl < std::chrono::seconds(1)) return invalidArgument("a lease lasts at least 1 s");
  json::Value body = json::Value::emptyObject();
  body.set("TTL", static_cast<int64_t>(ttl.count()));
  FERRY_ASSIGN_OR_RETURN(json::Value answer, post("/v3/lease/grant", body));
  return decodeEtcdLeaseGrant(answer, url_.text);
}

Status EtcdStore::keepAlive(LeaseId lease) {
  json::Value body = json::Value::emptyObject();
  body.set("ID", std::to_string(lease));
  FERRY_ASSIGN_OR_RETURN(json::Value answer, post("/v3/lease/keepalive", body));
  FERRY_ASSIGN_OR_RETURN(int64_t ttl, decodeEtcdKeepAlive(answer, url_.text));
  if (ttl <= 0) return notFound("lease " + std::to_string(lease) + " has expired or was never granted");
  return Status::ok();
}

Status EtcdStore::revokeLease(LeaseId lease) {
  json::Value body = json::Value::emptyObject();
  body.set("ID", std::to_string(lease));
  auto answer = post("/v3/lease/revoke", body);
  if (!answer.isOk() && answer.status().code() == StatusCode::kNotFound) return Status::ok();
  return answer.status();
}

Result<WatchId> EtcdStore::watch(std::string_view prefix, WatchCb cb) {
  if (!prefix.empty()) FERRY_RETURN_IF_ERROR(checkStoreKey(prefix));
  if (!cb) return invalidArgument("watch needs a callback");
  auto w = std::make_unique<Watch>();
  w->prefix.assign(prefix);
  w->cb = std::move(cb);
  EtcdSnapshot snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    FERRY_ASSIGN_OR_RETURN(snapshot, etcdRange(http_, prefix, options_.timeout));
  }
  w->mirror.reset(snapshot.entries);
  Watch* raw = w.get();
  // The stream starts at the revision after the snapshot: a change made once watch() has
  // returned is reported even if the stream is set up a moment later.
  raw->thread = std::thread([this, raw, revision = snapshot.revision] { runWatch(raw, revision); });
  std::lock_guard<std::mutex> lock(watchMu_);
  WatchId id = nextWatch_++;
  watches_[id] = std::move(w);
  return id;
}

void EtcdStore::runWatch(Watch* w, int64_t revision) {
  EtcdHttp http(url_);
  auto timeout = std::min<std::chrono::milliseconds>(options_.timeout, kWatchConnectTimeout);
  while (!w->stop) {
    streamWatch(w, revision + 1);
    // The stream ended: the server went away or cancelled the watch. Converge once it answers.
    while (!w->stop) {
      auto snapshot = etcdRange(http, w->prefix, timeout);
      if (snapshot.isOk()) {
        revision = snapshot->revision;
        for (const StoreEvent& event : w->mirror.resync(snapshot->entries)) {
          if (w->stop) return;
          w->cb(event);
        }
        break;
      }
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait_for(lock, std::chrono::milliseconds(kWatchRetryPauseMs), [&] { return w->stop.load(); });
    }
  }
}

namespace {

struct StreamContext {
  net::LineFramer* framer;
  std::vector<StoreEvent>* events;
  std::string_view prefix;
  const std::string& url;
  Status refusal = Status::ok();  // why a line of the stream was refused
};

size_t onWatchBytes(char* data, size_t size, size_t count, void* user) {
  auto* ctx = static_cast<StreamContext*>(user);
  ctx->framer->feed(std::string_view(data, size * count));
  while (auto line = ctx->framer->next()) {
    if (line->find_first_not_of(" \r\t") == std::string_view::npos) continue;
    auto update = decodeEtcdWatchLine(*line, ctx->prefix, ctx->url);
    if (!update.isOk()) ctx->refusal = update.status();
    // A line refused or a watch cancelled ends the stream: the watch converges from a snapshot.
    if (!update.isOk() || update->canceled) return 0;  // aborts the transfer
    for (StoreEvent& event : update->events) ctx->events->push_back(std::move(event));
  }
  if (ctx->framer->overLimit()) {
    ctx->refusal =
        Status(StatusCode::kProtocolError, ctx->url + ": etcd's watch stream: a line over the size limit");
    return 0;
  }
  return size * count;
}

}  // namespace

void EtcdStore::streamWatch(Watch* w, int64_t revision) {
  json::Value create = rangeOf(w->prefix);
  create.set("start_revision", std::to_string(revision));
  json::Value body = json::Value::emptyObject();
  body.set("create_request", std::move(create));
  std::string request = json::serialize(body);
  std::string target = http_.base() + "/v3/watch";
  net::LineFramer framer(kMaxResponseBytes);
  std::vector<StoreEvent> events;
  StreamContext ctx{&framer, &events, w->prefix, url_.text};

  CURL* curl = curl_easy_init();
  CURLM* multi = curl_multi_init();
  if (curl == nullptr || multi == nullptr) {
    if (curl) curl_easy_cleanup(curl);
    if (multi) curl_multi_cleanup(multi);
    return;
  }
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_URL, target.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, onWatchBytes);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(kWatchConnectTimeout.count()));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http");
  // A server host that vanishes sends no FIN: TCP keepalive ends the stream within ~15 s.
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPIDLE, 5L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPINTVL, 5L);
  curl_multi_add_handle(multi, curl);
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->multi = multi;
  }
  int running = 1;
  while (running > 0 && !w->stop) {
    if (curl_multi_perform(multi, &running) != CURLM_OK) break;
    for (const StoreEvent& event : events) {
      if (w->stop) break;
      w->mirror.note(event);
      w->cb(event);
    }
    events.clear();
    if (running > 0 && !w->stop) curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->multi = nullptr;
  }
  curl_multi_remove_handle(multi, curl);
  curl_easy_cleanup(curl);
  curl_multi_cleanup(multi);
  curl_slist_free_all(headers);
  if (!ctx.refusal.isOk()) FERRY_LOG(kWarn, "%s; watching again", ctx.refusal.toString().c_str());
}

void EtcdStore::unwatch(WatchId id) {
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
    if (w->multi != nullptr) curl_multi_wakeup(w->multi);
  }
  w->cv.notify_all();
  if (w->thread.joinable()) w->thread.join();
}

}  // namespace ferry::agent
