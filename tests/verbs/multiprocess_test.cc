// Two-process verbs tests: this process against verbs_peer (a separate program, fork/exec'd), the
// two exchanging paths, addresses and keys over the peer's stdin/stdout as a real application would
// over its own channel. Covers byte-exact transfers both ways, what a requester sees when the
// peer process is killed or stopped mid-transfer or is not ready yet, and that a process whose peer
// was killed exits cleanly.
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;
namespace access = ferry::verbs::access;
using std::chrono::milliseconds;
using v::WcOpcode;
using v::WcStatus;
using v::WorkCompletion;
using v::WrOpcode;

constexpr size_t kMiB = 1024 * 1024;
constexpr milliseconds kPeerLossBound{5000};

std::string peerProgram() { return std::string(FERRY_TEST_BIN_DIR) + "/verbs_peer"; }

// One verbs_peer child: commands go to its stdin, one reply line per command comes from its stdout.
// The destructor kills (SIGKILL) and reaps it if it is still running.
class PeerProcess {
 public:
  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() { killAndReap(); }

  Status start() {
    const std::string program = peerProgram();
    int toChild[2] = {-1, -1};
    int fromChild[2] = {-1, -1};
    if (::pipe2(toChild, O_CLOEXEC) != 0) return ioError("pipe2");
    if (::pipe2(fromChild, O_CLOEXEC) != 0) {
      ::close(toChild[0]);
      ::close(toChild[1]);
      return ioError("pipe2");
    }
    char* const argv[] = {const_cast<char*>(program.c_str()), nullptr};
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) return ioError("fork");
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      ::dup2(toChild[0], STDIN_FILENO);
      ::dup2(fromChild[1], STDOUT_FILENO);
      ::execv(program.c_str(), argv);
      ::_exit(127);
    }
    pid_ = pid;
    ::close(toChild[0]);
    ::close(fromChild[1]);
    toPeer_ = toChild[1];
    fromPeer_ = fromChild[0];
    return Status::ok();
  }

  pid_t pid() const { return pid_; }

  // Sends one command; returns the text after "ok" or the peer's error.
  Result<std::string> call(const std::string& command, milliseconds timeout = kWaitTimeout) {
    const std::string line = command + "\n";
    size_t sent = 0;
    while (sent < line.size()) {
      const ssize_t n = ::write(toPeer_, line.data() + sent, line.size() - sent);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ioError("write to verbs_peer");
      sent += static_cast<size_t>(n);
    }
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const size_t newline = buffered_.find('\n');
      if (newline != std::string::npos) {
        std::string reply = buffered_.substr(0, newline);
        buffered_.erase(0, newline + 1);
        if (reply == "ok") return std::string();
        if (reply.rfind("ok ", 0) == 0) return reply.substr(3);
        return Status(StatusCode::kInternal, "verbs_peer '" + command.substr(0, 80) + "': " + reply);
      }
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0)
        return Status(StatusCode::kTimedOut, "no reply from verbs_peer to '" + command.substr(0, 80) + "'");
      pollfd p{.fd = fromPeer_, .events = POLLIN, .revents = 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(fromPeer_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status(StatusCode::kUnavailable, "verbs_peer exited");
      buffered_.append(chunk, static_cast<size_t>(n));
    }
  }

  void signal(int sig) const {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  // Waits up to timeout for the child to exit; true and its wait status when it did.
  bool reap(milliseconds timeout, int* waitStatus) {
    if (pid_ <= 0) return false;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      const pid_t done = ::waitpid(pid_, waitStatus, WNOHANG);
      if (done == pid_) {
        pid_ = -1;
        closePipes();
        return true;
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(milliseconds(2));
    }
  }

  // Waits until the child is stopped (after SIGSTOP).
  bool waitStopped(milliseconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG | WUNTRACED);
      if (done == pid_ && WIFSTOPPED(status)) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
  }

  void killAndReap() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    closePipes();
  }

 private:
  void closePipes() {
    if (toPeer_ >= 0) ::close(toPeer_);
    if (fromPeer_ >= 0) ::close(fromPeer_);
    toPeer_ = fromPeer_ = -1;
  }

  pid_t pid_ = -1;
  int toPeer_ = -1;
  int fromPeer_ = -1;
  std::string buffered_;
};

// A region of the peer, as its "mr" command describes it.
struct PeerRegion {
  int index = -1;
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t length = 0;
};

// A signaled request of `opcode` with the one SGE `local`, aimed at the peer's region at
// remoteOffset under its rkey: the request most cases here post.
SendOp peerRequest(WrOpcode opcode, uint64_t wrId, const v::Sge& local, const PeerRegion& remote,
                   uint64_t remoteOffset = 0) {
  return {.opcode = opcode,
          .wrId = wrId,
          .sges = {local},
          .remoteAddr = remote.addr + remoteOffset,
          .rkey = remote.rkey};
}

