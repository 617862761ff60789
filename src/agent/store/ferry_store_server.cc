#include "agent/store/ferry_store_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <unordered_map>
#include <vector>

#include "agent/store/store_table.h"
#include "common/base64.h"
#include "common/log.h"
#include "common/net/admission.h"
#include "common/net/line_connection.h"
#include "common/net/listen.h"
#include "common/reactor.h"
#include "ferry/common/config.h"

namespace ferry::agent {
namespace {

using Clock = StoreTable::Clock;
using Type = StoreRequest::Type;

constexpr int64_t kMaxRequestId = int64_t{1} << 53;
// Entries per "entries"/"watching" line are cut at this many bytes, so that a line with one more
// entry (at most ~1.4 MiB) stays under kMaxStoreLine.
constexpr size_t kEntriesPerLineBytes = size_t{512} << 10;

// The line that tells a client why it is dropped: {"ferry_store": 1, "type": "error", "message": ...}.
std::string errorLine(const std::string& message) {
  json::Value why = json::Value::emptyObject();
  why.set("ferry_store", kStoreProtocolVersion);
  why.set("type", "error");
  why.set("message", message);
  return json::serialize(why);
}

struct RequestTypeName {
  Type type;
  const char* name;
};
constexpr RequestTypeName kTypeNames[] = {
    {Type::kSet, "set"},
    {Type::kGet, "get"},
    {Type::kList, "list"},
    {Type::kErase, "erase"},
    {Type::kGrantLease, "grant"},
    {Type::kKeepAlive, "keepalive"},
    {Type::kRevokeLease, "revoke"},
    {Type::kWatch, "watch"},
};

Status malformedRequest(const std::string& why) {
  return Status(StatusCode::kProtocolError, "malformed request: " + why);
}

// The members each request type has besides "ferry_store", "type" and "id".
std::vector<std::string_view> fieldsOf(Type type) {
  switch (type) {
    case Type::kSet: return {"key", "value", "lease"};
    case Type::kGet:
    case Type::kErase: return {"key"};
    case Type::kList:
    case Type::kWatch: return {"prefix"};
    case Type::kGrantLease: return {"ttl"};
    case Type::kKeepAlive:
    case Type::kRevokeLease: return {"lease"};
  }
  return {};
}

Result<std::string> keyField(const json::Fields& f, std::string_view field, bool prefix) {
  FERRY_ASSIGN_OR_RETURN(std::string key, f.text(field, 1024));
  if (prefix && key.empty()) return key;
  Status st = checkStoreKey(key);
  if (!st.isOk()) return malformedRequest(st.message());
  return key;
}

Status decodeFields(const json::Fields& f, StoreRequest* out) {
  switch (out->type) {
    case Type::kSet: {
      FERRY_ASSIGN_OR_RETURN(out->key, keyField(f, "key", false));
      FERRY_ASSIGN_OR_RETURN(std::string text, f.text("value", kMaxStoreValueText));
      auto bytes = decodeBase64(text);
      if (!bytes.isOk()) return malformedRequest("field 'value': " + bytes.status().message());
      out->value = std::move(*bytes);
      Status st = checkStoreValue(out->value);
      if (!st.isOk()) return malformedRequest(st.message());
      FERRY_ASSIGN_OR_RETURN(out->lease, f.integer("lease", 0, INT64_MAX));
      return Status::ok();
    }
    case Type::kGet:
    case Type::kErase: {
      FERRY_ASSIGN_OR_RETURN(out->key, keyField(f, "key", false));
      return Status::ok();
    }
    case Type::kList:
    case Type::kWatch: {
      FERRY_ASSIGN_OR_RETURN(out->key, keyField(f, "prefix", true));
      return Status::ok();
    }
    case Type::kGrantLease: {
      FERRY_ASSIGN_OR_RETURN(out->ttlSeconds, f.integer("ttl", 1, kMaxLeaseTtlSeconds));
      return Status::ok();
    }
    case Type::kKeepAlive:
    case Type::kRevokeLease: {
      FERRY_ASSIGN_OR_RETURN(out->lease, f.integer("lease", 0, INT64_MAX));
      return Status::ok();
    }
  }
  return malformedRequest("unknown type");
}

}  // namespace

ControlProtocol storeProtocol() { return {"ferry_store", kStoreProtocolVersion, kMaxStoreLine}; }

const char* storeRequestTypeName(Type type) {
  for (const RequestTypeName& t : kTypeNames) {
    if (t.type == type) return t.name;
  }
  return "?";
}

Result<StoreRequest> decodeStoreRequest(std::string_view line) {
  if (line.size() > kMaxStoreLine)
    return malformedRequest("a line longer than " + std::to_string(kMaxStoreLine) + " bytes");
  auto parsed = json::parse(line);
  if (!parsed.isOk()) return malformedRequest(parsed.status().message());
  const json::Value& message = *parsed;
  const json::Object* members = message.object();
  if (members == nullptr) return malformedRequest("not a JSON object");
  const json::Value* version = message.find("ferry_store");
  if (version == nullptr) return malformedRequest("no \"ferry_store\" version field");
  auto v = version->getInt();
  if (!version->isInt() || !v.isOk() || *v != kStoreProtocolVersion) {
    return Status(StatusCode::kProtocolError, "the client speaks ferry_store protocol version " +
                                                  json::serialize(*version).substr(0, 32) +
                                                  "; this server speaks " +
                                                  std::to_string(kStoreProtocolVersion));
  }
  FERRY_ASSIGN_OR_RETURN(std::string typeText, controlFields(message).text("type", 16));
  StoreRequest out;
  const RequestTypeName* known = nullptr;
  for (const RequestTypeName& t : kTypeNames) {
    if (typeText == t.name) known = &t;
  }
  if (known == nullptr) return malformedRequest("unknown type '" + typeText + "'");
  out.type = known->type;
  // Exactly the members the type takes: an extra one means a client this server does not
  // understand, and guessing would be worse than refusing.
  json::Fields f = controlFields(message);
  std::vector<std::string_view> fields = fieldsOf(out.type);
  for (const auto& [name, value] : *members) {
    bool expected = name == "ferry_store" || name == "type" || name == "id" ||
                    std::find(fields.begin(), fields.end(), name) != fields.end();
    if (!expected) return f.refuse(name, "is an unknown member");
  }
  const json::Value* id = message.find("id");
  if (id == nullptr || !id->isInt())
    return malformedRequest("request '" + typeText + "' has no integer 'id'");
  FERRY_ASSIGN_OR_RETURN(out.id, f.integer("id", 1, kMaxRequestId));
  // Integers only as integer literals: 1.0 is not a lease.
  for (std::string_view field : fields) {
    const json::Value* v = message.find(field);
    if (v != nullptr && v->isNumber() && !v->isInt()) return f.refuse(field, "must be an integer literal");
  }
  FERRY_RETURN_IF_ERROR(decodeFields(f, &out));
  return out;
}

json::Value storeRequestBody(const StoreRequest& request) {
  json::Value body = json::Value::emptyObject();
  body.set("id", request.id);
  switch (request.type) {
    case Type::kSet:
      body.set("key", request.key);
      body.set("value", encodeBase64(request.value));
      body.set("lease", request.lease);
      break;
    case Type::kGet:
    case Type::kErase: body.set("key", request.key); break;
    case Type::kList:
    case Type::kWatch: body.set("prefix", request.key); break;
    case Type::kGrantLease: body.set("ttl", request.ttlSeconds); break;
    case Type::kKeepAlive:
    case Type::kRevokeLease: body.set("lease", request.lease); break;
  }
  return body;
}

// The server runs on a ferry Reactor: one epoll thread owns the table, the leases and every
// connection, so nothing needs a lock, a change and the events it sends to watchers happen in one
// step (a watcher's snapshot and its events never interleave wrongly), lease expiry is a reactor
// timer, and a thousand idle connections cost nothing. A store's requests are tiny; one thread
// keeps up with far more than an agent fleet sends.
class StoreServer::Impl {
 public:
  ~Impl() { stop(); }
  Status start(const std::string& host, uint16_t port, StoreServerOptions options);
  void stop();
  uint16_t port() const { return port_; }

