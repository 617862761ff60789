// The data path of `ferry bench`: each side's objects, the client's measured loops and the server's
// responders. BenchSide is what the control conversation (bench.cc) drives; VerbsSide implements it
// with the public verbs API and EndpointSide (bench_endpoint.h) with the Endpoint API, so the same
// code measures every device.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench.h"
#include "common/json.h"
#include "ferry/verbs/path.h"
#include "ferry/verbs/verbs.h"

namespace ferry::cli::bench {

using Clock = std::chrono::steady_clock;

// Seconds from t until now.
inline double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The peer's buffer of one thread, as its hello described it.
struct RemoteBuffer {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t length = 0;
};

// One benchmark thread's objects on one side: a CQ for its QPs' sends and receives, its QPs and
// one registered buffer.
struct ThreadResources {
  verbs::CompletionChannel channel;  // where the bandwidth loop sleeps when nothing completes
  verbs::CompletionQueue cq;
  std::vector<verbs::QueuePair> qps;
  std::unordered_map<uint32_t, size_t> qpIndex;  // QP number -> index in qps
  std::vector<uint32_t> recvPosted;              // receives outstanding per QP
  std::vector<verbs::Path> localPaths;
  uint8_t* buffer = nullptr;
  size_t bufferSize = 0;
  bool bufferMapped = false;  // buffer is our anonymous mapping (else the region owns it)
  verbs::MemoryRegion mr;
  RemoteBuffer remote;
};

// What one run of one message size asks for.
struct RunSpec {
  uint64_t size = 0;
  uint64_t iters = 0;   // timed iterations per thread (ignored when duration > 0)
  uint64_t warmup = 0;  // untimed iterations per thread before them
  // ... repeated until this long has passed too: a short run otherwise measures where the kernel
  // first placed the threads. Two spinning threads that start on one core of two stay there for
  // tens of milliseconds, and a 5000-iteration 8 B ping-pong measured 12 us instead of 0.3.
  double warmupSeconds = 0.05;
  double duration = 0;       // seconds of timed work per thread; 0: run by iters
  double stallTimeout = 30;  // seconds without progress before a run fails
};

// What the client measured in one run (all threads together).
struct RunMeasurement {
  uint64_t iterations = 0;        // timed iterations, all threads
  double seconds = 0;             // first timed post to last completion
  std::vector<double> latencyUs;  // latency mode: one sample per timed iteration, sorted
  // Endpoint API: operations issued in the run, warm-up included (the server checks that as many
  // messages or immediates arrived), the time spent inside the calls that issued the timed ones,
  // and the bytes the client checked after the run (READ: what landed here).
  uint64_t operations = 0;
  double callSeconds = 0;  // (verbs: with --call-time, inside postSend)
  uint64_t verifiedBytes = 0;
};

// Shared by a run's threads and the thread watching them.
struct RunControl {
  std::atomic<bool> abort{false};
  std::atomic<bool> go{false};
  std::atomic<int> warmedUp{0};
  std::vector<std::unique_ptr<std::atomic<uint64_t>>> done;  // timed iterations per thread
};

// One thread's warmup: once() runs the spec's warmup iterations, again until spec.warmupSeconds
// have passed too or the run aborts. Nothing when the spec asks for no warmup iterations.
template <typename Once>
Status warmUp(const RunSpec& spec, const RunControl& control, Once&& once) {
  if (spec.warmup == 0) return Status::ok();
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(spec.warmupSeconds));
  do {
    Status st = once();
    if (!st.isOk()) return st;
  } while (Clock::now() < until && !control.abort.load());
  return Status::ok();
}

// One side of a run, on the API the run's shape names. The control conversation is the same for
// every API: only what a hello carries besides the shape, and what a side checks when a run ends,
// are the side's own.
class BenchSide {
 public:
  // Validates the shape, opens `device` and sets up everything a run of `shape` needs: a
  // VerbsSide for Api::kVerbs, an EndpointSide for Api::kEndpoint.
  static Result<std::unique_ptr<BenchSide>> create(const std::string& device, const RunShape& shape);
  virtual ~BenchSide() = default;

  const std::string& deviceName() const { return device_; }
  const RunShape& shape() const { return shape_; }

