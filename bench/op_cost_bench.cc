// ferry_op_cost_bench: what one small operation costs in software on each of the soft provider's
// paths, with one thread driving both ends of a connected pair inside this process. No second core
// and no scheduler sits in these figures (as they do in `ferry bench --mode lat`'s ping-pongs, whose
// medians swing with where each side's thread runs): they are the instructions, locks and system
// calls of a post and of the polls that carry it out, so that a change to the data path can be
// weighed in one run against the binary before it. Nothing here asserts a time.
//
//   ferry_op_cost_bench [--ops LIST] [--iters N] [--rounds R] [--size BYTES] [--json]
//
//   --ops     comma list of (default: all of them)
//             mapped-write  8 B WRITE into memory both sides map (ProtectionDomain::allocMr), post and
//                           poll its completion: loads and stores inside the post
//             heap-write    the same into registered heap memory: one cross-memory-attach call
//             mapped-atomic fetch-and-add on memory both sides map, post and poll
//             ring-send     a SEND ping-pong over the same-host rings: a SENDs, b's poll takes it
//                           and b posts its receive again and SENDs back, a's poll takes that; the
//                           send completions and ACKs are taken by the polls as they come
//             tcp-send      the same over TCP on loopback (FERRY_SOFT_SAME_HOST=0)
//             tcp-write     a WRITE ping-pong over TCP: each side polls its CQ (its progress) until
//                           the peer's WRITE has landed its last byte, then WRITEs back
//             empty-poll    one poll of a CQ that holds nothing, on a context with a ring connection
//                           (set up by a few SENDs): what a waiting application pays per look, and
//                           so how late, on average, it sees a message that came in meanwhile
//   --iters   operations per round (default 20000); --rounds rounds per op (default 11), the ops
//             interleaved round by round so drift hits each alike
//   --size    message bytes (default 8)
//
// Each row gives the median, lowest and highest of the rounds' wall time per operation (for the
// ping-pongs, a round trip: two messages), and the process's CPU time per operation (the progress
// threads' share included: a hand-off to them shows).
// Exit codes: 0 done; 1 a failure (printed); 2 bad options.
#include <getopt.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/common/status.h"
#include "ferry/devices.h"
#include "ferry/verbs/path.h"
#include "ferry/verbs/verbs.h"