 private:
  struct Conn {
    uint64_t id = 0;  // its key in conns_ (never reused, unlike a descriptor)
    // The line framing and its bounds: kMaxStoreLine per request, kMaxStorePendingOutput of answers
    // the client leaves unread.
    std::shared_ptr<net::LineConnection> line;
    bool watching = false;
    std::string prefix;
    Clock::time_point lastRequest;  // connected, or its last whole request
    bool answered = false;          // it sent a whole request
    net::Admission::Ticket ticket;
  };

  void acceptFromLoop();
  // Makes room for one more connection: closes the one idle the longest (a watch excepted).
  bool evictIdlestFromLoop();
  // Closes connections past kStoreFirstRequestTimeout / kStoreIdleTimeout.
  void closeIdleFromLoop();
  // Handles one line; the connection may be dropped.
  void handleLineFromLoop(Conn& conn, std::string_view line);
  void answerFromLoop(Conn& conn, const StoreRequest& request);
  // These two return false when the connection ended (too far behind, or lost); conn stays valid
  // until the loop's next turn.
  bool sendEntriesFromLoop(Conn& conn, std::string_view type, int64_t id,
                           const std::vector<StoreEntry>& entries);
  bool sendFromLoop(Conn& conn, std::string_view type, json::Value body);
  // Closes the connection (telling the client why, when `why` is not empty); conn is gone then.
  void dropFromLoop(Conn& conn, const std::string& why);
  void publishFromLoop(const std::vector<StoreEvent>& events);
  void sweepFromLoop();
  void armExpiryFromLoop();
  void pingFromLoop();

