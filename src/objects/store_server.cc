// The object store (include/ferry/objects/store.h): S3-style HTTP on cpp-httplib (Debian's
// libcpp-httplib-dev: a maintained server, so ferry carries no HTTP parser of its own), objects in
// memory registered with a cuObjServer, payloads moved by RDMA when a request carries a descriptor.
// This file is its HTTP front: start, admission, authentication, errors and routing; the
// handlers live in the files store_server_impl.h names.
#include "objects/store_server_impl.h"

namespace ferry::objects {

void ObjectStore::Impl::error(httplib::Response& res, int status, const std::string& code,
                              const std::string& message, const std::string& resource) {
  {
    std::lock_guard<std::mutex> lock(statsMu);
    ++stats.refused;
  }
  res.status = status;
  res.set_content(std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>") + code +
                      "</Code><Message>" + xmlEscape(message) + "</Message><Resource>" + xmlEscape(resource) +
                      "</Resource><RequestId>" + agent::randomHex(8) + "</RequestId></Error>",
                  "application/xml");
}

// A refusal of a client's request that an operator may need to see (protected mode, bounds,
// framing, credentials): logged at a bounded rate, so that a flood of bad requests cannot flood
// the log too.
void ObjectStore::Impl::logRefusal(const httplib::Request& req, int status, const std::string& code,
                                   const std::string& message) {
  uint64_t held = 0;
  if (!refusalLog.allow(&held)) return;
  FERRY_LOG(kWarn, "objects serve: refused %s %s from %s: %d %s: %s%s", req.method.c_str(), req.path.c_str(),
            req.remote_addr.c_str(), status, code.c_str(), message.c_str(),
            held ? (" (" + std::to_string(held) + " more refusals not logged)").c_str() : "");
}

// Refuses a request whose body was not read, logging why; the connection skips the body or
// closes.
httplib::Server::HandlerResponse ObjectStore::Impl::refuse(const httplib::Request& req,
                                                           httplib::Response& res, int status,
                                                           const std::string& code,
                                                           const std::string& message, uint64_t unreadBody) {
  error(res, status, code, message, req.path);
  logRefusal(req, status, code, message);
  if (StoreConnection* conn = StoreConnection::current()) conn->discardBody(unreadBody);
  return httplib::Server::HandlerResponse::Handled;
}

// Runs once a request's headers are in, before any of its body is read: every rule that does not
// need the body (docs/objects.md, "What the store refuses").
httplib::Server::HandlerResponse ObjectStore::Impl::admit(const httplib::Request& req,
                                                          httplib::Response& res) {
  if (StoreConnection* conn = StoreConnection::current()) conn->startBody();
  // The store answers ranges itself (decideRange): cpp-httplib must not apply one again.
  const_cast<httplib::Request&>(req).ranges.clear();
  auto [framing, badFraming] =
      decideFraming(headerValues(req, "Content-Length"), headerValues(req, "Transfer-Encoding"));
  if (badFraming) {
    return refuse(req, res, badFraming->status, badFraming->code, badFraming->message, ~uint64_t{0});
  }
  const uint64_t declared = framing.contentLength.value_or(0);
  if (!admitsClient(opts, req.remote_addr)) {
    return refuse(
        req, res, 403, "AccessDenied",
        "this store has no credentials, so it serves clients on its own host only (protected "
        "mode); to serve " +
            req.remote_addr +
            ", set FERRY_OBJECTS_ACCESS_KEY and FERRY_OBJECTS_SECRET_KEY, or start it with "
            "--insecure-allow-remote (anyone who can reach it may then read and replace every object)",
        declared);
  }
  sweepAbandonedUploads();
  const OperationDecision decision = decide(req);
  if (decision.refusal) {
    const RequestRefusal& refusal = *decision.refusal;
    return refuse(req, res, refusal.status, refusal.code, refusal.message, declared);
  }
  const bool objectPut =
      decision.operation == StoreOperation::kPutObject || decision.operation == StoreOperation::kUploadPart;
  if ((req.method == "GET" || req.method == "HEAD") && declared > 0)
    return refuse(req, res, 400, "InvalidRequest", req.method + " carries no body", declared);
  if ((req.method == "PUT" || req.method == "POST") && !framing.contentLength)
    return refuse(req, res, 411, "MissingContentLength", req.method + " needs a Content-Length", 0);
  const uint64_t limit = objectPut              ? opts.maxBodyBytes
                         : req.method == "POST" ? kMaxPostDocumentBytes
                                                : kMaxDocumentBytes;
  if (declared > limit) {
    return refuse(req, res, 400, objectPut ? "EntityTooLarge" : "MaxMessageLengthExceeded",
                  "the body declares " + std::to_string(declared) + " bytes; this store takes at most " +
                      std::to_string(limit) + (objectPut ? " in one PUT (--max-body)" : " here"),
                  declared);
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

// The operation a request names (admit() refused those the store does not implement).
OperationDecision ObjectStore::Impl::decide(const httplib::Request& req) {
  std::string bucket, key;
  split(req.path, bucket, key);
  const StoreCall call = bucket.empty() ? StoreCall::kListBuckets
                         : key.empty()  ? StoreCall::kBucket
                                        : StoreCall::kObject;
  std::vector<std::pair<std::string, std::string>> params(req.params.begin(), req.params.end());
  std::vector<std::string> headerNames;
  for (const auto& [name, value] : req.headers) headerNames.push_back(name);
  return decideOperation(req.method, call, params, headerNames);
}

// Splits the decoded path into bucket and key.
void ObjectStore::Impl::split(const std::string& path, std::string& bucket, std::string& key) {
  std::string p = path.size() > 1 ? path.substr(1) : "";
  size_t slash = p.find('/');
  bucket = p.substr(0, slash);
  key = slash == std::string::npos ? "" : p.substr(slash + 1);
}

// SigV4 when credentials are set: the headers' signature first (an unsigned or wrongly signed
// request costs nothing more: no body is read into memory for it), the payload's hash once the
// body is there (payloadMatches).
bool ObjectStore::Impl::authorized(const httplib::Request& req, httplib::Response& res) {
  if (opts.accessKey.empty()) return true;
  const std::string authorization = req.get_header_value("Authorization");
  if (authorization.empty()) {
    error(res, 403, "AccessDenied", "the request is not signed (this store requires AWS Signature Version 4)",
          req.path);
    return false;
  }
  SignedRequest r;
  r.method = req.method;
  r.path = req.path;
  for (const auto& [k, v] : req.params) r.query.emplace_back(k, v);
  for (const auto& [k, v] : req.headers) {
    if (k == "REMOTE_ADDR" || k == "REMOTE_PORT" || k == "LOCAL_ADDR" || k == "LOCAL_PORT") continue;
    r.headers.emplace_back(k, v);
  }
  r.payloadHash = req.get_header_value("x-amz-content-sha256");
  if (r.payloadHash.empty()) {
    error(res, 400, "InvalidRequest", "x-amz-content-sha256 is missing", req.path);
    return false;
  }
  if (r.payloadHash != "UNSIGNED-PAYLOAD" && r.payloadHash.size() != 64) {
    error(res, 400, "InvalidRequest",
          "x-amz-content-sha256 '" + r.payloadHash +
              "' is not supported (sign the payload, or send UNSIGNED-PAYLOAD)",
          req.path);
    return false;
  }
  Status st = verifyV4(r, authorization, opts.accessKey, opts.secretKey);
  if (st.isOk()) st = checkRequestTime(r, nowNs() / 1000000000);
  if (!st.isOk()) {
    const std::string& why = st.message();
    const std::string code = why.find("SignatureDoesNotMatch") != std::string::npos  ? "SignatureDoesNotMatch"
                             : why.find("RequestTimeTooSkewed") != std::string::npos ? "RequestTimeTooSkewed"
                                                                                     : "AccessDenied";
    error(res, 403, code, why, req.path);
    logRefusal(req, 403, code, why);
    return false;
  }
  return true;
}

// Whether the body's SHA-256 (hex) is the one the signed request named (UNSIGNED-PAYLOAD: any).
bool ObjectStore::Impl::payloadMatches(const httplib::Request& req, httplib::Response& res,
                                       const std::string& bodyHex) {
  if (opts.accessKey.empty()) return true;
  const std::string named = req.get_header_value("x-amz-content-sha256");
  if (named == "UNSIGNED-PAYLOAD" || named == bodyHex) return true;
  error(res, 400, "XAmzContentSHA256Mismatch", "the payload does not match x-amz-content-sha256", req.path);
  return false;
}

void ObjectStore::Impl::onGuarded(const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader, BodyHandler handler) {
  bool read = false;
  httplib::ContentReader tracked(
      [&](httplib::ContentReceiver receiver) {
        read = true;
        return reader(std::move(receiver));
      },
      [&](httplib::MultipartContentHeader header, httplib::ContentReceiver receiver) {
        read = true;
        return reader(std::move(header), std::move(receiver));
      });
  (this->*handler)(req, res, tracked);
  StoreConnection* conn = StoreConnection::current();
  if (!read && conn) conn->discardBody(number(req.get_header_value("Content-Length")).value_or(~uint64_t{0}));
}

// A small body (a document; admit() bounded its length) read whole.
std::string ObjectStore::Impl::readDocument(const httplib::ContentReader& reader, uint64_t declared) {
  std::string body;
  if (declared > 0) {
    reader([&](const char* data, size_t n) {
      if (body.size() + n > kMaxPostDocumentBytes) return false;
      body.append(data, n);
      return true;
    });
  }
  return body;
}

// A document's signed hash and Content-MD5 (when sent) checked; false once the refusal is
// answered.
bool ObjectStore::Impl::documentMatches(const httplib::Request& req, httplib::Response& res,
                                        const std::string& body) {
  if (!payloadMatches(req, res, sha256Hex(body))) return false;
  if (!req.has_header("Content-MD5")) return true;
  auto expected = contentMd5(req.get_header_value("Content-MD5"));
  if (!expected) {
    error(res, 400, "InvalidDigest", "Content-MD5 is not the base64 of 16 bytes", req.path);
    return false;
  }
  if (*expected != md5Of(body.data(), body.size())) {
    error(res, 400, "BadDigest", "the body's MD5 is not the Content-MD5 sent", req.path);
    return false;
  }
  return true;
}

std::string ObjectStore::Impl::xmlHead(const char* root) {
  return std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<") + root + " xmlns=\"" + kXmlNs + "\">";
}

// Sets the listener's socket options and limits, and routes each method to its handler.
void ObjectStore::Impl::route() {
  http->set_tcp_nodelay(true);
  // cpp-httplib sets SO_REUSEPORT by default, which lets a second store bind the same port and
  // take half of its clients: only SO_REUSEADDR here (a restarted store rebinds at once).
  http->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http->set_payload_max_length(static_cast<size_t>(opts.maxBodyBytes));
  http->set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return admit(req, res); });
  // A connection that must close after this answer says so (and not Keep-Alive).
  http->set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    StoreConnection* conn = StoreConnection::current();
    if (conn == nullptr || !conn->closeAfter()) return;
    res.headers.erase("Keep-Alive");
    res.headers.erase("Connection");
    res.set_header("Connection", "close");
  });
  http->Get(".*", [this](const httplib::Request& req, httplib::Response& res) { onGet(req, res); });
  http->Put(".*", [this](const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& r) { onGuarded(req, res, r, &Impl::onPut); });
  http->Post(".*", [this](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& r) { onGuarded(req, res, r, &Impl::onPost); });
  http->Delete(".*", [this](const httplib::Request& req, httplib::Response& res) { onDelete(req, res); });
  http->set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
        error(res, 500, "InternalError", "the request failed", req.path);
      });
}

