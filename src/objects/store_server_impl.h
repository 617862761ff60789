// The object store's private parts (include/ferry/objects/store.h), shared by its files:
// store_server.cc (HTTP front: start, admission, authentication, routing), store_objects.cc
// (object GET, PUT, copy and DELETE), store_buckets.cc (buckets and listings), store_multipart.cc
// (multipart uploads), store_rdma.cc (payloads moved by RDMA), store_persistence.cc (objects
// and their metadata under --data-dir), store_cache.cc (the memory cache of objects on disk),
// store_memory.cc (object memory and the store's bounds) and store_formats.cc (XML, times,
// names, MD5).
#pragma once

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
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/crypto.h"
#include "common/log.h"
#include "common/net/admission.h"
#include "ferry/common/config.h"
#include "ferry/cuobj_server.h"
#include "ferry/objects/store.h"
#include "objects/sigv4.h"
#include "objects/store_connections.h"
#include "objects/store_request.h"

namespace ferry::objects {

namespace fs = std::filesystem;

inline constexpr const char* kXmlNs = "http://s3.amazonaws.com/doc/2006-03-01/";
// Bodies of calls other than an object's PUT (bucket calls, DELETE) are small documents at most.
inline constexpr uint64_t kMaxDocumentBytes = 1 << 20;
// An RDMA upload whose next piece has not come for this long is dropped (its client went away).
inline constexpr int64_t kUploadIdleNs = int64_t{60} * 1000000000;
// S3's smallest part of a multipart object, but for its last.
inline constexpr uint64_t kMinPartBytes = uint64_t{5} << 20;
// Multipart uploads in progress at once (each holds at most kMaxParts parts).
inline constexpr size_t kMaxUploadsInProgress = 10000;

// Text escaped for an XML element or attribute.
std::string xmlEscape(std::string_view s);
// A time (ns since the epoch) as S3's listings write it, and as HTTP headers do.
std::string isoTime(int64_t ns);
std::string httpTime(int64_t ns);
// CLOCK_REALTIME in nanoseconds.
int64_t nowNs();
// S3's bucket naming rules, and keys that can be files under the data directory.
bool validBucket(const std::string& b);
bool validKey(const std::string& k);
// A decimal number, or nullopt.
std::optional<uint64_t> number(const std::string& text);
// Every value of a header the request carries.
std::vector<std::string_view> headerValues(const httplib::Request& req, const char* name);
// cpp-httplib's text form of a peer ("127.0.0.1", "::1") as a socket address; AF_UNSPEC when it
// is neither.
sockaddr_storage socketAddress(const std::string& text);
// Whether the store serves a client at `remoteAddr` before reading its request further: with
// credentials every client (each request is then signed); without them, protected mode, only
// clients of this host unless the deployment opted out.
bool admitsClient(const StoreOptions& opts, const std::string& remoteAddr);
// MD5 of one piece (16 bytes).
std::string md5Of(const void* data, size_t n);
// An object's user metadata: its x-amz-meta-* headers (names in lower case, values as sent), at
// most kMaxUserMetadataBytes of names (without the prefix) and values together, as S3 allows.
using UserMetadata = std::vector<std::pair<std::string, std::string>>;
inline constexpr size_t kMaxUserMetadataBytes = 2048;
// The request's user metadata; an error text (for 400 MetadataTooLarge) when it is above the limit.
Result<UserMetadata> userMetadataOf(const httplib::Request& req);
// Sets the object's user metadata as x-amz-meta-* headers of the answer.
void setUserMetadata(httplib::Response& res, const UserMetadata& meta);
// A Content-MD5 header's 16 bytes (strict base64), or nullopt.
std::optional<std::string> contentMd5(std::string_view text);

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

// One object: page-aligned memory registered with the object server. With --data-dir, an object
// in a bucket is instead a record of its file (onDisk): its size, ETag and metadata, the file's
// inode, and its bytes in memory (`cached`, an object of the first kind) while the memory cache
// holds them.
struct StoredObject {
  cuObjServer* server = nullptr;
  void* mem = nullptr;
  uint64_t size = 0;
  rdma_buffer* buf = nullptr;
  std::string etag;
  int64_t modifiedNs = 0;
  std::string contentType = "application/octet-stream";
  UserMetadata meta;      // x-amz-meta-* of its PUT, copy or multipart upload
  uint64_t received = 0;  // an upload's bytes so far
  int64_t touchedNs = 0;  // an upload's last piece
  BoundShare receiving;   // an RDMA upload's share of the receiving bound, until it completes
  BoundShare memory;      // its share of maxMemoryBytes, for as long as it lives
  std::string md5;        // a body's or part's MD5 (16 bytes), when it was computed as it arrived
  size_t mapped = 0;      // the mapping's length
  bool onDisk = false;    // a record of a file under --data-dir (an object's, or a part's)
  uint64_t inode = 0;     // that file's inode: a file replaced since is not this object's
  std::shared_ptr<StoredObject> cached;                       // the file's bytes in memory, under mu
  std::list<std::shared_ptr<StoredObject>>::iterator lruPos;  // in Impl::lru while cached
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
  UserMetadata meta;
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
  std::map<std::string, ObjectPtr> uploads;    // "bucket/key/upload-id" -> object being received
  std::map<std::string, UploadPtr> multipart;  // upload id -> multipart upload in progress
  std::list<ObjectPtr> lru;    // --data-dir: records whose bytes are cached, least recently used first
  mutable std::mutex statsMu;  // never held with mu's callers waiting: error() runs under mu
  StoreStats stats;