class CrossProcess : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // A write to the pipe of a peer that was just killed must fail, not kill the test.
    std::signal(SIGPIPE, SIG_IGN);
    ASSERT_EQ(::access(peerProgram().c_str(), X_OK), 0) << peerProgram() << ": " << std::strerror(errno);
    ASSERT_OK(peer_.start());
    ASSERT_TRUE(isOk(peer_.call("open " + providerPath().device)));
  }

  void TearDown() override {
    // On success the peer must shut down cleanly (closing its device does not hang); on failure,
    // or when a test already disposed of it, it is killed and reaped.
    if (peer_.pid() > 0 && !HasFailure()) {
      EXPECT_OK(peer_.call("exit"));
      int status = 0;
      EXPECT_TRUE(peer_.reap(kWaitTimeout, &status)) << "verbs_peer did not exit";
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "verbs_peer wait status " << status;
    }
    peer_.killAndReap();
    VerbsTest::TearDown();
  }

  // Creates this side's QP and one of the peer's, and connects them through the peer's pipe.
  void connect(Side& side, const LinkOptions& link = {}) {
    std::string peerCommand;
    ASSERT_NO_FATAL_FAILURE(exchangePaths(side, link, &peerCommand));
    ASSERT_OK(peer_.call(peerCommand));
    ASSERT_OK(side.qp.establish(side.path, kRemoteAccess));
  }

  // Creates this side's QP and one of the peer's and exchanges their paths: side.path is what this
  // side establishes with, *peerCommand what makes the peer establish its QP (sent when the test
  // wants: the verbs document's No-CM set-up has each side establish on its own time).
  void exchangePaths(Side& side, const LinkOptions& link, std::string* peerCommand) {
    ASSERT_OK(openSide(side, nullptr, 1024));
    ASSERT_OK(
        createQp(side, {.cap = {.maxSendWr = 256, .maxRecvWr = 256, .maxSendSge = 4, .maxRecvSge = 4}}));
    ASSERT_OK_AND_ASSIGN(std::string reply, peer_.call("qp"));
    std::istringstream in(reply);
    in >> peerQp_;
    std::string json;
    std::getline(in, json);
    ASSERT_OK_AND_ASSIGN(v::Path peerPath, v::Path::fromJson(json));
    ASSERT_OK_AND_ASSIGN(v::Path local, makeLocalPath(*side.context, side.qp));
    ASSERT_OK_AND_ASSIGN(side.path, pathTowardsPeer(*side.context, side.qp, local, peerPath, link));
    std::ostringstream command;
    command << "connect " << peerQp_ << " " << int(link.timeout) << " " << int(link.retries) << " "
            << int(link.rnrRetries) << " " << int(link.minRnrTimer) << " " << kRemoteAccess << " "
            << local.toJson();
    *peerCommand = command.str();
  }

  void peerRegion(size_t size, uint32_t accessFlags, uint64_t seed, PeerRegion* out) {
    ASSERT_OK_AND_ASSIGN(std::string reply,
                         peer_.call("mr " + std::to_string(size) + " " + std::to_string(accessFlags) + " " +
                                    std::to_string(seed)));
    std::istringstream in(reply);
    ASSERT_TRUE(static_cast<bool>(in >> out->index >> out->addr >> out->rkey >> out->length)) << reply;
    ASSERT_EQ(out->length, size);
  }

  // One 4 KiB WRITE from src into remote that completes: the connection to the peer is up.
  static void writeOnce(Side& side, const RegisteredBuffer& src, const PeerRegion& remote) {
    ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, 4096), remote)));
    WorkCompletion wc;
    ASSERT_TRUE(pollOne(side.sendCq, &wc));
    ASSERT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  }

  // Sends a command built from the arguments, separated by spaces.
  template <typename... Args>
  Result<std::string> peer(const Args&... args) {
    std::ostringstream command;
    ((command << args << ' '), ...);
    std::string text = command.str();
    text.pop_back();
    return peer_.call(text);
  }

  PeerProcess peer_;
  int peerQp_ = -1;
};

