// The Endpoint API's side of `ferry bench --api endpoint`: one RDMAEndpoint (ferry::endpoint::
// Endpoint) per side, with num_qp = --qps, and one registered buffer "bench" of two halves: the
// source [0, max_size), filled with patternByte(), and the landing half after it, where the peer's
// bytes arrive (for send, room for `batch` messages of max_size).
//
// Each operation names `batch` ranges of the message size, all the same source and landing range,
// so the endpoint cannot merge them: one work request each, as perftest posts them. The client
// times every call that issues an operation (read, write, write_with_imm, send) and waits for the
// futures: bandwidth keeps `depth` operations in flight, latency issues one and waits for it.
//
// The server answers sends with recv()s and write_with_imm with imm_recv()s (checking each
// immediate is the next of the client's sequence) while a run lasts. After each run, the side the
// bytes landed on checks them against the pattern: the server for write, write_imm and send (and
// that as many messages or immediates arrived as the client issued), the client for read.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "bench_engine.h"
#include "ferry/endpoint/endpoint.h"

namespace ferry::cli::bench {

class EndpointSide final : public BenchSide {
 public:
  static Result<std::unique_ptr<BenchSide>> create(const std::string& device, const RunShape& shape);
  ~EndpointSide() override;

  // Each hello carries {"endpoint": endpoint_info} (docs/endpoint.md); both sides connect().
  Result<json::Value> clientHello() override;
  Result<json::Value> serverHello(const json::Value& clientHello) override;
  Status finishHello(const json::Value& serverHello) override;
  Status measure(const RunSpec& spec, RunControl& control, RunMeasurement* out) override;
  Status startResponders(uint64_t size, double stallTimeout) override;
  // Waits (up to stallTimeout) until the `operations` of `done` have all arrived, then checks the
  // landed bytes; adds "verified_bytes".
  Status finishRun(const json::Value& done, double stallTimeout, json::Value& result) override;

 private:
  EndpointSide(std::string device, const RunShape& shape) : BenchSide(std::move(device), shape) {}
  // Connects to the peer's hello and finds its buffer.
  Status connectTo(const json::Value& peerHello);
  // Issues one operation of the run's op over the batch (or the chunks) of the run.
  Result<endpoint::Future> issue();
  // The bytes that landed in one operation (size x batch for send, else size) against the pattern.
  Status checkLanded(uint64_t size, const char* what);
  // Server: the responder's loop; it ends when stop_ is set, or at the first error.
  Status respond();
  void stopResponder();

  std::shared_ptr<endpoint::Endpoint> ep_;
  uint8_t* buffer_ = nullptr;
  size_t bufferSize_ = 0;
  bool bufferMapped_ = false;  // buffer_ is our anonymous mapping (else the pool's region holds it)
  endpoint::MrHandle local_ = 0;
  endpoint::MrHandle remote_ = 0;
  std::vector<endpoint::Assignment> batch_;  // client: the run's batch (read, write, write_imm)
  std::vector<endpoint::Chunk> chunks_;      // client: the run's chunks (send)
  uint32_t nextImm_ = 0;  // client: the immediate of the next write_with_imm; server: the one due

  // Server: the thread that keeps recv()s or imm_recv()s issued during a run.
  std::thread responder_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> responding_{false};
  std::atomic<uint64_t> arrived_{0};
  Status responderStatus_;
  std::deque<endpoint::Future> pending_;  // issued and not yet complete; kept across runs
  uint64_t runSize_ = 0;
};

}  // namespace ferry::cli::bench