  // Client, first: the fields its hello carries besides the run's shape.
  virtual Result<json::Value> clientHello() = 0;
  // Server: takes the client's hello, connects this side, and returns the fields of its own hello.
  virtual Result<json::Value> serverHello(const json::Value& clientHello) = 0;
  // Client, last: connects this side with the server's hello.
  virtual Status finishHello(const json::Value& serverHello) = 0;

  // Client: one measured run. `control` is shared with the watching thread: the side bumps
  // control.warmedUp after each thread's warm-up, waits for control.go, then counts timed
  // iterations in control.done; control.abort stops it early.
  virtual Status measure(const RunSpec& spec, RunControl& control, RunMeasurement* out) = 0;

  // Server: prepares for a run of `size` and starts whatever answers the client during it.
  virtual Status startResponders(uint64_t size, double stallTimeout) = 0;
  // Server: ends the run the client's `done` message closed, returns the first error the run hit
  // here, and adds what this side found to `result` (the result message).
  virtual Status finishRun(const json::Value& done, double stallTimeout, json::Value& result) = 0;

 protected:
  BenchSide(std::string device, const RunShape& shape) : device_(std::move(device)), shape_(shape) {}

  const std::string device_;
  const RunShape shape_;
};

// The verbs side: per thread a CQ, shape.qps RC QPs and a buffer of bufferBytes(shape) registered
// for local write and remote read, write and atomics. Its hello carries one Path per QP and one
// buffer description per thread.
class VerbsSide final : public BenchSide {
 public:
  static Result<std::unique_ptr<BenchSide>> create(const std::string& device, const RunShape& shape);
  ~VerbsSide() override;

  Result<json::Value> clientHello() override;
  Result<json::Value> serverHello(const json::Value& clientHello) override;
  Status finishHello(const json::Value& serverHello) override;
  Status measure(const RunSpec& spec, RunControl& control, RunMeasurement* out) override;
  // Posts receives, clears landing bytes and starts the threads that answer the client
  // (ping-pong partners and receive reposting), if the run needs any.
  Status startResponders(uint64_t size, double stallTimeout) override;
  Status finishRun(const json::Value& done, double stallTimeout, json::Value& result) override;

 private:
  VerbsSide(std::string device, const RunShape& shape) : BenchSide(std::move(device), shape) {}
  // Client, first: fills the local half of each QP's path. Returns them, thread-major, as JSON
  // objects (Path::toJson).
  Result<json::Array> localPaths();
  // Server: takes the client's paths (one per QP, thread-major), connects each QP to its peer and
  // returns this side's paths for the client.
  Result<json::Array> acceptPaths(const json::Array& peerPaths);
  // Client, last: connects each QP with the path the server returned for it.
  Status completePaths(const json::Array& peerPaths);
  // This side's buffers, one {"addr","rkey","length"} object per thread.
  json::Array bufferDescriptions() const;
  // Takes the peer's buffer descriptions; each must hold at least bufferBytes(shape).
  Status setRemoteBuffers(const json::Array& buffers);
  Status postReceives(ThreadResources& t, size_t qp, uint32_t count);
  Status topUpReceives(ThreadResources& t);
  // Ends the responders and returns the first error they hit.
  Status stopResponders();

  verbs::Context ctx_;
  verbs::ProtectionDomain pd_;
  std::vector<ThreadResources> threads_;
  uint32_t maxRecvWr_ = 0;
  std::atomic<bool> stopResponders_{false};
  std::vector<std::thread> responders_;
  std::vector<Status> responderStatus_;
};

// Process CPU time (all threads, including the devices' progress threads), in seconds.
double processCpuSeconds();

// The whole machine's CPU time from /proc/stat's first line, in clock ticks: busy (everything but
// idle and iowait, so softirq work too, which a process's own CPU time leaves out: on loopback TCP
// that is the protocol's receive path) and total, over every core. Zeros where /proc is missing.
struct MachineCpu {
  uint64_t busy = 0;
  uint64_t total = 0;
};
MachineCpu machineCpu();

// The share of the machine that was busy between two readings, in percent of all its cores
// (100 = every core busy throughout); -1 when the readings are missing or equal.
double machineBusyPercent(const MachineCpu& from, const MachineCpu& to);

}  // namespace ferry::cli::bench