TEST_P(CrossProcess, TransfersAreByteExactBothWays) {
  Side side;
  ASSERT_NO_FATAL_FAILURE(connect(side));
  constexpr size_t kSize = 16 * kMiB;
  PeerRegion remote;
  ASSERT_NO_FATAL_FAILURE(peerRegion(kSize, access::kAll, 500, &remote));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, kSize, access::kLocalWrite, 501));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(side.pd, kSize, access::kLocalWrite, 502));
  WorkCompletion wc;

  // WRITE 16 MiB into the peer.
  ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaWrite, 1, sgeOf(src, 0, kSize), remote)));
  ASSERT_TRUE(pollOne(side.sendCq, &wc));
  EXPECT_TRUE(wc.status == WcStatus::kSuccess && wc.wrId == 1) << describe(wc);
  EXPECT_OK(peer("check", remote.index, 0, kSize, 501));

  // READ 16 MiB back after the peer rewrote it.
  ASSERT_OK(peer("fill", remote.index, 0, kSize, 503));
  ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaRead, 2, sgeOf(dst, 0, kSize), remote)));
  ASSERT_TRUE(pollOne(side.sendCq, &wc));
  EXPECT_TRUE(wc.status == WcStatus::kSuccess && wc.wrId == 2) << describe(wc);
  EXPECT_TRUE(matchesPattern(bytesOf(dst), 503));

  // SEND 1 MiB into a posted receive.
  ASSERT_OK(peer("recv", peerQp_, 7, remote.index, 0, 2 * kMiB));
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 0, kMiB)}}));
  ASSERT_TRUE(pollOne(side.sendCq, &wc));
  EXPECT_TRUE(wc.status == WcStatus::kSuccess && wc.wrId == 3) << describe(wc);
  ASSERT_OK_AND_ASSIGN(std::string received, peer("poll", "recv", 1, 10000));
  EXPECT_EQ(received, "7:SUCCESS:RECV:1048576:0");
  EXPECT_OK(peer("check", remote.index, 0, kMiB, 501));
  EXPECT_OK(peer("check", remote.index, kMiB, kMiB, 503)) << "past the message";

  // WRITE_WITH_IMM: data plus the immediate in a receive.
  ASSERT_OK(peer("recv", peerQp_, 8, remote.index, 0, 16));
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kRdmaWriteWithImm,
                           .wrId = 4,
                           .sges = {sgeOf(src, 0, 4096)},
                           .remoteAddr = remote.addr + 8 * kMiB,
                           .rkey = remote.rkey,
                           .imm = 2748}));
  ASSERT_TRUE(pollOne(side.sendCq, &wc));
  EXPECT_TRUE(wc.status == WcStatus::kSuccess && wc.wrId == 4) << describe(wc);
  ASSERT_OK_AND_ASSIGN(received, peer("poll", "recv", 1, 10000));
  EXPECT_EQ(received, "8:SUCCESS:RECV_RDMA_WITH_IMM:4096:2748");
  EXPECT_OK(peer("check", remote.index, 8 * kMiB, 4096, 501, 0));

  // Atomics on the peer's memory.
  ASSERT_OK(peer("set64", remote.index, 64, 100));
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kAtomicFetchAndAdd,
                           .wrId = 5,
                           .sges = {sgeOf(dst, 0, 8)},
                           .remoteAddr = remote.addr + 64,
                           .rkey = remote.rkey,
                           .compareAdd = 5}));
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kAtomicCmpAndSwp,
                           .wrId = 6,
                           .sges = {sgeOf(dst, 8, 8)},
                           .remoteAddr = remote.addr + 64,
                           .rkey = remote.rkey,
                           .compareAdd = 105,
                           .swap = 7}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(side.sendCq, 2, &completions));
  EXPECT_TRUE(completions[0].status == WcStatus::kSuccess && completions[0].opcode == WcOpcode::kFetchAdd)
      << describe(completions[0]);
  EXPECT_TRUE(completions[1].status == WcStatus::kSuccess && completions[1].opcode == WcOpcode::kCompSwap)
      << describe(completions[1]);
  uint64_t fetched = 0, compared = 0;
  std::memcpy(&fetched, dst.data(), 8);
  std::memcpy(&compared, dst.data() + 8, 8);
  EXPECT_EQ(fetched, 100u);
  EXPECT_EQ(compared, 105u);
  ASSERT_OK_AND_ASSIGN(std::string value, peer("get64", remote.index, 64));
  EXPECT_EQ(value, "7");
}

TEST_P(CrossProcess, PeerReadsAndWritesAnIdleProcess) {
  // This process only registers memory: its provider serves the peer's requests on its own.
  Side side;
  ASSERT_NO_FATAL_FAILURE(connect(side));
  constexpr size_t kSize = 4 * kMiB;
  ASSERT_OK_AND_ASSIGN(auto target, registerBuffer(side.pd, 2 * kSize, access::kAll, 510));
  PeerRegion remote;
  ASSERT_NO_FATAL_FAILURE(peerRegion(2 * kSize, access::kAll, 511, &remote));
  ASSERT_OK(peer("post", peerQp_, "write", 1, remote.index, 0, kSize, target.address(), target.mr.rkey()));
  ASSERT_OK(
      peer("post", peerQp_, "read", 2, remote.index, kSize, kSize, target.address(kSize), target.mr.rkey()));
  ASSERT_OK_AND_ASSIGN(std::string done, peer("poll", "send", 2, 10000));
  std::istringstream in(done);
  std::string first, second;
  in >> first >> second;
  // wr_id:STATUS:OPCODE:byte_len:imm; a WRITE's byte_len is undefined, a READ's is what was read.
  EXPECT_EQ(first.rfind("1:SUCCESS:RDMA_WRITE:", 0), 0u) << done;
  EXPECT_EQ(second, "2:SUCCESS:RDMA_READ:" + std::to_string(kSize) + ":0") << done;
  EXPECT_TRUE(matchesPattern(bytesOf(target, 0, kSize), 511, 0));
  EXPECT_OK(peer("check", remote.index, kSize, kSize, 510, kSize));
}