namespace {

namespace v = ferry::verbs;
using ferry::Result;
using ferry::Status;
using ferry::StatusCode;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kAccess = v::access::kAll;
constexpr std::chrono::seconds kWaitLimit{10};

struct Options {
  std::vector<std::string> ops{"mapped-write", "heap-write", "mapped-atomic", "ring-send",
                               "tcp-send",     "tcp-write",  "empty-poll"};
  uint64_t iters = 20000;
  int rounds = 11;
  uint32_t size = 8;
  bool json = false;
};

// One end: its own context (a device instance of its own, as a peer process would have), PD, CQ,
// QP and a region of 4 KiB.
struct End {
  v::Context ctx;
  v::ProtectionDomain pd;
  v::CompletionQueue cq;
  v::QueuePair qp;
  v::MemoryRegion mr;
  std::vector<uint8_t> heap;
  uint8_t* buf = nullptr;
  int outstanding = 0;  // signaled send requests not completed yet
};

constexpr size_t kRegion = 4096;

Status openEnd(End& e, bool mapped) {
  FERRY_ASSIGN_OR_RETURN(e.ctx, ferry::openDevice("soft_lo"));
  FERRY_ASSIGN_OR_RETURN(e.pd, e.ctx.allocPd());
  FERRY_ASSIGN_OR_RETURN(e.cq, e.ctx.createCq({.cqe = 256}));
  FERRY_ASSIGN_OR_RETURN(
      e.qp, e.pd.createQp({.type = v::QpType::kRc,
                           .sendCq = &e.cq,
                           .recvCq = &e.cq,
                           .cap = {.maxSendWr = 64, .maxRecvWr = 64, .maxSendSge = 1, .maxRecvSge = 1}}));
  if (mapped) {
    FERRY_ASSIGN_OR_RETURN(e.mr, e.pd.allocMr(kRegion, kAccess));
    e.buf = static_cast<uint8_t*>(e.mr.addr());
  } else {
    e.heap.assign(kRegion, 0);
    e.buf = e.heap.data();
    FERRY_ASSIGN_OR_RETURN(e.mr, e.pd.registerMemory(e.buf, kRegion, kAccess));
  }
  return Status::ok();
}

Status connect(End& a, End& b) {
  v::Path pa, pb;
  FERRY_RETURN_IF_ERROR(v::fillPath(a.ctx, a.qp, pa));
  FERRY_RETURN_IF_ERROR(v::fillPath(b.ctx, b.qp, pb));
  v::Path towardB = pb;
  towardB.reverse();
  FERRY_RETURN_IF_ERROR(v::fillPath(a.ctx, a.qp, towardB));
  towardB.sqpsn = pa.sqpsn;
  v::Path towardA = pa;
  towardA.reverse();
  FERRY_RETURN_IF_ERROR(v::fillPath(b.ctx, b.qp, towardA));
  towardA.sqpsn = pb.sqpsn;
  FERRY_RETURN_IF_ERROR(a.qp.establish(towardB, kAccess));
  return b.qp.establish(towardA, kAccess);
}

// One end's CQ, polled: every completion must succeed; the receives and send completions it holds
// are counted.
struct Reaped {
  int receives = 0;
  int sends = 0;
};
Status take(v::CompletionQueue& cq, Reaped* got) {
  v::WorkCompletion wc[16];
  FERRY_ASSIGN_OR_RETURN(int n, cq.poll(std::span<v::WorkCompletion>(wc, 16)));
  for (int i = 0; i < n; ++i) {
    if (wc[i].status != v::WcStatus::kSuccess) {
      return Status(StatusCode::kIoError,
                    std::string("a completion failed: ") + v::wcStatusName(wc[i].status));
    }
    (wc[i].opcode == v::WcOpcode::kRecv ? got->receives : got->sends) += 1;
  }
  return Status::ok();
}

// Gives up after kWaitLimit (checked every 1024 looks).
class Deadline {
 public:
  Status check() {
    if (++looks_ % 1024 != 0 || Clock::now() < limit_) return Status::ok();
    return Status(StatusCode::kTimedOut, "nothing arrived within 10 s");
  }

 private:
  Clock::time_point limit_ = Clock::now() + kWaitLimit;
  uint32_t looks_ = 0;
};

// One operation kind, set up once, run in rounds.
class Op {
 public:
  enum class Shape { kPostAndPoll, kSendPingPong, kWritePingPong, kEmptyPoll };
  Op(std::string name, std::string sameHost, bool mapped, v::WrOpcode opcode, Shape shape)
      : name_(std::move(name)),
        sameHost_(std::move(sameHost)),
        mapped_(mapped),
        opcode_(opcode),
        shape_(shape) {}

  const std::string& name() const { return name_; }

  Status setUp(uint32_t size) {
    size_ = size;
    if (sameHost_.empty()) {
      ::unsetenv("FERRY_SOFT_SAME_HOST");
    } else {
      ::setenv("FERRY_SOFT_SAME_HOST", sameHost_.c_str(), 1);
    }
    FERRY_RETURN_IF_ERROR(openEnd(a_, mapped_));
    FERRY_RETURN_IF_ERROR(openEnd(b_, mapped_));
    FERRY_RETURN_IF_ERROR(connect(a_, b_));
    ::unsetenv("FERRY_SOFT_SAME_HOST");
    if (shape_ == Shape::kSendPingPong || shape_ == Shape::kEmptyPoll) {
      for (int i = 0; i < 16; ++i) {
        FERRY_RETURN_IF_ERROR(postRecv(a_));
        FERRY_RETURN_IF_ERROR(postRecv(b_));
      }
    }
    // The first operations open connections and map memory: not part of any round.
    for (int i = 0; i < 200; ++i) {
      FERRY_RETURN_IF_ERROR(shape_ == Shape::kEmptyPoll ? sendRoundTrip() : once());
    }
    if (shape_ == Shape::kEmptyPoll) {  // nothing left to complete: b's polls find nothing
      FERRY_RETURN_IF_ERROR(settle(a_, 1));
      FERRY_RETURN_IF_ERROR(settle(b_, 1));
    }
    return Status::ok();
  }

