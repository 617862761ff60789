// The Endpoint API's side of `ferry bench` (see bench_endpoint.h).
#include "bench_endpoint.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/control_channel.h"

namespace ferry::cli::bench {
namespace {

namespace ep = ferry::endpoint;

// The region each side registers and finds in its peer's metadata.
constexpr const char* kRegionName = "bench";
// A wait on a future wakes this often to notice an aborted or stalled run.
constexpr std::chrono::milliseconds kWaitSlice{100};

template <typename F>
Result<ep::Future> asFuture(Result<F> f) {
  if (!f.isOk()) return f.status();
  return ep::Future(std::move(*f));
}

// Waits for one operation; kCancelled when the run is aborted, kTimedOut when it stalls.
Status awaitOp(const ep::Future& f, const RunControl& control, double stall) {
  auto since = Clock::now();
  while (true) {
    Status st = f.wait(kWaitSlice);
    if (st.code() != StatusCode::kTimedOut || f.done()) return st;
    if (control.abort.load(std::memory_order_relaxed)) return Status(StatusCode::kCancelled, "run aborted");
    if (secondsSince(since) > stall) {
      return Status(StatusCode::kTimedOut, "an operation made no progress for " +
                                               std::to_string(static_cast<int>(stall)) +
                                               " s (is the peer alive?)");
    }
  }
}

}  // namespace

Result<std::unique_ptr<BenchSide>> EndpointSide::create(const std::string& device, const RunShape& shape) {
  std::unique_ptr<EndpointSide> side(new EndpointSide(device, shape));
  FERRY_ASSIGN_OR_RETURN(side->ep_,
                         ep::Endpoint::create(ep::ContextOptions{.deviceName = device, .linkType = ""},
                                              {.numQp = static_cast<size_t>(shape.qps)}));
  const size_t bytes = bufferBytes(shape);
  if (shape.sharedMemory) {
    // --memory shared: the pool allocates the buffer (memory a same-host peer maps) and holds it.
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<SharedMemory> memory,
                           side->ep_->pool()->allocMemoryRegion(kRegionName, bytes));
    side->buffer_ = static_cast<uint8_t*>(memory->data());
  } else {
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return ioError("cannot map a " + std::to_string(bytes) + "-byte buffer");
    side->buffer_ = static_cast<uint8_t*>(mem);
    side->bufferMapped_ = true;
  }
  side->bufferSize_ = bytes;
  // The source half holds the pattern; the landing half is touched now, so no run pays for
  // first-touch faults.
  const uint64_t period = std::min<uint64_t>(shape.maxSize, 251);
  for (uint64_t i = 0; i < period; ++i) side->buffer_[i] = patternByte(i);
  for (uint64_t filled = period; filled < shape.maxSize; filled *= 2) {
    std::memcpy(side->buffer_ + filled, side->buffer_, std::min(filled, shape.maxSize - filled));
  }
  std::memset(side->buffer_ + shape.maxSize, 0, bytes - shape.maxSize);
  if (shape.sharedMemory) {
    FERRY_ASSIGN_OR_RETURN(side->local_, side->ep_->pool()->handleOf(kRegionName));
  } else {
    FERRY_ASSIGN_OR_RETURN(side->local_, side->ep_->registerMemoryRegion(kRegionName, side->buffer_, bytes));
  }
  return std::unique_ptr<BenchSide>(std::move(side));
}

EndpointSide::~EndpointSide() {
  stopResponder();
  pending_.clear();
  if (ep_) {
    // No device access to the buffer once the queue pairs are stopped and the region is gone.
    ep_->shutdown();
    (void)ep_->pool()->unregisterMemoryRegion(kRegionName);
  }
  if (buffer_ && bufferMapped_) munmap(buffer_, bufferSize_);
}

Result<json::Value> EndpointSide::clientHello() {
  FERRY_ASSIGN_OR_RETURN(json::Value info, json::parse(ep_->endpointInfo()));
  json::Value hello = json::Value::emptyObject();
  hello.set("endpoint", std::move(info));
  return hello;
}

Result<json::Value> EndpointSide::serverHello(const json::Value& clientHello) {
  FERRY_RETURN_IF_ERROR(connectTo(clientHello));
  return this->clientHello();
}

Status EndpointSide::finishHello(const json::Value& serverHello) { return connectTo(serverHello); }

Status EndpointSide::connectTo(const json::Value& peerHello) {
  FERRY_ASSIGN_OR_RETURN(const json::Value* info, controlFields(peerHello).object("endpoint"));
  Status st = ep_->connect(json::serialize(*info));
  if (!st.isOk()) return Status(StatusCode::kProtocolError, "the peer's endpoint metadata: " + st.message());
  auto remote = ep_->remoteHandle(kRegionName);
  if (!remote.isOk()) {
    return Status(StatusCode::kProtocolError,
                  std::string("the peer's endpoint metadata has no region '") + kRegionName + "'");
  }
  remote_ = *remote;
  return Status::ok();
}