  // A new reactor for each start(): a stopped Reactor does not start again.
  std::unique_ptr<Reactor> reactor_;
  bool started_ = false;
  int listenFd_ = -1;
  uint16_t port_ = 0;
  std::shared_ptr<net::Admission> admission_;
  StoreTable table_;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  uint64_t nextConnId_ = 1;
  Reactor::TimerId expiryTimer_ = 0;
  Clock::time_point expiryAt_;
  Reactor::TimerId pingTimer_ = 0;
};

Status StoreServer::Impl::start(const std::string& host, uint16_t port, StoreServerOptions options) {
  if (started_) return Status(StatusCode::kBusy, "the store server is already started");
  bool remote = options.allowRemote || config::agentAllowRemote();
  admission_ = net::Admission::create(
      {.thisHostOnly = !remote, .maxPerSource = kMaxStoreConnections, .maxTotal = kMaxStoreConnections},
      "ferry store");
  auto listener =
      net::listenTcp(host, port, {.backlog = SOMAXCONN, .nonBlocking = true, .resolveNames = true});
  if (!listener.isOk()) {
    return Status(listener.status().code(), "store server: " + listener.status().message(),
                  listener.status().cause());
  }
  const int fd = listener->fd;
  port_ = listener->port;
  reactor_ = std::make_unique<Reactor>();
  Status st = reactor_->start("ferry-store");
  if (!st.isOk()) {
    reactor_.reset();
    ::close(fd);
    return st;
  }
  listenFd_ = fd;
  (void)reactor_->runSync([&] {
    st = reactor_->addFd(listenFd_, EPOLLIN, [this](uint32_t) { acceptFromLoop(); });
    pingTimer_ = reactor_->addTimer(Clock::now() + kWatchPingInterval, [this] { pingFromLoop(); });
  });
  if (!st.isOk()) {
    reactor_->stop();
    reactor_.reset();
    ::close(listenFd_);
    listenFd_ = -1;
    return st;
  }
  started_ = true;
  return Status::ok();
}

void StoreServer::Impl::stop() {
  if (!started_) return;
  (void)reactor_->runSync([&] {
    for (auto& [id, conn] : conns_) conn->line->close();
    conns_.clear();
    reactor_->removeFd(listenFd_);
    ::close(listenFd_);
    listenFd_ = -1;
  });
  reactor_->stop();
  reactor_.reset();
  table_ = StoreTable();
  expiryTimer_ = pingTimer_ = 0;
  port_ = 0;
  started_ = false;
}

void StoreServer::Impl::acceptFromLoop() {
  FERRY_ON_LOOP(*reactor_);
  while (true) {
    int fd = accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: all taken. EMFILE and the like: the client waits in the backlog until fds free up.
      return;
    }
    if (conns_.size() >= kMaxStoreConnections) (void)evictIdlestFromLoop();
    auto ticket = admission_->admit(net::peerOf(fd));
    if (!ticket.isOk()) {
      admission_->logRefusal(ticket.status());
      const std::string line = errorLine(ticket.status().message()) + "\n";
      (void)::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      continue;
    }
    auto conn = std::make_unique<Conn>();
    const uint64_t id = nextConnId_++;
    conn->id = id;
    conn->lastRequest = Clock::now();
    conn->ticket = std::move(*ticket);
    conn->line = net::LineConnection::adopt(
        *reactor_, fd, {.maxLine = kMaxStoreLine, .maxPendingOutput = kMaxStorePendingOutput},
        [this, id](net::LineConnection&, std::string_view line) {
          auto it = conns_.find(id);
          if (it != conns_.end()) handleLineFromLoop(*it->second, line);
        },
        // Lost, or too far behind: forgotten on the loop's next turn, so that whoever is sending
        // to it now still holds a valid Conn.
        [this, id](net::LineConnection&, const Status&, bool) {
          reactor_->post([this, id] { conns_.erase(id); });
        });
    conn->line->setFarewell([](const Status&) {
      return errorLine("malformed request: a line longer than " + std::to_string(kMaxStoreLine) + " bytes");
    });
    conns_[id] = std::move(conn);
  }
}