namespace {

// Fills the options the environment or the host decide (credentials, the memory bound) and checks
// the rest.
Status checkOptions(StoreOptions& options) {
  if (options.accessKey.empty()) options.accessKey = config::objectsAccessKey();
  if (options.secretKey.empty()) options.secretKey = config::objectsSecretKey();
  if (!options.accessKey.empty() && options.secretKey.empty()) {
    return invalidArgument("objects serve: an access key without a secret key (FERRY_OBJECTS_SECRET_KEY)");
  }
  if (options.threads < 1 || options.threads > 256)
    return invalidArgument("objects serve: threads must be 1..256");
  if (options.maxConnections < 1 || options.maxConnections > 65536)
    return invalidArgument("objects serve: max connections must be 1..65536");
  if (options.maxBodyBytes == 0 || options.maxReceivingBytes < options.maxBodyBytes) {
    return invalidArgument(
        "objects serve: max body must be at least 1 byte, and max receiving at least max body "
        "(else a body of the largest size could never be received)");
  }
  if (options.headerTimeoutMs < 100 || options.idleTimeoutMs < 100)
    return invalidArgument("objects serve: the header and idle timeouts must be at least 100 ms");
  if (options.maxMemoryBytes == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), pageBytes = sysconf(_SC_PAGE_SIZE);
    options.maxMemoryBytes =
        pages > 0 && pageBytes > 0 ? uint64_t(pages) * uint64_t(pageBytes) / 2 : uint64_t{8} << 30;
  }
  if (options.abandonedUploadSeconds < 1)
    return invalidArgument("objects serve: the abandoned-upload timeout must be at least 1 second");
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<ObjectStore>> ObjectStore::start(StoreOptions options) {
  FERRY_RETURN_IF_ERROR(checkOptions(options));
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  const std::string rdmaHost = options.rdmaHost.empty() ? options.host : options.rdmaHost;
  impl->rdma = std::make_unique<cuObjServer>(rdmaHost.c_str(), options.rdmaPort, CUOBJ_PROTO_RDMA_DC_V1);
  if (!impl->rdma->isConnected()) {
    return Status(StatusCode::kUnavailable, "objects serve: the object server's session on [" + rdmaHost +
                                                "]:" + std::to_string(options.rdmaPort) + " did not start");
  }
  FERRY_RETURN_IF_ERROR(impl->load());
  Impl* self = impl.get();
  impl->limits = ConnectionLimits{.maxConnections = static_cast<size_t>(options.maxConnections),
                                  .readyWorkers = static_cast<size_t>(options.threads),
                                  .headerTimeout = std::chrono::milliseconds(options.headerTimeoutMs),
                                  .idleTimeout = std::chrono::milliseconds(options.idleTimeoutMs)};
  impl->http = std::make_unique<StoreHttpServer>(impl->limits);
  httplib::Server& http = *impl->http;
  impl->http->busyAnswer = [self] {
    httplib::Response res;
    self->error(res, 503, "SlowDown", "the store serves as many connections as it may (--max-connections)");
    return res.body;
  };
  impl->route();
  int port = options.port == 0 ? http.bind_to_any_port(options.host)
                               : (http.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port <= 0) {
    return Status(StatusCode::kUnavailable,
                  "objects serve: cannot listen on [" + options.host + "]:" + std::to_string(options.port));
  }
  impl->port = static_cast<uint16_t>(port);
  impl->http->widenBacklog();
  impl->thread = std::thread([self] { self->http->listen_after_bind(); });
  // Returns once the listener runs, so that a stop() right after start() is not lost.
  for (int i = 0; i < 5000 && !impl->http->is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!impl->http->is_running()) {
    impl->http->stop();
    impl->thread.join();
    return Status(StatusCode::kUnavailable, "objects serve: the HTTP listener did not start");
  }
  return std::make_unique<ObjectStore>(std::move(impl));
}

ObjectStore::ObjectStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ObjectStore::~ObjectStore() { stop(); }

uint16_t ObjectStore::port() const { return impl_->port; }

std::string ObjectStore::url() const {
  const std::string& h = impl_->opts.host;
  bool v6 = h.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + h + "]" : h) + ":" + std::to_string(impl_->port);
}

