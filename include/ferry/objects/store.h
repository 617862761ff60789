// ferry's object store: objects kept in registered memory, or on disk with memory as their cache,
// served over HTTP in the S3 style, with payloads moved by RDMA when the client hands a descriptor.
//
//   auto store = ferry::objects::ObjectStore::start({.port = 9000}).value();     // `ferry objects serve`
//   auto client = ferry::objects::ObjectClient::connect(store->url()).value();  // `ferry objects put/get/ls`
//   client->createBucket("models");
//   client->put("models", "w.bin", data, size);       // the server READs the client's memory
//   client->get("models", "w.bin", out, size);        // the server WRITEs it
//
// Control path (plain HTTP/1.1, path-style S3): PUT /bucket creates a bucket, DELETE /bucket removes
// an empty one, GET / lists buckets, GET /bucket?list-type=2 (or v1) lists objects; PUT, GET, HEAD
// and DELETE of /bucket/key act on objects. A stock S3 client (boto3, the aws CLI) works against
// it over plain HTTP with the payload in the body. ferry's client adds, per piece of an object:
//   x-ferry-rdma-descriptor   the client's descriptor (cuobj_client.h) for the piece's memory
//   x-ferry-rdma-addr         the address of the piece's first byte in the client
//   x-ferry-rdma-length       the piece's bytes
//   x-ferry-object-offset     where the piece lies in the object
//   x-ferry-object-size       PUT: the object's total size
//   x-ferry-upload-id         PUT: one id for all pieces of one upload (the object appears, whole,
//                             when its last byte arrived)
// and the server moves the piece with handlePutObject() / handleGetObject() (cuobj_server.h); a
// GET answers with x-ferry-rdma-bytes and no body. Errors are S3's XML <Error> documents.
//
// Credentials: with an access key and secret set (StoreOptions, or FERRY_OBJECTS_ACCESS_KEY and
// FERRY_OBJECTS_SECRET_KEY), every request must carry a valid AWS Signature Version 4
// Authorization header (the payload hash too when it is given) dated within 15 minutes of the
// server's clock; without them only clients on this host are served (protected mode), unless
// StoreOptions::allowRemoteWithoutCredentials. Besides these calls the store serves S3's multipart
// uploads (POST ?uploads, PUT ?partNumber&uploadId, POST/DELETE/GET ?uploadId, GET /bucket?uploads),
// DeleteObjects (POST /bucket?delete) and CopyObject (PUT with x-amz-copy-source); ETags are S3's
// (the quoted MD5 of the bytes, "MD5-OF-PART-MD5S-N" for a multipart object) and a Content-MD5 is
// checked (400 BadDigest). Calls it does not implement (?tagging, ?acl, ?versioning,
// x-amz-copy-source-range, ...) are refused with 501 NotImplemented.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/common/status.h"

namespace ferry::objects {

struct StoreOptions {
  std::string host = "127.0.0.1";  // the HTTP listener (IPv4 or IPv6 text)
  uint16_t port = 0;               // 0: the kernel picks one (see ObjectStore::port())
  std::string rdmaHost;            // the object server's session address ("" : host)
  uint16_t rdmaPort = 0;           // its port (0: the kernel picks)
  // "" : objects live in memory. Else they live on disk, as files DIR/bucket/key (metadata in
  // DIR/.ferry/meta, parts of multipart uploads in DIR/.ferry/uploads), and memory is their
  // cache: an object received, or read by an RDMA GET, stays in memory until maxMemoryBytes needs
  // the room (least recently used first); an HTTP GET of one that is not cached reads its file.
  // At start the objects found there are served again, with their ETags and metadata.
  std::string dataDir;
  std::string accessKey;  // "" : FERRY_OBJECTS_ACCESS_KEY, else no authentication
  std::string secretKey;  // "" : FERRY_OBJECTS_SECRET_KEY
  std::string region = "us-east-1";
  int threads = 8;  // HTTP workers started at once (more are started on demand, up to maxConnections)
  uint64_t maxObjectBytes = uint64_t{64} << 30;  // the largest object (by RDMA pieces or in a body)

