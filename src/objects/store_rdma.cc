// The object store's RDMA transfers: a GET or PUT that carries a client descriptor moves its
// payload by the object server (WRITE for a GET, READ for a PUT), in pieces for an upload.
#include "objects/store_server_impl.h"

namespace ferry::objects {

void ObjectStore::Impl::rdmaGet(const httplib::Request& req, httplib::Response& res,
                                const std::string& bucket, const std::string& key, const ObjectPtr& o) {
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
    auto source = rdmaSource(bucket, key, o, *offset, n);  // may shorten n
    if (!source.isOk()) {
      const bool retry = source.status().code() != StatusCode::kIoError;
      if (retry) res.set_header("Retry-After", "1");
      return error(res, retry ? 503 : 500, retry ? "SlowDown" : "InternalError", source.status().message(),
                   req.path);
    }
    const auto& [bytes, at] = *source;
    uint16_t ch = rdma->allocateChannelId();
    if (ch == INVALID_CHANNEL_ID) return error(res, 503, "SlowDown", "every channel is busy", req.path);
    ibv_wc_status st = IBV_WC_SUCCESS;
    ssize_t rc = rdma->handleGetObject(bucket + "/" + key, bytes->buf, *addr, n,
                                       req.get_header_value("x-ferry-rdma-descriptor"), ch, at, &st);
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

Result<std::pair<ObjectPtr, uint64_t>> ObjectStore::Impl::rdmaSource(const std::string& bucket,
                                                                     const std::string& key,
                                                                     const ObjectPtr& record, uint64_t offset,
                                                                     uint64_t& n) {
  auto whole = bytesOf(bucket, key, record);
  if (whole.isOk()) return std::make_pair(*whole, offset);
  if (whole.status().code() != StatusCode::kResourceExhausted) return whole.status();
  // Larger than the cache can hold: the piece alone (at most half the memory bound; the client
  // asks for the rest next), read into registered memory of its own.
  n = std::min(n, std::max<uint64_t>(opts.maxMemoryBytes / 2, 1));
  FERRY_ASSIGN_OR_RETURN(ObjectPtr piece, readRecord(bucket, key, record, offset, n));
  return std::make_pair(piece, uint64_t{0});
}

void ObjectStore::Impl::rdmaPut(const httplib::Request& req, httplib::Response& res,
                                const std::string& bucket, const std::string& key) {
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
  ObjectPtr o = rdmaUploadTarget(req, res, id, *total);
  if (!o) return;
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
  rdmaPieceReceived(req, res, bucket, key, id, o, *length);
}

// The upload `id`'s object: the one in progress, or a new one of `total` bytes. nullptr when it was
// refused (the answer is in res).
ObjectPtr ObjectStore::Impl::rdmaUploadTarget(const httplib::Request& req, httplib::Response& res,
                                              const std::string& id, uint64_t total) {
  {
    std::lock_guard<std::mutex> lock(mu);
    dropStaleUploads();
    auto it = uploads.find(id);
    if (it != uploads.end()) return it->second;
  }
  // The whole object is registered now (the pieces are written into it by RDMA), so its size is
  // held against maxReceivingBytes until the last piece arrives or the upload is dropped.
  if (total > opts.maxObjectBytes) {
    error(res, 400, "EntityTooLarge",
          "the object is larger than the store's limit of " + std::to_string(opts.maxObjectBytes) + " bytes",
          req.path);
    return nullptr;
  }
  auto grant = reserveReceiving(total);
  if (!grant) {
    res.set_header("Retry-After", "1");
    logRefusal(req, 503, "SlowDown", "the receiving bound is reached");
    error(res, 503, "SlowDown",
          "the store is receiving as many bytes as it may at once (--max-receiving); retry later", req.path);
    return nullptr;
  }
  auto held = reserveMemory(total);
  if (!held) {
    insufficientStorage(req, res, total);
    return nullptr;
  }
  auto made = newObject(total);
  if (!made.isOk()) {
    error(res, 503, "SlowDown", made.status().message(), req.path);
    return nullptr;
  }
  ObjectPtr o = *made;
  o->memory = std::move(*held);
  o->receiving = std::move(*grant);
  o->touchedNs = nowNs();
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = uploads.emplace(id, o);
  if (!fresh) o = it->second;
  return o;
}

// Counts a piece that arrived; the last one commits the object, an earlier one answers how many
// bytes the upload has.
void ObjectStore::Impl::rdmaPieceReceived(const httplib::Request& req, httplib::Response& res,
                                          const std::string& bucket, const std::string& key,
                                          const std::string& id, const ObjectPtr& o, uint64_t length) {
  bool complete = false;
  uint64_t received = 0;
  {
    std::lock_guard<std::mutex> lock(statsMu);
    ++stats.rdmaPuts;
    stats.rdmaBytes += length;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    o->received += length;
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

}  // namespace ferry::objects
