// The object store (include/ferry/objects/store.h): S3-style HTTP on cpp-httplib (Debian's
// libcpp-httplib-dev: a maintained server, so ferry carries no HTTP parser of its own), objects in
// memory registered with a cuObjServer, payloads moved by RDMA when a request carries a descriptor.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "agent/crypto.h"
#include "common/log.h"
#include "common/net/admission.h"
#include "ferry/common/config.h"
#include "ferry/cuobj_server.h"
#include "ferry/objects/store.h"
#include "objects/sigv4.h"
#include "objects/store_connections.h"
#include "objects/store_request.h"

namespace fs = std::filesystem;

namespace ferry::objects {
namespace {

constexpr const char* kXmlNs = "http://s3.amazonaws.com/doc/2006-03-01/";

std::string xmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string isoTime(int64_t ns) {
  time_t secs = static_cast<time_t>(ns / 1000000000);
  tm utc{};
  gmtime_r(&secs, &utc);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>((ns / 1000000) % 1000));
  return buf;
}

std::string httpTime(int64_t ns) {
  time_t secs = static_cast<time_t>(ns / 1000000000);
  tm utc{};
  gmtime_r(&secs, &utc);
  char buf[64];
  strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &utc);
  return buf;
}

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// S3's bucket naming rules, and keys that can be files under the data directory.
bool validBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
          c == '-' || c == '.')) {
      return false;
    }
  }
  return b.front() != '-' && b.front() != '.' && b.back() != '-' && b.back() != '.';
}

bool validKey(const std::string& k) {
  if (k.empty() || k.size() > 1024 || k.find('\0') != std::string::npos) return false;
  // No segment may be "." or ".." (a key is a path under the data directory).
  size_t start = 0;
  for (size_t i = 0; i <= k.size(); ++i) {
    if (i == k.size() || k[i] == '/') {
      std::string_view seg(k.data() + start, i - start);
      if (seg == "." || seg == ".." || (seg.empty() && i != k.size())) return false;
      start = i + 1;
    }
  }
  return true;
}

std::optional<uint64_t> number(const std::string& text) { return parseDecimal(text); }

// Bodies of calls other than an object's PUT (bucket calls, DELETE) are small documents at most.
constexpr uint64_t kMaxDocumentBytes = 1 << 20;
// An RDMA upload whose next piece has not come for this long is dropped (its client went away).
constexpr int64_t kUploadIdleNs = int64_t{60} * 1000000000;

std::vector<std::string_view> headerValues(const httplib::Request& req, const char* name) {
  std::vector<std::string_view> out;
  auto range = req.headers.equal_range(name);
  for (auto it = range.first; it != range.second; ++it) out.emplace_back(it->second);
  return out;
}

// cpp-httplib's text form of a peer ("127.0.0.1", "::1") as a socket address; AF_UNSPEC when it
// is neither.
sockaddr_storage socketAddress(const std::string& text) {
  sockaddr_storage out{};
  out.ss_family = AF_UNSPEC;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
  } else if (inet_pton(AF_INET6, text.substr(0, text.find('%')).c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
  }
  return out;
}

// Whether the store serves a client at `remoteAddr` before reading its request further: with
// credentials every client (each request is then signed); without them, protected mode, only
// clients of this host unless the deployment opted out.
bool admitsClient(const StoreOptions& opts, const std::string& remoteAddr) {
  if (!opts.accessKey.empty() || opts.allowRemoteWithoutCredentials) return true;
  return net::isThisHost(socketAddress(remoteAddr));
}

// A share of one of the store's bounds (StoreOptions::maxReceivingBytes, maxMemoryBytes), given
// back when destroyed.
class BoundShare {
 public:
  BoundShare() = default;
  BoundShare(std::atomic<uint64_t>* pool, uint64_t bytes) : pool_(pool), bytes_(bytes) {}
  BoundShare(BoundShare&& o) noexcept : pool_(std::exchange(o.pool_, nullptr)), bytes_(o.bytes_) {}
  BoundShare& operator=(BoundShare&& o) noexcept {
    if (this != &o) {
      release();
      pool_ = std::exchange(o.pool_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  ~BoundShare() { release(); }
  void release() {
    if (pool_) pool_->fetch_sub(bytes_);
    pool_ = nullptr;
  }

 private:
  std::atomic<uint64_t>* pool_ = nullptr;
  uint64_t bytes_ = 0;
};

// MD5 of a stream of pieces (16 bytes): S3's ETag of a single-part object, and Content-MD5.
class Md5 {
 public:
  Md5() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_md5(), nullptr); }
  ~Md5() { EVP_MD_CTX_free(ctx_); }
  Md5(const Md5&) = delete;
  Md5& operator=(const Md5&) = delete;
  void update(const void* data, size_t n) { EVP_DigestUpdate(ctx_, data, n); }
  std::string digest() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx_, out, &len);
    return std::string(reinterpret_cast<char*>(out), len);
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string md5Of(const void* data, size_t n) {
  Md5 md5;
  md5.update(data, n);
  return md5.digest();
}

// A Content-MD5 header's 16 bytes (strict base64), or nullopt.
std::optional<std::string> contentMd5(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() != 24 || text.substr(22) != "==") return std::nullopt;
  std::string out;
  uint32_t bits = 0;
  int held = 0;
  for (char c : text.substr(0, 22)) {
    int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(static_cast<char>((bits >> held) & 0xFF));
    }
  }
  if (out.size() != 16 || (bits & ((1u << held) - 1)) != 0) return std::nullopt;
  return out;
}

// S3's smallest part of a multipart object, but for its last.
constexpr uint64_t kMinPartBytes = uint64_t{5} << 20;
// Multipart uploads in progress at once (each holds at most kMaxParts parts).
constexpr size_t kMaxUploadsInProgress = 10000;

}  // namespace

// One object: page-aligned memory registered with the object server.
struct StoredObject {
  cuObjServer* server = nullptr;
  void* mem = nullptr;
  uint64_t size = 0;
  rdma_buffer* buf = nullptr;
  std::string etag;
  int64_t modifiedNs = 0;
  std::string contentType = "application/octet-stream";
  uint64_t received = 0;  // an upload's bytes so far
  int64_t touchedNs = 0;  // an upload's last piece
  BoundShare receiving;   // an RDMA upload's share of the receiving bound, until it completes
  BoundShare memory;      // its share of maxMemoryBytes, for as long as it lives
  std::string md5;        // a body's or part's MD5 (16 bytes), when it was computed as it arrived
  size_t mapped = 0;      // the mapping's length
  ~StoredObject() {
    if (buf) server->deRegisterBuffer(buf);
    if (mem) munmap(mem, mapped);
  }
};
using ObjectPtr = std::shared_ptr<StoredObject>;

// One multipart upload in progress: its parts, kept unregistered until the completion copies
// them into the object.
struct MultipartUpload {
  std::string bucket, key, id;
  std::string contentType = "application/octet-stream";
  int64_t initiatedNs = 0;
  int64_t touchedNs = 0;                // its last call (abandonedUploadSeconds)
  std::map<uint32_t, ObjectPtr> parts;  // part number -> part (etag, md5, modifiedNs set)
};
using UploadPtr = std::shared_ptr<MultipartUpload>;