  // Bounds on what clients can make the server hold (docs/objects.md, "Bounds"). A request past a
  // bound is refused with S3's error before anything is allocated for it, and changes nothing.
  //
  // The largest body of one request (S3's limit for a single PUT); larger: 400 EntityTooLarge.
  uint64_t maxBodyBytes = uint64_t{5} << 30;
  // Bytes of bodies and RDMA uploads being received at once, over all connections, counted as
  // declared (Content-Length, x-ferry-object-size); past it: 503 SlowDown. Memory for a body is
  // committed page by page as its bytes arrive, never for the declared length up front.
  uint64_t maxReceivingBytes = uint64_t{16} << 30;
  // Bytes of objects, multipart parts and bodies being received, held in memory at once; a PUT,
  // part, copy or completion past it: 507 InsufficientStorage, and nothing changes. 0: half of the
  // host's physical memory. Replacing an object needs room for both until the new one is whole.
  // With dataDir it bounds the bodies being received and the cache (evicted to make room); the
  // disk bounds the objects (507 InsufficientStorage when it is full).
  uint64_t maxMemoryBytes = 0;
  // A multipart upload that receives no call for this long is dropped with its parts.
  int64_t abandonedUploadSeconds = int64_t{24} * 3600;
  // Connections served at once (one worker each); past it a connection is answered 503 SlowDown
  // and closed.
  int maxConnections = 256;
  // A request's line and headers must arrive within this (a slow sender is closed).
  int headerTimeoutMs = 10000;
  // The longest wait for the next byte of a body, for the next request on a kept-alive
  // connection, and for a client to take the answer; then the connection is closed.
  int idleTimeoutMs = 10000;
  // Protected mode: without credentials, clients of other hosts are refused (403 AccessDenied,
  // saying how to open the store). True serves them without credentials: anyone who can reach
  // the port can then read, replace and delete every object.
  bool allowRemoteWithoutCredentials = false;
};

struct StoreStats {
  uint64_t objects = 0, bytes = 0, buckets = 0;
  uint64_t rdmaGets = 0, rdmaPuts = 0, httpGets = 0, httpPuts = 0;
  uint64_t rdmaBytes = 0, httpBytes = 0;
  uint64_t refused = 0;         // requests answered with an error
  uint64_t receivingBytes = 0;  // declared bytes of bodies and uploads being received now
  uint64_t connections = 0;     // connections held now
  uint64_t memoryBytes = 0;     // bytes of objects, parts and bodies held now (maxMemoryBytes)
  uint64_t uploads = 0;         // multipart uploads in progress
  uint64_t cachedObjects = 0;   // with a data directory: objects whose bytes are in memory too
};

class ObjectStore {
 public:
  struct Impl;
  // Starts the HTTP listener and the object server. kInvalidArgument for bad options,
  // kUnavailable when the address cannot be bound or the RDMA session does not start, kIoError
  // when the data directory cannot be read.
  static Result<std::unique_ptr<ObjectStore>> start(StoreOptions options);
  explicit ObjectStore(std::unique_ptr<Impl> impl);
  ~ObjectStore();  // stop()
  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  uint16_t port() const;
  std::string url() const;  // "http://127.0.0.1:9000" ("http://[::1]:9000" for IPv6)
  StoreStats stats() const;
  // Stops serving (requests in flight finish first). Idempotent.
  void stop();
  // Blocks until stop() (from another thread or a signal handler's thread).
  void wait();

 private:
  std::unique_ptr<Impl> impl_;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;
  int64_t modifiedNs = 0;  // wall clock
};

struct ClientOptions {
  std::string accessKey;  // "" : FERRY_OBJECTS_ACCESS_KEY (requests are signed when set)
  std::string secretKey;  // "" : FERRY_OBJECTS_SECRET_KEY
  std::string region = "us-east-1";
  // Move payloads by RDMA (descriptors); false: in the HTTP body, as a plain S3 client does.
  bool rdma = true;
  // Bytes per piece (one request and one registered staging buffer of this size for files).
  uint64_t pieceBytes = uint64_t{64} << 20;
  // Called after each piece with the bytes done and the total (a progress bar).
  std::function<void(uint64_t done, uint64_t total)> progress;
  int timeoutSeconds = 120;  // per HTTP request
};

class ObjectClient {
 public:
  struct Impl;
  // url: "http://host:port" (a path after it is ignored). kInvalidArgument for a malformed URL;
  // kUnavailable when the client's RDMA session does not start (rdma = true).
  static Result<std::unique_ptr<ObjectClient>> connect(std::string url, ClientOptions options = {});
  explicit ObjectClient(std::unique_ptr<Impl> impl);
  ~ObjectClient();
  ObjectClient(const ObjectClient&) = delete;
  ObjectClient& operator=(const ObjectClient&) = delete;

  Status createBucket(const std::string& bucket);
  Status deleteBucket(const std::string& bucket);
  Result<std::vector<std::string>> buckets();
  Result<std::vector<ObjectInfo>> list(const std::string& bucket, const std::string& prefix = "");

  // Stores [data, +size) as the object (replacing it). kNotFound for a bucket that does not exist.
  // data may be CUDA device memory (docs/gpu.md): over HTTP it is copied to the host through the
  // driver a piece at a time as the socket takes it; over RDMA the engine registers it. A range
  // that starts on a device and leaves it is kInvalidArgument; a copy the driver refuses fails the
  // call with the driver's error.
  Status put(const std::string& bucket, const std::string& key, const void* data, uint64_t size);
  Status putFile(const std::string& bucket, const std::string& key, const std::string& path);
  // Reads the object into [data, +capacity): its size (kInvalidArgument when it does not fit,
  // kNotFound when there is no such object). data may be CUDA device memory, as for put().
  Result<uint64_t> get(const std::string& bucket, const std::string& key, void* data, uint64_t capacity);
  Result<std::string> get(const std::string& bucket, const std::string& key);
  Status getFile(const std::string& bucket, const std::string& key, const std::string& path);
  Result<ObjectInfo> head(const std::string& bucket, const std::string& key);
  Status remove(const std::string& bucket, const std::string& key);

 private:
  std::unique_ptr<Impl> impl_;
};

// Splits "http://host:port/bucket/key" into the base URL and the bucket and key ("" when absent).
// kInvalidArgument for anything else.
struct ObjectUrl {
  std::string base, bucket, key;
};
Result<ObjectUrl> parseObjectUrl(const std::string& url);

}  // namespace ferry::objects