  // `iters` operations; the wall and process CPU seconds they took.
  Status round(uint64_t iters, double* wall, double* cpu) {
    const double cpu0 = processCpu();
    const auto t0 = Clock::now();
    for (uint64_t i = 0; i < iters; ++i) FERRY_RETURN_IF_ERROR(once());
    *wall = std::chrono::duration<double>(Clock::now() - t0).count();
    *cpu = processCpu() - cpu0;
    return Status::ok();
  }

  void tearDown() {
    for (End* e : {&b_, &a_}) {
      e->qp.close();
      e->mr.close();
      e->cq.close();
      e->pd.close();
      e->ctx.close();
    }
  }

 private:
  // Half of each region is where the peer's messages land; the other half is sent from.
  static constexpr size_t kLanding = kRegion / 2;

  static double processCpu() {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  }

  Status postRecv(End& e) {
    v::Sge sge{.addr = reinterpret_cast<uintptr_t>(e.buf + kLanding), .length = size_, .lkey = e.mr.lkey()};
    v::RecvWr wr;
    wr.wrId = 2;
    wr.sgList = std::span<const v::Sge>(&sge, 1);
    return e.qp.postRecv(wr);
  }

  Status post(End& from, End& to) {
    v::Sge sge{.addr = reinterpret_cast<uintptr_t>(from.buf), .length = size_, .lkey = from.mr.lkey()};
    v::SendWr wr;
    wr.wrId = 1;
    wr.opcode = opcode_;
    wr.sendFlags = v::send_flags::kSignaled;
    wr.sgList = std::span<const v::Sge>(&sge, 1);
    const uintptr_t target =
        reinterpret_cast<uintptr_t>(to.buf) + (shape_ == Shape::kPostAndPoll ? 0 : kLanding);
    if (opcode_ == v::WrOpcode::kAtomicFetchAndAdd) {
      wr.atomic = {.remoteAddr = target, .compareAdd = 1, .swap = 0, .rkey = to.mr.rkey()};
    } else {
      wr.rdma = {.remoteAddr = target, .rkey = to.mr.rkey()};
    }
    FERRY_RETURN_IF_ERROR(from.qp.postSend(wr));
    ++from.outstanding;
    return Status::ok();
  }

  // `from` sends its message; `to` polls until it has it (and posts its receive again).
  Status pass(End& from, End& to) {
    uint8_t mark = 0;
    if (shape_ == Shape::kWritePingPong) {
      mark = static_cast<uint8_t>(++seq_ % 255 + 1);
      from.buf[size_ - 1] = mark;
    }
    FERRY_RETURN_IF_ERROR(post(from, to));
    Deadline deadline;
    for (;;) {
      Reaped got;
      FERRY_RETURN_IF_ERROR(take(to.cq, &got));
      to.outstanding -= got.sends;
      if ((shape_ == Shape::kSendPingPong || shape_ == Shape::kEmptyPoll) && got.receives > 0) {
        if (got.receives > 1) return Status(StatusCode::kInternal, "more receives than SENDs");
        return postRecv(to);
      }
      if (shape_ == Shape::kWritePingPong &&
          __atomic_load_n(to.buf + kLanding + size_ - 1, __ATOMIC_ACQUIRE) == mark) {
        return Status::ok();
      }
      FERRY_RETURN_IF_ERROR(deadline.check());
    }
  }