struct ObjectStore::Impl {
  StoreOptions opts;
  std::unique_ptr<cuObjServer> rdma;
  std::unique_ptr<StoreHttpServer> http;
  ConnectionLimits limits;
  std::atomic<uint64_t> receiving{0};  // declared bytes being received (maxReceivingBytes)
  std::atomic<uint64_t> memory{0};     // bytes of objects, parts and bodies held (maxMemoryBytes)
  std::atomic<int64_t> lastSweepNs{0};
  net::LogLimiter refusalLog;
  std::thread thread;
  uint16_t port = 0;
  std::atomic<bool> stopped{false};
  std::mutex waitMu;
  std::condition_variable waitCv;

  mutable std::mutex mu;
  std::map<std::string, std::map<std::string, ObjectPtr>> buckets;  // bucket -> key -> object
  std::map<std::string, int64_t> bucketCreated;
  std::map<std::string, ObjectPtr> uploads;  // "bucket/key/upload-id" -> object being received
  std::map<std::string, UploadPtr> multipart;  // upload id -> multipart upload in progress
  mutable std::mutex statsMu;  // never held with mu's callers waiting: error() runs under mu
  StoreStats stats;

  // ---- objects ----
  // A share of maxReceivingBytes for `bytes` about to be received, or nullopt when the bound would
  // be passed.
  std::optional<BoundShare> reserveReceiving(uint64_t bytes) {
    return reserve(receiving, opts.maxReceivingBytes, bytes);
  }
  // A share of maxMemoryBytes for an object or part of `bytes`, or nullopt when the bound would be
  // passed.
  std::optional<BoundShare> reserveMemory(uint64_t bytes) {
    return reserve(memory, opts.maxMemoryBytes, bytes);
  }
  static std::optional<BoundShare> reserve(std::atomic<uint64_t>& pool, uint64_t limit, uint64_t bytes) {
    uint64_t held = pool.load();
    do {
      if (bytes > limit || held > limit - bytes) return std::nullopt;
    } while (!pool.compare_exchange_weak(held, held + bytes));
    return BoundShare(&pool, bytes);
  }

  // `registered`: registered with the object server now (an RDMA upload's target must be); else
  // the caller fills the memory first and registers it with registerObject(). The mapping reserves
  // address space only: memory is committed page by page as it is written.
  Result<ObjectPtr> newObject(uint64_t size, bool registered = true) {
    if (size > opts.maxObjectBytes) {
      return Status(StatusCode::kResourceExhausted, "the object is larger than the store's limit of " +
                                                        std::to_string(opts.maxObjectBytes) + " bytes");
    }
    auto o = std::make_shared<StoredObject>();
    o->server = rdma.get();
    o->size = size;
    o->modifiedNs = nowNs();
    if (size > 0) {
      // Anonymous memory in 2 MiB pages where the kernel has them: a fresh object is written once,
      // and 4 KiB page faults would cost more than the copy itself.
      o->mapped = (size + (2u << 20) - 1) & ~size_t{(2u << 20) - 1};
      void* m =
          mmap(nullptr, o->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) {
        o->mapped = 0;
        return Status(StatusCode::kResourceExhausted, "no memory for the object");
      }
      o->mem = m;
      (void)madvise(m, o->mapped, MADV_HUGEPAGE);
      if (registered) FERRY_RETURN_IF_ERROR(registerObject(o));
    }
    return o;
  }

  Status registerObject(const ObjectPtr& o) {
    if (o->size == 0 || o->buf != nullptr) return Status::ok();
    o->buf = rdma->registerBuffer(o->mem, o->size);
    if (o->buf == nullptr) return Status(StatusCode::kResourceExhausted, "the object's memory did not register");
    return Status::ok();
  }

  // S3's ETag of a single-part object: its MD5, quoted hex.
  static std::string etagOf(const ObjectPtr& o) {
    return "\"" + agent::hexOf(o->md5.empty() ? md5Of(o->mem, o->size) : o->md5) + "\"";
  }

  fs::path fileOf(const std::string& bucket, const std::string& key) const {
    return fs::path(opts.dataDir) / bucket / key;
  }

