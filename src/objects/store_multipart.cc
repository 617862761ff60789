// The object store's multipart uploads: create, upload a part, list parts and uploads,
// complete, abort, and the sweep of abandoned uploads.
#include "objects/store_server_impl.h"

namespace ferry::objects {

// Under mu: forgets uploads whose client stopped sending pieces.
void ObjectStore::Impl::dropStaleUploads() {
  const int64_t now = nowNs();
  for (auto it = uploads.begin(); it != uploads.end();) {
    it = now - it->second->touchedNs > kUploadIdleNs ? uploads.erase(it) : std::next(it);
  }
}

// Drops, at most once a second, the multipart uploads that received no call for
// abandonedUploadSeconds (their clients went away), freeing their parts.
void ObjectStore::Impl::sweepAbandonedUploads() {
  const int64_t now = nowNs();
  int64_t last = lastSweepNs.load();
  if (now - last < 1000000000 || !lastSweepNs.compare_exchange_strong(last, now)) return;
  const int64_t idleNs = opts.abandonedUploadSeconds * 1000000000;
  std::vector<UploadPtr> dropped;  // freed outside mu
  {
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
  for (const UploadPtr& u : dropped) removeUploadFiles(u->id);
}

// Under mu: the upload `id` of bucket/key, touched, or nullptr.
UploadPtr ObjectStore::Impl::findUploadLocked(const std::string& bucket, const std::string& key,
                                              const std::string& id) {
  auto it = multipart.find(id);
  if (it == multipart.end() || it->second->bucket != bucket || it->second->key != key) return nullptr;
  it->second->touchedNs = nowNs();
  return it->second;
}

void ObjectStore::Impl::noSuchUpload(httplib::Response& res, const std::string& path) {
  error(res, 404, "NoSuchUpload",
        "no such upload: it was completed, aborted, or abandoned for longer than the store keeps uploads",
        path);
}

void ObjectStore::Impl::onPost(const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
  if (!authorized(req, res)) return;
  std::string bucket, key;
  split(req.path, bucket, key);
  const uint64_t declared = number(req.get_header_value("Content-Length")).value_or(0);  // admit() checked it
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

void ObjectStore::Impl::createUpload(const httplib::Request& req, httplib::Response& res,
                                     const std::string& bucket, const std::string& key) {
  if (!validKey(key)) return error(res, 400, "InvalidArgument", "'" + key + "' is not a valid key", req.path);
  auto upload = std::make_shared<MultipartUpload>();
  upload->bucket = bucket;
  upload->key = key;
  upload->id = agent::randomHex(16);
  upload->initiatedNs = upload->touchedNs = nowNs();
  if (req.has_header("Content-Type")) upload->contentType = req.get_header_value("Content-Type");
  Result<UserMetadata> meta = userMetadataOf(req);
  if (!meta.isOk()) return error(res, 400, "MetadataTooLarge", meta.status().message(), req.path);
  upload->meta = std::move(meta).value();
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

void ObjectStore::Impl::uploadPart(const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader, const std::string& bucket,
                                   const std::string& key) {
  auto partNumber = number(req.get_param_value("partNumber"));
  if (!partNumber || *partNumber < 1 || *partNumber > kMaxParts) {
    return error(res, 400, "InvalidArgument", "partNumber must be 1.." + std::to_string(kMaxParts), req.path);
  }
  const std::string id = req.get_param_value("uploadId");
  UploadPtr upload;
  {
    std::lock_guard<std::mutex> lock(mu);
    upload = findUploadLocked(bucket, key, id);
  }
  if (!upload) return noSuchUpload(res, req.path);  // before the body is read
  fs::path written;                                 // with --data-dir a part waits on disk, not in memory
  ObjectPtr part = receiveBody(req, res, reader, &written);
  if (!part) return;
  part->etag = etagOf(part);
  part->modifiedNs = nowNs();
  const auto number = static_cast<uint32_t>(*partNumber);
  if (!written.empty()) {
    struct stat sb {};
    if (::stat(written.c_str(), &sb) == 0) part->inode = sb.st_ino;
    part->onDisk = true;
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (findUploadLocked(bucket, key, id) != upload) {  // aborted meanwhile
      std::error_code ec;
      if (!written.empty()) fs::remove(written, ec);
      return noSuchUpload(res, req.path);
    }
    if (!written.empty()) {
      std::error_code ec;
      const fs::path file = partOf(id, number);
      fs::create_directories(file.parent_path(), ec);
      fs::rename(written, file, ec);
      if (ec) {
        fs::remove(written, ec);
        return error(res, 500, "InternalError", "cannot keep the part as " + file.string(), req.path);
      }
    }
    upload->parts[number] = part;
  }
  res.status = 200;
  res.set_header("ETag", part->etag);
}

void ObjectStore::Impl::removeUploadFiles(const std::string& id) {
  if (!onDisk()) return;
  std::error_code ec;
  fs::remove_all(partOf(id, 1).parent_path(), ec);
}

Result<fs::path> ObjectStore::Impl::concatenateParts(const std::string& id,
                                                     const std::vector<CompletedPart>& listed,
                                                     const std::vector<ObjectPtr>& parts) {
  std::vector<int> files;
  Status st;
  for (size_t i = 0; i < parts.size() && st.isOk(); ++i) {
    auto fd = openFile(partOf(id, listed[i].number), parts[i]->inode);
    if (fd.isOk())
      files.push_back(*fd);
    else
      st = fd.status();
  }
  auto file = st.isOk() ? writeTemporary([&](int fd) { return copyFiles(fd, files); }, nullptr)
                        : Result<fs::path>(st);
  for (int fd : files) ::close(fd);
  return file;
}

std::optional<ObjectStore::Impl::ListedParts> ObjectStore::Impl::listedParts(
    const httplib::Request& req, httplib::Response& res, const std::string& bucket, const std::string& key,
    const std::vector<CompletedPart>& listed) {
  ListedParts out;
  std::lock_guard<std::mutex> lock(mu);
  UploadPtr upload = findUploadLocked(bucket, key, req.get_param_value("uploadId"));
  if (!upload) {
    noSuchUpload(res, req.path);
    return std::nullopt;
  }
  out.contentType = upload->contentType;
  out.meta = upload->meta;
  for (size_t i = 0; i < listed.size(); ++i) {
    auto it = upload->parts.find(listed[i].number);
    if (it == upload->parts.end() || !equalsHex(agent::hexOf(it->second->md5), listed[i].etag)) {
      error(
          res, 400, "InvalidPart",
          "part " + std::to_string(listed[i].number) + " was not uploaded, or its ETag is not the one listed",
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

void ObjectStore::Impl::completeUpload(const httplib::Request& req, httplib::Response& res,
                                       const std::string& bucket, const std::string& key,
                                       const std::string& body) {
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
  ObjectPtr o;
  fs::path written;
  if (onDisk()) {  // the parts' files, one after another, in the object's
    auto file = concatenateParts(id, listed, found->parts);
    if (!file.isOk()) return diskFull(res, req.path, file.status());
    written = *file;
    o = std::make_shared<StoredObject>();
    o->server = rdma.get();
    o->size = total;
  } else {
    o = joinInMemory(req, res, found->parts, total);
    if (!o) return;
  }
  o->contentType = found->contentType;
  o->meta = found->meta;
  o->etag = "\"" + agent::hexOf(md5Of(found->md5s.data(), found->md5s.size())) + "-" +
            std::to_string(found->parts.size()) + "\"";
  found.reset();
  UploadPtr finished;  // its parts are freed outside mu
  {
    std::lock_guard<std::mutex> lock(mu);  // one completion wins; an abort meanwhile wins too
    auto it = multipart.find(id);
    if (it == multipart.end()) {
      std::error_code ec;
      if (!written.empty()) fs::remove(written, ec);
      return noSuchUpload(res, req.path);
    }
    finished = it->second;
    multipart.erase(it);
  }
  removeUploadFiles(id);
  commit(res, bucket, key, o, req.path, written);
  if (res.status != 200) return;
  res.set_content(xmlHead("CompleteMultipartUploadResult") + "<Location>/" + xmlEscape(bucket) + "/" +
                      xmlEscape(key) + "</Location><Bucket>" + xmlEscape(bucket) + "</Bucket><Key>" +
                      xmlEscape(key) + "</Key><ETag>" + xmlEscape(o->etag) +
                      "</ETag></CompleteMultipartUploadResult>",
                  "application/xml");
}

ObjectPtr ObjectStore::Impl::joinInMemory(const httplib::Request& req, httplib::Response& res,
                                          const std::vector<ObjectPtr>& parts, uint64_t total) {
  // The object is a copy of its parts (registered memory is one range): room for both is needed
  // until the parts are freed.
  ObjectPtr o = heldObject(req, res, total);
  if (!o) return nullptr;
  uint64_t at = 0;
  for (const ObjectPtr& part : parts) {
    if (part->size) std::memcpy(static_cast<char*>(o->mem) + at, part->mem, part->size);
    at += part->size;
  }
  if (Status st = registerObject(o); !st.isOk()) {
    error(res, 503, "SlowDown", st.message(), req.path);
    return nullptr;
  }
  return o;
}

bool ObjectStore::Impl::equalsHex(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

void ObjectStore::Impl::abortUpload(const httplib::Request& req, httplib::Response& res,
                                    const std::string& bucket, const std::string& key) {
  UploadPtr upload;  // its parts are freed outside mu
  {
    std::lock_guard<std::mutex> lock(mu);
    upload = findUploadLocked(bucket, key, req.get_param_value("uploadId"));
    if (!upload) return noSuchUpload(res, req.path);
    multipart.erase(upload->id);
  }
  removeUploadFiles(upload->id);
  res.status = 204;
}

void ObjectStore::Impl::listParts(const httplib::Request& req, httplib::Response& res,
                                  const std::string& bucket, const std::string& key) {
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
                      std::to_string(last) + "</NextPartNumberMarker><MaxParts>" + std::to_string(maxParts) +
                      "</MaxParts><IsTruncated>" + (truncated ? "true" : "false") + "</IsTruncated>" + parts +
                      "</ListPartsResult>",
                  "application/xml");
}

void ObjectStore::Impl::listUploads(const httplib::Request& req, httplib::Response& res,
                                    const std::string& bucket) {
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

}  // namespace ferry::objects
