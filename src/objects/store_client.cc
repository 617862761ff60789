// ferry's object client (include/ferry/objects/store.h): S3-style HTTP requests on cpp-httplib's
// client; payloads by RDMA through a cuObjClient whose callbacks are those requests.
#include <httplib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <vector>

#include "agent/crypto.h"
#include "common/cuda_driver.h"
#include "ferry/common/config.h"
#include "ferry/cuobj_client.h"
#include "ferry/objects/store.h"
#include "objects/sigv4.h"

namespace ferry::objects {
namespace {

std::string xmlUnescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    static const std::pair<const char*, char> entities[] = {
        {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
    bool done = false;
    for (const auto& [e, c] : entities) {
      if (s.compare(i, std::strlen(e), e) == 0) {
        out.push_back(c);
        i += std::strlen(e) - 1;
        done = true;
        break;
      }
    }
    if (!done) out.push_back('&');
  }
  return out;
}

// The texts of every <tag>...</tag> in xml, in order (the store's own documents: no nesting of a
// tag in itself, no attributes on these tags).
std::vector<std::string> tags(std::string_view xml, std::string_view tag) {
  std::vector<std::string> out;
  const std::string open = "<" + std::string(tag) + ">", close = "</" + std::string(tag) + ">";
  size_t at = 0;
  while ((at = xml.find(open, at)) != std::string_view::npos) {
    size_t end = xml.find(close, at + open.size());
    if (end == std::string_view::npos) break;
    out.emplace_back(xml.substr(at + open.size(), end - at - open.size()));
    at = end + close.size();
  }
  return out;
}

std::string first(std::string_view xml, std::string_view tag) {
  auto all = tags(xml, tag);
  return all.empty() ? std::string() : xmlUnescape(all.front());
}

}  // namespace

struct ObjectClient::Impl {
  std::string base, host;
  ClientOptions opts;
  std::unique_ptr<cuObjClient> rdma;
  std::mutex mu;  // one request at a time on `http`
  std::unique_ptr<httplib::Client> http;

  // One object transfer: what the callbacks need.
  struct Call {
    Impl* self = nullptr;
    std::string bucket, key, upload;
    uint64_t total = 0;
    Status error;  // the store's refusal of a piece (its code kept: kNotFound, kPermissionDenied, ...)
  };

  static ssize_t onGet(const void* handle, char* ptr, size_t size, loff_t offset,
                       const cufileRDMAInfo_t* info) {
    auto* call = static_cast<Call*>(cuObjClient::getCtx(handle));
    if (call == nullptr || info == nullptr) return -EINVAL;
    httplib::Headers h = {{"x-ferry-rdma-descriptor", info->desc_str},
                          {"x-ferry-rdma-addr", std::to_string(reinterpret_cast<uint64_t>(ptr))},
                          {"x-ferry-rdma-length", std::to_string(size)},
                          {"x-ferry-object-offset", std::to_string(offset)}};
    auto res = call->self->request("GET", "/" + call->bucket + "/" + call->key, h, nullptr, 0);
    if (!res.isOk()) {
      call->error = res.status();
      return -EIO;
    }
    auto n = res->get_header_value("x-ferry-rdma-bytes");
    return n.empty() ? -EIO : static_cast<ssize_t>(std::strtoull(n.c_str(), nullptr, 10));
  }

  static ssize_t onPut(const void* handle, const char* ptr, size_t size, loff_t offset,
                       const cufileRDMAInfo_t* info) {
    auto* call = static_cast<Call*>(cuObjClient::getCtx(handle));
    if (call == nullptr || info == nullptr) return -EINVAL;
    httplib::Headers h = {{"x-ferry-rdma-descriptor", info->desc_str},
                          {"x-ferry-rdma-addr", std::to_string(reinterpret_cast<uint64_t>(ptr))},
                          {"x-ferry-rdma-length", std::to_string(size)},
                          {"x-ferry-object-offset", std::to_string(offset)},
                          {"x-ferry-object-size", std::to_string(call->total)},
                          {"x-ferry-upload-id", call->upload}};
    auto res = call->self->request("PUT", "/" + call->bucket + "/" + call->key, h, nullptr, 0);
    if (!res.isOk()) {
      call->error = res.status();
      return -EIO;
    }
    return static_cast<ssize_t>(size);
  }