Result<ep::Future> EndpointSide::issue() {
  switch (shape_.op) {
    case Op::kRead: return asFuture(ep_->read(batch_));
    case Op::kWrite: return asFuture(ep_->write(batch_));
    case Op::kWriteImm: return asFuture(ep_->writeWithImm(batch_, nextImm_++));
    case Op::kSend: return asFuture(ep_->send(chunks_));
    case Op::kAtomic: break;
  }
  return invalidArgument("the Endpoint API has no atomics");
}

Status EndpointSide::checkLanded(uint64_t size, const char* what) {
  const uint64_t copies = shape_.op == Op::kSend ? static_cast<uint64_t>(shape_.batch) : 1;
  const uint8_t* landed = buffer_ + shape_.maxSize;
  // Every copy must equal the first `size` bytes of the pattern, which this side's source half holds.
  for (uint64_t k = 0; k < copies; ++k) {
    const uint8_t* copy = landed + k * size;
    if (std::memcmp(copy, buffer_, size) == 0) continue;
    uint64_t j = 0;
    while (copy[j] == buffer_[j]) ++j;
    char text[160];
    std::snprintf(text, sizeof text, "byte %llu of the %llu %s here is 0x%02x, not 0x%02x",
                  static_cast<unsigned long long>(k * size + j),
                  static_cast<unsigned long long>(copies * size), what, copy[j], buffer_[j]);
    return Status(StatusCode::kInternal, text);
  }
  return Status::ok();
}