void StoreServer::Impl::handleLineFromLoop(Conn& conn, std::string_view line) {
  FERRY_ON_LOOP(*reactor_);
  if (conn.watching) {
    dropFromLoop(conn, "a watch connection takes no further requests");
    return;
  }
  auto request = decodeStoreRequest(line);
  if (!request.isOk()) {
    FERRY_LOG(kInfo, "ferry store: dropping a client: %s", request.status().message().c_str());
    dropFromLoop(conn, request.status().message());
    return;
  }
  conn.lastRequest = Clock::now();
  conn.answered = true;
  answerFromLoop(conn, *request);
}

void StoreServer::Impl::answerFromLoop(Conn& conn, const StoreRequest& request) {
  FERRY_ON_LOOP(*reactor_);
  std::vector<StoreEvent> events;
  table_.expire(Clock::now(), &events);
  json::Value body = json::Value::emptyObject();
  body.set("id", request.id);
  Status st;
  std::string_view replyType = "ok";
  switch (request.type) {
    case Type::kSet: st = table_.set(request.key, request.value, request.lease, &events); break;
    case Type::kGet: {
      auto value = table_.get(request.key);
      st = value.status();
      if (value.isOk()) body.set("value", encodeBase64(*value));
      replyType = "value";
      break;
    }
    case Type::kList:
      if (!sendEntriesFromLoop(conn, "entries", request.id, table_.list(request.key))) return;
      break;
    case Type::kErase: table_.erase(request.key, &events); break;
    case Type::kGrantLease: {
      auto lease = table_.grantLease(std::chrono::seconds(request.ttlSeconds), Clock::now());
      st = lease.status();
      if (lease.isOk()) body.set("lease", *lease);
      replyType = "lease";
      armExpiryFromLoop();
      break;
    }
    case Type::kKeepAlive: st = table_.keepAlive(request.lease, Clock::now()); break;
    case Type::kRevokeLease: table_.revokeLease(request.lease, &events); break;
    case Type::kWatch:
      // The snapshot and the registration are one step on this thread: no change falls between.
      if (!sendEntriesFromLoop(conn, "watching", request.id, table_.list(request.key))) return;
      conn.watching = true;
      conn.prefix = request.key;
      break;
  }
  if (request.type != Type::kList && request.type != Type::kWatch) {
    if (st.isOk()) {
      (void)sendFromLoop(conn, replyType, std::move(body));
    } else {
      json::Value failure = json::Value::emptyObject();
      failure.set("id", request.id);
      failure.set("code", statusCodeName(st.code()));
      failure.set("message", st.message());
      (void)sendFromLoop(conn, "failure", std::move(failure));
    }
  }
  // The requester's reply went out (or it was dropped); the changes still reach every watcher.
  publishFromLoop(events);
}

bool StoreServer::Impl::sendEntriesFromLoop(Conn& conn, std::string_view type, int64_t id,
                                            const std::vector<StoreEntry>& entries) {
  FERRY_ON_LOOP(*reactor_);
  size_t i = 0;
  do {
    json::Value body = json::Value::emptyObject();
    body.set("id", id);
    json::Value array = json::Value::emptyArray();
    size_t bytes = 0;
    for (; i < entries.size() && bytes < kEntriesPerLineBytes; ++i) {
      json::Value entry = json::Value::emptyObject();
      entry.set("key", entries[i].key);
      entry.set("value", encodeBase64(entries[i].value));
      bytes += entries[i].key.size() * 2 + entries[i].value.size() * 4 / 3 + 32;
      array.push(std::move(entry));
    }
    body.set("entries", std::move(array));
    body.set("more", i < entries.size());
    if (!sendFromLoop(conn, type, std::move(body))) return false;
  } while (i < entries.size());
  return true;
}

bool StoreServer::Impl::sendFromLoop(Conn& conn, std::string_view type, json::Value body) {
  FERRY_ON_LOOP(*reactor_);
  json::Value full = json::Value::emptyObject();
  full.set("ferry_store", kStoreProtocolVersion);
  full.set("type", std::string(type));
  if (const json::Object* members = body.object()) {
    for (const auto& [key, value] : *members) full.set(key, value);
  }
  if (!conn.line->open()) return false;
  conn.line->send(json::serialize(full));
  return conn.line->open();
}

void StoreServer::Impl::dropFromLoop(Conn& conn, const std::string& why) {
  FERRY_ON_LOOP(*reactor_);
  // Best effort: the client learns why, if its socket takes the line now.
  if (why.empty()) {
    conn.line->close();
  } else {
    conn.line->closeWith(errorLine(why));
  }
  conns_.erase(conn.id);  // destroys conn
}