  // One HTTP request (signed when there are credentials); an error status for anything but 2xx.
  Result<httplib::Result> raw(const std::string& method, const std::string& path, httplib::Headers headers,
                              const char* body, uint64_t bodySize,
                              httplib::ContentProvider provider = nullptr,
                              httplib::ContentReceiver receiver = nullptr,
                              const httplib::Params& query = {}) {
    std::string target = uriEncode(path, true);
    std::string qs;
    for (const auto& [k, v] : query)
      qs += (qs.empty() ? "?" : "&") + uriEncode(k, false) + "=" + uriEncode(v, false);
    headers.emplace("Host", host);
    if (!opts.accessKey.empty()) {
      std::string date = amzDateNow();
      std::string payload = (body == nullptr && !provider) ? sha256Hex("") : "UNSIGNED-PAYLOAD";
      if (body != nullptr) payload = sha256Hex(std::string_view(body, bodySize));
      headers.emplace("x-amz-date", date);
      headers.emplace("x-amz-content-sha256", payload);
      SignedRequest r;
      r.method = method;
      r.path = path;
      for (const auto& [k, v] : query) r.query.emplace_back(k, v);
      for (const auto& [k, v] : headers) r.headers.emplace_back(k, v);
      r.payloadHash = payload;
      headers.emplace("Authorization", signV4(r, opts.accessKey, opts.secretKey, opts.region, date));
    }
    std::lock_guard<std::mutex> lock(mu);
    httplib::Result res{nullptr, httplib::Error::Unknown};
    const std::string full = target + qs;
    if (method == "GET") {
      res = receiver ? http->Get(full, headers, receiver) : http->Get(full, headers);
    } else if (method == "HEAD") {
      res = http->Head(full, headers);
    } else if (method == "DELETE") {
      res = http->Delete(full, headers);
    } else if (provider) {
      res = http->Put(full, headers, static_cast<size_t>(bodySize), provider, "application/octet-stream");
    } else {
      res = http->Put(full, headers, body ? body : "", static_cast<size_t>(body ? bodySize : 0),
                      "application/octet-stream");
    }
    if (!res) {
      return Status(StatusCode::kUnavailable,
                    method + " " + base + target + ": " + httplib::to_string(res.error()));
    }
    return res;
  }

  Result<httplib::Response> request(const std::string& method, const std::string& path,
                                    httplib::Headers headers, const char* body, uint64_t bodySize,
                                    const httplib::Params& query = {}) {
    FERRY_ASSIGN_OR_RETURN(httplib::Result res,
                           raw(method, path, std::move(headers), body, bodySize, nullptr, nullptr, query));
    return check(method, path, *res);
  }

  Result<httplib::Response> check(const std::string& method, const std::string& path,
                                  const httplib::Response& r) {
    if (r.status >= 200 && r.status < 300) return r;
    std::string code = first(r.body, "Code"), message = first(r.body, "Message");
    std::string text = method + " " + path + ": HTTP " + std::to_string(r.status) +
                       (code.empty() ? "" : " " + code) + (message.empty() ? "" : ": " + message);
    StatusCode sc = StatusCode::kUnavailable;
    if (r.status == 404)
      sc = StatusCode::kNotFound;
    else if (r.status == 403)
      sc = StatusCode::kPermissionDenied;
    else if (r.status == 409)
      sc = StatusCode::kBusy;
    else if (r.status >= 400 && r.status < 500)
      sc = StatusCode::kInvalidArgument;
    return Status(sc, text);
  }

  std::string objectPath(const std::string& bucket, const std::string& key) {
    return "/" + bucket + "/" + key;
  }