TEST_P(CrossProcess, KilledPeerFailsOutstandingWritesQuickly) {
  Side side;
  ASSERT_NO_FATAL_FAILURE(connect(side, {.timeout = 14, .retries = 2}));
  constexpr size_t kChunk = 4 * kMiB;
  constexpr uint64_t kCount = 64;
  PeerRegion remote;
  ASSERT_NO_FATAL_FAILURE(peerRegion(kChunk, access::kAll, 520, &remote));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, kChunk, access::kLocalWrite, 521));
  WorkCompletion wc;
  ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaWrite, 0, sgeOf(src, 0, kChunk), remote)));
  ASSERT_TRUE(pollOne(side.sendCq, &wc));
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);

  std::vector<SendOp> ops;
  for (uint64_t id = 1; id <= kCount; ++id) {
    ops.push_back(peerRequest(WrOpcode::kRdmaWrite, id, sgeOf(src, 0, kChunk), remote));
  }
  ASSERT_OK(postAll(side.qp, ops));
  peer_.signal(SIGKILL);
  const auto killed = Clock::now();
  int status = 0;
  ASSERT_TRUE(peer_.reap(kWaitTimeout, &status));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(side.sendCq, kCount, &completions, kPeerLossBound))
      << "outstanding WRs after the peer was killed";
  EXPECT_LT(Clock::now() - killed, kPeerLossBound);
  size_t i = 0;
  while (i < kCount && completions[i].status == WcStatus::kSuccess) {
    EXPECT_EQ(completions[i].wrId, i + 1);
    ++i;
  }
  if (i == kCount) {
    // Only a path whose posting thread carries WRITEs out (the soft provider's) can end all of
    // them before the kill. A WRITE posted now meets the dead peer: it fails quickly, never succeeds.
    ASSERT_TRUE(mayFinishBeforeAPeerLeaves(GetParam())) << "every write finished before the kill";
    const auto posted = Clock::now();
    ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaWrite, kCount + 1, sgeOf(src, 0, kChunk), remote)));
    ASSERT_TRUE(pollOne(side.sendCq, &wc, kPeerLossBound));
    EXPECT_LT(Clock::now() - posted, kPeerLossBound);
    EXPECT_EQ(wc.wrId, kCount + 1);
    EXPECT_EQ(wc.status, WcStatus::kRetryExcErr) << describe(wc);
    EXPECT_TRUE(reachesState(side.qp, v::QpState::kErr));
    return;
  }
  EXPECT_EQ(completions[i].wrId, i + 1);
  EXPECT_EQ(completions[i].status, WcStatus::kRetryExcErr) << describe(completions[i]);
  for (++i; i < kCount; ++i) {
    EXPECT_EQ(completions[i].wrId, i + 1);
    EXPECT_EQ(completions[i].status, WcStatus::kWrFlushErr) << describe(completions[i]);
  }
  EXPECT_TRUE(reachesState(side.qp, v::QpState::kErr));
}

// A peer paused for less than the QP's transport timeout (timeout 20, retry_cnt 7: 8 tries of
// 4.3 s, what endpoints and agents use by default) resumes with the connection intact: the work
// posted while it was stopped completes, byte for byte, and the QP goes on.
TEST_P(CrossProcess, PeerPausedWithinTheTimeoutResumesIntact) {
  Side side;
  ASSERT_NO_FATAL_FAILURE(connect(side, {.timeout = 20, .retries = 7}));
  constexpr size_t kSize = 1 * kMiB;
  PeerRegion remote;
  ASSERT_NO_FATAL_FAILURE(peerRegion(2 * kSize, access::kAll, 540, &remote));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, 2 * kSize, access::kAll, 541));
  PeerRegion inbox;
  ASSERT_NO_FATAL_FAILURE(peerRegion(kSize, access::kLocalWrite, 542, &inbox));
  ASSERT_OK(peer("recv", peerQp_, 100, inbox.index, 0, kSize));
  WorkCompletion wc;
  ASSERT_NO_FATAL_FAILURE(writeOnce(side, src, remote));

  peer_.signal(SIGSTOP);
  ASSERT_TRUE(peer_.waitStopped(kWaitTimeout));
  // A SEND needs the stopped peer on every path (the same-host path carries WRITE and READ
  // without it), so each path waits out the pause.
  ASSERT_OK(postAll(side.qp, {peerRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, kSize), remote),
                              peerRequest(WrOpcode::kRdmaRead, 3, sgeOf(src, kSize, kSize), remote, kSize),
                              {.opcode = WrOpcode::kSend, .wrId = 5, .sges = {sgeOf(src, 0, kSize)}}}));
  // Three seconds: longer than the 2 s that used to end an endpoint's connection.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  peer_.signal(SIGCONT);
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(side.sendCq, 3, &completions, kPeerLossBound));
  EXPECT_EQ(completions[0].wrId, 2u);
  EXPECT_EQ(completions[0].status, WcStatus::kSuccess) << describe(completions[0]);
  EXPECT_EQ(completions[1].wrId, 3u);
  EXPECT_EQ(completions[1].status, WcStatus::kSuccess) << describe(completions[1]);
  EXPECT_EQ(completions[2].wrId, 5u);
  EXPECT_EQ(completions[2].status, WcStatus::kSuccess) << describe(completions[2]);
  EXPECT_OK(peer("check", remote.index, 0, kSize, 541, 0));
  EXPECT_TRUE(matchesPattern(bytesOf(src, kSize, kSize), 540, kSize));
  ASSERT_OK_AND_ASSIGN(std::string got, peer("poll", "recv", 1, 10000));
  EXPECT_EQ(got, "100:SUCCESS:RECV:" + std::to_string(kSize) + ":0");
  EXPECT_OK(peer("check", inbox.index, 0, kSize, 541, 0));
  // And the connection carries on.
  ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaWrite, 4, sgeOf(src, 0, 4096), remote)));
  ASSERT_TRUE(pollOne(side.sendCq, &wc));
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_TRUE(reachesState(side.qp, v::QpState::kRts));
}

// The kill campaign: trials of SIGKILL and of SIGSTOP (a pause of up to 0.6 s, then SIGCONT) at a
// random moment of a stream of WRITEs, READs and SENDs, each against a fresh peer process. After a
// SIGKILL every work request completes (success, or an error and then flushes) within the peer-loss
// bound and the QP ends in ERR or with everything done; after a SIGSTOP everything completes
// successfully, byte-checked on both sides. Never a hang. FERRY_CAMPAIGN_TRIALS sets the number of
// trials per signal (default 100; 25 under a sanitizer; 5 on an RDMA NIC, where a kill is found by
// the transport timeout alone).
int campaignTrials() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  int trials = 25;
#else
  int trials = 100;