  // ---- objects ----
  // A share of maxReceivingBytes for `bytes` about to be received, or nullopt when the bound would
  // be passed.
  std::optional<BoundShare> reserveReceiving(uint64_t bytes);
  // A share of maxMemoryBytes for an object or part of `bytes`, or nullopt when the bound would be
  // passed. With --data-dir, cached objects are evicted to make room. Never called under mu.
  std::optional<BoundShare> reserveMemory(uint64_t bytes);
  static std::optional<BoundShare> reserve(std::atomic<uint64_t>& pool, uint64_t limit, uint64_t bytes);

  // `registered`: registered with the object server now (an RDMA upload's target must be); else
  // the caller fills the memory first and registers it with registerObject(). The mapping reserves
  // address space only: memory is committed page by page as it is written.
  Result<ObjectPtr> newObject(uint64_t size, bool registered = true);

  Status registerObject(const ObjectPtr& o);

  // S3's ETag of a single-part object: its MD5, quoted hex.
  static std::string etagOf(const ObjectPtr& o);

  // ---- objects on disk (store_persistence.cc) ----
  // Whether objects live on disk (--data-dir), with memory as their cache.
  bool onDisk() const { return !opts.dataDir.empty(); }
  // DIR/bucket/key, and its metadata DIR/.ferry/meta/bucket/key (a bucket name never starts with
  // a dot, so .ferry is no bucket's).
  fs::path fileOf(const std::string& bucket, const std::string& key) const;
  fs::path metaOf(const std::string& bucket, const std::string& key) const;
  // Where a multipart upload keeps its parts: DIR/.ferry/uploads/ID/N.
  fs::path partOf(const std::string& uploadId, uint32_t partNumber) const;
  // A new temporary file under DIR/.ferry/tmp (same file system as the objects) that `fill`
  // writes; its path, and its inode in *inode. kResourceExhausted (cause ENOSPC) when the disk is
  // full, kIoError for other failures; the file is removed then.
  Result<fs::path> writeTemporary(const std::function<Status(int fd)>& fill, uint64_t* inode);
  // `fill`s: the object's memory, and the bytes of open files one after another.
  static Status writeMemory(int fd, const void* data, uint64_t size);
  // (`hash`, when given, takes the bytes copied.)
  static Status copyFiles(int out, const std::vector<int>& from, Md5* hash = nullptr);
  // A copy of bucket/key's file in a temporary file, and the object it holds (its size, and its
  // MD5 when `from` is a multipart object, whose copy's ETag is that).
  Result<std::pair<ObjectPtr, fs::path>> copyFile(const std::string& bucket, const std::string& key,
                                                  const ObjectPtr& from);
  // The record that stands for `o` on disk once its file is in place (bytes in `o->mem`, if any,
  // are kept as its cache).
  static ObjectPtr recordOf(const ObjectPtr& o, uint64_t inode);
  // Writes `record`'s metadata (size, ETag, times, Content-Type, x-amz-meta-*) to a temporary
  // file, for installLocked() to move in place.
  Result<fs::path> writeMetadata(const ObjectPtr& record);
  // Under mu: moves an object's written file and metadata in place.
  Status installLocked(const std::string& bucket, const std::string& key, const fs::path& data,
                       const fs::path& meta);
  // Under mu: removes an object's file and metadata.
  void removeFilesLocked(const std::string& bucket, const std::string& key);
  // The object's file, open for reading; kBusy when it was replaced since `record` was taken.
  Result<int> openRecord(const std::string& bucket, const std::string& key, const ObjectPtr& record) const;
  Result<int> openFile(const fs::path& file, uint64_t inode) const;
  // Records for the objects under the data directory (their bytes stay on disk), with the
  // metadata written beside them, or what the file tells where there is none.
  Status load();
  Status loadBucket(const fs::path& dir);