Status EndpointSide::measure(const RunSpec& spec, RunControl& control, RunMeasurement* out) {
  const uint64_t size = spec.size;
  const uint64_t landing = shape_.maxSize;
  const size_t n = static_cast<size_t>(shape_.batch);
  // The same source and landing range in every entry: no two are contiguous, so none merge.
  if (shape_.op == Op::kSend) {
    chunks_.assign(n, ep::Chunk{.mr = local_, .offset = 0, .length = size});
  } else if (shape_.op == Op::kRead) {
    batch_.assign(n,
                  ep::Assignment{.local = local_, .remote = remote_, .localOffset = landing, .length = size});
    std::memset(buffer_ + landing, 0, size);
  } else {
    batch_.assign(
        n, ep::Assignment{.local = local_, .remote = remote_, .remoteOffset = landing, .length = size});
  }

  RunMeasurement m;
  std::vector<double> samples;
  std::atomic<uint64_t>* progress = nullptr;
  // Issues operations until `count` have completed or `stopAt` passed (then no new ones start).
  auto run = [&](uint64_t count, Clock::time_point stopAt, uint64_t* completed) -> Status {
    const bool timed = progress != nullptr;
    std::deque<ep::Future> inflight;
    const size_t depth = shape_.mode == Mode::kBandwidth ? static_cast<size_t>(shape_.depth) : 1;
    uint64_t issued = 0;
    while (true) {
      while (inflight.size() < depth && issued < count && Clock::now() < stopAt) {
        auto t0 = Clock::now();
        auto f = issue();
        auto t1 = Clock::now();
        if (!f.isOk()) return f.status();
        inflight.push_back(std::move(*f));
        ++issued;
        ++m.operations;
        if (timed) m.callSeconds += std::chrono::duration<double>(t1 - t0).count();
        if (timed && shape_.mode == Mode::kLatency) {
          // One at a time: the sample runs from the call to the return of its wait().
          FERRY_RETURN_IF_ERROR(awaitOp(inflight.front(), control, spec.stallTimeout));
          samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
      }
      if (inflight.empty()) return Status::ok();
      FERRY_RETURN_IF_ERROR(awaitOp(inflight.front(), control, spec.stallTimeout));
      inflight.pop_front();
      ++*completed;
      if (progress) progress->fetch_add(1, std::memory_order_relaxed);
    }
  };

  uint64_t warm = 0;
  FERRY_RETURN_IF_ERROR(
      warmUp(spec, control, [&] { return run(spec.warmup, Clock::time_point::max(), &warm); }));
  control.warmedUp.fetch_add(1);
  while (!control.go.load()) {
    if (control.abort.load()) return Status(StatusCode::kCancelled, "run aborted");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  progress = control.done[0].get();
  samples.reserve(spec.duration > 0 ? 1 << 16 : spec.iters);
  auto start = Clock::now();
  auto stopAt = spec.duration > 0
                    ? start + std::chrono::microseconds(static_cast<int64_t>(spec.duration * 1e6))
                    : Clock::time_point::max();
  FERRY_RETURN_IF_ERROR(
      run(spec.duration > 0 ? std::numeric_limits<uint64_t>::max() : spec.iters, stopAt, &m.iterations));
  m.seconds = secondsSince(start);
  std::sort(samples.begin(), samples.end());
  m.latencyUs = std::move(samples);
  if (shape_.op == Op::kRead) {
    FERRY_RETURN_IF_ERROR(checkLanded(size, "bytes read"));
    m.verifiedBytes = size;
  }
  *out = std::move(m);
  return Status::ok();
}

Status EndpointSide::startResponders(uint64_t size, double stallTimeout) {
  stopResponder();
  if (size < 1 || size > shape_.maxSize) {
    return Status(StatusCode::kProtocolError, "run size " + std::to_string(size) + " is outside [1, " +
                                                  std::to_string(shape_.maxSize) + "] agreed in the hello");
  }
  runSize_ = size;
  // Nothing is in flight between runs: every message and immediate of the last one has arrived.
  std::memset(buffer_ + shape_.maxSize, 0, bufferSize_ - shape_.maxSize);
  arrived_.store(0);
  responderStatus_ = Status::ok();
  if (shape_.op != Op::kSend && shape_.op != Op::kWriteImm) return Status::ok();
  stop_.store(false);
  responding_.store(true);
  responder_ = std::thread([this] {
    responderStatus_ = respond();
    responding_.store(false);
  });
  return Status::ok();
}

Status EndpointSide::respond() {
  // Enough receives for every operation the client may have in flight. Each recv() takes a whole
  // landing half, so one left over from a run takes any message of the next.
  const size_t window = static_cast<size_t>(std::min(shape_.depth, 256));
  const ep::Chunk landing{.mr = local_, .offset = shape_.maxSize, .length = bufferSize_ - shape_.maxSize};
  const uint64_t messageBytes = runSize_ * static_cast<uint64_t>(shape_.batch);
  while (true) {
    while (pending_.size() < window) {
      auto f = shape_.op == Op::kSend ? asFuture(ep_->recv({&landing, 1})) : asFuture(ep_->immRecv());
      if (!f.isOk()) return f.status();
      pending_.push_back(std::move(*f));
    }
    const ep::Future& f = pending_.front();
    Status st = f.wait(kWaitSlice);
    if (st.code() == StatusCode::kTimedOut && !f.done()) {
      if (stop_.load()) return Status::ok();
      continue;
    }
    if (!st.isOk()) return st;
    if (shape_.op == Op::kSend && f.state()->bytes() != messageBytes) {
      return Status(StatusCode::kInternal, "a message of " + std::to_string(f.state()->bytes()) +
                                               " bytes arrived; the client sends " +
                                               std::to_string(messageBytes));
    }
    if (shape_.op == Op::kWriteImm && f.state()->immData() != nextImm_++) {
      return Status(StatusCode::kInternal, "immediate " + std::to_string(f.state()->immData()) +
                                               " arrived where " + std::to_string(nextImm_ - 1) + " was due");
    }
    pending_.pop_front();
    arrived_.fetch_add(1);
  }
}

void EndpointSide::stopResponder() {
  stop_.store(true);
  if (responder_.joinable()) responder_.join();
}

Status EndpointSide::finishRun(const json::Value& done, double stallTimeout, json::Value& result) {
  if (responder_.joinable()) {
    auto operations = controlFields(done).integer("operations", 0, std::numeric_limits<int64_t>::max());
    if (!operations.isOk()) return stopResponder(), operations.status();
    const uint64_t want = static_cast<uint64_t>(*operations);
    auto since = Clock::now();
    while (arrived_.load() < want && responding_.load() && secondsSince(since) < stallTimeout) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stopResponder();
    FERRY_RETURN_IF_ERROR(responderStatus_);
    if (arrived_.load() != want) {
      return Status(StatusCode::kTimedOut,
                    std::to_string(arrived_.load()) + " of the client's " + std::to_string(want) + " " +
                        (shape_.op == Op::kSend ? "messages" : "immediates") + " arrived");
    }
  }
  uint64_t verified = 0;
  if (shape_.op != Op::kRead) {
    FERRY_RETURN_IF_ERROR(checkLanded(runSize_, shape_.op == Op::kSend ? "bytes received" : "bytes written"));
    verified = runSize_ * (shape_.op == Op::kSend ? static_cast<uint64_t>(shape_.batch) : 1);
  }
  result.set("verified_bytes", static_cast<int64_t>(verified));
  return Status::ok();
}

}  // namespace ferry::cli::bench