#endif
  if (const char* env = std::getenv("FERRY_CAMPAIGN_TRIALS")) trials = std::max(1, std::atoi(env));
  return trials;
}

TEST_P(CrossProcess, KillAndStopCampaign) {
  // On an RDMA NIC (rxe in the VM, at an eighth of this CPU's speed) a killed peer is found only by
  // the transport timeout: fewer trials, with a timeout (8 tries of 0.27 s) that still outlasts
  // the pauses.
  const bool nic = GetParam().name.rfind("ibverbs", 0) == 0;
  const int trials = nic ? std::min(campaignTrials(), 5) : campaignTrials();
  // rxe retransmits everything outstanding on each of its 8 tries, at an eighth of the speed:
  // finding a killed peer can take it several seconds more than the software devices' 5 s bound.
  const milliseconds lossBound = nic ? milliseconds(20000) : kPeerLossBound;
  const LinkOptions link =
      nic ? LinkOptions{.timeout = 16, .retries = 7} : LinkOptions{.timeout = 20, .retries = 7};
  std::mt19937_64 rng(0xfe77 + std::hash<std::string>{}(GetParam().name));
  constexpr size_t kChunk = 64 * 1024;
  constexpr size_t kWrites = 24, kReads = 8, kSends = 4;
  constexpr size_t kTotal = kWrites + kReads + kSends;
  int killed = 0, stopped = 0, errorsSeen = 0, silentDevice = 0;
  auto start = Clock::now();
  for (int trial = 0; trial < 2 * trials; ++trial) {
    const bool kill = trial % 2 == 0;
    SCOPED_TRACE(std::string(kill ? "SIGKILL" : "SIGSTOP") + " trial " + std::to_string(trial / 2));
    if (trial > 0) {
      peer_.killAndReap();
      ASSERT_OK(peer_.start());
      ASSERT_TRUE(isOk(peer_.call("open " + providerPath().device)));
    }
    Side side;
    ASSERT_NO_FATAL_FAILURE(connect(side, link));
    PeerRegion remote, inbox;
    ASSERT_NO_FATAL_FAILURE(peerRegion(kWrites * kChunk + kReads * kChunk, access::kAll, 600, &remote));
    ASSERT_NO_FATAL_FAILURE(peerRegion(kSends * kChunk, access::kLocalWrite, 601, &inbox));
    for (size_t i = 0; i < kSends; ++i) {
      ASSERT_OK(peer("recv", peerQp_, 100 + i, inbox.index, i * kChunk, kChunk));
    }
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, kWrites * kChunk, access::kLocalWrite, 602));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(side.pd, kReads * kChunk, access::kLocalWrite, 603));
    std::vector<SendOp> ops;
    size_t w = 0, r = 0, m = 0;
    auto addRead = [&](uint64_t id) {
      ops.push_back(peerRequest(WrOpcode::kRdmaRead, id, sgeOf(dst, r * kChunk, kChunk), remote,
                                (kWrites + r) * kChunk));
      ++r;
    };
    auto addSend = [&](uint64_t id) {
      ops.push_back({.opcode = WrOpcode::kSend, .wrId = id, .sges = {sgeOf(src, m * kChunk, kChunk)}});
      ++m;
    };
    for (size_t i = 0; i < kTotal; ++i) {
      const size_t kind = i % 9;  // interleaved: WRITEs, a READ every few, a SEND now and then
      if (kind == 4 && r < kReads) {
        addRead(i);
      } else if (kind == 8 && m < kSends) {
        addSend(i);
      } else if (w < kWrites) {
        ops.push_back(
            peerRequest(WrOpcode::kRdmaWrite, i, sgeOf(src, w * kChunk, kChunk), remote, w * kChunk));
        ++w;
      } else if (r < kReads) {
        addRead(i);
      } else {
        addSend(i);
      }
    }
    // Post in a few bursts while the signal lands at a random moment among them.
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(rng));
    const auto pause = milliseconds(std::uniform_int_distribution<int>(0, 600)(rng));
    std::thread signaller([&] {
      std::this_thread::sleep_for(delay);
      peer_.signal(kill ? SIGKILL : SIGSTOP);
      if (!kill) {
        std::this_thread::sleep_for(pause);
        peer_.signal(SIGCONT);
      }
    });
    for (size_t at = 0; at < ops.size(); at += 6) {
      std::vector<SendOp> burst(ops.begin() + at, ops.begin() + std::min(ops.size(), at + 6));
      ASSERT_OK(postAll(side.qp, burst));
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
    signaller.join();
    std::vector<WorkCompletion> completions;
    bool silent = false;  // the device never reported the dead peer; the QP was moved to ERR
    if (::testing::AssertionResult all =
            pollCompletions(side.sendCq, kTotal, &completions, lossBound + pause);
        !all) {
      // rxe (the Debian 12 kernel's) sometimes never times out the work outstanding to a killed
      // process (seen with a WRITE and with a READ at the head): no retry error ever comes, and
      // there is nothing ferry's ibverbs provider could see. What a caller does then, the test does: move the
      // QP to ERR, which must flush everything left, in order. The software devices must not need it.
      ASSERT_TRUE(nic && kill) << all << "\na hang: " << completions.size() << " of " << kTotal
                               << " work requests completed";
      ++silentDevice;
      silent = true;
      v::QpAttr attr;
      attr.state = v::QpState::kErr;
      ASSERT_OK(side.qp.modify(attr, v::qp_attr_mask::kState));
      std::vector<WorkCompletion> rest;
      ASSERT_TRUE(pollCompletions(side.sendCq, kTotal - completions.size(), &rest, milliseconds(10000)))
          << "moving the QP to ERR did not flush what the device held";
      completions.insert(completions.end(), rest.begin(), rest.end());
    }
    // Completions in post order; after the first error, only flushes.
    bool failed = false;
    for (size_t i = 0; i < kTotal; ++i) {
      EXPECT_EQ(completions[i].wrId, ops[i].wrId);
      if (failed) {
        EXPECT_EQ(completions[i].status, WcStatus::kWrFlushErr) << describe(completions[i]);
      } else if (completions[i].status != WcStatus::kSuccess) {
        failed = true;
        ++errorsSeen;
        EXPECT_TRUE(kill) << "a paused peer must not fail work: " << describe(completions[i]);
        // The software devices report the lost peer as RETRY_EXC_ERR. On a NIC the dying process's
        // kernel may tear its memory regions down before its QP, so a request can also meet a
        // remote access or operation error there.
        if (!nic) {
          EXPECT_EQ(completions[i].status, WcStatus::kRetryExcErr) << describe(completions[i]);
        } else if (!silent) {
          EXPECT_NE(completions[i].status, WcStatus::kWrFlushErr) << describe(completions[i]);
        }
      }
    }
    if (failed) {
      EXPECT_TRUE(reachesState(side.qp, v::QpState::kErr));
    }
    if (kill) {
      ++killed;
      int status = 0;
      ASSERT_TRUE(peer_.reap(kWaitTimeout, &status));
      continue;
    }
    ++stopped;
    // Everything arrived, both ways.
    for (size_t i = 0; i < kReads; ++i) {
      ASSERT_TRUE(matchesPattern(bytesOf(dst, i * kChunk, kChunk), 600, (kWrites + i) * kChunk));
    }
    EXPECT_OK(peer("check", remote.index, 0, kWrites * kChunk, 602, 0));
    ASSERT_OK_AND_ASSIGN(std::string got, peer("poll", "recv", kSends, 10000));
    std::istringstream each(got);
    std::string one;
    size_t received = 0;
    while (each >> one) {
      EXPECT_NE(one.find(":SUCCESS:RECV:" + std::to_string(kChunk) + ":"), std::string::npos) << got;
      ++received;
    }
    EXPECT_EQ(received, kSends) << got;
    EXPECT_OK(peer("check", inbox.index, 0, kSends * kChunk, 602, 0));
    if (HasFailure()) return;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "kill campaign on %s: %d SIGKILL trials (%d failed their work, the rest had finished; %d of them "
      "flushed by moving the QP to ERR after the device stayed silent), %d SIGSTOP trials, 0 hangs, %.1f s\n",
      GetParam().name.c_str(), killed, errorsSeen, silentDevice, stopped, seconds);
}