  // Takes the completions of `e`'s own requests until fewer than `most` are outstanding.
  Status settle(End& e, int most) {
    Deadline deadline;
    while (e.outstanding >= most) {
      Reaped got;
      FERRY_RETURN_IF_ERROR(take(e.cq, &got));
      e.outstanding -= got.sends;
      if (got.receives > 0) return Status(StatusCode::kInternal, "a receive nothing was sent for");
      FERRY_RETURN_IF_ERROR(deadline.check());
    }
    return Status::ok();
  }

  Status once() {
    if (shape_ == Shape::kPostAndPoll) {
      FERRY_RETURN_IF_ERROR(post(a_, b_));
      return settle(a_, 1);
    }
    if (shape_ == Shape::kEmptyPoll) {
      Reaped got;
      FERRY_RETURN_IF_ERROR(take(b_.cq, &got));
      if (got.receives + got.sends != 0)
        return Status(StatusCode::kInternal, "a completion nothing was posted for");
      return Status::ok();
    }
    return sendRoundTrip();
  }

  // A round trip; each side's completions are taken as its polls come upon them, and its send
  // queue never holds more than a few.
  Status sendRoundTrip() {
    FERRY_RETURN_IF_ERROR(pass(a_, b_));
    FERRY_RETURN_IF_ERROR(pass(b_, a_));
    FERRY_RETURN_IF_ERROR(settle(a_, 8));
    return settle(b_, 8);
  }