void StoreServer::Impl::publishFromLoop(const std::vector<StoreEvent>& events) {
  FERRY_ON_LOOP(*reactor_);
  if (events.empty()) return;
  std::vector<Conn*> watchers;
  for (auto& [id, conn] : conns_) {
    if (conn->watching && conn->line->open()) watchers.push_back(conn.get());
  }
  for (const StoreEvent& e : events) {
    for (Conn*& w : watchers) {
      if (w == nullptr || !keyHasPrefix(e.key, w->prefix)) continue;
      json::Value body = json::Value::emptyObject();
      body.set("kind", e.kind == StoreEvent::Kind::kPut ? "put" : "delete");
      body.set("key", e.key);
      if (e.kind == StoreEvent::Kind::kPut) body.set("value", encodeBase64(e.value));
      if (!sendFromLoop(*w, "event", std::move(body))) w = nullptr;  // dropped: too far behind
    }
  }
}

void StoreServer::Impl::sweepFromLoop() {
  FERRY_ON_LOOP(*reactor_);
  expiryTimer_ = 0;
  std::vector<StoreEvent> events;
  table_.expire(Clock::now(), &events);
  publishFromLoop(events);
  armExpiryFromLoop();
}

void StoreServer::Impl::armExpiryFromLoop() {
  FERRY_ON_LOOP(*reactor_);
  auto next = table_.nextDeadline();
  if (!next) return;
  // keepAlive only moves deadlines later: a timer already due earlier fires, finds nothing due,
  // and arms itself again for the real deadline.
  if (expiryTimer_ != 0 && expiryAt_ <= *next) return;
  if (expiryTimer_ != 0) reactor_->cancelTimer(expiryTimer_);
  expiryAt_ = *next;
  expiryTimer_ = reactor_->addTimer(*next, [this] { sweepFromLoop(); });
}

bool StoreServer::Impl::evictIdlestFromLoop() {
  FERRY_ON_LOOP(*reactor_);
  Conn* idlest = nullptr;
  for (auto& [id, conn] : conns_) {
    if (conn->watching || !conn->line->open()) continue;
    if (idlest == nullptr || conn->lastRequest < idlest->lastRequest) idlest = conn.get();
  }
  if (idlest == nullptr) return false;
  admission_->logRefusal(
      resourceExhausted("ferry store: closed the connection idle the longest to serve a new one (" +
                        std::to_string(kMaxStoreConnections) + " held, the cap)"));
  dropFromLoop(*idlest, "the store holds " + std::to_string(kMaxStoreConnections) +
                            " connections: this one, idle the longest, makes room for a new one");
  return true;
}

void StoreServer::Impl::closeIdleFromLoop() {
  FERRY_ON_LOOP(*reactor_);
  auto now = Clock::now();
  std::vector<Conn*> idle;
  for (auto& [id, conn] : conns_) {
    if (conn->watching || !conn->line->open()) continue;
    auto limit = conn->answered ? std::chrono::duration_cast<Clock::duration>(kStoreIdleTimeout)
                                : std::chrono::duration_cast<Clock::duration>(kStoreFirstRequestTimeout);
    if (now - conn->lastRequest > limit) idle.push_back(conn.get());
  }
  for (Conn* conn : idle) {
    admission_->logRefusal(Status(StatusCode::kTimedOut, "ferry store: closed a connection idle too long"));
    dropFromLoop(*conn, conn->answered ? "idle for too long" : "no request within the first seconds");
  }
}

void StoreServer::Impl::pingFromLoop() {
  FERRY_ON_LOOP(*reactor_);
  closeIdleFromLoop();
  std::vector<uint64_t> watchers;
  for (auto& [id, conn] : conns_) {
    if (conn->watching) watchers.push_back(id);
  }
  for (uint64_t id : watchers) {
    auto it = conns_.find(id);
    if (it != conns_.end()) (void)sendFromLoop(*it->second, "ping", json::Value::emptyObject());
  }
  pingTimer_ = reactor_->addTimer(Clock::now() + kWatchPingInterval, [this] { pingFromLoop(); });
}

StoreServer::StoreServer() : impl_(std::make_unique<Impl>()) {}
StoreServer::~StoreServer() { stop(); }
Status StoreServer::start(const std::string& host, uint16_t port, StoreServerOptions options) {
  return impl_->start(host, port, options);
}
uint16_t StoreServer::port() const { return impl_->port(); }
void StoreServer::stop() { impl_->stop(); }

}  // namespace ferry::agent