// The verbs document's No-CM set-up (7.2.3) lets this side establish before the peer has: its
// first SEND may leave while the peer's QP is still in RESET. As on a NIC, which retries a QP that
// drops its packets, the SEND waits for the peer within its transport timeout (timeout 18, retry_cnt
// 7: 8 tries of 1.07 s) and completes once the peer's QP is ready; the peer is not taken for gone.
TEST_P(CrossProcess, SendPostedBeforeThePeerIsReadyCompletesOnceItIs) {
  Side side;
  std::string peerCommand;
  ASSERT_NO_FATAL_FAILURE(exchangePaths(side, {.timeout = 18, .retries = 7}, &peerCommand));
  ASSERT_OK(side.qp.establish(side.path, kRemoteAccess));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, 4096, access::kLocalWrite, 560));
  PeerRegion inbox;
  ASSERT_NO_FATAL_FAILURE(peerRegion(4096, access::kLocalWrite, 561, &inbox));
  const auto posted = Clock::now();
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 4096)}}));
  // The peer's process is busy elsewhere for a while, then moves its QP to RTS and posts a receive.
  constexpr milliseconds kPeerLate{1500};
  std::this_thread::sleep_for(kPeerLate);
  WorkCompletion wc;
  ASSERT_FALSE(pollOne(side.sendCq, &wc, milliseconds(0)))
      << "completed before the peer was ready: " << describe(wc);
  ASSERT_OK(peer_.call(peerCommand));
  ASSERT_OK(peer("recv", peerQp_, 9, inbox.index, 0, 4096));
  ASSERT_TRUE(pollOne(side.sendCq, &wc, kPeerLossBound));
  EXPECT_EQ(wc.wrId, 1u);
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  EXPECT_GE(Clock::now() - posted, kPeerLate);
  ASSERT_OK_AND_ASSIGN(std::string got, peer("poll", "recv", 1, 10000));
  EXPECT_EQ(got, "9:SUCCESS:RECV:4096:0");
  EXPECT_OK(peer("check", inbox.index, 0, 4096, 560, 0));
  EXPECT_TRUE(reachesState(side.qp, v::QpState::kRts));
}