  std::string name_;
  std::string sameHost_;  // FERRY_SOFT_SAME_HOST while connecting; empty: unset (the default)
  bool mapped_;
  v::WrOpcode opcode_;
  Shape shape_;
  uint32_t size_ = 8;
  uint64_t seq_ = 0;
  End a_, b_;
};

std::unique_ptr<Op> makeOp(const std::string& name) {
  using S = Op::Shape;
  if (name == "mapped-write")
    return std::make_unique<Op>(name, "", true, v::WrOpcode::kRdmaWrite, S::kPostAndPoll);
  if (name == "heap-write")
    return std::make_unique<Op>(name, "", false, v::WrOpcode::kRdmaWrite, S::kPostAndPoll);
  if (name == "mapped-atomic") {
    return std::make_unique<Op>(name, "", true, v::WrOpcode::kAtomicFetchAndAdd, S::kPostAndPoll);
  }
  if (name == "ring-send") return std::make_unique<Op>(name, "", false, v::WrOpcode::kSend, S::kSendPingPong);
  if (name == "tcp-send") return std::make_unique<Op>(name, "0", false, v::WrOpcode::kSend, S::kSendPingPong);
  if (name == "tcp-write")
    return std::make_unique<Op>(name, "0", false, v::WrOpcode::kRdmaWrite, S::kWritePingPong);
  if (name == "empty-poll") return std::make_unique<Op>(name, "", false, v::WrOpcode::kSend, S::kEmptyPoll);
  return nullptr;
}

int usage(const char* why) {
  std::fprintf(stderr,
               "ferry_op_cost_bench: %s\nusage: ferry_op_cost_bench [--ops LIST] [--iters N] [--rounds R] "
               "[--size BYTES] [--json]\n",
               why);
  return 2;
}

bool parseCount(const char* text, uint64_t lo, uint64_t hi, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || value < lo || value > hi) return false;
  *out = value;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  static const option longOpts[] = {{"ops", required_argument, nullptr, 'o'},
                                    {"iters", required_argument, nullptr, 'i'},
                                    {"rounds", required_argument, nullptr, 'r'},
                                    {"size", required_argument, nullptr, 's'},
                                    {"json", no_argument, nullptr, 'j'},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  int c;
  uint64_t value = 0;
  while ((c = getopt_long(argc, argv, "", longOpts, nullptr)) != -1) {
    switch (c) {
      case 'o': {
        opt.ops.clear();
        std::string list = optarg;
        size_t at = 0;
        while (at <= list.size()) {
          size_t comma = list.find(',', at);
          if (comma == std::string::npos) comma = list.size();
          std::string name = list.substr(at, comma - at);
          if (!makeOp(name)) return usage(("unknown op '" + name + "'").c_str());
          opt.ops.push_back(name);
          at = comma + 1;
        }
        break;
      }
      case 'i':
        if (!parseCount(optarg, 1, 100000000, &opt.iters)) return usage("--iters takes 1 to 100000000");
        break;
      case 'r':
        if (!parseCount(optarg, 1, 1000, &value)) return usage("--rounds takes 1 to 1000");
        opt.rounds = static_cast<int>(value);
        break;
      case 's':
        if (!parseCount(optarg, 1, 2048, &value)) return usage("--size takes 1 to 2048 bytes");
        opt.size = static_cast<uint32_t>(value);
        break;
      case 'j': opt.json = true; break;
      case 'h': usage("what one small operation costs on each soft path"); return 0;
      default: return usage("bad option");
    }
  }
  if (optind != argc) return usage("unexpected argument");

  std::vector<std::unique_ptr<Op>> ops;
  for (const auto& name : opt.ops) {
    ops.push_back(makeOp(name));
    Status st = ops.back()->setUp(opt.size);
    if (!st.isOk()) {
      std::fprintf(stderr, "ferry_op_cost_bench: %s: %s\n", name.c_str(), st.toString().c_str());
      return 1;
    }
  }
  std::vector<std::vector<double>> wall(ops.size()), cpu(ops.size());
  for (int r = 0; r < opt.rounds; ++r) {
    for (size_t k = 0; k < ops.size(); ++k) {
      double w = 0, cs = 0;
      Status st = ops[k]->round(opt.iters, &w, &cs);
      if (!st.isOk()) {
        std::fprintf(stderr, "ferry_op_cost_bench: %s: %s\n", ops[k]->name().c_str(), st.toString().c_str());
        return 1;
      }
      wall[k].push_back(w * 1e9 / static_cast<double>(opt.iters));
      cpu[k].push_back(cs * 1e9 / static_cast<double>(opt.iters));
    }
  }
  for (auto& op : ops) op->tearDown();

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  if (opt.json) {
    std::printf("{\"op_cost_bench\": 1, \"size\": %u, \"iters\": %llu, \"rounds\": %d, \"ops\": [", opt.size,
                static_cast<unsigned long long>(opt.iters), opt.rounds);
    for (size_t k = 0; k < ops.size(); ++k) {
      std::printf(
          "%s{\"op\": \"%s\", \"wall_ns_median\": %.1f, \"wall_ns_min\": %.1f, \"wall_ns_max\": %.1f, "
          "\"cpu_ns_median\": %.1f}",
          k ? ", " : "", ops[k]->name().c_str(), median(wall[k]),
          *std::min_element(wall[k].begin(), wall[k].end()),
          *std::max_element(wall[k].begin(), wall[k].end()), median(cpu[k]));
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("ferry_op_cost_bench: %u B, %d rounds of %llu operations each, one thread driving both ends\n",
              opt.size, opt.rounds, static_cast<unsigned long long>(opt.iters));
  std::printf("%-14s %12s %12s %12s %14s\n", "op", "wall ns/op", "lowest", "highest", "CPU ns/op");
  for (size_t k = 0; k < ops.size(); ++k) {
    std::printf("%-14s %12.1f %12.1f %12.1f %14.1f\n", ops[k]->name().c_str(), median(wall[k]),
                *std::min_element(wall[k].begin(), wall[k].end()),
                *std::max_element(wall[k].begin(), wall[k].end()), median(cpu[k]));
  }
  return 0;
}
