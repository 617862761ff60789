// `ferry demo`: the main job in one command. The initiator (this process) starts a target process,
// the two swap their QP paths and memory keys over the target's stdin/stdout, then the initiator
// moves the buffer with RDMA WRITE into the target's memory and back with RDMA READ. Both sides
// check every byte against a pattern neither could have had without the transfer.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "ferry/devices.h"
#include "ferry/verbs/path.h"
#include "ferry/verbs/verbs.h"

extern char** environ;

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;
namespace v = ferry::verbs;

constexpr size_t kChunk = 16u << 20;  // bytes per work request
constexpr int kDepth = 8;             // work requests in flight

// A pattern that depends on the seed and each 8-byte word's position.
uint64_t patternWord(uint64_t seed, uint64_t index) {
  uint64_t z = seed + index * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fillPattern(uint8_t* buf, size_t len, uint64_t seed) {
  auto* words = reinterpret_cast<uint64_t*>(buf);
  for (size_t i = 0; i < len / 8; ++i) words[i] = patternWord(seed, i);
}

// Offset of the first byte that differs from the pattern, or -1.
int64_t checkPattern(const uint8_t* buf, size_t len, uint64_t seed) {
  const auto* words = reinterpret_cast<const uint64_t*>(buf);
  for (size_t i = 0; i < len / 8; ++i) {
    if (words[i] != patternWord(seed, i)) return static_cast<int64_t>(i * 8);
  }
  return -1;
}

struct Side {
  v::Context ctx;
  v::ProtectionDomain pd;
  v::CompletionQueue cq;
  v::QueuePair qp;
  v::MemoryRegion mr;
  std::unique_ptr<uint8_t[]> buf;
  size_t size = 0;
};

bool fail(const char* who, const Status& st) {
  std::fprintf(stderr, "ferry demo (%s): %s\n", who, st.toString().c_str());
  return false;
}

bool setUp(Side& s, const std::string& device, size_t size, const char* who) {
  auto ctx = openDevice(device);
  if (!ctx.isOk()) return fail(who, ctx.status());
  s.ctx = std::move(*ctx);
  auto pd = s.ctx.allocPd();
  if (!pd.isOk()) return fail(who, pd.status());
  s.pd = std::move(*pd);
  auto cq = s.ctx.createCq({.cqe = 256});
  if (!cq.isOk()) return fail(who, cq.status());
  s.cq = std::move(*cq);
  auto qp = s.pd.createQp({.type = v::QpType::kRc,
                           .sendCq = &s.cq,
                           .recvCq = &s.cq,
                           .cap = {.maxSendWr = 64, .maxRecvWr = 64, .maxSendSge = 1, .maxRecvSge = 1}});
  if (!qp.isOk()) return fail(who, qp.status());
  s.qp = std::move(*qp);
  s.size = size;
  s.buf.reset(new (std::nothrow) uint8_t[size]);
  if (!s.buf) return fail(who, resourceExhausted("cannot allocate the buffer"));
  std::memset(s.buf.get(), 0, size);
  auto mr = s.pd.registerMemory(s.buf.get(), size,
                                v::access::kLocalWrite | v::access::kRemoteWrite | v::access::kRemoteRead);
  if (!mr.isOk()) return fail(who, mr.status());
  s.mr = std::move(*mr);
  return true;
}

bool readLine(FILE* in, std::string* line) {
  char buf[4096];
  if (!std::fgets(buf, sizeof buf, in)) return false;
  *line = buf;
  while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
  return true;
}

// ---- target: serves the initiator's commands on stdin/stdout ----
int runTarget(const std::string& device, size_t size) {
  Side s;
  if (!setUp(s, device, size, "target")) return 1;
  v::Path mine;
  Status st = v::fillPath(s.ctx, s.qp, mine);
  if (!st.isOk()) return fail("target", st), 1;
  std::printf("%s %" PRIu64 " %u\n", mine.toJson().c_str(), static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s.buf.get())),
              s.mr.rkey());
  std::fflush(stdout);
  std::string line;
  if (!readLine(stdin, &line)) return 1;
  auto peer = v::Path::fromJson(line);
  if (!peer.isOk()) return fail("target", peer.status()), 1;
  v::Path path = *peer;
  path.reverse();
  path.sgid = mine.sgid;
  path.sqpn = mine.sqpn;
  path.sqpsn = mine.sqpsn;
  st = s.qp.establish(path, v::access::kRemoteWrite | v::access::kRemoteRead);
  if (!st.isOk()) return fail("target", st), 1;
  std::printf("ready\n");
  std::fflush(stdout);
  while (readLine(stdin, &line)) {
    std::istringstream cmd(line);
    std::string verb;
    uint64_t seed = 0;
    cmd >> verb >> seed;
    if (verb == "check") {
      int64_t bad = checkPattern(s.buf.get(), s.size, seed);
      std::printf("%s %" PRId64 "\n", bad < 0 ? "ok" : "mismatch", bad);
    } else if (verb == "fill") {
      fillPattern(s.buf.get(), s.size, seed);
      std::printf("filled\n");
    } else if (verb == "quit") {
      std::printf("bye\n");
      std::fflush(stdout);
      return 0;
    } else {
      std::printf("unknown\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

// Moves the whole buffer with `opcode` in kChunk pieces, kDepth in flight. Returns seconds or <0.
double transfer(Side& s, v::WrOpcode opcode, uint64_t remoteAddr, uint32_t rkey) {
  auto start = Clock::now();
  size_t posted = 0;
  size_t completed = 0;
  size_t chunks = (s.size + kChunk - 1) / kChunk;
  int inFlight = 0;
  auto deadline = start + std::chrono::seconds(120);
  v::WorkCompletion wcs[16];
  while (completed < chunks) {
    while (posted < chunks && inFlight < kDepth) {
      size_t off = posted * kChunk;
      size_t len = std::min(kChunk, s.size - off);
      v::Sge sge = s.mr.sge(off, len);
      v::SendWr wr{.wrId = posted, .opcode = opcode, .sendFlags = v::send_flags::kSignaled,
                   .sgList = std::span<const v::Sge>(&sge, 1)};
      wr.rdma = {.remoteAddr = remoteAddr + off, .rkey = rkey};
      Status st = s.qp.postSend(wr);
      if (!st.isOk()) return fail("initiator", st), -1;
      ++posted;
      ++inFlight;
    }
    auto n = s.cq.poll(wcs);
    if (!n.isOk()) return fail("initiator", n.status()), -1;
    for (int i = 0; i < *n; ++i) {
      if (wcs[i].status != v::WcStatus::kSuccess) {
        std::fprintf(stderr, "ferry demo: work request %" PRIu64 " failed: %s\n", wcs[i].wrId,
                     v::wcStatusName(wcs[i].status));
        return -1;
      }
      ++completed;
      --inFlight;
    }
    if (*n == 0) {
      if (Clock::now() > deadline) return fail("initiator", Status(StatusCode::kTimedOut, "transfer took over 120 s")), -1;
      std::this_thread::yield();
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int runDemo(const std::vector<std::string>& args, const std::string& self) {
  std::string device = "soft_lo";
  std::string targetDevice;
  std::string via;
  size_t size = size_t{1} << 30;
  bool target = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--device" && i + 1 < args.size()) {
      device = args[++i];
    } else if (args[i] == "--target-device" && i + 1 < args.size()) {
      targetDevice = args[++i];
    } else if (args[i] == "--target-via" && i + 1 < args.size()) {
      via = args[++i];
    } else if (args[i] == "--size" && i + 1 < args.size()) {
      char* end = nullptr;
      size = std::strtoull(args[i + 1].c_str(), &end, 10);
      if (end == args[i + 1].c_str() || *end != '\0' || size < 8 || size % 8 != 0) {
        std::fprintf(stderr, "ferry demo: --size takes a byte count, a multiple of 8\n");
        return 2;
      }
      ++i;
    } else if (args[i] == "--target") {
      target = true;
    } else {
      std::fprintf(stderr, "ferry demo: unknown option '%s'\n", args[i].c_str());
      return 2;
    }
  }
  if (target) return runTarget(device, size);

  // Start the target with pipes on its stdin and stdout.
  int toTarget[2], fromTarget[2];
  if (pipe2(toTarget, O_CLOEXEC) != 0 || pipe2(fromTarget, O_CLOEXEC) != 0) {
    std::perror("ferry demo: pipe");
    return 1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, toTarget[0], 0);
  posix_spawn_file_actions_adddup2(&actions, fromTarget[1], 1);
  std::string sizeText = std::to_string(size);
  if (targetDevice.empty()) targetDevice = device;
  // The target may start through a launcher (e.g. "ip netns exec NS"): its words come first.
  std::vector<std::string> argvText;
  std::istringstream viaWords(via);
  for (std::string word; viaWords >> word;) argvText.push_back(word);
  std::string program = argvText.empty() ? self : argvText.front();
  for (std::string word : {self, std::string("demo"), std::string("--target"), std::string("--device"), targetDevice,
                           std::string("--size"), sizeText}) {
    argvText.push_back(word);
  }
  std::vector<char*> argv;
  for (auto& a : argvText) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    std::perror("ferry demo: cannot start the target process");
    return 1;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(toTarget[0]);
  close(fromTarget[1]);
  FILE* out = fdopen(toTarget[1], "w");
  FILE* in = fdopen(fromTarget[0], "r");
  auto finish = [&](int code) {
    std::fprintf(out, "quit\n");
    std::fflush(out);
    std::fclose(out);
    std::string line;
    while (readLine(in, &line)) {
    }
    std::fclose(in);
    int status = 0;
    waitpid(pid, &status, 0);
    return code;
  };

  std::printf("ferry demo: %s -> %s, two processes (initiator %d, target %d), %.2f GiB\n", device.c_str(),
              targetDevice.c_str(), static_cast<int>(getpid()), static_cast<int>(pid),
              static_cast<double>(size) / (1u << 30));
  Side s;
  if (!setUp(s, device, size, "initiator")) return finish(1);
  std::string line;
  if (!readLine(in, &line)) {
    std::fprintf(stderr, "ferry demo: the target process did not start\n");
    return finish(1);
  }
  std::istringstream hello(line);
  std::string peerJson;
  uint64_t remoteAddr = 0;
  uint32_t rkey = 0;
  hello >> peerJson >> remoteAddr >> rkey;
  auto peer = v::Path::fromJson(peerJson);
  if (!peer.isOk()) return fail("initiator", peer.status()), finish(1);
  v::Path path = *peer;
  path.reverse();
  Status st = v::fillPath(s.ctx, s.qp, path);
  if (!st.isOk()) return fail("initiator", st), finish(1);
  std::fprintf(out, "%s\n", path.toJson().c_str());
  std::fflush(out);
  st = s.qp.establish(path, 0);
  if (!st.isOk()) return fail("initiator", st), finish(1);
  if (!readLine(in, &line) || line != "ready") {
    std::fprintf(stderr, "ferry demo: the target could not connect\n");
    return finish(1);
  }

  const uint64_t writeSeed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  const uint64_t readSeed = writeSeed ^ 0x5a5a5a5a5a5a5a5aull;
  fillPattern(s.buf.get(), size, writeSeed);
  double writeSeconds = transfer(s, v::WrOpcode::kRdmaWrite, remoteAddr, rkey);
  if (writeSeconds < 0) return finish(1);
  std::fprintf(out, "check %" PRIu64 "\n", writeSeed);
  std::fflush(out);
  if (!readLine(in, &line) || line.rfind("ok", 0) != 0) {
    std::fprintf(stderr, "ferry demo: WRITE verification failed at the target: %s\n", line.c_str());
    return finish(1);
  }
  std::printf("  RDMA WRITE %.2f GiB in %.3f s: %.2f GB/s, verified by the target byte for byte\n",
              static_cast<double>(size) / (1u << 30), writeSeconds, static_cast<double>(size) / writeSeconds / 1e9);

  std::fprintf(out, "fill %" PRIu64 "\n", readSeed);
  std::fflush(out);
  if (!readLine(in, &line) || line != "filled") {
    std::fprintf(stderr, "ferry demo: the target could not fill its buffer\n");
    return finish(1);
  }
  std::memset(s.buf.get(), 0, size);
  double readSeconds = transfer(s, v::WrOpcode::kRdmaRead, remoteAddr, rkey);
  if (readSeconds < 0) return finish(1);
  int64_t bad = checkPattern(s.buf.get(), size, readSeed);
  if (bad >= 0) {
    std::fprintf(stderr, "ferry demo: READ data differs at offset %" PRId64 "\n", bad);
    return finish(1);
  }
  std::printf("  RDMA READ  %.2f GiB in %.3f s: %.2f GB/s, verified byte for byte\n",
              static_cast<double>(size) / (1u << 30), readSeconds, static_cast<double>(size) / readSeconds / 1e9);
  int code = finish(0);
  std::printf("ferry demo: done\n");
  return code;
}

}  // namespace ferry::cli