// A peer whose QP never becomes ready (its process lives, its QP stays in RESET) fails the SEND
// waiting for it with RETRY_EXC_ERR, but only once the transport timeout has run out (timeout 16,
// retry_cnt 3: 4 tries of 268 ms), never at the first refusal.
TEST_P(CrossProcess, PeerThatNeverBecomesReadyFailsOnlyAfterTheTransportTimeout) {
  Side side;
  std::string peerCommand;
  ASSERT_NO_FATAL_FAILURE(exchangePaths(side, {.timeout = 16, .retries = 3}, &peerCommand));
  ASSERT_OK(side.qp.establish(side.path, kRemoteAccess));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, 4096, access::kLocalWrite, 570));
  const auto posted = Clock::now();
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 4096)}}));
  WorkCompletion wc;
  ASSERT_TRUE(pollOne(side.sendCq, &wc, kPeerLossBound));
  const auto elapsed = Clock::now() - posted;
  EXPECT_EQ(wc.wrId, 1u);
  EXPECT_EQ(wc.status, WcStatus::kRetryExcErr) << describe(wc);
  // 4 x 4.096 us x 2^16 = 1.07 s.
  EXPECT_GE(elapsed, milliseconds(1000));
  EXPECT_LT(elapsed, kPeerLossBound);
  EXPECT_TRUE(reachesState(side.qp, v::QpState::kErr));
}

// A process whose peer (same-host: over shared-memory rings and the one-copy path) is SIGKILLed
// closes its objects and exits cleanly: exit status 0, no abort, whether it had noticed the death
// first (a SEND posted after the kill fails with RETRY_EXC_ERR) or not. Each trial takes a fresh
// pair of processes, the survivor and the victim both verbs_peer children connected to each other.
TEST_P(CrossProcess, SurvivorOfAKilledPeerExitsCleanly) {
  constexpr int kTrials = 8;
  constexpr size_t kSize = 4 * kMiB;  // the one-copy path's two-thread copy takes 4 MiB and up
  const bool nic = GetParam().name.rfind("ibverbs", 0) == 0;
  auto newQp = [](PeerProcess& process, int* index, std::string* json) -> ::testing::AssertionResult {
    Result<std::string> reply = process.call("qp");
    if (!reply.isOk()) return ::testing::AssertionFailure() << reply.status().toString();
    std::istringstream in(*reply);
    in >> *index;
    std::getline(in, *json);
    return ::testing::AssertionSuccess();
  };
  auto connectTo = [](PeerProcess& process, int index, const std::string& peerJson) {
    return process.call("connect " + std::to_string(index) + " 14 7 7 12 " + std::to_string(kRemoteAccess) +
                        " " + peerJson);
  };
  for (int trial = 0; trial < kTrials; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    if (trial > 0) {
      ASSERT_OK(peer_.start());
      ASSERT_TRUE(isOk(peer_.call("open " + providerPath().device)));
    }
    PeerProcess victim;
    ASSERT_OK(victim.start());
    ASSERT_TRUE(isOk(victim.call("open " + providerPath().device)));
    int survivorQp = -1, victimQp = -1;
    std::string survivorJson, victimJson;
    ASSERT_TRUE(newQp(peer_, &survivorQp, &survivorJson));
    ASSERT_TRUE(newQp(victim, &victimQp, &victimJson));
    ASSERT_OK(connectTo(victim, victimQp, survivorJson));
    ASSERT_OK(connectTo(peer_, survivorQp, victimJson));
    PeerRegion mine, theirs;
    ASSERT_NO_FATAL_FAILURE(peerRegion(kSize, access::kAll, 580, &mine));
    {
      ASSERT_OK_AND_ASSIGN(std::string reply, victim.call("mr " + std::to_string(kSize) + " " +
                                                          std::to_string(access::kAll) + " 581"));
      std::istringstream in(reply);
      ASSERT_TRUE(static_cast<bool>(in >> theirs.index >> theirs.addr >> theirs.rkey >> theirs.length))
          << reply;
    }
    // Traffic both ways: the survivor's requester and responder both hold the victim's connections.
    ASSERT_OK(peer("post", survivorQp, "write", 1, mine.index, 0, kSize, theirs.addr, theirs.rkey));
    ASSERT_OK_AND_ASSIGN(std::string done, peer("poll", "send", 1, 10000));
    EXPECT_EQ(done.rfind("1:SUCCESS:", 0), 0u) << done;
    ASSERT_OK(victim.call("post " + std::to_string(victimQp) + " read 2 " + std::to_string(theirs.index) +
                          " 0 " + std::to_string(kSize) + " " + std::to_string(mine.addr) + " " +
                          std::to_string(mine.rkey)));
    ASSERT_OK_AND_ASSIGN(done, victim.call("poll send 1 10000"));
    EXPECT_EQ(done.rfind("2:SUCCESS:", 0), 0u) << done;

    victim.signal(SIGKILL);
    int status = 0;
    ASSERT_TRUE(victim.reap(kWaitTimeout, &status));
    if (trial % 2 == 0 && !nic) {
      // The survivor notices: a SEND needs the victim on every software path, and fails quickly.
      // (On a NIC only the transport timeout finds a killed peer, and rxe sometimes never does:
      // KillAndStopCampaign covers that; here what counts is the exit.)
      ASSERT_OK(peer("post", survivorQp, "send", 3, mine.index, 0, 64, 0, 0));
      ASSERT_OK_AND_ASSIGN(done, peer("poll", "send", 1, static_cast<int>(kPeerLossBound.count())));
      EXPECT_EQ(done.rfind("3:RETRY_EXC_ERR:", 0), 0u) << done;
    }
    ASSERT_OK(peer_.call("exit"));
    status = 0;
    ASSERT_TRUE(peer_.reap(kWaitTimeout, &status)) << "the survivor did not exit";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the survivor's wait status " << status
        << (WIFSIGNALED(status) ? std::string(" (signal ") + strsignal(WTERMSIG(status)) + ")"
                                : std::string());
    if (HasFailure()) return;
  }
}