  // ---- the memory cache of objects on disk (store_cache.cc) ----
  // The bytes of `record` in memory: `record` itself without --data-dir; else its cached copy,
  // read from its file into the cache when it is not there (least recently used objects are
  // evicted to make room). kResourceExhausted when it cannot fit in maxMemoryBytes.
  Result<ObjectPtr> bytesOf(const std::string& bucket, const std::string& key, const ObjectPtr& record);
  // `n` bytes at `offset` of `record`'s file, in new registered memory held against
  // maxMemoryBytes (evicting cached objects for room). kResourceExhausted when they cannot fit,
  // kBusy when the file was replaced since `record` was taken.
  Result<ObjectPtr> readRecord(const std::string& bucket, const std::string& key, const ObjectPtr& record,
                               uint64_t offset, uint64_t n);
  // Under mu: `record` (in its bucket now) becomes the most recently used cached object.
  void cacheLocked(const ObjectPtr& record);
  // Under mu: `record` leaves the cache (it was replaced or deleted); the bytes are freed when the
  // last request that reads them ends.
  void forgetLocked(const ObjectPtr& record);
  // Evicts the least recently used cached object; false when none is cached.
  bool evictOne();

  // Sets the listener's socket options and limits, and routes each method to its handler.
  void route();

  // ---- responses ----
  void error(httplib::Response& res, int status, const std::string& code, const std::string& message,
             const std::string& resource = "");

  // A refusal of a client's request that an operator may need to see (protected mode, bounds,
  // framing, credentials): logged at a bounded rate, so that a flood of bad requests cannot flood
  // the log too.
  void logRefusal(const httplib::Request& req, int status, const std::string& code,
                  const std::string& message);

  // Refuses a request whose body was not read, logging why; the connection skips the body or
  // closes.
  httplib::Server::HandlerResponse refuse(const httplib::Request& req, httplib::Response& res, int status,
                                          const std::string& code, const std::string& message,
                                          uint64_t unreadBody);

  // Runs once a request's headers are in, before any of its body is read: every rule that does not
  // need the body (docs/objects.md, "What the store refuses").
  httplib::Server::HandlerResponse admit(const httplib::Request& req, httplib::Response& res);

  // The operation a request names (admit() refused those the store does not implement).
  static OperationDecision decide(const httplib::Request& req);

  // Splits the decoded path into bucket and key.
  static void split(const std::string& path, std::string& bucket, std::string& key);

  // SigV4 when credentials are set: the headers' signature first (an unsigned or wrongly signed
  // request costs nothing more: no body is read into memory for it), the payload's hash once the
  // body is there (payloadMatches).
  bool authorized(const httplib::Request& req, httplib::Response& res);

  // Whether the body's SHA-256 (hex) is the one the signed request named (UNSIGNED-PAYLOAD: any).
  bool payloadMatches(const httplib::Request& req, httplib::Response& res, const std::string& bodyHex);