  Status persist(const std::string& bucket, const std::string& key, const ObjectPtr& o) {
    if (opts.dataDir.empty()) return Status::ok();
    fs::path file = fileOf(bucket, key);
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    fs::path tmp = file;
    tmp += ".ferry-tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (o->size) out.write(static_cast<const char*>(o->mem), static_cast<std::streamsize>(o->size));
      if (!out) return Status(StatusCode::kIoError, "cannot write " + tmp.string());
    }
    fs::rename(tmp, file, ec);
    if (ec) return Status(StatusCode::kIoError, "cannot rename " + tmp.string() + ": " + ec.message());
    return Status::ok();
  }

  Status load() {
    if (opts.dataDir.empty()) return Status::ok();
    std::error_code ec;
    fs::create_directories(opts.dataDir, ec);
    if (!fs::is_directory(opts.dataDir))
      return Status(StatusCode::kIoError, opts.dataDir + " is not a directory");
    for (const auto& b : fs::directory_iterator(opts.dataDir, ec)) {
      if (!b.is_directory()) continue;
      std::string bucket = b.path().filename().string();
      if (!validBucket(bucket)) continue;
      buckets[bucket];
      bucketCreated[bucket] = nowNs();
      for (const auto& f : fs::recursive_directory_iterator(b.path(), ec)) {
        if (!f.is_regular_file()) continue;
        std::string key = fs::relative(f.path(), b.path()).generic_string();
        if (key.size() > 10 && key.substr(key.size() - 10) == ".ferry-tmp") continue;
        if (!validKey(key)) continue;
        auto o = newObject(f.file_size());
        if (!o.isOk()) return o.status();
        memory.fetch_add((*o)->size);  // loaded whatever the bound: it was stored before
        (*o)->memory = BoundShare(&memory, (*o)->size);
        std::ifstream in(f.path(), std::ios::binary);
        if ((*o)->size) in.read(static_cast<char*>((*o)->mem), static_cast<std::streamsize>((*o)->size));
        if (!in) return Status(StatusCode::kIoError, "cannot read " + f.path().string());
        (*o)->etag = etagOf(*o);
        buckets[bucket][key] = *o;
      }
    }
    return Status::ok();
  }

  // ---- responses ----
  void error(httplib::Response& res, int status, const std::string& code, const std::string& message,
             const std::string& resource = "") {
    {
      std::lock_guard<std::mutex> lock(statsMu);
      ++stats.refused;
    }
    res.status = status;
    res.set_content(std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>") + code +
                        "</Code><Message>" + xmlEscape(message) + "</Message><Resource>" +
                        xmlEscape(resource) + "</Resource><RequestId>" + agent::randomHex(8) +
                        "</RequestId></Error>",
                    "application/xml");
  }

  // A refusal of a client's request that an operator may need to see (protected mode, bounds,
  // framing, credentials): logged at a bounded rate, so that a flood of bad requests cannot flood
  // the log too.
  void logRefusal(const httplib::Request& req, int status, const std::string& code, const std::string& message) {
    uint64_t held = 0;
    if (!refusalLog.allow(&held)) return;
    FERRY_LOG(kWarn, "objects serve: refused %s %s from %s: %d %s: %s%s", req.method.c_str(), req.path.c_str(),
              req.remote_addr.c_str(), status, code.c_str(), message.c_str(),
              held ? (" (" + std::to_string(held) + " more refusals not logged)").c_str() : "");
  }

  // Refuses a request whose body was not read, logging why; the connection skips the body or
  // closes.
  httplib::Server::HandlerResponse refuse(const httplib::Request& req, httplib::Response& res, int status,
                                          const std::string& code, const std::string& message,
                                          uint64_t unreadBody) {
    error(res, status, code, message, req.path);
    logRefusal(req, status, code, message);
    if (StoreConnection* conn = StoreConnection::current()) conn->discardBody(unreadBody);
    return httplib::Server::HandlerResponse::Handled;
  }

  // Runs once a request's headers are in, before any of its body is read: every rule that does not
  // need the body (docs/objects.md, "What the store refuses").
  httplib::Server::HandlerResponse admit(const httplib::Request& req, httplib::Response& res) {
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
      return refuse(req, res, 403, "AccessDenied",
                    "this store has no credentials, so it serves clients on its own host only (protected "
                    "mode); to serve " + req.remote_addr +
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
  static OperationDecision decide(const httplib::Request& req) {
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
  static void split(const std::string& path, std::string& bucket, std::string& key) {
    std::string p = path.size() > 1 ? path.substr(1) : "";
    size_t slash = p.find('/');
    bucket = p.substr(0, slash);
    key = slash == std::string::npos ? "" : p.substr(slash + 1);
  }

  // SigV4 when credentials are set: the headers' signature first (an unsigned or wrongly signed
  // request costs nothing more: no body is read into memory for it), the payload's hash once the
  // body is there (payloadMatches).
  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opts.accessKey.empty()) return true;
    const std::string authorization = req.get_header_value("Authorization");
    if (authorization.empty()) {
      error(res, 403, "AccessDenied",
            "the request is not signed (this store requires AWS Signature Version 4)", req.path);
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
  bool payloadMatches(const httplib::Request& req, httplib::Response& res, const std::string& bodyHex) {
    if (opts.accessKey.empty()) return true;
    const std::string named = req.get_header_value("x-amz-content-sha256");
    if (named == "UNSIGNED-PAYLOAD" || named == bodyHex) return true;
    error(res, 400, "XAmzContentSHA256Mismatch", "the payload does not match x-amz-content-sha256", req.path);
    return false;
  }

  // ---- handlers ----
  void onGet(const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res) || !payloadMatches(req, res, sha256Hex(req.body))) return;
    std::string bucket, key;
    split(req.path, bucket, key);
    if (bucket.empty()) return listBuckets(res);
    const StoreOperation op = decide(req).operation;
    if (op == StoreOperation::kListUploads) return listUploads(req, res, bucket);
    if (key.empty()) return listObjects(req, res, bucket);
    if (op == StoreOperation::kListParts) return listParts(req, res, bucket, key);
    ObjectPtr o;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto b = buckets.find(bucket);
      if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
      auto it = b->second.find(key);
      if (it == b->second.end()) return error(res, 404, "NoSuchKey", "no object '" + key + "'", req.path);
      o = it->second;
    }
    res.set_header("ETag", o->etag);
    res.set_header("Last-Modified", httpTime(o->modifiedNs));
    res.set_header("x-ferry-object-size", std::to_string(o->size));
    if (req.has_header("x-ferry-rdma-descriptor")) return rdmaGet(req, res, bucket + "/" + key, o);
    res.set_header("Accept-Ranges", "bytes");
    const ByteRange range = decideRange(req.get_header_value("Range"), o->size);
    if (range.kind == ByteRange::kUnsatisfiable) {
      res.set_header("Content-Range", "bytes */" + std::to_string(o->size));
      return error(res, 416, "InvalidRange",
                   "the range '" + req.get_header_value("Range").substr(0, 64) + "' is not satisfiable: the object has " +
                       std::to_string(o->size) + " bytes",
                   req.path);
    }
    const bool partial = range.kind == ByteRange::kPartial;
    const uint64_t first = partial ? range.first : 0;
    const uint64_t n = partial ? range.length : o->size;
    res.status = partial ? 206 : 200;
    if (partial) {
      res.set_header("Content-Range", "bytes " + std::to_string(first) + "-" + std::to_string(first + n - 1) + "/" +
                                          std::to_string(o->size));
    }
    if (req.method == "HEAD") {
      res.set_header("Content-Length", std::to_string(n));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(statsMu);
      ++stats.httpGets;
      stats.httpBytes += n;
    }
    if (n == 0) return res.set_content("", o->contentType);  // a provider of 0 bytes is never asked
    res.set_content_provider(n, o->contentType,
                             [o, first](size_t offset, size_t length, httplib::DataSink& sink) {
                               return sink.write(static_cast<const char*>(o->mem) + first + offset, length);
                             });
  }

  void rdmaGet(const httplib::Request& req, httplib::Response& res, const std::string& name,
               const ObjectPtr& o) {
    auto addr = number(req.get_header_value("x-ferry-rdma-addr"));
    auto length = number(req.get_header_value("x-ferry-rdma-length"));
    auto offset =
        number(req.has_header("x-ferry-object-offset") ? req.get_header_value("x-ferry-object-offset") : "0");
    if (!addr || !length || !offset) {
      return error(res, 400, "InvalidRequest",
                   "x-ferry-rdma-addr, x-ferry-rdma-length and x-ferry-object-offset "
                   "must be decimal numbers",
                   req.path);
    }
    uint64_t n = *offset >= o->size ? 0 : std::min(*length, o->size - *offset);
    if (n > 0) {
      uint16_t ch = rdma->allocateChannelId();
      if (ch == INVALID_CHANNEL_ID) return error(res, 503, "SlowDown", "every channel is busy", req.path);
      ibv_wc_status st = IBV_WC_SUCCESS;
      ssize_t rc = rdma->handleGetObject(name, o->buf, *addr, n,
                                         req.get_header_value("x-ferry-rdma-descriptor"), ch, *offset, &st);
      rdma->freeChannelId(ch);
      if (rc < 0) {
        return error(res, 400, "RdmaTransferFailed",
                     "handleGetObject: " + std::string(std::strerror(static_cast<int>(-rc))) +
                         " (completion status " + std::to_string(static_cast<int>(st)) + ")",
                     req.path);
      }
    }
    {
      std::lock_guard<std::mutex> lock(statsMu);
      ++stats.rdmaGets;
      stats.rdmaBytes += n;
    }
    res.status = 200;
    res.set_header("x-ferry-rdma-bytes", std::to_string(n));
    res.set_content("", "application/octet-stream");
  }

  void listBuckets(httplib::Response& res) {
    std::string xml =
        std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListAllMyBucketsResult xmlns=\"") + kXmlNs +
        "\"><Owner><ID>ferry</ID><DisplayName>ferry</DisplayName></Owner><Buckets>";
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [name, objects] : buckets) {
        xml += "<Bucket><Name>" + xmlEscape(name) + "</Name><CreationDate>" + isoTime(bucketCreated[name]) +
               "</CreationDate></Bucket>";
      }
    }
    xml += "</Buckets></ListAllMyBucketsResult>";
    res.status = 200;
    res.set_content(xml, "application/xml");
  }

  void listObjects(const httplib::Request& req, httplib::Response& res, const std::string& bucket) {
    const bool v2 = req.get_param_value("list-type") == "2";
    // encoding-type=url: keys and prefixes are percent-encoded (they may hold bytes XML cannot).
    const bool urlEncoded = req.get_param_value("encoding-type") == "url";
    auto text = [&](const std::string& s) { return urlEncoded ? uriEncode(s, true) : xmlEscape(s); };
    const std::string prefix = req.get_param_value("prefix");
    const std::string delimiter = req.get_param_value("delimiter");
    std::string after = v2 ? (req.has_param("continuation-token") ? req.get_param_value("continuation-token")
                                                                  : req.get_param_value("start-after"))
                           : req.get_param_value("marker");
    uint64_t maxKeys = 1000;
    if (req.has_param("max-keys")) {
      auto m = number(req.get_param_value("max-keys"));
      if (!m) return error(res, 400, "InvalidArgument", "max-keys must be a number", req.path);
      maxKeys = std::min<uint64_t>(*m, 1000);
    }
    std::string contents, prefixes, last;
    uint64_t count = 0;
    bool truncated = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto b = buckets.find(bucket);
      if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
      if (req.method == "HEAD") {
        res.status = 200;
        return;
      }
      std::string lastPrefix;
      for (auto it = after.empty() ? b->second.begin() : b->second.upper_bound(after); it != b->second.end();
           ++it) {
        const std::string& key = it->first;
        if (key.compare(0, prefix.size(), prefix) != 0) continue;
        if (!delimiter.empty()) {
          size_t d = key.find(delimiter, prefix.size());
          if (d != std::string::npos) {
            std::string cp = key.substr(0, d + delimiter.size());
            if (cp == lastPrefix) continue;
            if (count == maxKeys) {
              truncated = true;
              break;
            }
            lastPrefix = cp;
            prefixes += "<CommonPrefixes><Prefix>" + text(cp) + "</Prefix></CommonPrefixes>";
            ++count;
            last = key;
            continue;
          }
        }
        if (count == maxKeys) {
          truncated = true;
          break;
        }
        const ObjectPtr& o = it->second;
        contents += "<Contents><Key>" + text(key) + "</Key><LastModified>" + isoTime(o->modifiedNs) +
                    "</LastModified><ETag>" + xmlEscape(o->etag) + "</ETag><Size>" + std::to_string(o->size) +
                    "</Size><StorageClass>STANDARD</StorageClass></Contents>";
        ++count;
        last = key;
      }
    }
    std::string xml = std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"") +
                      kXmlNs + "\"><Name>" + xmlEscape(bucket) + "</Name><Prefix>" + text(prefix) + "</Prefix>";
    if (!delimiter.empty()) xml += "<Delimiter>" + text(delimiter) + "</Delimiter>";
    if (urlEncoded) xml += "<EncodingType>url</EncodingType>";
    xml += "<MaxKeys>" + std::to_string(maxKeys) + "</MaxKeys><IsTruncated>" +
           (truncated ? "true" : "false") + "</IsTruncated>";
    if (v2) {
      xml += "<KeyCount>" + std::to_string(count) + "</KeyCount>";
      if (req.has_param("continuation-token")) {
        xml += "<ContinuationToken>" + xmlEscape(req.get_param_value("continuation-token")) +
               "</ContinuationToken>";
      }
      if (truncated) xml += "<NextContinuationToken>" + xmlEscape(last) + "</NextContinuationToken>";
    } else {
      xml += "<Marker>" + text(after) + "</Marker>";
      if (truncated) xml += "<NextMarker>" + text(last) + "</NextMarker>";
    }
    xml += contents + prefixes + "</ListBucketResult>";
    res.status = 200;
    res.set_content(xml, "application/xml");
  }

  // A PUT or POST whose handler did not read its body (a refusal) has the connection skip it or
  // close.
  using BodyHandler = void (Impl::*)(const httplib::Request&, httplib::Response&,
                                     const httplib::ContentReader&);
  void onGuarded(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 BodyHandler handler) {
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
  static std::string readDocument(const httplib::ContentReader& reader, uint64_t declared) {
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
  bool documentMatches(const httplib::Request& req, httplib::Response& res, const std::string& body) {
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

  void onPut(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    if (!authorized(req, res)) return;  // before anything is read or allocated for the request
    std::string bucket, key;
    split(req.path, bucket, key);
    if (bucket.empty())
      return error(res, 400, "InvalidRequest", "PUT needs /bucket or /bucket/key", req.path);
    const uint64_t declared = number(req.get_header_value("Content-Length")).value_or(0);  // admit() checked it
    if (key.empty()) {
      std::string body = readDocument(reader, declared);
      if (!payloadMatches(req, res, sha256Hex(body))) return;
      if (!validBucket(bucket)) {
        return error(res, 400, "InvalidBucketName", "'" + bucket + "' is not a valid bucket name", req.path);
      }
      std::lock_guard<std::mutex> lock(mu);
      if (buckets.count(bucket)) {
        res.status = 409;
        res.set_content(
            std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>"
                        "BucketAlreadyOwnedByYou</Code><Message>the bucket exists</Message></Error>"),
            "application/xml");
        return;
      }
      buckets[bucket];
      bucketCreated[bucket] = nowNs();
      if (!opts.dataDir.empty()) {
        std::error_code ec;
        fs::create_directories(fs::path(opts.dataDir) / bucket, ec);
      }
      res.status = 200;
      res.set_header("Location", "/" + bucket);
      return;
    }
    if (!validKey(key))
      return error(res, 400, "InvalidArgument", "'" + key + "' is not a valid key", req.path);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!buckets.count(bucket))
        return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
    }
    if (req.has_header("x-ferry-rdma-descriptor")) {
      if (!payloadMatches(req, res, sha256Hex(""))) return;  // the payload is not in the body
      return rdmaPut(req, res, bucket, key);
    }
    const StoreOperation op = decide(req).operation;
    if (op == StoreOperation::kCopyObject) return copyObject(req, res, bucket, key);
    if (op == StoreOperation::kUploadPart) return uploadPart(req, res, reader, bucket, key);
    ObjectPtr o = receiveBody(req, res, reader);
    if (!o) return;
    if (Status st = registerObject(o); !st.isOk()) return error(res, 503, "SlowDown", st.message(), req.path);
    commit(res, bucket, key, o, req.path);
  }

  // The body of a PUT, received into a new object of its declared length: held against
  // maxReceivingBytes while it arrives and maxMemoryBytes while the object lives; its MD5 checked
  // against Content-MD5 and its SHA-256 against the signed hash. nullptr once a refusal is answered
  // (the body may then be unread: onGuarded() skips it).
  ObjectPtr receiveBody(const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader) {
    const uint64_t declared =
        number(req.get_header_value("Content-Length")).value_or(0);  // admit() checked it
    if (req.get_header_value("Content-Encoding").find("aws-chunked") != std::string::npos) {
      error(res, 501, "NotImplemented", "aws-chunked bodies are not supported: send the payload whole",
            req.path);
      return nullptr;
    }
    std::optional<std::string> expectedMd5;
    if (req.has_header("Content-MD5")) {
      expectedMd5 = contentMd5(req.get_header_value("Content-MD5"));
      if (!expectedMd5) {
        error(res, 400, "InvalidDigest", "Content-MD5 is not the base64 of 16 bytes", req.path);
        return nullptr;
      }
    }
    // Memory for the body is committed as its bytes arrive, and registered once it is whole. Its
    // declared length is held against maxReceivingBytes until then.
    auto grant = reserveReceiving(declared);
    if (!grant) {
      res.set_header("Retry-After", "1");
      error(res, 503, "SlowDown",
            "the store is receiving as many bytes as it may at once (--max-receiving); retry later", req.path);
      logRefusal(req, 503, "SlowDown", "the receiving bound is reached");
      return nullptr;
    }
    auto held = reserveMemory(declared);
    if (!held) {
      insufficientStorage(req, res, declared);
      return nullptr;
    }
    auto made = newObject(declared, /*registered=*/false);
    if (!made.isOk()) {
      error(res, 400, "EntityTooLarge", made.status().message(), req.path);
      return nullptr;
    }
    ObjectPtr o = *made;
    o->memory = std::move(*held);
    uint64_t got = 0;
    const bool hashed = !opts.accessKey.empty();
    Sha256 hash;
    Md5 md5;
    bool ok = declared == 0 || reader([&](const char* data, size_t n) {
                if (n > o->size - got) return false;
                std::memcpy(static_cast<char*>(o->mem) + got, data, n);
                if (hashed) hash.update(data, n);
                md5.update(data, n);
                got += n;
                return true;
              });
    if (!ok || got != o->size) {
      if (StoreConnection* conn = StoreConnection::current()) conn->closeAfterResponse();
      error(res, 400, "IncompleteBody",
            "the body has " + std::to_string(got) + " of " + std::to_string(o->size) + " bytes", req.path);
      return nullptr;
    }
    if (hashed && !payloadMatches(req, res, hash.hex())) return nullptr;
    o->md5 = md5.digest();
    if (expectedMd5 && *expectedMd5 != o->md5) {
      error(res, 400, "BadDigest", "the body's MD5 is not the Content-MD5 sent", req.path);
      return nullptr;
    }
    if (req.has_header("Content-Type")) o->contentType = req.get_header_value("Content-Type");
    {
      std::lock_guard<std::mutex> lock(statsMu);
      ++stats.httpPuts;
      stats.httpBytes += o->size;
    }
    return o;
  }

  void insufficientStorage(const httplib::Request& req, httplib::Response& res, uint64_t bytes) {
    const std::string why = "the store holds as many bytes in memory as it may (--max-memory " +
                            std::to_string(opts.maxMemoryBytes) + "); " + std::to_string(bytes) +
                            " more do not fit";
    logRefusal(req, 507, "InsufficientStorage", why);
    error(res, 507, "InsufficientStorage", why, req.path);
  }

  void rdmaPut(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
               const std::string& key) {
    auto addr = number(req.get_header_value("x-ferry-rdma-addr"));
    auto length = number(req.get_header_value("x-ferry-rdma-length"));
    auto offset =
        number(req.has_header("x-ferry-object-offset") ? req.get_header_value("x-ferry-object-offset") : "0");
    auto total = number(req.has_header("x-ferry-object-size") ? req.get_header_value("x-ferry-object-size")
                                                              : req.get_header_value("x-ferry-rdma-length"));
    std::string upload = req.get_header_value("x-ferry-upload-id");
    if (!addr || !length || !offset || !total || *length == 0 || *offset > *total ||
        *length > *total - *offset || upload.size() > 128) {
      return error(res, 400, "InvalidRequest",
                   "x-ferry-rdma-* headers: numbers, a nonzero length inside "
                   "x-ferry-object-size, an upload id of at most 128 bytes",
                   req.path);
    }
    const std::string id = bucket + "/" + key + "/" + upload;
    ObjectPtr o;
    {
      std::lock_guard<std::mutex> lock(mu);
      dropStaleUploads();
      auto it = uploads.find(id);
      if (it != uploads.end()) o = it->second;
    }
    if (!o) {
      // The whole object is registered now (the pieces are written into it by RDMA), so its size is
      // held against maxReceivingBytes until the last piece arrives or the upload is dropped.
      if (*total > opts.maxObjectBytes) {
        return error(res, 400, "EntityTooLarge",
                     "the object is larger than the store's limit of " + std::to_string(opts.maxObjectBytes) +
                         " bytes",
                     req.path);
      }
      auto grant = reserveReceiving(*total);
      if (!grant) {
        res.set_header("Retry-After", "1");
        logRefusal(req, 503, "SlowDown", "the receiving bound is reached");
        return error(res, 503, "SlowDown",
                     "the store is receiving as many bytes as it may at once (--max-receiving); retry later",
                     req.path);
      }
      auto held = reserveMemory(*total);
      if (!held) return insufficientStorage(req, res, *total);
      auto made = newObject(*total);
      if (!made.isOk()) return error(res, 503, "SlowDown", made.status().message(), req.path);
      o = *made;
      o->memory = std::move(*held);
      o->receiving = std::move(*grant);
      o->touchedNs = nowNs();
      std::lock_guard<std::mutex> lock(mu);
      auto [it, fresh] = uploads.emplace(id, o);
      if (!fresh) o = it->second;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      o->touchedNs = nowNs();
    }
    if (o->size != *total) {
      return error(res, 409, "InvalidRequest",
                   "upload '" + upload + "' has x-ferry-object-size " + std::to_string(o->size), req.path);
    }
    uint16_t ch = rdma->allocateChannelId();
    if (ch == INVALID_CHANNEL_ID) return error(res, 503, "SlowDown", "every channel is busy", req.path);
    ibv_wc_status st = IBV_WC_SUCCESS;
    ssize_t rc = rdma->handlePutObject(bucket + "/" + key, o->buf, *addr, *length,
                                       req.get_header_value("x-ferry-rdma-descriptor"), ch, *offset, &st);
    rdma->freeChannelId(ch);
    if (rc < 0) {
      {
        std::lock_guard<std::mutex> lock(mu);  // a failed piece ends the upload: the client starts again
        auto it = uploads.find(id);
        if (it != uploads.end() && it->second == o) uploads.erase(it);
      }
      return error(res, 400, "RdmaTransferFailed",
                   "handlePutObject: " + std::string(std::strerror(static_cast<int>(-rc))) +
                       " (completion status " + std::to_string(static_cast<int>(st)) + ")",
                   req.path);
    }
    bool complete = false;
    uint64_t received = 0;
    {
      std::lock_guard<std::mutex> lock(statsMu);
      ++stats.rdmaPuts;
      stats.rdmaBytes += *length;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      o->received += *length;
      received = o->received;
      complete = received >= o->size;
      if (complete) {
        uploads.erase(id);
        o->receiving.release();
      }
    }
    if (!complete) {
      res.status = 200;
      res.set_header("x-ferry-upload-received", std::to_string(received));
      return;
    }
    commit(res, bucket, key, o, req.path);
  }

  // Under mu: forgets uploads whose client stopped sending pieces.
  void dropStaleUploads() {
    const int64_t now = nowNs();
    for (auto it = uploads.begin(); it != uploads.end();) {
      it = now - it->second->touchedNs > kUploadIdleNs ? uploads.erase(it) : std::next(it);
    }
  }

  void commit(httplib::Response& res, const std::string& bucket, const std::string& key, const ObjectPtr& o,
              const std::string& path) {
    if (o->etag.empty()) o->etag = etagOf(o);
    o->modifiedNs = nowNs();
    Status st = persist(bucket, key, o);
    if (!st.isOk()) return error(res, 500, "InternalError", st.message(), path);
    {
      std::lock_guard<std::mutex> lock(mu);
      auto b = buckets.find(bucket);
      if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "the bucket was deleted", path);
      b->second[key] = o;
    }
    res.status = 200;
    res.set_header("ETag", o->etag);
  }

  // ---- multipart uploads, DeleteObjects, CopyObject ----
  static std::string xmlHead(const char* root) {
    return std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<") + root + " xmlns=\"" + kXmlNs + "\">";
  }

  // Drops, at most once a second, the multipart uploads that received no call for
  // abandonedUploadSeconds (their clients went away), freeing their parts.
  void sweepAbandonedUploads() {
    const int64_t now = nowNs();
    int64_t last = lastSweepNs.load();
    if (now - last < 1000000000 || !lastSweepNs.compare_exchange_strong(last, now)) return;
    const int64_t idleNs = opts.abandonedUploadSeconds * 1000000000;
    std::vector<UploadPtr> dropped;  // freed outside mu
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = multipart.begin(); it != multipart.end();) {
      if (now - it->second->touchedNs > idleNs) {
        dropped.push_back(it->second);
        it = multipart.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Under mu: the upload `id` of bucket/key, touched, or nullptr.
  UploadPtr findUploadLocked(const std::string& bucket, const std::string& key, const std::string& id) {
    auto it = multipart.find(id);
    if (it == multipart.end() || it->second->bucket != bucket || it->second->key != key) return nullptr;
    it->second->touchedNs = nowNs();
    return it->second;
  }

  void noSuchUpload(httplib::Response& res, const std::string& path) {
    error(res, 404, "NoSuchUpload",
          "no such upload: it was completed, aborted, or abandoned for longer than the store keeps uploads",
          path);
  }

  void onPost(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    if (!authorized(req, res)) return;
    std::string bucket, key;
    split(req.path, bucket, key);
    const uint64_t declared =
        number(req.get_header_value("Content-Length")).value_or(0);  // admit() checked it
    const std::string body = readDocument(reader, declared);
    if (body.size() != declared) {
      if (StoreConnection* conn = StoreConnection::current()) conn->closeAfterResponse();
      return error(res, 400, "IncompleteBody", "the body ended early", req.path);
    }
    if (!documentMatches(req, res, body)) return;
    switch (decide(req).operation) {
      case StoreOperation::kCreateUpload: return createUpload(req, res, bucket, key);
      case StoreOperation::kCompleteUpload: return completeUpload(req, res, bucket, key, body);
      case StoreOperation::kDeleteObjects: return deleteObjects(req, res, bucket, body);
      default: return error(res, 501, "NotImplemented", "this POST is not implemented", req.path);
    }
  }

  void createUpload(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                    const std::string& key) {
    if (!validKey(key))
      return error(res, 400, "InvalidArgument", "'" + key + "' is not a valid key", req.path);
    auto upload = std::make_shared<MultipartUpload>();
    upload->bucket = bucket;
    upload->key = key;
    upload->id = agent::randomHex(16);
    upload->initiatedNs = upload->touchedNs = nowNs();
    if (req.has_header("Content-Type")) upload->contentType = req.get_header_value("Content-Type");
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!buckets.count(bucket))
        return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
      if (multipart.size() >= kMaxUploadsInProgress) {
        res.set_header("Retry-After", "1");
        return error(res, 503, "SlowDown",
                     "the store has " + std::to_string(kMaxUploadsInProgress) +
                         " multipart uploads in progress: complete or abort some",
                     req.path);
      }
      multipart.emplace(upload->id, upload);
    }
    res.status = 200;
    res.set_content(xmlHead("InitiateMultipartUploadResult") + "<Bucket>" + xmlEscape(bucket) +
                        "</Bucket><Key>" + xmlEscape(key) + "</Key><UploadId>" + upload->id +
                        "</UploadId></InitiateMultipartUploadResult>",
                    "application/xml");
  }

  void uploadPart(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                  const std::string& bucket, const std::string& key) {
    auto partNumber = number(req.get_param_value("partNumber"));
    if (!partNumber || *partNumber < 1 || *partNumber > kMaxParts) {
      return error(res, 400, "InvalidArgument", "partNumber must be 1.." + std::to_string(kMaxParts),
                   req.path);
    }
    const std::string id = req.get_param_value("uploadId");
    UploadPtr upload;
    {
      std::lock_guard<std::mutex> lock(mu);
      upload = findUploadLocked(bucket, key, id);
    }
    if (!upload) return noSuchUpload(res, req.path);  // before the body is read
    ObjectPtr part = receiveBody(req, res, reader);
    if (!part) return;
    part->etag = etagOf(part);
    part->modifiedNs = nowNs();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (findUploadLocked(bucket, key, id) != upload)
        return noSuchUpload(res, req.path);  // aborted meanwhile
      upload->parts[static_cast<uint32_t>(*partNumber)] = part;
    }
    res.status = 200;
    res.set_header("ETag", part->etag);
  }

  // The parts a completion lists, as S3 validates them: each uploaded with the ETag listed, each but
  // the last of at least 5 MiB. Empty once the refusal is answered.
  struct ListedParts {
    std::vector<ObjectPtr> parts;
    std::string contentType;
    uint64_t bytes = 0;
    std::string md5s;  // the parts' binary MD5s, concatenated
  };
  std::optional<ListedParts> listedParts(const httplib::Request& req, httplib::Response& res,
                                         const std::string& bucket, const std::string& key,
                                         const std::vector<CompletedPart>& listed) {
    ListedParts out;
    std::lock_guard<std::mutex> lock(mu);
    UploadPtr upload = findUploadLocked(bucket, key, req.get_param_value("uploadId"));
    if (!upload) {
      noSuchUpload(res, req.path);
      return std::nullopt;
    }
    out.contentType = upload->contentType;
    for (size_t i = 0; i < listed.size(); ++i) {
      auto it = upload->parts.find(listed[i].number);
      if (it == upload->parts.end() || !equalsHex(agent::hexOf(it->second->md5), listed[i].etag)) {
        error(res, 400, "InvalidPart",
              "part " + std::to_string(listed[i].number) +
                  " was not uploaded, or its ETag is not the one listed",
              req.path);
        return std::nullopt;
      }
      if (i + 1 < listed.size() && it->second->size < kMinPartBytes) {
        error(res, 400, "EntityTooSmall",
              "part " + std::to_string(listed[i].number) + " has " + std::to_string(it->second->size) +
                  " bytes: every part but the last needs at least 5 MiB",
              req.path);
        return std::nullopt;
      }
      out.parts.push_back(it->second);
      out.bytes += it->second->size;
      out.md5s += it->second->md5;
    }
    return out;
  }

  void completeUpload(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                      const std::string& key, const std::string& body) {
    auto [listed, refusal] = decideCompleteUpload(body);
    if (refusal) return error(res, refusal->status, refusal->code, refusal->message, req.path);
    const std::string id = req.get_param_value("uploadId");
    auto found = listedParts(req, res, bucket, key, listed);
    if (!found) return;
    const uint64_t total = found->bytes;
    if (total > opts.maxObjectBytes) {
      return error(
          res, 400, "EntityTooLarge",
          "the object is larger than the store's limit of " + std::to_string(opts.maxObjectBytes) + " bytes",
          req.path);
    }
    // The object is a copy of its parts (registered memory is one range): room for both is needed
    // until the parts are freed below.
    auto held = reserveMemory(total);
    if (!held) return insufficientStorage(req, res, total);
    auto made = newObject(total, /*registered=*/false);
    if (!made.isOk()) return error(res, 400, "EntityTooLarge", made.status().message(), req.path);
    ObjectPtr o = *made;
    o->memory = std::move(*held);
    uint64_t at = 0;
    for (const ObjectPtr& part : found->parts) {
      if (part->size) std::memcpy(static_cast<char*>(o->mem) + at, part->mem, part->size);
      at += part->size;
    }
    if (Status st = registerObject(o); !st.isOk()) return error(res, 503, "SlowDown", st.message(), req.path);
    o->contentType = found->contentType;
    o->etag = "\"" + agent::hexOf(md5Of(found->md5s.data(), found->md5s.size())) + "-" +
              std::to_string(found->parts.size()) + "\"";
    found.reset();
    UploadPtr finished;  // its parts are freed outside mu
    {
      std::lock_guard<std::mutex> lock(mu);  // one completion wins; an abort meanwhile wins too
      auto it = multipart.find(id);
      if (it == multipart.end()) return noSuchUpload(res, req.path);
      finished = it->second;
      multipart.erase(it);
    }
    commit(res, bucket, key, o, req.path);
    if (res.status != 200) return;
    res.set_content(xmlHead("CompleteMultipartUploadResult") + "<Location>/" + xmlEscape(bucket) + "/" +
                        xmlEscape(key) + "</Location><Bucket>" + xmlEscape(bucket) + "</Bucket><Key>" +
                        xmlEscape(key) + "</Key><ETag>" + xmlEscape(o->etag) +
                        "</ETag></CompleteMultipartUploadResult>",
                    "application/xml");
  }

  static bool equalsHex(const std::string& a, const std::string& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) ==
                    std::tolower(static_cast<unsigned char>(y));
           });
  }

  void abortUpload(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                   const std::string& key) {
    UploadPtr upload;  // its parts are freed outside mu
    {
      std::lock_guard<std::mutex> lock(mu);
      upload = findUploadLocked(bucket, key, req.get_param_value("uploadId"));
      if (!upload) return noSuchUpload(res, req.path);
      multipart.erase(upload->id);
    }
    res.status = 204;
  }

  void listParts(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                 const std::string& key) {
    uint64_t maxParts = 1000, marker = 0;
    if (req.has_param("max-parts")) {
      auto m = number(req.get_param_value("max-parts"));
      if (!m) return error(res, 400, "InvalidArgument", "max-parts must be a number", req.path);
      maxParts = std::min<uint64_t>(*m, 1000);
    }
    if (req.has_param("part-number-marker")) {
      auto m = number(req.get_param_value("part-number-marker"));
      if (!m) return error(res, 400, "InvalidArgument", "part-number-marker must be a number", req.path);
      marker = *m;
    }
    const std::string id = req.get_param_value("uploadId");
    std::string parts;
    uint64_t count = 0, last = 0;
    bool truncated = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      UploadPtr upload = findUploadLocked(bucket, key, id);
      if (!upload) return noSuchUpload(res, req.path);
      for (auto it = upload->parts.upper_bound(static_cast<uint32_t>(std::min<uint64_t>(marker, kMaxParts)));
           it != upload->parts.end(); ++it) {
        if (count == maxParts) {
          truncated = true;
          break;
        }
        parts += "<Part><PartNumber>" + std::to_string(it->first) + "</PartNumber><LastModified>" +
                 isoTime(it->second->modifiedNs) + "</LastModified><ETag>" + xmlEscape(it->second->etag) +
                 "</ETag><Size>" + std::to_string(it->second->size) + "</Size></Part>";
        ++count;
        last = it->first;
      }
    }
    res.status = 200;
    res.set_content(xmlHead("ListPartsResult") + "<Bucket>" + xmlEscape(bucket) + "</Bucket><Key>" +
                        xmlEscape(key) + "</Key><UploadId>" + xmlEscape(id) +
                        "</UploadId><StorageClass>STANDARD</StorageClass>"
                        "<PartNumberMarker>" +
                        std::to_string(marker) + "</PartNumberMarker><NextPartNumberMarker>" +
                        std::to_string(last) + "</NextPartNumberMarker><MaxParts>" +
                        std::to_string(maxParts) + "</MaxParts><IsTruncated>" +
                        (truncated ? "true" : "false") + "</IsTruncated>" + parts + "</ListPartsResult>",
                    "application/xml");
  }

  void listUploads(const httplib::Request& req, httplib::Response& res, const std::string& bucket) {
    uint64_t maxUploads = 1000;
    if (req.has_param("max-uploads")) {
      auto m = number(req.get_param_value("max-uploads"));
      if (!m) return error(res, 400, "InvalidArgument", "max-uploads must be a number", req.path);
      maxUploads = std::min<uint64_t>(*m, 1000);
    }
    const bool urlEncoded = req.get_param_value("encoding-type") == "url";
    auto text = [&](const std::string& s) { return urlEncoded ? uriEncode(s, true) : xmlEscape(s); };
    const std::string prefix = req.get_param_value("prefix");
    const std::string keyMarker = req.get_param_value("key-marker");
    const std::string idMarker = req.get_param_value("upload-id-marker");
    std::vector<UploadPtr> found;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!buckets.count(bucket))
        return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
      for (const auto& [id, u] : multipart) {
        if (u->bucket != bucket || u->key.compare(0, prefix.size(), prefix) != 0) continue;
        if (!keyMarker.empty() &&
            (u->key < keyMarker || (u->key == keyMarker && (idMarker.empty() || id <= idMarker))))
          continue;
        found.push_back(u);
      }
    }
    std::sort(found.begin(), found.end(), [](const UploadPtr& a, const UploadPtr& b) {
      return std::tie(a->key, a->id) < std::tie(b->key, b->id);
    });
    const bool truncated = found.size() > maxUploads;
    if (truncated) found.resize(maxUploads);
    std::string xml = xmlHead("ListMultipartUploadsResult") + "<Bucket>" + xmlEscape(bucket) +
                      "</Bucket><KeyMarker>" + text(keyMarker) + "</KeyMarker><UploadIdMarker>" +
                      xmlEscape(idMarker) + "</UploadIdMarker>";
    if (truncated && !found.empty()) {
      xml += "<NextKeyMarker>" + text(found.back()->key) + "</NextKeyMarker><NextUploadIdMarker>" +
             found.back()->id + "</NextUploadIdMarker>";
    }
    if (!prefix.empty()) xml += "<Prefix>" + text(prefix) + "</Prefix>";
    if (urlEncoded) xml += "<EncodingType>url</EncodingType>";
    xml += "<MaxUploads>" + std::to_string(maxUploads) + "</MaxUploads><IsTruncated>" +
           (truncated ? "true" : "false") + "</IsTruncated>";
    for (const UploadPtr& u : found) {
      xml += "<Upload><Key>" + text(u->key) + "</Key><UploadId>" + u->id +
             "</UploadId><Initiator><ID>ferry</ID><DisplayName>ferry</DisplayName></"
             "Initiator><Owner><ID>ferry</ID>"
             "<DisplayName>ferry</DisplayName></Owner><StorageClass>STANDARD</StorageClass><Initiated>" +
             isoTime(u->initiatedNs) + "</Initiated></Upload>";
    }
    xml += "</ListMultipartUploadsResult>";
    res.status = 200;
    res.set_content(xml, "application/xml");
  }

  void deleteObjects(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                     const std::string& body) {
    auto [request, refusal] = decideDeleteObjects(body);
    if (refusal) return error(res, refusal->status, refusal->code, refusal->message, req.path);
    std::string entries;
    std::vector<ObjectPtr> removed;  // freed outside mu
    {
      std::lock_guard<std::mutex> lock(mu);
      auto b = buckets.find(bucket);
      if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
      for (const std::string& key : request.keys) {
        if (!validKey(key)) {  // no such object can exist; S3 answers per key
          entries += "<Error><Key>" + xmlEscape(key) +
                     "</Key><Code>InvalidArgument</Code><Message>not a valid key</Message></Error>";
          continue;
        }
        auto it = b->second.find(key);
        if (it != b->second.end()) {
          removed.push_back(it->second);
          b->second.erase(it);
        }
        if (!opts.dataDir.empty()) {
          std::error_code ec;
          fs::remove(fileOf(bucket, key), ec);
        }
        if (!request.quiet)
          entries += "<Deleted><Key>" + xmlEscape(key) + "</Key></Deleted>";  // S3: present or not
      }
    }
    res.status = 200;
    res.set_content(xmlHead("DeleteResult") + entries + "</DeleteResult>", "application/xml");
  }

  void copyObject(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                  const std::string& key) {
    if (number(req.get_header_value("Content-Length")).value_or(0) != 0)
      return error(res, 400, "InvalidRequest", "a copy carries no body", req.path);
    if (!payloadMatches(req, res, sha256Hex(""))) return;
    auto source = decideCopySource(req.get_header_value("x-amz-copy-source"));
    if (!source)
      return error(res, 400, "InvalidArgument", "x-amz-copy-source must be /bucket/key (URL-encoded)",
                   req.path);
    if (source->versioned)
      return error(res, 501, "NotImplemented", "copying a version (versionId) is not implemented", req.path);
    const std::string directive = req.has_header("x-amz-metadata-directive")
                                      ? req.get_header_value("x-amz-metadata-directive")
                                      : "COPY";
    if (directive != "COPY" && directive != "REPLACE")
      return error(res, 400, "InvalidArgument", "x-amz-metadata-directive must be COPY or REPLACE", req.path);
    if (source->bucket == bucket && source->key == key && directive != "REPLACE") {
      return error(
          res, 400, "InvalidRequest",
          "This copy request is illegal because it is trying to copy an object to itself without changing "
          "the object's metadata (send x-amz-metadata-directive: REPLACE)",
          req.path);
    }
    ObjectPtr from;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto b = buckets.find(source->bucket);
      if (b == buckets.end())
        return error(res, 404, "NoSuchBucket", "no bucket '" + source->bucket + "'", req.path);
      auto it = b->second.find(source->key);
      if (it == b->second.end())
        return error(res, 404, "NoSuchKey", "no object '" + source->key + "'", req.path);
      from = it->second;
    }
    auto held = reserveMemory(from->size);
    if (!held) return insufficientStorage(req, res, from->size);
    auto made = newObject(from->size, /*registered=*/false);
    if (!made.isOk()) return error(res, 400, "EntityTooLarge", made.status().message(), req.path);
    ObjectPtr o = *made;
    o->memory = std::move(*held);
    if (o->size) std::memcpy(o->mem, from->mem, o->size);
    if (Status st = registerObject(o); !st.isOk()) return error(res, 503, "SlowDown", st.message(), req.path);
    // A copy is one part: a multipart source's ETag is recomputed as the MD5 of the bytes.
    o->etag = from->etag.find('-') == std::string::npos ? from->etag : etagOf(o);
    o->contentType = directive == "REPLACE" && req.has_header("Content-Type")
                         ? req.get_header_value("Content-Type")
                         : from->contentType;
    commit(res, bucket, key, o, req.path);
    if (res.status != 200) return;
    res.set_content(xmlHead("CopyObjectResult") + "<LastModified>" + isoTime(o->modifiedNs) +
                        "</LastModified><ETag>" + xmlEscape(o->etag) + "</ETag></CopyObjectResult>",
                    "application/xml");
  }

  void onDelete(const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res) || !payloadMatches(req, res, sha256Hex(req.body))) return;
    std::string bucket, key;
    split(req.path, bucket, key);
    if (decide(req).operation == StoreOperation::kAbortUpload) return abortUpload(req, res, bucket, key);
    std::lock_guard<std::mutex> lock(mu);
    auto b = buckets.find(bucket);
    if (b == buckets.end()) return error(res, 404, "NoSuchBucket", "no bucket '" + bucket + "'", req.path);
    if (key.empty()) {
      if (!b->second.empty()) return error(res, 409, "BucketNotEmpty", "the bucket has objects", req.path);
      buckets.erase(b);
      bucketCreated.erase(bucket);
      if (!opts.dataDir.empty()) {
        std::error_code ec;
        fs::remove_all(fs::path(opts.dataDir) / bucket, ec);
      }
      res.status = 204;
      return;
    }
    b->second.erase(key);  // S3 answers 204 whether or not the key existed
    if (!opts.dataDir.empty() && validKey(key)) {
      std::error_code ec;
      fs::remove(fileOf(bucket, key), ec);
    }
    res.status = 204;
  }
};