  // Moves [data, +size) by RDMA in pieces (pieceBytes each) through registered memory.
  Status rdmaMove(cuObjOpType_t op, const std::string& bucket, const std::string& key, void* data,
                  uint64_t size) {
    if (rdma->cuMemObjGetDescriptor(data, size) != CU_OBJ_SUCCESS) {
      return Status(StatusCode::kInvalidArgument, "the memory did not register (is it mapped and writable?)");
    }
    Call call{.self = this,
              .bucket = bucket,
              .key = key,
              .upload = agent::randomHex(8),
              .total = size,
              .error = {}};
    Status st;
    for (uint64_t off = 0; off < size && st.isOk();) {
      uint64_t n = std::min(opts.pieceBytes, size - off);
      ssize_t r = op == CUOBJ_GET
                      ? rdma->cuObjGet(&call, data, n, static_cast<loff_t>(off), static_cast<loff_t>(off))
                      : rdma->cuObjPut(&call, data, n, static_cast<loff_t>(off), static_cast<loff_t>(off));
      // A GET may be answered with less than the piece (a store on disk sends what fits in its
      // memory); the rest is asked for next.
      const bool moved =
          op == CUOBJ_GET ? r > 0 && static_cast<uint64_t>(r) <= n : static_cast<uint64_t>(r) == n;
      if (r < 0 || !moved) {
        st = !call.error.isOk() ? call.error
                                : Status(StatusCode::kIoError,
                                         std::string(op == CUOBJ_GET ? "GET" : "PUT") + " /" + bucket + "/" +
                                             key + " at " + std::to_string(off) + ": moved " +
                                             std::to_string(r) + " of " + std::to_string(n) + " bytes");
        break;
      }
      off += static_cast<uint64_t>(r);
      if (opts.progress) opts.progress(off, size);
    }
    rdma->cuMemObjPutDescriptor(data);
    return st;
  }
};

ObjectClient::ObjectClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ObjectClient::~ObjectClient() = default;

Result<std::unique_ptr<ObjectClient>> ObjectClient::connect(std::string url, ClientOptions options) {
  FERRY_ASSIGN_OR_RETURN(ObjectUrl u, parseObjectUrl(url));
  if (options.accessKey.empty()) options.accessKey = config::objectsAccessKey();
  if (options.secretKey.empty()) options.secretKey = config::objectsSecretKey();
  if (options.pieceBytes == 0 || options.pieceBytes > CUOBJ_MAX_REQUEST_SIZE) {
    return invalidArgument("objects client: the piece size must be 1 byte .. 1 GiB");
  }
  auto impl = std::make_unique<Impl>();
  impl->base = u.base;
  impl->host = u.base.substr(std::strlen("http://"));
  impl->opts = std::move(options);
  impl->http = std::make_unique<httplib::Client>(u.base);
  impl->http->set_keep_alive(true);
  impl->http->set_tcp_nodelay(true);
  impl->http->set_read_timeout(impl->opts.timeoutSeconds, 0);
  impl->http->set_write_timeout(impl->opts.timeoutSeconds, 0);
  impl->http->set_connection_timeout(10, 0);
  if (impl->opts.rdma) {
    static CUObjOps_t ops{.get = Impl::onGet, .put = Impl::onPut};
    impl->rdma = std::make_unique<cuObjClient>(ops);
    if (!impl->rdma->isConnected()) {
      return Status(StatusCode::kUnavailable, "objects client: the RDMA session did not start");
    }
  }
  return std::make_unique<ObjectClient>(std::move(impl));
}

Status ObjectClient::createBucket(const std::string& bucket) {
  return impl_->request("PUT", "/" + bucket, {}, "", 0).status();
}

Status ObjectClient::deleteBucket(const std::string& bucket) {
  return impl_->request("DELETE", "/" + bucket, {}, nullptr, 0).status();
}

Result<std::vector<std::string>> ObjectClient::buckets() {
  FERRY_ASSIGN_OR_RETURN(httplib::Response r, impl_->request("GET", "/", {}, nullptr, 0));
  std::vector<std::string> out;
  for (const auto& b : tags(r.body, "Bucket")) out.push_back(first(b, "Name"));
  return out;
}

Result<std::vector<ObjectInfo>> ObjectClient::list(const std::string& bucket, const std::string& prefix) {
  std::vector<ObjectInfo> out;
  std::string token;
  for (;;) {
    httplib::Params q = {{"list-type", "2"}};
    if (!prefix.empty()) q.emplace("prefix", prefix);
    if (!token.empty()) q.emplace("continuation-token", token);
    FERRY_ASSIGN_OR_RETURN(httplib::Response r, impl_->request("GET", "/" + bucket, {}, nullptr, 0, q));
    for (const auto& c : tags(r.body, "Contents")) {
      ObjectInfo info;
      info.key = first(c, "Key");
      info.size = std::strtoull(first(c, "Size").c_str(), nullptr, 10);
      info.etag = first(c, "ETag");
      out.push_back(std::move(info));
    }
    if (first(r.body, "IsTruncated") != "true") break;
    token = first(r.body, "NextContinuationToken");
    if (token.empty()) break;
  }
  return out;
}

Result<ObjectInfo> ObjectClient::head(const std::string& bucket, const std::string& key) {
  FERRY_ASSIGN_OR_RETURN(httplib::Response r,
                         impl_->request("HEAD", impl_->objectPath(bucket, key), {}, nullptr, 0));
  ObjectInfo info;
  info.key = key;
  std::string size = r.get_header_value("x-ferry-object-size");
  if (size.empty()) size = r.get_header_value("Content-Length");
  info.size = std::strtoull(size.c_str(), nullptr, 10);
  info.etag = r.get_header_value("ETag");
  return info;
}

Status ObjectClient::remove(const std::string& bucket, const std::string& key) {
  return impl_->request("DELETE", impl_->objectPath(bucket, key), {}, nullptr, 0).status();
}

namespace {

// Where [data, data + size) lives: host memory, or one device's memory throughout (a range that
// starts on a device and leaves it is refused). Over HTTP, device memory is copied through the
// driver a piece at a time as the socket takes or gives it; over RDMA the engine registers it.
constexpr size_t kStagedPiece = 1 << 20;  // device memory staged for an HTTP body at a time

Result<MemoryLocation> locateRange(const char* what, const void* data, uint64_t size) {
  const MemoryLocation where = size > 0 ? cuda::locate(data) : MemoryLocation{};
  if (where.onDevice() && cuda::locate(static_cast<const char*>(data) + size - 1) != where) {
    return invalidArgument(std::string(what) + ": the " + std::to_string(size) +
                           " bytes start in memory of " + where.toString() + " but do not end there");
  }
  return where;
}

}  // namespace

Status ObjectClient::put(const std::string& bucket, const std::string& key, const void* data, uint64_t size) {
  if (data == nullptr && size > 0) return invalidArgument("put: null data");
  FERRY_ASSIGN_OR_RETURN(const MemoryLocation where, locateRange("put", data, size));
  if (impl_->rdma && size > 0) return impl_->rdmaMove(CUOBJ_PUT, bucket, key, const_cast<void*>(data), size);
  const char* bytes = static_cast<const char*>(data);
  std::vector<char> staged;  // device memory: each piece the socket takes, copied to the host first
  Status copyError;
  auto provider = [&, bytes, size, this](size_t offset, size_t length, httplib::DataSink& sink) {
    const char* piece = bytes + offset;
    if (where.onDevice()) {
      // At most kStagedPiece at a time: httplib asks again for the rest from where this ends.
      length = std::min<size_t>(length, kStagedPiece);
      staged.resize(length);
      copyError = cuda::copy(staged.data(), MemoryLocation{}, piece, where, length);
      if (!copyError.isOk()) return false;
      piece = staged.data();
    }
    bool ok = sink.write(piece, length);
    if (impl_->opts.progress) impl_->opts.progress(offset + length, size);
    return ok;
  };
  if (size == 0) return impl_->request("PUT", impl_->objectPath(bucket, key), {}, "", 0).status();
  Result<httplib::Result> res = impl_->raw("PUT", impl_->objectPath(bucket, key), {}, nullptr, size,
                                           httplib::ContentProvider(provider));
  FERRY_RETURN_IF_ERROR(copyError);  // the driver's refusal, before the request's failure it caused
  FERRY_RETURN_IF_ERROR(res.status());
  return impl_->check("PUT", impl_->objectPath(bucket, key), **res).status();
}

Result<uint64_t> ObjectClient::get(const std::string& bucket, const std::string& key, void* data,
                                   uint64_t capacity) {
  FERRY_ASSIGN_OR_RETURN(ObjectInfo info, head(bucket, key));
  if (info.size > capacity) {
    return invalidArgument("get: the object has " + std::to_string(info.size) + " bytes, the buffer " +
                           std::to_string(capacity));
  }
  if (info.size == 0) return uint64_t{0};
  FERRY_ASSIGN_OR_RETURN(const MemoryLocation where, locateRange("get", data, capacity));
  if (impl_->rdma) {
    FERRY_RETURN_IF_ERROR(impl_->rdmaMove(CUOBJ_GET, bucket, key, data, info.size));
    return info.size;
  }
  uint64_t got = 0;
  char* out = static_cast<char*>(data);
  Status copyError;
  // Device memory: the body gathers in a host buffer and goes to the device kStagedPiece at a time
  // (the socket gives a few KiB a call; a driver copy each would be most of the time spent).
  std::vector<char> staged(where.onDevice() ? std::min<uint64_t>(info.size, kStagedPiece) : 0);
  size_t pending = 0;  // gathered bytes not yet on the device: they land at out + got - pending
  auto flush = [&] {
    if (pending > 0)
      copyError = cuda::copy(out + got - pending, where, staged.data(), MemoryLocation{}, pending);
    pending = 0;
    return copyError.isOk();
  };
  auto receiver = [&](const char* bytes, size_t n) {
    if (n > capacity - got) return false;
    if (!where.onDevice()) {
      std::memcpy(out + got, bytes, n);
      got += n;
    }
    while (where.onDevice() && n > 0) {
      const size_t take = std::min(n, staged.size() - pending);
      std::memcpy(staged.data() + pending, bytes, take);
      pending += take;
      got += take;
      bytes += take;
      n -= take;
      if (pending == staged.size() && !flush()) return false;
    }
    if (impl_->opts.progress) impl_->opts.progress(got, info.size);
    return true;
  };
  Result<httplib::Result> res =
      impl_->raw("GET", impl_->objectPath(bucket, key), {}, nullptr, 0, nullptr, receiver);
  if (res.isOk()) (void)flush();  // the last piece
  FERRY_RETURN_IF_ERROR(copyError);
  FERRY_RETURN_IF_ERROR(res.status());
  FERRY_RETURN_IF_ERROR(impl_->check("GET", impl_->objectPath(bucket, key), **res).status());
  if (got != info.size) return Status(StatusCode::kIoError, "get: the object changed while it was read");
  return got;
}

Result<std::string> ObjectClient::get(const std::string& bucket, const std::string& key) {
  FERRY_ASSIGN_OR_RETURN(ObjectInfo info, head(bucket, key));
  std::string out(info.size, '\0');
  FERRY_ASSIGN_OR_RETURN(uint64_t n, get(bucket, key, out.data(), out.size()));
  out.resize(n);
  return out;
}

namespace {

// A page-aligned staging buffer.
struct Staging {
  void* mem = nullptr;
  explicit Staging(uint64_t n) {
    if (posix_memalign(&mem, 4096, std::max<uint64_t>(n, 1)) != 0) mem = nullptr;
  }
  ~Staging() { std::free(mem); }
};

}  // namespace

Status ObjectClient::putFile(const std::string& bucket, const std::string& key, const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status(StatusCode::kNotFound, "put: cannot open " + path);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (!impl_->rdma || size == 0) {
    std::string body(size, '\0');
    in.read(body.data(), static_cast<std::streamsize>(size));
    if (!in) return Status(StatusCode::kIoError, "put: cannot read " + path);
    return put(bucket, key, body.data(), size);
  }
  const uint64_t piece = std::min(impl_->opts.pieceBytes, size);
  Staging staging(piece);
  if (staging.mem == nullptr)
    return Status(StatusCode::kResourceExhausted, "put: no memory for the staging buffer");
  if (impl_->rdma->cuMemObjGetDescriptor(staging.mem, piece) != CU_OBJ_SUCCESS) {
    return Status(StatusCode::kUnavailable, "put: the staging buffer did not register");
  }
  Impl::Call call{.self = impl_.get(),
                  .bucket = bucket,
                  .key = key,
                  .upload = agent::randomHex(8),
                  .total = size,
                  .error = {}};
  Status st;
  for (uint64_t off = 0; off < size;) {
    uint64_t n = std::min(piece, size - off);
    in.read(static_cast<char*>(staging.mem), static_cast<std::streamsize>(n));
    if (!in) {
      st = Status(StatusCode::kIoError, "put: cannot read " + path);
      break;
    }
    ssize_t r = impl_->rdma->cuObjPut(&call, staging.mem, n, static_cast<loff_t>(off), 0);
    if (r < 0 || static_cast<uint64_t>(r) != n) {
      st = !call.error.isOk()
               ? call.error
               : Status(StatusCode::kIoError, "put " + path + " at " + std::to_string(off) + ": moved " +
                                                  std::to_string(r) + " of " + std::to_string(n) + " bytes");
      break;
    }
    off += n;
    if (impl_->opts.progress) impl_->opts.progress(off, size);
  }
  impl_->rdma->cuMemObjPutDescriptor(staging.mem);
  return st;
}

Status ObjectClient::getFile(const std::string& bucket, const std::string& key, const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(ObjectInfo info, head(bucket, key));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status(StatusCode::kIoError, "get: cannot write " + path);
  if (!impl_->rdma || info.size == 0) {
    FERRY_ASSIGN_OR_RETURN(std::string bytes, get(bucket, key));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return out ? Status::ok() : Status(StatusCode::kIoError, "get: cannot write " + path);
  }
  const uint64_t piece = std::min(impl_->opts.pieceBytes, info.size);
  Staging staging(piece);
  if (staging.mem == nullptr)
    return Status(StatusCode::kResourceExhausted, "get: no memory for the staging buffer");
  if (impl_->rdma->cuMemObjGetDescriptor(staging.mem, piece) != CU_OBJ_SUCCESS) {
    return Status(StatusCode::kUnavailable, "get: the staging buffer did not register");
  }
  Impl::Call call{
      .self = impl_.get(), .bucket = bucket, .key = key, .upload = {}, .total = info.size, .error = {}};
  Status st;
  for (uint64_t off = 0; off < info.size;) {
    uint64_t n = std::min(piece, info.size - off);
    ssize_t r = impl_->rdma->cuObjGet(&call, staging.mem, n, static_cast<loff_t>(off), 0);
    if (r <= 0 || static_cast<uint64_t>(r) > n) {  // less than n: the rest is asked for next
      st = Status(StatusCode::kIoError,
                  "get " + path + " at " + std::to_string(off) + ": " +
                      (call.error.isOk() ? "short read (the object changed?)" : call.error.toString()));
      break;
    }
    out.write(static_cast<const char*>(staging.mem), static_cast<std::streamsize>(r));
    if (!out) {
      st = Status(StatusCode::kIoError, "get: cannot write " + path);
      break;
    }
    off += static_cast<uint64_t>(r);
    if (impl_->opts.progress) impl_->opts.progress(off, info.size);
  }
  impl_->rdma->cuMemObjPutDescriptor(staging.mem);
  return st;
}

}  // namespace ferry::objects
