// The verbs test fixture: one suite, written against the public verbs API, run over every provider
// path (a device plus the environment that selects how it moves bytes).
//
// A path whose device is not listed here is skipped with the reason, unless FERRY_REQUIRE_PROVIDERS
// (a comma list of path names, e.g. "soft_tcp") names it: then the test fails, so a CI job that
// requires a provider cannot pass by skipping everything.
//
// Every wait in these functions has a deadline (kWaitTimeout unless told otherwise); running out of
// time is a test failure, never a hang.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/common/shared_memory.h"
#include "ferry/common/status.h"
#include "ferry/devices.h"
#include "ferry/verbs/path.h"
#include "ferry/verbs/types.h"
#include "ferry/verbs/verbs.h"

namespace ferry::test {

// ---- provider paths ----

// One way of running the verbs API: the device to open and the environment that selects the
// provider's data path (applied for the duration of each test).
struct ProviderPath {
  std::string name;    // the test-name suffix, e.g. "soft_tcp"
  std::string device;  // the device name as listDevices() reports it
  std::vector<std::pair<std::string, std::string>> env;
};

// Every path the suite runs over. Adding a provider path is one entry here.
const std::vector<ProviderPath>& providerPaths();

// Whether the path carries WRITE and READ out within the post itself (the soft provider's
// same-host path, soft_same_host and soft_mapped), reaching even a stopped process's memory.
bool carriesOutInThePost(const ProviderPath& path);
// Whether many large WRITEs may all complete before a peer that is killed or closed at once after
// the post loses them: on every soft path, where the posting thread sends its requests itself
// (FERRY_SOFT_CALLER_PROGRESS) or carries them out within the post.
bool mayFinishBeforeAPeerLeaves(const ProviderPath& path);

// For INSTANTIATE_TEST_SUITE_P: the path's name as the test-name suffix.
std::string providerPathTestName(const ::testing::TestParamInfo<ProviderPath>& info);

void PrintTo(const ProviderPath& path, std::ostream* os);

// Sets environment variables and restores the previous values (or their absence) on destruction.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars);
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv();
  void set(const std::string& name, const std::string& value);
  void unset(const std::string& name);

 private:
  void remember(const std::string& name);
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// ---- timing ----

inline constexpr std::chrono::milliseconds kWaitTimeout{10000};
using Clock = std::chrono::steady_clock;

// ---- status assertions ----

::testing::AssertionResult isOk(const Status& status);
template <typename T>
::testing::AssertionResult isOk(const Result<T>& result) {
  return isOk(result.status());
}
// The status has this code (and, when cause != 0, this cause).
::testing::AssertionResult hasCode(const Status& status, StatusCode code, int cause = 0);

#define FERRY_TEST_CONCAT_INNER_(a, b) a##b
#define FERRY_TEST_CONCAT_(a, b) FERRY_TEST_CONCAT_INNER_(a, b)

#ifndef ASSERT_OK
#define ASSERT_OK(expr) ASSERT_TRUE(::ferry::test::isOk((expr)))
#endif
#ifndef EXPECT_OK
#define EXPECT_OK(expr) EXPECT_TRUE(::ferry::test::isOk((expr)))
#endif
#ifndef ASSERT_OK_AND_ASSIGN
// Declares lhs from a Result<T> expression, or fails the test with the status.
#define ASSERT_OK_AND_ASSIGN(lhs, expr)                                             \
  auto FERRY_TEST_CONCAT_(ferryTestResult_, __LINE__) = (expr);                     \
  ASSERT_TRUE(::ferry::test::isOk(FERRY_TEST_CONCAT_(ferryTestResult_, __LINE__))); \
  lhs = std::move(FERRY_TEST_CONCAT_(ferryTestResult_, __LINE__)).value()
#endif

// ---- memory ----

// Page-aligned anonymous memory (mmap), released on destruction. Move-only. With
// FERRY_TEST_SHARED_MEMORY=1 (the soft_mapped path) it comes from SharedMemory::allocate instead:
// memory a same-host peer maps.
class TestBuffer {
 public:
  TestBuffer() = default;
  explicit TestBuffer(size_t size);
  TestBuffer(TestBuffer&& other) noexcept;
  TestBuffer& operator=(TestBuffer&& other) noexcept;
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;
  ~TestBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> bytes() const { return {data_, size_}; }
  uint64_t address(size_t offset = 0) const { return reinterpret_cast<uint64_t>(data_ + offset); }

 private:
  void release();
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
  std::shared_ptr<SharedMemory> shared_;  // FERRY_TEST_SHARED_MEMORY=1: the memory comes from here
};

// A test buffer and its registration. The region closes before the memory goes away.
struct RegisteredBuffer {
  TestBuffer memory;
  verbs::MemoryRegion mr;