  // ---- handlers ----
  void onGet(const httplib::Request& req, httplib::Response& res);

  // Moves the piece a GET names by RDMA WRITE, from the object's memory (with --data-dir, its
  // cached copy, or the piece alone read from its file when the object does not fit in memory).
  void rdmaGet(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
               const std::string& key, const ObjectPtr& o);
  // The bytes a GET of `n` bytes at `offset` of `record` reads, and where in them the piece starts;
  // `n` shortened when only part of the piece fits in memory (the client asks for the rest).
  Result<std::pair<ObjectPtr, uint64_t>> rdmaSource(const std::string& bucket, const std::string& key,
                                                    const ObjectPtr& record, uint64_t offset, uint64_t& n);

  // Answers bytes [first, +n) of an object ("bucket/key" is its name) from memory, or from its file.
  void sendBytes(const httplib::Request& req, httplib::Response& res, const std::string& name,
                 const ObjectPtr& o, uint64_t first, uint64_t n);
  // Answers bytes [first, +n) of an object on disk that is not cached, read from its file as the
  // client takes them ("bucket/key" is its name).
  void sendFile(const httplib::Request& req, httplib::Response& res, const std::string& name,
                const ObjectPtr& o, uint64_t first, uint64_t n);

  void listBuckets(httplib::Response& res);

  void listObjects(const httplib::Request& req, httplib::Response& res, const std::string& bucket);
  // One page of a bucket's listing, as XML pieces: its objects, its common prefixes, the last key
  // listed, how many entries, whether more follow.
  struct ListingPage {
    std::string contents, prefixes, last;
    uint64_t count = 0;
    bool truncated = false;
  };
  // The page of `keys` after `after` under `prefix` (keys with `delimiter` past the prefix rolled
  // up into common prefixes), at most maxKeys entries. The caller holds mu.
  static ListingPage listPage(const std::map<std::string, ObjectPtr>& keys, const std::string& after,
                              const std::string& prefix, const std::string& delimiter, uint64_t maxKeys,
                              bool urlEncoded);

  // A PUT or POST whose handler did not read its body (a refusal) has the connection skip it or
  // close.
  using BodyHandler = void (Impl::*)(const httplib::Request&, httplib::Response&,
                                     const httplib::ContentReader&);
  void onGuarded(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 BodyHandler handler);

  // A small body (a document; admit() bounded its length) read whole.
  static std::string readDocument(const httplib::ContentReader& reader, uint64_t declared);

  // A document's signed hash and Content-MD5 (when sent) checked; false once the refusal is
  // answered.
  bool documentMatches(const httplib::Request& req, httplib::Response& res, const std::string& body);

  void onPut(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader);

  // The body of a PUT, received into a new object of its declared length: held against
  // maxReceivingBytes while it arrives and maxMemoryBytes while the object lives (with --data-dir,
  // written to a temporary file *written instead, as it arrives); its MD5 checked against
  // Content-MD5 and its SHA-256 against the signed hash. nullptr once a refusal is answered (the
  // body may then be unread: onGuarded() skips it).
  ObjectPtr receiveBody(const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader, fs::path* written);

  // The object a body of `declared` bytes is received into: in memory (held against
  // maxMemoryBytes), or with --data-dir one whose bytes go to a file. nullptr once a refusal is
  // answered.
  ObjectPtr bodyTarget(const httplib::Request& req, httplib::Response& res, uint64_t declared);
  // A new unregistered object of `size` bytes in memory, held against maxMemoryBytes; nullptr once
  // the refusal is answered (507 InsufficientStorage, 503 SlowDown when no memory maps).
  ObjectPtr heldObject(const httplib::Request& req, httplib::Response& res, uint64_t size);
  // Where a body's bytes go as they arrive (the object's memory, or the file `fd`) and their
  // hashes.
  struct BodySink {
    ObjectPtr o;
    bool hashed = false;  // SHA-256 too (a signed payload)
    int fd = -1;
    uint64_t got = 0;
    Sha256 hash;
    Md5 md5;
    Status stored;  // a write to the file that failed
    bool take(const char* data, size_t n);
  };
  // Reads the whole body into `sink` (with --data-dir into a temporary file, *written); false once
  // a refusal is answered (an incomplete body, a full disk).
  bool readBody(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                BodySink& sink, fs::path* written);