// A peer that moves its QP back to RESET and sets it up again (INIT, RTR, RTS) is not ready for a
// while, not gone: its QP answers "not ready", which the requester retries within its transport
// timeout (timeout 18, retry_cnt 7: 8 tries of 1.07 s), and a SEND posted meanwhile completes once
// the QP is back. ("No such QP" from a QP we had reached would fail it at once.)
TEST_P(CrossProcess, PeerThatSetsItsQpUpAgainIsNotTakenForGone) {
  Side side;
  std::string peerCommand;
  ASSERT_NO_FATAL_FAILURE(exchangePaths(side, {.timeout = 18, .retries = 7}, &peerCommand));
  ASSERT_OK(peer_.call(peerCommand));
  ASSERT_OK(side.qp.establish(side.path, kRemoteAccess));
  // Nothing is posted (the peer's QP comes back expecting the PSN this side started with); the QP
  // connects to its peer at RTS, which takes a few milliseconds.
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_OK(peer("reset", peerQp_));
  // The reset closed the peer's end of the connection; a request that left before this side saw
  // that would be lost with it (a lost connection fails what is in flight): let it see.
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, 4096, access::kLocalWrite, 590));
  PeerRegion inbox;
  ASSERT_NO_FATAL_FAILURE(peerRegion(4096, access::kLocalWrite, 591, &inbox));
  ASSERT_OK(post(side.qp, {.opcode = WrOpcode::kSend, .wrId = 1, .sges = {sgeOf(src, 0, 4096)}}));
  std::this_thread::sleep_for(milliseconds(1000));
  WorkCompletion wc;
  ASSERT_FALSE(pollOne(side.sendCq, &wc, milliseconds(0))) << "the peer was taken for gone: " << describe(wc);
  ASSERT_OK(peer_.call(peerCommand));
  ASSERT_OK(peer("recv", peerQp_, 9, inbox.index, 0, 4096));
  ASSERT_TRUE(pollOne(side.sendCq, &wc, kPeerLossBound));
  EXPECT_EQ(wc.wrId, 1u);
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
  ASSERT_OK_AND_ASSIGN(std::string got, peer("poll", "recv", 1, 10000));
  EXPECT_EQ(got, "9:SUCCESS:RECV:4096:0");
  EXPECT_OK(peer("check", inbox.index, 0, 4096, 590, 0));
}

TEST_P(CrossProcess, StoppedPeerTimesOutWithRetryExceeded) {
  Side side;
  const LinkOptions link{.timeout = 12, .retries = 2};
  ASSERT_NO_FATAL_FAILURE(connect(side, link));
  PeerRegion remote;
  ASSERT_NO_FATAL_FAILURE(peerRegion(1 * kMiB, access::kAll, 530, &remote));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(side.pd, 1 * kMiB, access::kLocalWrite, 531));
  WorkCompletion wc;
  ASSERT_NO_FATAL_FAILURE(writeOnce(side, src, remote));

  // The peer's sockets stay open, but nothing answers.
  peer_.signal(SIGSTOP);
  ASSERT_TRUE(peer_.waitStopped(kWaitTimeout));
  const auto start = Clock::now();
  if (carriesOutInThePost(GetParam())) {
    // As an RDMA NIC does (and the kernel's rxe), the same-host path reaches a stopped process's
    // registered memory without its help: the WRITEs complete.
    ASSERT_OK(post(side.qp, peerRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 64 * 1024), remote)));
    ASSERT_TRUE(pollOne(side.sendCq, &wc));
    EXPECT_EQ(wc.wrId, 2u);
    EXPECT_EQ(wc.status, WcStatus::kSuccess) << describe(wc);
    peer_.signal(SIGCONT);
    return;
  }
  ASSERT_OK(postAll(side.qp, {peerRequest(WrOpcode::kRdmaWrite, 2, sgeOf(src, 0, 64 * 1024), remote),
                              peerRequest(WrOpcode::kRdmaWrite, 3, sgeOf(src, 0, 4096), remote)}));
  std::vector<WorkCompletion> completions;
  ASSERT_TRUE(pollCompletions(side.sendCq, 2, &completions, kPeerLossBound));
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(completions[0].wrId, 2u);
  EXPECT_EQ(completions[0].status, WcStatus::kRetryExcErr) << describe(completions[0]);
  EXPECT_EQ(completions[1].wrId, 3u);
  EXPECT_EQ(completions[1].status, WcStatus::kWrFlushErr) << describe(completions[1]);
  // Not before one transport timeout (4.096 us * 2^12 = 16.8 ms), well within the bound.
  EXPECT_GE(elapsed, milliseconds(16));
  EXPECT_LT(elapsed, kPeerLossBound);
  EXPECT_TRUE(reachesState(side.qp, v::QpState::kErr));
  peer_.signal(SIGCONT);
  peer_.killAndReap();
}

INSTANTIATE_TEST_SUITE_P(Providers, CrossProcess, ::testing::ValuesIn(providerPaths()), providerPathTestName);

}  // namespace
}  // namespace ferry::test
