// The data path of `ferry bench` (see bench_engine.h).
//
// Bandwidth: each thread keeps up to `depth` work requests outstanding on each of its QPs, posts
// them `batch` at a time round-robin over its QPs, and signals only the last request of a batch
// (RC completes in order, so that completion retires the whole batch).
//
// Latency: WRITE, SEND and WRITE_WITH_IMM are ping-pongs as in ib_write_lat / ib_send_lat. For
// WRITE each side writes its message into the other's "landing" half and watches the last byte of
// its own landing half for the sequence value the peer wrote; the round trip is halved. READ and
// atomics are timed from posting one request to polling its completion.
//
// Every loop polls without blocking and, after every --poll-yield-th poll that found nothing,
// yields the processor, so a machine with few cores still runs both sides' progress threads.
#include "bench_engine.h"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

#include "bench_endpoint.h"
#include "common/control_channel.h"
#include "ferry/devices.h"

namespace ferry::cli::bench {
namespace {

// After a poll that did not find what the loop waits for (a completion of another request reaped
// on the way counts as nothing): gives the core away at every shape.pollYield-th such poll in a row
// (0: never); `empty` counts them, and the caller sets it to 0 when it found what it waits for.
void afterEmptyPoll(const RunShape& shape, uint32_t& empty) {
  if (shape.pollYield > 0 && ++empty % static_cast<uint32_t>(shape.pollYield) == 0) std::this_thread::yield();
}

namespace v = ferry::verbs;

constexpr uint64_t kRecvTag = uint64_t{1} << 63;
constexpr uint32_t kRemoteAccess =
    v::access::kRemoteWrite | v::access::kRemoteRead | v::access::kRemoteAtomic;

bool needsReceives(const RunShape& s) { return s.op == Op::kSend || s.op == Op::kWriteImm; }
// Where the peer's ping-pong messages land in a buffer (the first half is what this side sends).
uint64_t landingOffset(const RunShape& s) { return isPingPong(s) ? s.maxSize : 0; }

v::WrOpcode opcodeOf(Op op) {
  switch (op) {
    case Op::kWrite: return v::WrOpcode::kRdmaWrite;
    case Op::kRead: return v::WrOpcode::kRdmaRead;
    case Op::kSend: return v::WrOpcode::kSend;
    case Op::kWriteImm: return v::WrOpcode::kRdmaWriteWithImm;
    case Op::kAtomic: return v::WrOpcode::kAtomicFetchAndAdd;
  }
  return v::WrOpcode::kRdmaWrite;
}

bool isReceive(const v::WorkCompletion& wc) { return (static_cast<unsigned>(wc.opcode) & 128u) != 0; }

Status wcError(const v::WorkCompletion& wc) {
  return Status(StatusCode::kWorkCompletionError,
                std::string("a work request failed with ") + v::wcStatusName(wc.status) + " (" +
                    v::wcOpcodeName(wc.opcode) + ", QP " + std::to_string(wc.qpNum) + ")",
                static_cast<int>(wc.status));
}

Status stalled(double seconds) {
  return Status(StatusCode::kTimedOut,
                "no progress for " + std::to_string(static_cast<int>(seconds)) + " s (is the peer alive?)");
}

uint8_t loadByte(const uint8_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
// Polls *p for value `spins` times, without a system call; true when it arrived.
bool landsSoon(const uint8_t* p, uint8_t value, int spins) {
  for (int i = 0; i < spins; ++i) {
    if (loadByte(p) == value) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return false;
}
void storeByte(uint8_t* p, uint8_t value) { __atomic_store_n(p, value, __ATOMIC_RELEASE); }

// How a side of a WRITE ping-pong waits for its landing byte (as ib_write_lat polls the byte
// itself). Where the peer's post writes this memory (the same-host paths) the byte lands within a
// spin on it, and a CQ poll between looks (its progress may make a system call) would only delay
// seeing it: the wait spins alone while the byte keeps landing within the spin. Where it lands
// only once this side's progress took the frame from the connection (TCP, rings the application
// attends), spinning is wasted: the wait then has the caller poll the CQ between looks, and tries
// a short spin again every kProbeEvery looks.
class LandingWait {
 public:
  // True once the byte holds value; false when the caller should poll its CQ and look again.
  bool look(const uint8_t* p, uint8_t value) {
    if (loadByte(p) == value) return true;
    if (!spinning_ && ++sinceProbe_ < kProbeEvery) return false;
    sinceProbe_ = 0;
    spinning_ = landsSoon(p, value, spinning_ ? kSpins : kProbeSpins);
    return spinning_;
  }

 private:
  static constexpr int kSpins = 4096;     // about 100 us of pause instructions here
  static constexpr int kProbeSpins = 64;  // about 2 us
  static constexpr uint32_t kProbeEvery = 256;
  bool spinning_ = true;
  uint32_t sinceProbe_ = 0;
};
// The ping-pong marker of iteration `seq`: never 0 (the cleared value), never equal to the last.
uint8_t marker(uint64_t seq) { return static_cast<uint8_t>(seq % 255 + 1); }

// A request of the run's operation from this thread's buffer to the peer's.
v::SendWr makeWr(const ThreadResources& t, const RunShape& shape, const v::Sge* sge, uint64_t wrId,
                 uint32_t flags, uint64_t remoteOffset) {
  v::SendWr wr;
  wr.wrId = wrId;
  wr.opcode = opcodeOf(shape.op);
  wr.sendFlags = flags;
  wr.sgList = std::span<const v::Sge>(sge, 1);
  if (shape.op == Op::kAtomic) {
    wr.atomic = {.remoteAddr = t.remote.addr, .compareAdd = 1, .swap = 0, .rkey = t.remote.rkey};
  } else {
    wr.rdma = {.remoteAddr = t.remote.addr + remoteOffset, .rkey = t.remote.rkey};
  }
  wr.immData = static_cast<uint32_t>(wrId);
  return wr;
}

// The outcome of one thread's part of a run.
struct ThreadOutcome {
  Status status;
  uint64_t iterations = 0;
  Clock::time_point start;
  Clock::time_point end;
  std::vector<double> samplesUs;
  double callSeconds = 0;  // --call-time: inside postSend, timed iterations
};

// Tracks the send requests one thread has outstanding per QP, and reaps completions.
class SendTracker {
 public:
  SendTracker(ThreadResources& t, std::atomic<bool>* abort)
      : t_(t), abort_(abort), outstanding_(t.qps.size(), 0) {}

  // Polls the CQ once. Send completions retire the count encoded in their wrId (QP index in the
  // high half, requests retired in the low half); receive completions go to onReceive.
  template <typename OnReceive>
  Result<int> reap(OnReceive&& onReceive) {
    std::span<v::WorkCompletion> wcs(wcs_);
    auto got = t_.cq.poll(wcs);
    if (!got.isOk()) return got.status();
    for (int i = 0; i < *got; ++i) {
      const v::WorkCompletion& wc = wcs[i];
      if (wc.status != v::WcStatus::kSuccess) {
        if (abort_) abort_->store(true);
        return wcError(wc);
      }
      if (isReceive(wc)) {
        Status st = onReceive(wc);
        if (!st.isOk()) return st;
        continue;
      }
      size_t q = static_cast<size_t>((wc.wrId >> 32) & 0x7fffffff);
      uint32_t n = static_cast<uint32_t>(wc.wrId);
      if (q < outstanding_.size()) outstanding_[q] -= std::min(outstanding_[q], n);
      completed_ += n;
    }
    return *got;
  }
  Result<int> reap() {
    return reap([](const v::WorkCompletion&) { return Status::ok(); });
  }
  // Reaps, and when nothing completed, arms the CQ, reaps once more (a completion may have
  // slipped in) and sleeps on the completion channel until an event or timeoutMs, as an
  // event-driven application does.
  template <typename OnReceive>
  Result<int> reapOrSleep(OnReceive&& onReceive, int timeoutMs = 100) {
    auto got = reap(onReceive);
    if (!got.isOk() || *got > 0) return got;
    FERRY_RETURN_IF_ERROR(t_.cq.reqNotify());
    got = reap(onReceive);
    if (!got.isOk() || *got > 0) return got;
    auto event = t_.channel.getEvent(timeoutMs);
    if (!event.isOk() && event.status().code() != StatusCode::kTimedOut) return event.status();
    return 0;
  }
  Result<int> reapOrSleep(int timeoutMs = 100) {
    return reapOrSleep([](const v::WorkCompletion&) { return Status::ok(); }, timeoutMs);
  }

  uint32_t& outstanding(size_t q) { return outstanding_[q]; }
  uint64_t completed() const { return completed_; }
  bool idle() const {
    return std::all_of(outstanding_.begin(), outstanding_.end(), [](uint32_t n) { return n == 0; });
  }
  static uint64_t wrId(size_t q, uint32_t n) { return (static_cast<uint64_t>(q) << 32) | n; }

 private:
  // The poll's array, made once: 64 completions built (zeroed) for every poll cost more than the
  // poll of an empty queue.
  std::array<v::WorkCompletion, 64> wcs_;
  ThreadResources& t_;
  std::atomic<bool>* abort_;
  std::vector<uint32_t> outstanding_;
  uint64_t completed_ = 0;
};

// Waits until every outstanding send request of the thread completed.
Status drain(SendTracker& tracker, const RunShape& shape, double stall, std::atomic<bool>& abort) {
  auto last = Clock::now();
  uint32_t empty = 0;
  while (!tracker.idle()) {
    auto got = tracker.reap();
    if (!got.isOk()) return got.status();
    if (*got > 0) {
      last = Clock::now();
      empty = 0;
      continue;
    }
    if (abort.load(std::memory_order_relaxed)) return Status(StatusCode::kCancelled, "run aborted");
    if (secondsSince(last) > stall) return stalled(stall);
    afterEmptyPoll(shape, empty);
  }
  return Status::ok();
}

struct LoopArgs {
  ThreadResources* t = nullptr;
  const RunShape* shape = nullptr;
  uint64_t size = 0;
  uint64_t count = 0;                                   // iterations to do
  Clock::time_point stopAt = Clock::time_point::max();  // or stop starting new ones then
  double stall = 30;
  RunControl* control = nullptr;
  std::atomic<uint64_t>* progress = nullptr;  // timed iterations done (nullptr while warming up)
  std::vector<double>* samples = nullptr;     // latency samples (nullptr while warming up)
  uint64_t* seq = nullptr;                    // ping-pong sequence, continued across calls
  double* callSeconds = nullptr;              // --call-time: adds the time inside each postSend
};

// A latency loop's post, begun at t0: with --call-time, the time it took is added up.
void countCall(const LoopArgs& a, Clock::time_point t0) {
  if (a.callSeconds) *a.callSeconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

// How long the bandwidth loop polls without a completion before it sleeps on the channel.
constexpr double kPollBeforeSleep = 50e-6;

Status bandwidthLoop(const LoopArgs& a, uint64_t* iterations) {
  ThreadResources& t = *a.t;
  const RunShape& shape = *a.shape;
  const size_t nq = t.qps.size();
  SendTracker tracker(t, &a.control->abort);
  std::vector<v::Sge> sges(static_cast<size_t>(shape.batch));
  std::vector<v::SendWr> wrs(static_cast<size_t>(shape.batch));
  const uint32_t depth = static_cast<uint32_t>(shape.depth);
  const uint64_t size = shape.op == Op::kAtomic ? 8 : a.size;
  // The requests are built once, unsignaled, and reposted (as ucx_perftest reposts its
  // descriptors): a batch only marks its last one signaled, with the QP and count in its wrId.
  for (size_t i = 0; i < wrs.size(); ++i) {
    sges[i] = {.addr = reinterpret_cast<uintptr_t>(t.buffer),
               .length = static_cast<uint32_t>(size),
               .lkey = t.mr.lkey()};
    wrs[i] = makeWr(t, shape, &sges[i], 0, 0, 0);
  }
  uint64_t posted = 0;
  size_t cursor = 0;
  // The clock is read seldom, as ucx_perftest checks its limits every few iterations: one read
  // costs as much as posting several small requests. The time limit is looked at every 8th round,
  // and the time of the last progress is taken at the first poll after it that found nothing.
  uint64_t rounds = 0;
  auto last = Clock::now();
  bool lastKnown = true;
  bool posting = true;
  // Whether some QP has room for another batch.
  auto canPost = [&] {
    if (!posting) return false;
    for (size_t q = 0; q < nq; ++q) {
      if (depth - tracker.outstanding(q) >= static_cast<uint32_t>(shape.batch)) return true;
    }
    return false;
  };
  while (true) {
    if (posting && (posted >= a.count || ((++rounds & 7) == 0 && Clock::now() >= a.stopAt))) posting = false;
    for (size_t tries = 0; posting && tries < nq; ++tries) {
      size_t q = cursor;
      cursor = cursor + 1 == nq ? 0 : cursor + 1;
      uint32_t n =
          static_cast<uint32_t>(std::min<uint64_t>(static_cast<uint64_t>(shape.batch), a.count - posted));
      if (depth - tracker.outstanding(q) < n) continue;
      v::SendWr& lastWr = wrs[n - 1];
      lastWr.wrId = SendTracker::wrId(q, n);
      lastWr.immData = static_cast<uint32_t>(lastWr.wrId);
      lastWr.sendFlags = v::send_flags::kSignaled;
      Status st = t.qps[q].postSend(std::span<const v::SendWr>(wrs.data(), n));
      lastWr.wrId = 0;
      lastWr.immData = 0;
      lastWr.sendFlags = 0;
      if (!st.isOk()) return st;
      tracker.outstanding(q) += n;
      posted += n;
      if (posted >= a.count) posting = false;
    }
    if (!posting && tracker.idle()) break;
    uint64_t before = tracker.completed();
    auto got = tracker.reap();
    if (!got.isOk()) return got.status();
    if (tracker.completed() != before) {
      if (a.progress) a.progress->fetch_add(tracker.completed() - before, std::memory_order_relaxed);
      lastKnown = false;
    } else {
      if (!lastKnown) {
        last = Clock::now();
        lastKnown = true;
      }
      if (a.control->abort.load(std::memory_order_relaxed))
        return Status(StatusCode::kCancelled, "run aborted");
      if (secondsSince(last) > a.stall) return stalled(a.stall);
      if (secondsSince(last) > kPollBeforeSleep && !canPost()) {
        // Nothing completed for a while and every QP is at its depth: sleep until a completion
        // instead of taking the core the device's threads need. What it reaps counts as progress.
        got = tracker.reapOrSleep(1);
        if (!got.isOk()) return got.status();
        if (tracker.completed() != before) {
          if (a.progress) a.progress->fetch_add(tracker.completed() - before, std::memory_order_relaxed);
          lastKnown = false;
        }
        continue;
      }
      std::this_thread::yield();
    }
  }
  *iterations = tracker.completed();
  return Status::ok();
}

// Client side of a WRITE ping-pong.
Status writePingPong(const LoopArgs& a, uint64_t* iterations) {
  ThreadResources& t = *a.t;
  const RunShape& shape = *a.shape;
  const size_t nq = t.qps.size();
  SendTracker tracker(t, &a.control->abort);
  uint8_t* mark = t.buffer + a.size - 1;
  LandingWait wait;
  const uint8_t* landing = t.buffer + landingOffset(shape) + a.size - 1;
  v::Sge sge{.addr = reinterpret_cast<uintptr_t>(t.buffer),
             .length = static_cast<uint32_t>(a.size),
             .lkey = t.mr.lkey()};
  uint64_t i = 0;
  for (; i < a.count && Clock::now() < a.stopAt; ++i) {
    size_t q = i % nq;
    uint8_t value = marker((*a.seq)++);
    storeByte(mark, value);
    auto t0 = Clock::now();
    Status st = t.qps[q].postSend(
        makeWr(t, shape, &sge, SendTracker::wrId(q, 1), v::send_flags::kSignaled, landingOffset(shape)));
    countCall(a, t0);
    if (!st.isOk()) return st;
    ++tracker.outstanding(q);
    uint32_t spins = 0, empty = 0;
    while (!wait.look(landing, value)) {
      auto got = tracker.reap();
      if (!got.isOk()) return got.status();
      if (++spins % 256 == 0) {
        if (a.control->abort.load(std::memory_order_relaxed))
          return Status(StatusCode::kCancelled, "run aborted");
        if (secondsSince(t0) > a.stall) return stalled(a.stall);
      }
      afterEmptyPoll(shape, empty);
    }
    auto t1 = Clock::now();
    if (a.samples) a.samples->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
    if (a.progress) a.progress->fetch_add(1, std::memory_order_relaxed);
    // Keep the send queue from filling up with completions nobody polled.
    while (tracker.outstanding(q) > 4) {
      auto got = tracker.reap();
      if (!got.isOk()) return got.status();
      if (*got == 0) afterEmptyPoll(shape, empty);
    }
  }
  *iterations = i;
  return drain(tracker, shape, a.stall, a.control->abort);
}

// Client side of a SEND or WRITE_WITH_IMM ping-pong: the reply is a receive completion.
Status receivePingPong(const LoopArgs& a, uint64_t* iterations,
                       const std::function<Status(size_t qp)>& repost) {
  ThreadResources& t = *a.t;
  const RunShape& shape = *a.shape;
  const size_t nq = t.qps.size();
  SendTracker tracker(t, &a.control->abort);
  v::Sge sge{.addr = reinterpret_cast<uintptr_t>(t.buffer),
             .length = static_cast<uint32_t>(a.size),
             .lkey = t.mr.lkey()};
  uint64_t i = 0;
  for (; i < a.count && Clock::now() < a.stopAt; ++i) {
    size_t q = i % nq;
    ++*a.seq;
    bool replied = false;
    auto onReceive = [&](const v::WorkCompletion& wc) {
      auto it = t.qpIndex.find(wc.qpNum);
      if (it == t.qpIndex.end()) return Status(StatusCode::kInternal, "a receive completed on an unknown QP");
      replied = true;
      --t.recvPosted[it->second];
      return repost(it->second);
    };
    auto t0 = Clock::now();
    Status st = t.qps[q].postSend(
        makeWr(t, shape, &sge, SendTracker::wrId(q, 1), v::send_flags::kSignaled, landingOffset(shape)));
    countCall(a, t0);
    if (!st.isOk()) return st;
    ++tracker.outstanding(q);
    uint32_t spins = 0, empty = 0;
    while (!replied) {
      auto got = shape.events ? tracker.reapOrSleep(onReceive) : tracker.reap(onReceive);
      if (!got.isOk()) return got.status();
      if (replied) break;
      if (shape.events || ++spins % 256 == 0) {
        if (a.control->abort.load(std::memory_order_relaxed))
          return Status(StatusCode::kCancelled, "run aborted");
        if (secondsSince(t0) > a.stall) return stalled(a.stall);
      }
      if (!shape.events) afterEmptyPoll(shape, empty);
    }
    auto t1 = Clock::now();
    if (a.samples) a.samples->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
    if (a.progress) a.progress->fetch_add(1, std::memory_order_relaxed);
  }
  *iterations = i;
  return drain(tracker, shape, a.stall, a.control->abort);
}

// READ or atomic latency: post one request, poll until it completes.
Status postToCompletion(const LoopArgs& a, uint64_t* iterations) {
  ThreadResources& t = *a.t;
  const RunShape& shape = *a.shape;
  const size_t nq = t.qps.size();
  SendTracker tracker(t, &a.control->abort);
  const uint64_t size = shape.op == Op::kAtomic ? 8 : a.size;
  v::Sge sge{.addr = reinterpret_cast<uintptr_t>(t.buffer),
             .length = static_cast<uint32_t>(size),
             .lkey = t.mr.lkey()};
  uint64_t i = 0;
  for (; i < a.count && Clock::now() < a.stopAt; ++i) {
    size_t q = i % nq;
    auto t0 = Clock::now();
    Status st =
        t.qps[q].postSend(makeWr(t, shape, &sge, SendTracker::wrId(q, 1), v::send_flags::kSignaled, 0));
    countCall(a, t0);
    if (!st.isOk()) return st;
    ++tracker.outstanding(q);
    uint32_t spins = 0, empty = 0;
    while (!tracker.idle()) {
      auto got = shape.events ? tracker.reapOrSleep() : tracker.reap();
      if (!got.isOk()) return got.status();
      if (*got > 0) break;
      if (shape.events || ++spins % 256 == 0) {
        if (a.control->abort.load(std::memory_order_relaxed))
          return Status(StatusCode::kCancelled, "run aborted");
        if (secondsSince(t0) > a.stall) return stalled(a.stall);
      }
      if (!shape.events) afterEmptyPoll(shape, empty);
    }
    auto t1 = Clock::now();
    if (a.samples) a.samples->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (a.progress) a.progress->fetch_add(1, std::memory_order_relaxed);
  }
  *iterations = i;
  return Status::ok();
}

}  // namespace

double processCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

MachineCpu machineCpu() {
  MachineCpu m;
  std::ifstream stat("/proc/stat");
  std::string label;
  if (!(stat >> label) || label != "cpu") return m;
  // user nice system idle iowait irq softirq steal (guest time is counted within user already)
  uint64_t v[8] = {};
  for (uint64_t& x : v) {
    if (!(stat >> x)) return MachineCpu{};
  }
  for (uint64_t x : v) m.total += x;
  m.busy = m.total - v[3] - v[4];
  return m;
}

double machineBusyPercent(const MachineCpu& from, const MachineCpu& to) {
  if (to.total <= from.total || to.busy < from.busy) return -1;
  return 100.0 * static_cast<double>(to.busy - from.busy) / static_cast<double>(to.total - from.total);
}

Result<std::unique_ptr<BenchSide>> BenchSide::create(const std::string& device, const RunShape& shape) {
  FERRY_RETURN_IF_ERROR(validateShape(shape));
  if (shape.api == Api::kEndpoint) return EndpointSide::create(device, shape);
  return VerbsSide::create(device, shape);
}

Result<std::unique_ptr<BenchSide>> VerbsSide::create(const std::string& device, const RunShape& shape) {
  std::unique_ptr<VerbsSide> side(new VerbsSide(device, shape));
  FERRY_ASSIGN_OR_RETURN(side->ctx_, openDevice(device));
  FERRY_ASSIGN_OR_RETURN(v::DeviceAttr attr, side->ctx_.queryDevice());
  if (shape.op == Op::kAtomic && attr.atomicCap == 0) {
    return notSupported("device " + device + " does not offer atomics");
  }
  uint32_t maxSendWr = static_cast<uint32_t>(std::max(shape.depth, 16));
  uint32_t maxRecvWr = needsReceives(shape) ? static_cast<uint32_t>(std::max(2 * shape.depth, 16)) : 1;
  uint32_t deviceMax = static_cast<uint32_t>(std::max(attr.maxQpWr, 1));
  if (maxSendWr > deviceMax) {
    return invalidArgument("--depth " + std::to_string(shape.depth) + " exceeds the " +
                           std::to_string(deviceMax) + " work requests a QP of " + device + " holds");
  }
  maxRecvWr = std::min(maxRecvWr, deviceMax);
  side->maxRecvWr_ = maxRecvWr;
  int cqe = shape.qps * static_cast<int>(maxSendWr + maxRecvWr) + 16;
  if (attr.maxCqe > 0 && cqe > attr.maxCqe) {
    return invalidArgument("--qps x --depth needs " + std::to_string(cqe) + " CQ entries; " + device +
                           " offers " + std::to_string(attr.maxCqe));
  }
  FERRY_ASSIGN_OR_RETURN(side->pd_, side->ctx_.allocPd());
  const size_t bytes = bufferBytes(shape);
  side->threads_.reserve(static_cast<size_t>(shape.threads));
  for (int ti = 0; ti < shape.threads; ++ti) {
    ThreadResources& t = side->threads_.emplace_back();
    FERRY_ASSIGN_OR_RETURN(t.channel, side->ctx_.createCompChannel());
    FERRY_ASSIGN_OR_RETURN(t.cq, side->ctx_.createCq({.cqe = cqe, .channel = &t.channel}));
    for (int qi = 0; qi < shape.qps; ++qi) {
      FERRY_ASSIGN_OR_RETURN(
          v::QueuePair qp,
          side->pd_.createQp(
              {.type = v::QpType::kRc,
               .sendCq = &t.cq,
               .recvCq = &t.cq,
               .cap = {.maxSendWr = maxSendWr, .maxRecvWr = maxRecvWr, .maxSendSge = 1, .maxRecvSge = 1}}));
      t.qpIndex[qp.qpNum()] = t.qps.size();
      t.qps.push_back(std::move(qp));
      t.recvPosted.push_back(0);
    }
    if (shape.sharedMemory) {
      // The region owns this memory (freed with it).
      FERRY_ASSIGN_OR_RETURN(t.mr, side->pd_.allocMr(bytes, v::access::kAll));
      t.buffer = static_cast<uint8_t*>(t.mr.addr());
      t.bufferSize = bytes;
      std::memset(t.buffer, 0, bytes);
      continue;
    }
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return ioError("cannot map a " + std::to_string(bytes) + "-byte buffer");
    t.buffer = static_cast<uint8_t*>(mem);
    t.bufferSize = bytes;
    t.bufferMapped = true;
    // Touch every page now, so no run pays for first-touch faults.
    std::memset(t.buffer, 0, bytes);
    FERRY_ASSIGN_OR_RETURN(t.mr, side->pd_.registerMemory(t.buffer, bytes, v::access::kAll));
  }
  return std::unique_ptr<BenchSide>(std::move(side));
}

VerbsSide::~VerbsSide() {
  (void)stopResponders();
  for (ThreadResources& t : threads_) {
    t.mr.close();
    for (auto& qp : t.qps) qp.close();
    t.cq.close();
    if (t.buffer && t.bufferMapped) munmap(t.buffer, t.bufferSize);
    t.buffer = nullptr;
  }
  pd_.close();
  ctx_.close();
}

Result<json::Array> VerbsSide::localPaths() {
  json::Array out;
  for (ThreadResources& t : threads_) {
    t.localPaths.clear();
    for (v::QueuePair& qp : t.qps) {
      v::Path path;
      // 1.07 s per try, 8.6 s with the 7 retries: a QP over TCP on a link that drops packets
      // waits out TCP's own recovery (a lost SYN is sent again after 1 s) instead of failing the
      // run with RETRY_EXC_ERR, as the default 67 ms per try (0.54 s in all) can. A peer that
      // stops answering is still caught by --timeout. The server takes this from the client's path.
      path.packetLifeTime = 18;
      FERRY_RETURN_IF_ERROR(v::fillPath(ctx_, qp, path));
      t.localPaths.push_back(path);
      FERRY_ASSIGN_OR_RETURN(json::Value value, json::parse(path.toJson()));
      out.push_back(std::move(value));
    }
  }
  return out;
}

namespace {

Result<v::Path> decodePath(const json::Value& value, size_t index) {
  if (!value.isObject()) {
    return Status(StatusCode::kProtocolError, "path " + std::to_string(index) + " is not a JSON object");
  }
  auto path = v::Path::fromJson(json::serialize(value));
  if (!path.isOk()) {
    return Status(StatusCode::kProtocolError,
                  "path " + std::to_string(index) + ": " + path.status().message());
  }
  return *path;
}

}  // namespace

Result<json::Array> VerbsSide::acceptPaths(const json::Array& peerPaths) {
  json::Array out;
  size_t index = 0;
  for (ThreadResources& t : threads_) {
    for (v::QueuePair& qp : t.qps) {
      if (index >= peerPaths.size()) return Status(StatusCode::kProtocolError, "too few paths");
      FERRY_ASSIGN_OR_RETURN(v::Path path, decodePath(peerPaths[index], index));
      path.reverse();
      FERRY_RETURN_IF_ERROR(v::fillPath(ctx_, qp, path));
      FERRY_RETURN_IF_ERROR(qp.establish(path, kRemoteAccess));
      FERRY_ASSIGN_OR_RETURN(json::Value value, json::parse(path.toJson()));
      out.push_back(std::move(value));
      ++index;
    }
  }
  return out;
}

Status VerbsSide::completePaths(const json::Array& peerPaths) {
  size_t index = 0;
  for (ThreadResources& t : threads_) {
    for (size_t q = 0; q < t.qps.size(); ++q) {
      if (index >= peerPaths.size()) return Status(StatusCode::kProtocolError, "too few paths");
      FERRY_ASSIGN_OR_RETURN(v::Path path, decodePath(peerPaths[index], index));
      path.reverse();
      const v::Path& mine = t.localPaths.at(q);
      if (path.sqpn != mine.sqpn || path.sgid != mine.sgid) {
        return Status(StatusCode::kProtocolError, "path " + std::to_string(index) +
                                                      " of the server names another QP than the one offered");
      }
      path.sqpsn = mine.sqpsn;
      FERRY_RETURN_IF_ERROR(t.qps[q].establish(path, kRemoteAccess));
      ++index;
    }
  }
  return Status::ok();
}

json::Array VerbsSide::bufferDescriptions() const {
  json::Array out;
  for (const ThreadResources& t : threads_) {
    json::Value b = json::Value::emptyObject();
    b.set("addr", static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.buffer)));
    b.set("rkey", static_cast<int64_t>(t.mr.rkey()));
    b.set("length", static_cast<int64_t>(t.bufferSize));
    out.push_back(std::move(b));
  }
  return out;
}

Status VerbsSide::setRemoteBuffers(const json::Array& buffers) {
  if (buffers.size() != threads_.size()) {
    return Status(StatusCode::kProtocolError, "expected " + std::to_string(threads_.size()) +
                                                  " buffers, got " + std::to_string(buffers.size()));
  }
  const int64_t need = static_cast<int64_t>(bufferBytes(shape_));
  for (size_t i = 0; i < buffers.size(); ++i) {
    const json::Value& b = buffers[i];
    if (!b.isObject())
      return Status(StatusCode::kProtocolError, "buffer " + std::to_string(i) + " is not an object");
    auto addr = controlFields(b).integer("addr", 1, std::numeric_limits<int64_t>::max());
    auto rkey = controlFields(b).integer("rkey", 0, 0xffffffffll);
    auto length = controlFields(b).integer("length", need, std::numeric_limits<int64_t>::max());
    for (const Status& st : {addr.status(), rkey.status(), length.status()}) {
      if (!st.isOk()) {
        std::string what = st.message();
        what = what.substr(std::min(what.size(), what.find("field")));
        return Status(StatusCode::kProtocolError, "buffer " + std::to_string(i) + " of the peer: " + what);
      }
    }
    if (*addr % 8 != 0)
      return Status(StatusCode::kProtocolError, "buffer " + std::to_string(i) + " is not 8-aligned");
    threads_[i].remote = {.addr = static_cast<uint64_t>(*addr),
                          .rkey = static_cast<uint32_t>(*rkey),
                          .length = static_cast<uint64_t>(*length)};
  }
  return Status::ok();
}

Result<json::Value> VerbsSide::clientHello() {
  json::Value hello = json::Value::emptyObject();
  FERRY_ASSIGN_OR_RETURN(json::Array paths, localPaths());
  hello.set("paths", std::move(paths));
  hello.set("buffers", bufferDescriptions());
  return hello;
}

Result<json::Value> VerbsSide::serverHello(const json::Value& clientHello) {
  const size_t qpCount = static_cast<size_t>(shape_.threads * shape_.qps);
  FERRY_ASSIGN_OR_RETURN(const json::Array* peerPaths,
                         controlFields(clientHello).exactArray("paths", qpCount));
  FERRY_ASSIGN_OR_RETURN(
      const json::Array* peerBuffers,
      controlFields(clientHello).exactArray("buffers", static_cast<size_t>(shape_.threads)));
  FERRY_RETURN_IF_ERROR(setRemoteBuffers(*peerBuffers));
  FERRY_ASSIGN_OR_RETURN(json::Array paths, acceptPaths(*peerPaths));
  json::Value reply = json::Value::emptyObject();
  reply.set("paths", std::move(paths));
  reply.set("buffers", bufferDescriptions());
  return reply;
}

Status VerbsSide::finishHello(const json::Value& serverHello) {
  const size_t qpCount = static_cast<size_t>(shape_.threads * shape_.qps);
  FERRY_ASSIGN_OR_RETURN(const json::Array* paths, controlFields(serverHello).exactArray("paths", qpCount));
  FERRY_ASSIGN_OR_RETURN(
      const json::Array* buffers,
      controlFields(serverHello).exactArray("buffers", static_cast<size_t>(shape_.threads)));
  FERRY_RETURN_IF_ERROR(setRemoteBuffers(*buffers));
  return completePaths(*paths);
}

Status VerbsSide::finishRun(const json::Value& done, double stallTimeout, json::Value& result) {
  return stopResponders();
}

Status VerbsSide::postReceives(ThreadResources& t, size_t qp, uint32_t count) {
  if (count == 0) return Status::ok();
  v::Sge sge{.addr = reinterpret_cast<uintptr_t>(t.buffer + landingOffset(shape_)),
             .length = static_cast<uint32_t>(std::min<uint64_t>(shape_.maxSize, UINT32_MAX)),
             .lkey = t.mr.lkey()};
  std::vector<v::RecvWr> wrs(count,
                             v::RecvWr{.wrId = kRecvTag | qp, .sgList = std::span<const v::Sge>(&sge, 1)});
  FERRY_RETURN_IF_ERROR(t.qps[qp].postRecv(wrs));
  t.recvPosted[qp] += count;
  return Status::ok();
}

Status VerbsSide::topUpReceives(ThreadResources& t) {
  for (size_t q = 0; q < t.qps.size(); ++q) {
    FERRY_RETURN_IF_ERROR(postReceives(t, q, maxRecvWr_ - t.recvPosted[q]));
  }
  return Status::ok();
}

Status VerbsSide::measure(const RunSpec& spec, RunControl& control, RunMeasurement* out) {
  const size_t n = threads_.size();
  std::vector<ThreadOutcome> outcomes(n);
  std::vector<std::thread> workers;
  workers.reserve(n);
  for (size_t ti = 0; ti < n; ++ti) {
    workers.emplace_back([this, ti, &spec, &control, &outcomes] {
      ThreadResources& t = threads_[ti];
      ThreadOutcome& o = outcomes[ti];
      uint64_t seq = 0;
      auto run = [&](LoopArgs& a, uint64_t* iterations) -> Status {
        if (shape_.mode == Mode::kBandwidth) return bandwidthLoop(a, iterations);
        if (shape_.op == Op::kWrite) return writePingPong(a, iterations);
        if (shape_.op == Op::kRead || shape_.op == Op::kAtomic) return postToCompletion(a, iterations);
        return receivePingPong(a, iterations, [&](size_t q) { return postReceives(t, q, 1); });
      };
      auto body = [&]() -> Status {
        if (isPingPong(shape_)) storeByte(t.buffer + landingOffset(shape_) + spec.size - 1, 0);
        if (needsReceives(shape_) && shape_.mode == Mode::kLatency) FERRY_RETURN_IF_ERROR(topUpReceives(t));
        LoopArgs a;
        a.t = &t;
        a.shape = &shape_;
        a.size = spec.size;
        a.count = spec.warmup;
        a.stall = spec.stallTimeout;
        a.control = &control;
        a.seq = &seq;
        uint64_t warm = 0;
        FERRY_RETURN_IF_ERROR(warmUp(spec, control, [&] { return run(a, &warm); }));
        control.warmedUp.fetch_add(1);
        while (!control.go.load()) {
          if (control.abort.load()) return Status(StatusCode::kCancelled, "run aborted");
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        o.samplesUs.reserve(spec.duration > 0 ? 1 << 16 : spec.iters);
        a.count = spec.duration > 0 ? std::numeric_limits<uint64_t>::max() : spec.iters;
        a.progress = control.done[ti].get();
        a.samples = shape_.mode == Mode::kLatency ? &o.samplesUs : nullptr;
        a.callSeconds = shape_.callTime ? &o.callSeconds : nullptr;
        o.start = Clock::now();
        if (spec.duration > 0) {
          a.stopAt = o.start + std::chrono::microseconds(static_cast<int64_t>(spec.duration * 1e6));
        }
        Status st = run(a, &o.iterations);
        o.end = Clock::now();
        return st;
      };
      o.status = body();
      if (!o.status.isOk()) control.abort.store(true);
    });
  }
  for (auto& w : workers) w.join();
  // The first real error, not the cancellations it caused in the other threads.
  for (const ThreadOutcome& o : outcomes) {
    if (!o.status.isOk() && o.status.code() != StatusCode::kCancelled) return o.status;
  }
  for (const ThreadOutcome& o : outcomes) {
    if (!o.status.isOk()) return o.status;
  }
  RunMeasurement m;
  Clock::time_point first = outcomes[0].start, last = outcomes[0].end;
  for (ThreadOutcome& o : outcomes) {
    m.iterations += o.iterations;
    first = std::min(first, o.start);
    last = std::max(last, o.end);
    m.latencyUs.insert(m.latencyUs.end(), o.samplesUs.begin(), o.samplesUs.end());
    m.callSeconds += o.callSeconds;
  }
  m.seconds = std::chrono::duration<double>(last - first).count();
  std::sort(m.latencyUs.begin(), m.latencyUs.end());
  *out = std::move(m);
  return Status::ok();
}

Status VerbsSide::startResponders(uint64_t size, double stallTimeout) {
  (void)stallTimeout;
  FERRY_RETURN_IF_ERROR(stopResponders());
  if (size < 1 || size > shape_.maxSize) {
    return Status(StatusCode::kProtocolError, "run size " + std::to_string(size) + " is outside [1, " +
                                                  std::to_string(shape_.maxSize) + "] agreed in the hello");
  }
  const bool pingPong = isPingPong(shape_);
  const bool receives = needsReceives(shape_);
  if (!pingPong && !receives) return Status::ok();
  for (ThreadResources& t : threads_) {
    if (pingPong) storeByte(t.buffer + landingOffset(shape_) + size - 1, 0);
    if (receives) FERRY_RETURN_IF_ERROR(topUpReceives(t));
  }
  stopResponders_.store(false);
  responderStatus_.assign(threads_.size(), Status::ok());
  for (size_t ti = 0; ti < threads_.size(); ++ti) {
    responders_.emplace_back([this, ti, size, pingPong] {
      ThreadResources& t = threads_[ti];
      SendTracker tracker(t, nullptr);
      const size_t nq = t.qps.size();
      uint32_t empty = 0;
      auto body = [&]() -> Status {
        if (pingPong && shape_.op == Op::kWrite) {
          // Answer ping k with pong k: wait for the marker in the landing half, write it back.
          uint8_t* mark = t.buffer + size - 1;
          const uint8_t* landing = t.buffer + landingOffset(shape_) + size - 1;
          v::Sge sge{.addr = reinterpret_cast<uintptr_t>(t.buffer),
                     .length = static_cast<uint32_t>(size),
                     .lkey = t.mr.lkey()};
          LandingWait wait;  // as the client waits for its pong
          for (uint64_t k = 0;; ++k) {
            uint8_t value = marker(k);
            empty = 0;
            while (!wait.look(landing, value)) {
              if (stopResponders_.load(std::memory_order_relaxed)) return Status::ok();
              auto got = tracker.reap();
              if (!got.isOk()) return got.status();
              afterEmptyPoll(shape_, empty);
            }
            size_t q = k % nq;
            while (tracker.outstanding(q) >= 8) {
              auto got = tracker.reap();
              if (!got.isOk()) return got.status();
              if (stopResponders_.load(std::memory_order_relaxed)) return Status::ok();
              if (*got == 0) afterEmptyPoll(shape_, empty);
            }
            storeByte(mark, value);
            FERRY_RETURN_IF_ERROR(t.qps[q].postSend(makeWr(t, shape_, &sge, SendTracker::wrId(q, 1),
                                                           v::send_flags::kSignaled, landingOffset(shape_))));
            ++tracker.outstanding(q);
          }
        }
        // Receives: repost each one consumed; in a ping-pong also answer it on its QP.
        v::Sge sge{.addr = reinterpret_cast<uintptr_t>(t.buffer),
                   .length = static_cast<uint32_t>(size),
                   .lkey = t.mr.lkey()};
        auto onReceive = [&](const v::WorkCompletion& wc) -> Status {
          auto it = t.qpIndex.find(wc.qpNum);
          if (it == t.qpIndex.end())
            return Status(StatusCode::kInternal, "a receive completed on an unknown QP");
          size_t q = it->second;
          --t.recvPosted[q];
          FERRY_RETURN_IF_ERROR(postReceives(t, q, 1));
          if (!pingPong) return Status::ok();
          FERRY_RETURN_IF_ERROR(t.qps[q].postSend(makeWr(t, shape_, &sge, SendTracker::wrId(q, 1),
                                                         v::send_flags::kSignaled, landingOffset(shape_))));
          ++tracker.outstanding(q);
          return Status::ok();
        };
        while (!stopResponders_.load(std::memory_order_relaxed)) {
          auto got = shape_.events ? tracker.reapOrSleep(onReceive) : tracker.reap(onReceive);
          if (!got.isOk()) return got.status();
          if (*got > 0) {
            empty = 0;
          } else if (!shape_.events) {
            afterEmptyPoll(shape_, empty);
          }
        }
        return Status::ok();
      };
      responderStatus_[ti] = body();
    });
  }
  return Status::ok();
}

Status VerbsSide::stopResponders() {
  stopResponders_.store(true);
  for (auto& r : responders_) r.join();
  responders_.clear();
  Status first;
  for (const Status& st : responderStatus_) {
    if (!st.isOk() && first.isOk()) first = st;
  }
  responderStatus_.clear();
  return first;
}

}  // namespace ferry::cli::bench