  uint8_t* data() const { return memory.data(); }
  size_t size() const { return memory.size(); }
  uint64_t address(size_t offset = 0) const { return memory.address(offset); }
};

// Read-only views of test memory, for the pattern and byte comparisons below.
inline std::span<const uint8_t> bytesOf(const RegisteredBuffer& buffer, size_t offset, size_t length) {
  return {buffer.data() + offset, length};
}
inline std::span<const uint8_t> bytesOf(const RegisteredBuffer& buffer) {
  return {buffer.data(), buffer.size()};
}
inline std::span<const uint8_t> bytesOf(const TestBuffer& buffer, size_t offset, size_t length) {
  return {buffer.data() + offset, length};
}

// size bytes filled with pattern(seed), registered in pd with access.
Result<RegisteredBuffer> registerBuffer(verbs::ProtectionDomain& pd, size_t size, uint32_t access,
                                        uint64_t seed);

// An SGE of exactly [offset, offset+length) of mr (length 0 stays 0, unlike MemoryRegion::sge()).
verbs::Sge sgeOf(const verbs::MemoryRegion& mr, size_t offset, size_t length);
verbs::Sge sgeOf(const RegisteredBuffer& buffer, size_t offset, size_t length);

// A key that names no region: k with its high bit and low byte flipped.
inline uint32_t corruptKey(uint32_t key) { return key ^ 0x800000a5u; }

// ---- patterns ----

// The pattern byte at absolute position `position` for `seed`: every byte of a buffer depends on
// both, so a misplaced, shifted or truncated copy never matches by accident.
uint8_t patternByte(uint64_t seed, uint64_t position);
// Writes pattern(seed) for positions [position, position + bytes.size()).
void fillPattern(std::span<uint8_t> bytes, uint64_t seed, uint64_t position = 0);
// bytes hold pattern(seed) for positions [position, ...); the message names the first mismatch.
::testing::AssertionResult matchesPattern(std::span<const uint8_t> bytes, uint64_t seed,
                                          uint64_t position = 0);
// actual equals expected byte for byte; the message names the first mismatch.
::testing::AssertionResult bytesEqual(std::span<const uint8_t> actual, std::span<const uint8_t> expected);
// Position of the first byte where pattern(seed) does not hold, or bytes.size().
size_t firstPatternMismatch(std::span<const uint8_t> bytes, uint64_t seed, uint64_t position = 0);

// ---- connecting queue pairs ----

// Remote access a QP grants its peer (qp_access_flags).
inline constexpr uint32_t kRemoteAccess =
    verbs::access::kRemoteWrite | verbs::access::kRemoteRead | verbs::access::kRemoteAtomic;

// The transport knobs a side establishes with.
struct LinkOptions {
  uint8_t timeout = 14;      // 4.096 us * 2^14 = 67 ms per try
  uint8_t retries = 7;       // retry_cnt
  uint8_t rnrRetries = 7;    // rnr_retry (7: forever)
  uint8_t minRnrTimer = 12;  // 0.64 ms
};

// The local half of a path: what a side sends its peer (fillPath on an empty Path).
Result<verbs::Path> makeLocalPath(const verbs::Context& context, const verbs::QueuePair& qp);

// The path a side establishes with, from what it sent (local) and what the peer sent (peer): the
// peer's path reversed, this side's own fields completed by fillPath, the PSN this side announced
// kept, and the link knobs applied.
Result<verbs::Path> pathTowardsPeer(const verbs::Context& context, const verbs::QueuePair& qp,
                                    const verbs::Path& local, const verbs::Path& peer,
                                    const LinkOptions& link);

// Connects two QPs of this process exactly as two hosts would: each fills its path, the paths
// travel as JSON (and must decode to what was sent), each side reverses what it got and calls
// establish(). established{A,B} receive the paths each side established with.
Status connectQps(const verbs::Context& contextA, verbs::QueuePair& qpA, const verbs::Context& contextB,
                  verbs::QueuePair& qpB, const LinkOptions& link = {}, uint32_t accessA = kRemoteAccess,
                  uint32_t accessB = kRemoteAccess, verbs::Path* establishedA = nullptr,
                  verbs::Path* establishedB = nullptr);

// ---- posting ----

// One send-queue work request with its SGEs held by value, so a designated-initialiser temporary
// can be posted without dangling spans.
struct SendOp {
  verbs::WrOpcode opcode = verbs::WrOpcode::kSend;
  uint64_t wrId = 0;
  std::vector<verbs::Sge> sges{};
  uint32_t flags = verbs::send_flags::kSignaled;
  uint64_t remoteAddr = 0;  // RDMA and atomic operations
  uint32_t rkey = 0;
  uint32_t imm = 0;         // *_WITH_IMM
  uint64_t compareAdd = 0;  // atomics
  uint64_t swap = 0;        // compare-and-swap
};

Status post(verbs::QueuePair& qp, const SendOp& op);
Status postAll(verbs::QueuePair& qp, const std::vector<SendOp>& ops, size_t* badIndex = nullptr);
Status postReceive(verbs::QueuePair& qp, uint64_t wrId, std::vector<verbs::Sge> sges);
Status postReceive(verbs::SharedReceiveQueue& srq, uint64_t wrId, std::vector<verbs::Sge> sges);

// ---- completions ----

// Polls until `count` completions arrived (appended to *out) or the timeout ran out.
::testing::AssertionResult pollCompletions(verbs::CompletionQueue& cq, size_t count,
                                           std::vector<verbs::WorkCompletion>* out,
                                           std::chrono::milliseconds timeout = kWaitTimeout);
::testing::AssertionResult pollOne(verbs::CompletionQueue& cq, verbs::WorkCompletion* out,
                                   std::chrono::milliseconds timeout = kWaitTimeout);
// No completion arrives for `quiet`.
::testing::AssertionResult noCompletionFor(verbs::CompletionQueue& cq, std::chrono::milliseconds quiet);
// The QP reaches `state` before the timeout (query() polled).
::testing::AssertionResult reachesState(const verbs::QueuePair& qp, verbs::QpState state,
                                        std::chrono::milliseconds timeout = kWaitTimeout);
// One line: "wr_id=7 status=REM_ACCESS_ERR opcode=RDMA_WRITE byte_len=0 imm=0 flags=0 qp=12".
std::string describe(const verbs::WorkCompletion& wc);

// ---- the fixture ----

// One side of a test connection: a context (its own, or borrowed from the other side), a PD, a send
// and a receive CQ, and one RC QP. Members close in reverse order: QP, CQs, PD, then the context.
struct Side {
  Side() = default;
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  verbs::Context ownContext;          // empty when the context is borrowed
  verbs::Context* context = nullptr;  // the context in use
  verbs::ProtectionDomain pd;
  verbs::CompletionQueue sendCq;
  verbs::CompletionQueue recvCq;
  verbs::QueuePair qp;
  verbs::Path path;  // what this side established with (s: itself, d: the peer)
};

struct QpOptions {
  verbs::QpCap cap{.maxSendWr = 128, .maxRecvWr = 128, .maxSendSge = 4, .maxRecvSge = 4, .maxInlineData = 0};
  bool sqSigAll = false;
  verbs::QpType type = verbs::QpType::kRc;  // kRc or kUc (connected)
};

struct PairOptions {
  bool sameContext = false;  // both QPs in one context (loopback inside one device instance)
  int cqe = 512;
  QpOptions qpA{};
  QpOptions qpB{};
  LinkOptions link{};                // both sides
  uint32_t accessA = kRemoteAccess;  // qp_access_flags of A (what B may do to A's memory)
  uint32_t accessB = kRemoteAccess;  // qp_access_flags of B (what A may do to B's memory)
};

// Two connected RC QPs; a requests, b responds in most tests. b closes before a.
struct ConnectedPair {
  Side a;
  Side b;
};

class VerbsTest : public ::testing::TestWithParam<ProviderPath> {
 protected:
  // Applies the path's environment; skips (or, when required, fails) if its device is absent.
  void SetUp() override;
  void TearDown() override;

  const ProviderPath& providerPath() const { return GetParam(); }
  Result<verbs::Context> openContext() const;
  // Opens side's context (or borrows `shared`), PD and CQs.
  Status openSide(Side& side, verbs::Context* shared, int cqe) const;
  // Creates side's RC QP on its PD and CQs.
  Status createQp(Side& side, const QpOptions& options) const;
  // Two sides, each with a QP, connected through connectQps().
  Result<std::unique_ptr<ConnectedPair>> makePair(const PairOptions& options = {}) const;

 private:
  std::unique_ptr<ScopedEnv> env_;
};

}  // namespace ferry::test

// Readable gtest output for verbs values (found by argument-dependent lookup).
namespace ferry {
void PrintTo(StatusCode code, std::ostream* os);
void PrintTo(const Status& status, std::ostream* os);
}  // namespace ferry
namespace ferry::verbs {
void PrintTo(WcStatus status, std::ostream* os);
void PrintTo(WcOpcode opcode, std::ostream* os);
void PrintTo(QpState state, std::ostream* os);
void PrintTo(AsyncEventType type, std::ostream* os);
void PrintTo(const WorkCompletion& wc, std::ostream* os);
}  // namespace ferry::verbs