  void insufficientStorage(const httplib::Request& req, httplib::Response& res, uint64_t bytes);

  void rdmaPut(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
               const std::string& key);
  // The upload `id`'s object: the one in progress, or a new one of `total` bytes. nullptr when it
  // was refused (the answer is in res).
  ObjectPtr rdmaUploadTarget(const httplib::Request& req, httplib::Response& res, const std::string& id,
                             uint64_t total);
  // Counts a piece that arrived; the last one commits the object.
  void rdmaPieceReceived(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                         const std::string& key, const std::string& id, const ObjectPtr& o, uint64_t length);

  // Under mu: forgets uploads whose client stopped sending pieces.
  void dropStaleUploads();

  // Puts `o` in its bucket (replacing the object of that key) and answers 200 with its ETag. With
  // --data-dir its file is written first: from o->mem, or `written` (a temporary file already
  // holding its bytes: a copy's, a completion's); 507 InsufficientStorage when the disk is full.
  void commit(httplib::Response& res, const std::string& bucket, const std::string& key, const ObjectPtr& o,
              const std::string& path, const fs::path& written = {});
  void diskFull(httplib::Response& res, const std::string& path, const Status& st);

  // ---- multipart uploads, DeleteObjects, CopyObject ----
  static std::string xmlHead(const char* root);

  // Drops, at most once a second, the multipart uploads that received no call for
  // abandonedUploadSeconds (their clients went away), freeing their parts.
  void sweepAbandonedUploads();

  // Under mu: the upload `id` of bucket/key, touched, or nullptr.
  UploadPtr findUploadLocked(const std::string& bucket, const std::string& key, const std::string& id);

  void noSuchUpload(httplib::Response& res, const std::string& path);

  void onPost(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader);

  void createUpload(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                    const std::string& key);

  void uploadPart(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                  const std::string& bucket, const std::string& key);

  // The parts a completion lists, as S3 validates them: each uploaded with the ETag listed, each but
  // the last of at least 5 MiB. Empty once the refusal is answered.
  struct ListedParts {
    std::vector<ObjectPtr> parts;
    std::string contentType;
    UserMetadata meta;
    uint64_t bytes = 0;
    std::string md5s;  // the parts' binary MD5s, concatenated
  };
  std::optional<ListedParts> listedParts(const httplib::Request& req, httplib::Response& res,
                                         const std::string& bucket, const std::string& key,
                                         const std::vector<CompletedPart>& listed);

  void completeUpload(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                      const std::string& key, const std::string& body);
  // Without --data-dir: a new registered object of the parts' bytes, one after another (held
  // against maxMemoryBytes); nullptr once a refusal is answered.
  ObjectPtr joinInMemory(const httplib::Request& req, httplib::Response& res,
                         const std::vector<ObjectPtr>& parts, uint64_t total);
  // With --data-dir: the listed parts' files (`parts`, as listedParts() found them) copied one
  // after another into a temporary file.
  Result<fs::path> concatenateParts(const std::string& id, const std::vector<CompletedPart>& listed,
                                    const std::vector<ObjectPtr>& parts);
  // With --data-dir: removes the parts an upload kept on disk.
  void removeUploadFiles(const std::string& id);

  static bool equalsHex(const std::string& a, const std::string& b);

  void abortUpload(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                   const std::string& key);

  void listParts(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                 const std::string& key);

  void listUploads(const httplib::Request& req, httplib::Response& res, const std::string& bucket);

  void deleteObjects(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                     const std::string& body);

  void copyObject(const httplib::Request& req, httplib::Response& res, const std::string& bucket,
                  const std::string& key);
  // Without --data-dir: a registered copy of `from`'s bytes; nullptr once a refusal is answered.
  ObjectPtr copyInMemory(const httplib::Request& req, httplib::Response& res, const ObjectPtr& from);

  void onDelete(const httplib::Request& req, httplib::Response& res);
};

}  // namespace ferry::objects