StoreStats ObjectStore::stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> lock(impl_->statsMu);
    s = impl_->stats;
  }
  s.receivingBytes = impl_->receiving.load();
  s.memoryBytes = impl_->memory.load();
  s.connections = impl_->http->connections();
  std::lock_guard<std::mutex> lock(impl_->mu);
  s.buckets = impl_->buckets.size();
  s.uploads = impl_->multipart.size();
  s.cachedObjects = impl_->lru.size();
  for (const auto& [b, objects] : impl_->buckets) {
    s.objects += objects.size();
    for (const auto& [k, o] : objects) s.bytes += o->size;
  }
  return s;
}

void ObjectStore::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->http->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->uploads.clear();
    impl_->multipart.clear();
    impl_->lru.clear();
    impl_->buckets.clear();
  }
  impl_->rdma.reset();
  std::lock_guard<std::mutex> lock(impl_->waitMu);
  impl_->waitCv.notify_all();
}

void ObjectStore::wait() {
  std::unique_lock<std::mutex> lock(impl_->waitMu);
  impl_->waitCv.wait(lock, [&] { return impl_->stopped.load(); });
}

Result<ObjectUrl> parseObjectUrl(const std::string& url) {
  auto bad = [&](const char* why) { return invalidArgument("'" + url + "' is not an object URL: " + why); };
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) return bad("expected http://HOST:PORT[/BUCKET[/KEY]]");
  size_t hostEnd = url.find('/', kScheme.size());
  std::string authority =
      url.substr(kScheme.size(), hostEnd == std::string::npos ? std::string::npos : hostEnd - kScheme.size());
  if (authority.empty() || authority.front() == ':') return bad("no host");
  size_t colon = authority.rfind(':');
  if (colon == std::string::npos || colon + 1 == authority.size() || authority.back() == ']')
    return bad("no port");
  if (!number(authority.substr(colon + 1)) || *number(authority.substr(colon + 1)) > 65535)
    return bad("bad port");
  ObjectUrl out;
  out.base = "http://" + authority;
  if (hostEnd != std::string::npos) {
    std::string path = url.substr(hostEnd + 1);
    size_t slash = path.find('/');
    out.bucket = path.substr(0, slash);
    if (slash != std::string::npos) out.key = path.substr(slash + 1);
  }
  return out;
}

}  // namespace ferry::objects
