// etcd://host:port: the discovery store on an etcd v3 server, through its JSON gateway over HTTP
// (libcurl; paths /v3/kv/put, /v3/kv/range, /v3/kv/deleterange, /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke, /v3/watch, as etcd 3.4 serves them). Keys and values
// travel base64-encoded in the JSON; answers are parsed with ferry's strict json::parse and read
// by proto3's JSON rules with json::Fields (etcd_answer.h).
//
// Leases are etcd's own (note that etcd rounds a TTL up to its minimum, about 2 s with default
// settings). Calls: one HTTP connection per handle, reused, one request at a time, each with the
// deadline StoreOptions::timeout; libcurl reconnects when the server restarted.
//
// Watches: each has a thread of its own that takes a snapshot of the prefix (a range, which also
// gives the store's revision) and then holds a streaming POST /v3/watch open from the next
// revision, so no change between the two is lost; the gateway sends one JSON object per line.
// When the stream ends (the server went away, or etcd cancelled the watch), the thread takes a new
// snapshot as soon as the server answers, converges the watcher (WatchMirror), and watches again.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/store/etcd_answer.h"
#include "agent/store/store_backend.h"
#include "common/json.h"

namespace ferry::agent {

// One reusable HTTP connection to the gateway (internal to the etcd backend).
class EtcdHttp {
 public:
  explicit EtcdHttp(const StoreUrl& url);
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  // POSTs body to path and parses the answer. kUnavailable naming the URL when the server cannot
  // be reached or does not answer within timeout; for an error answer, the status its gRPC code
  // maps to (NotFound, InvalidArgument, ...) with etcd's message; kProtocolError for an answer
  // that is not a JSON object or an error answer that cannot be read.
  Result<json::Value> post(const std::string& path, const json::Value& body,
                           std::chrono::milliseconds timeout);
  const std::string& base() const { return base_; }
  const std::string& url() const { return url_; }  // etcd://host:port, as the store was opened

 private:
  std::string url_;
  std::string base_;  // http://host:port
  void* curl_ = nullptr;
};

class EtcdStore final : public Store {
 public:
  EtcdStore(StoreUrl url, StoreOptions options);
  ~EtcdStore() override;

  const std::string& url() const override { return url_.text; }
  Status set(std::string_view key, std::string_view value, LeaseId lease) override;
  Result<std::string> get(std::string_view key) override;
  Result<std::vector<StoreEntry>> list(std::string_view prefix) override;
  Status erase(std::string_view key) override;
  Result<LeaseId> grantLease(std::chrono::seconds ttl) override;
  Status keepAlive(LeaseId lease) override;
  Status revokeLease(LeaseId lease) override;
  Result<WatchId> watch(std::string_view prefix, WatchCb cb) override;
  void unwatch(WatchId id) override;

 private:
  struct Watch;

  Result<json::Value> post(const std::string& path, const json::Value& body);
  void runWatch(Watch* w, int64_t revision);
  // Streams the watch from revision until the stream ends or the watch is stopped.
  void streamWatch(Watch* w, int64_t revision);

  const StoreUrl url_;
  const StoreOptions options_;

  std::mutex mu_;  // one request at a time on http_
  EtcdHttp http_;

  std::mutex watchMu_;
  std::map<WatchId, std::unique_ptr<Watch>> watches_;
  WatchId nextWatch_ = 1;
};

// The entries under prefix and the store's revision, from a range request (decodeEtcdRange).
Result<EtcdSnapshot> etcdRange(EtcdHttp& http, std::string_view prefix, std::chrono::milliseconds timeout);

}  // namespace ferry::agent
