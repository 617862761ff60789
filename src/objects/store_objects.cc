// The object store's objects: GET (whole or ranged), PUT (body received as it streams in),
// copy and DELETE.
#include "objects/store_server_impl.h"

namespace ferry::objects {

// S3's ETag of a single-part object: its MD5, quoted hex.
std::string ObjectStore::Impl::etagOf(const ObjectPtr& o) {
  return "\"" + agent::hexOf(o->md5.empty() ? md5Of(o->mem, o->size) : o->md5) + "\"";
}

Result<std::pair<ObjectPtr, fs::path>> ObjectStore::Impl::copyFile(const std::string& bucket,
                                                                   const std::string& key,
                                                                   const ObjectPtr& from) {
  FERRY_ASSIGN_OR_RETURN(int in, openRecord(bucket, key, from));
  // A multipart source's copy has the MD5 of its bytes as its ETag: they are read to hash them.
  const bool hashed = from->etag.find('-') != std::string::npos;
  Md5 md5;
  auto file = writeTemporary([&](int fd) { return copyFiles(fd, {in}, hashed ? &md5 : nullptr); }, nullptr);
  ::close(in);
  if (!file.isOk()) return file.status();
  auto o = std::make_shared<StoredObject>();
  o->server = rdma.get();
  o->size = from->size;
  if (hashed) o->md5 = md5.digest();
  return std::make_pair(o, *file);
}

void ObjectStore::Impl::onGet(const httplib::Request& req, httplib::Response& res) {
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
  setUserMetadata(res, o->meta);
  if (req.has_header("x-ferry-rdma-descriptor")) return rdmaGet(req, res, bucket, key, o);
  res.set_header("Accept-Ranges", "bytes");
  const ByteRange range = decideRange(req.get_header_value("Range"), o->size);
  if (range.kind == ByteRange::kUnsatisfiable) {
    res.set_header("Content-Range", "bytes */" + std::to_string(o->size));
    return error(res, 416, "InvalidRange",
                 "the range '" + req.get_header_value("Range").substr(0, 64) +
                     "' is not satisfiable: the object has " + std::to_string(o->size) + " bytes",
                 req.path);
  }
  const bool partial = range.kind == ByteRange::kPartial;
  const uint64_t first = partial ? range.first : 0;
  const uint64_t n = partial ? range.length : o->size;
  res.status = partial ? 206 : 200;
  if (partial) {
    res.set_header("Content-Range", "bytes " + std::to_string(first) + "-" + std::to_string(first + n - 1) +
                                        "/" + std::to_string(o->size));
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
  sendBytes(req, res, bucket + "/" + key, o, first, n);
}

void ObjectStore::Impl::sendBytes(const httplib::Request& req, httplib::Response& res,
                                  const std::string& name, const ObjectPtr& o, uint64_t first, uint64_t n) {
  if (n == 0) return res.set_content("", o->contentType);  // a provider of 0 bytes is never asked
  ObjectPtr bytes = o;
  if (o->onDisk) {
    std::lock_guard<std::mutex> lock(mu);
    bytes = o->cached;
  }
  if (!bytes) return sendFile(req, res, name, o, first, n);
  res.set_content_provider(n, o->contentType,
                           [bytes, first](size_t offset, size_t length, httplib::DataSink& sink) {
                             return sink.write(static_cast<const char*>(bytes->mem) + first + offset, length);
                           });
}

void ObjectStore::Impl::sendFile(const httplib::Request& req, httplib::Response& res, const std::string& name,
                                 const ObjectPtr& o, uint64_t first, uint64_t n) {
  const size_t slash = name.find('/');
  auto opened = openRecord(name.substr(0, slash), name.substr(slash + 1), o);
  if (!opened.isOk()) {
    res.headers.erase("Content-Range");
    if (opened.status().code() == StatusCode::kBusy) res.set_header("Retry-After", "1");
    return error(res, opened.status().code() == StatusCode::kBusy ? 503 : 500,
                 opened.status().code() == StatusCode::kBusy ? "SlowDown" : "InternalError",
                 opened.status().message(), req.path);
  }
  auto fd = std::shared_ptr<int>(new int(*opened), [](int* p) {
    ::close(*p);
    delete p;
  });
  std::vector<char> buf;
  res.set_content_provider(
      n, o->contentType, [fd, first, buf](size_t offset, size_t length, httplib::DataSink& sink) mutable {
        buf.resize(std::min<size_t>(length, size_t{1} << 20));
        ssize_t got = ::pread(*fd, buf.data(), buf.size(), static_cast<off_t>(first + offset));
        return got > 0 && sink.write(buf.data(), static_cast<size_t>(got));
      });
}

void ObjectStore::Impl::onPut(const httplib::Request& req, httplib::Response& res,
                              const httplib::ContentReader& reader) {
  if (!authorized(req, res)) return;  // before anything is read or allocated for the request
  std::string bucket, key;
  split(req.path, bucket, key);
  if (bucket.empty()) return error(res, 400, "InvalidRequest", "PUT needs /bucket or /bucket/key", req.path);
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
  if (!validKey(key)) return error(res, 400, "InvalidArgument", "'" + key + "' is not a valid key", req.path);
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
  Result<UserMetadata> meta = userMetadataOf(req);
  if (!meta.isOk()) return error(res, 400, "MetadataTooLarge", meta.status().message(), req.path);
  fs::path written;  // with --data-dir: the body's file
  ObjectPtr o = receiveBody(req, res, reader, &written);
  if (!o) return;
  o->meta = std::move(meta).value();
  if (Status st = registerObject(o); !st.isOk()) return error(res, 503, "SlowDown", st.message(), req.path);
  commit(res, bucket, key, o, req.path, written);
}

// The body of a PUT, received into a new object of its declared length: held against
// maxReceivingBytes while it arrives and maxMemoryBytes while the object lives (with --data-dir,
// written to a temporary file *written instead, as it arrives); its MD5 checked against
// Content-MD5 and its SHA-256 against the signed hash. nullptr once a refusal is answered (the body
// may then be unread: onGuarded() skips it).
ObjectPtr ObjectStore::Impl::receiveBody(const httplib::Request& req, httplib::Response& res,
                                         const httplib::ContentReader& reader, fs::path* written) {
  const uint64_t declared = number(req.get_header_value("Content-Length")).value_or(0);  // admit() checked it
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
  ObjectPtr o = bodyTarget(req, res, declared);
  if (!o) return nullptr;
  BodySink sink;
  sink.o = o;
  sink.hashed = !opts.accessKey.empty();
  if (!readBody(req, res, reader, sink, written)) return nullptr;
  auto dropFile = [&] {
    std::error_code ec;
    if (written && !written->empty()) fs::remove(*written, ec);
    return nullptr;
  };
  if (sink.hashed && !payloadMatches(req, res, sink.hash.hex())) return dropFile();
  o->md5 = sink.md5.digest();
  if (expectedMd5 && *expectedMd5 != o->md5) {
    error(res, 400, "BadDigest", "the body's MD5 is not the Content-MD5 sent", req.path);
    return dropFile();
  }
  if (req.has_header("Content-Type")) o->contentType = req.get_header_value("Content-Type");
  {
    std::lock_guard<std::mutex> lock(statsMu);
    ++stats.httpPuts;
    stats.httpBytes += o->size;
  }
  return o;
}

ObjectPtr ObjectStore::Impl::bodyTarget(const httplib::Request& req, httplib::Response& res,
                                        uint64_t declared) {
  if (declared > opts.maxObjectBytes) {
    error(res, 400, "EntityTooLarge",
          "the object is larger than the store's limit of " + std::to_string(opts.maxObjectBytes) + " bytes",
          req.path);
    return nullptr;
  }
  if (onDisk()) {  // the body goes to a file as it arrives, not into memory
    auto o = std::make_shared<StoredObject>();
    o->server = rdma.get();
    o->size = declared;
    return o;
  }
  return heldObject(req, res, declared);
}

ObjectPtr ObjectStore::Impl::heldObject(const httplib::Request& req, httplib::Response& res, uint64_t size) {
  auto held = reserveMemory(size);
  if (!held) {
    insufficientStorage(req, res, size);
    return nullptr;
  }
  auto made = newObject(size, /*registered=*/false);
  if (!made.isOk()) {
    error(res, 503, "SlowDown", made.status().message(), req.path);
    return nullptr;
  }
  (*made)->memory = std::move(*held);
  return *made;
}

bool ObjectStore::Impl::BodySink::take(const char* data, size_t n) {
  if (n > o->size - got) return false;
  if (fd >= 0) {
    stored = writeMemory(fd, data, n);
    if (!stored.isOk()) return false;
  } else {
    std::memcpy(static_cast<char*>(o->mem) + got, data, n);
  }
  if (hashed) hash.update(data, n);
  md5.update(data, n);
  got += n;
  return true;
}

bool ObjectStore::Impl::readBody(const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& reader, BodySink& sink, fs::path* written) {
  auto read = [&] {
    return sink.o->size == 0 || reader([&](const char* data, size_t n) { return sink.take(data, n); });
  };
  bool ok = true;
  if (onDisk()) {
    auto file = writeTemporary(
        [&](int fd) {
          sink.fd = fd;
          ok = read() && sink.got == sink.o->size;
          return ok ? Status::ok() : sink.stored.isOk() ? invalidArgument("incomplete body") : sink.stored;
        },
        nullptr);
    if (file.isOk()) {
      *written = *file;
    } else if (!sink.stored.isOk() || file.status().code() != StatusCode::kInvalidArgument) {
      if (StoreConnection* conn = StoreConnection::current()) conn->closeAfterResponse();
      diskFull(res, req.path, sink.stored.isOk() ? file.status() : sink.stored);
      return false;
    }
  } else {
    ok = read();
  }
  if (!ok || sink.got != sink.o->size) {
    if (StoreConnection* conn = StoreConnection::current()) conn->closeAfterResponse();
    error(res, 400, "IncompleteBody",
          "the body has " + std::to_string(sink.got) + " of " + std::to_string(sink.o->size) + " bytes",
          req.path);
    return false;
  }
  return true;
}

void ObjectStore::Impl::commit(httplib::Response& res, const std::string& bucket, const std::string& key,
                               const ObjectPtr& o, const std::string& path, const fs::path& written) {
  if (o->etag.empty()) o->etag = etagOf(o);
  o->modifiedNs = nowNs();
  ObjectPtr record = o;
  fs::path data = written, meta;
  if (onDisk()) {
    uint64_t inode = 0;
    if (data.empty()) {
      auto file = writeTemporary([&](int fd) { return writeMemory(fd, o->mem, o->size); }, &inode);
      if (!file.isOk()) return diskFull(res, path, file.status());
      data = *file;
    } else {
      struct stat sb {};
      if (::stat(data.c_str(), &sb) == 0) inode = sb.st_ino;
    }
    record = recordOf(o, inode);
    auto metaFile = writeMetadata(record);
    if (!metaFile.isOk()) {
      std::error_code ec;
      fs::remove(data, ec);
      return diskFull(res, path, metaFile.status());
    }
    meta = *metaFile;
  }
  ObjectPtr replaced;  // freed outside mu
  {
    std::lock_guard<std::mutex> lock(mu);
    auto b = buckets.find(bucket);
    if (b == buckets.end()) {
      std::error_code ec;
      if (!data.empty()) fs::remove(data, ec);
      if (!meta.empty()) fs::remove(meta, ec);
      return error(res, 404, "NoSuchBucket", "the bucket was deleted", path);
    }
    if (onDisk()) {
      if (Status st = installLocked(bucket, key, data, meta); !st.isOk())
        return error(res, 500, "InternalError", st.message(), path);
    }
    ObjectPtr& slot = b->second[key];
    if (slot) forgetLocked(slot);
    replaced = std::exchange(slot, record);
    cacheLocked(record);
  }
  res.status = 200;
  res.set_header("ETag", o->etag);
}

void ObjectStore::Impl::diskFull(httplib::Response& res, const std::string& path, const Status& st) {
  if (st.code() == StatusCode::kResourceExhausted)
    return error(res, 507, "InsufficientStorage", st.message(), path);
  error(res, 500, "InternalError", st.message(), path);
}

void ObjectStore::Impl::copyObject(const httplib::Request& req, httplib::Response& res,
                                   const std::string& bucket, const std::string& key) {
  if (number(req.get_header_value("Content-Length")).value_or(0) != 0)
    return error(res, 400, "InvalidRequest", "a copy carries no body", req.path);
  if (!payloadMatches(req, res, sha256Hex(""))) return;
  auto source = decideCopySource(req.get_header_value("x-amz-copy-source"));
  if (!source)
    return error(res, 400, "InvalidArgument", "x-amz-copy-source must be /bucket/key (URL-encoded)",
                 req.path);
  if (source->versioned)
    return error(res, 501, "NotImplemented", "copying a version (versionId) is not implemented", req.path);
  const std::string directive =
      req.has_header("x-amz-metadata-directive") ? req.get_header_value("x-amz-metadata-directive") : "COPY";
  if (directive != "COPY" && directive != "REPLACE")
    return error(res, 400, "InvalidArgument", "x-amz-metadata-directive must be COPY or REPLACE", req.path);
  Result<UserMetadata> meta = userMetadataOf(req);
  if (!meta.isOk()) return error(res, 400, "MetadataTooLarge", meta.status().message(), req.path);
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
  ObjectPtr o;
  fs::path written;  // with --data-dir the copy is a file, made without memory
  if (onDisk()) {
    auto copied = copyFile(source->bucket, source->key, from);
    if (!copied.isOk()) return diskFull(res, req.path, copied.status());
    std::tie(o, written) = std::move(*copied);
  } else {
    o = copyInMemory(req, res, from);
    if (!o) return;
  }
  // A copy is one part: a multipart source's ETag is recomputed as the MD5 of the bytes.
  o->etag = from->etag.find('-') == std::string::npos ? from->etag : std::string();
  o->contentType = directive == "REPLACE" && req.has_header("Content-Type")
                       ? req.get_header_value("Content-Type")
                       : from->contentType;
  o->meta = directive == "REPLACE" ? std::move(meta).value() : from->meta;
  commit(res, bucket, key, o, req.path, written);
  if (res.status != 200) return;
  res.set_content(xmlHead("CopyObjectResult") + "<LastModified>" + isoTime(o->modifiedNs) +
                      "</LastModified><ETag>" + xmlEscape(o->etag) + "</ETag></CopyObjectResult>",
                  "application/xml");
}

ObjectPtr ObjectStore::Impl::copyInMemory(const httplib::Request& req, httplib::Response& res,
                                          const ObjectPtr& from) {
  ObjectPtr o = heldObject(req, res, from->size);
  if (!o) return nullptr;
  if (o->size) std::memcpy(o->mem, from->mem, o->size);
  if (Status st = registerObject(o); !st.isOk()) {
    error(res, 503, "SlowDown", st.message(), req.path);
    return nullptr;
  }
  return o;
}

void ObjectStore::Impl::onDelete(const httplib::Request& req, httplib::Response& res) {
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
    if (onDisk()) {
      std::error_code ec;
      fs::remove_all(fs::path(opts.dataDir) / bucket, ec);
      fs::remove_all(fs::path(opts.dataDir) / ".ferry" / "meta" / bucket, ec);
    }
    res.status = 204;
    return;
  }
  if (auto it = b->second.find(key); it != b->second.end()) {  // S3 answers 204 whether or not it existed
    forgetLocked(it->second);
    b->second.erase(it);
  }
  removeFilesLocked(bucket, key);
  res.status = 204;
}

}  // namespace ferry::objects