Result<std::unique_ptr<ObjectStore>> ObjectStore::start(StoreOptions options) {
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
  http.set_tcp_nodelay(true);
  // cpp-httplib sets SO_REUSEPORT by default, which lets a second store bind the same port and
  // take half of its clients: only SO_REUSEADDR here (a restarted store rebinds at once).
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  http.set_payload_max_length(static_cast<size_t>(options.maxBodyBytes));
  http.set_pre_routing_handler(
      [self](const httplib::Request& req, httplib::Response& res) { return self->admit(req, res); });
  // A connection that must close after this answer says so (and not Keep-Alive).
  http.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    StoreConnection* conn = StoreConnection::current();
    if (conn == nullptr || !conn->closeAfter()) return;
    res.headers.erase("Keep-Alive");
    res.headers.erase("Connection");
    res.set_header("Connection", "close");
  });
  http.Get(".*", [self](const httplib::Request& req, httplib::Response& res) { self->onGet(req, res); });
  http.Put(".*", [self](const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& r) { self->onGuarded(req, res, r, &Impl::onPut); });
  http.Post(".*", [self](const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& r) { self->onGuarded(req, res, r, &Impl::onPost); });
  http.Delete(".*", [self](const httplib::Request& req, httplib::Response& res) { self->onDelete(req, res); });
  http.set_exception_handler(
      [self](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
        self->error(res, 500, "InternalError", "the request failed", req.path);
      });
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
