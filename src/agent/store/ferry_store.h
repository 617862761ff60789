// ferry://host:port: the client of ferry's own store (StoreServer, ferry_store_server.h).
//
// Requests go one at a time over one ControlChannel (tag "ferry_store"), each with the deadline
// StoreOptions::timeout for connecting, sending and the whole answer. A connection that breaks is
// closed and the next call connects again; a request whose reused connection turns out to be dead
// (the server restarted since the last call) is sent once more on a fresh one. Every reply is
// checked as strictly as the server checks requests; a malformed one drops the connection.
//
// Each watch has a connection and a thread of its own: the thread reads the server's pushed events
// and runs the callback. When the connection breaks (or the server's pings stop), the thread
// connects again until it succeeds or the watch is stopped, then delivers the difference between
// what it had reported and the server's current entries (WatchMirror), so the watcher converges.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agent/store/ferry_store_server.h"
#include "agent/store/store_backend.h"
#include "common/control_channel.h"

namespace ferry::agent {

class FerryStore final : public Store {
 public:
  FerryStore(StoreUrl url, StoreOptions options);
  ~FerryStore() override;

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

  // Sends one request and reads its replies (several for "entries") into *replies. kUnavailable
  // naming the URL when the server cannot be reached or breaks off; the server's own status for a
  // "failure" reply; kProtocolError for a malformed reply.
  Status call(StoreRequest& request, std::vector<json::Value>* replies);
  // The thread of one watch: reads events and runs the callback until the watch is stopped.
  void runWatch(Watch* w, ControlChannel ch);
  // Connects the watch again, retrying until it works (true) or the watch is stopped (false).
  bool reconnectWatch(Watch* w, ControlChannel* ch, std::vector<StoreEntry>* snapshot);

  const StoreUrl url_;
  const StoreOptions options_;

  std::mutex mu_;  // one request at a time on channel_
  ControlChannel channel_;
  int64_t nextRequest_ = 1;

  std::mutex watchMu_;
  std::map<WatchId, std::unique_ptr<Watch>> watches_;
  WatchId nextWatch_ = 1;
};

}  // namespace ferry::agent
