#include "support/verbs_fixture.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

namespace ferry::test {

using verbs::CompletionQueue;
using verbs::Context;
using verbs::Path;
using verbs::QueuePair;
using verbs::WorkCompletion;

// ---- provider paths ----

const std::vector<ProviderPath>& providerPaths() {
  // The soft provider over TCP on the loopback interface; with its same-host path (one-copy WRITE
  // and READ between contexts of this host, everything else over shared-memory rings); with rings
  // only (the path where cross-memory attach is refused); the ibverbs provider on the kernel's soft-RoCE
  // device rxe0 (the rxe VM, scripts/rxe-vm). Further paths are one entry each.
  static const std::vector<ProviderPath> paths = {
      // soft_tcp keeps one connection per QP (no stripe); soft_tcp_stripe below shares WRITEs.
      {.name = "soft_tcp",
       .device = "soft_lo",
       .env = {{"FERRY_SOFT_SAME_HOST", "0"}, {"FERRY_SOFT_TCP_STRIPE", "0"}}},
      {.name = "soft_same_host", .device = "soft_lo", .env = {{"FERRY_SOFT_SAME_HOST", "1"}}},
      {.name = "soft_ring", .device = "soft_lo", .env = {{"FERRY_SOFT_SAME_HOST", "ring"}}},
      // TCP with a stripe per QP (stripe.h) that shares every WRITE and READ of 64 bytes or more, so
      // that the suite's WRITEs and READs run over two connections.
      {.name = "soft_tcp_stripe",
       .device = "soft_lo",
       .env = {{"FERRY_SOFT_SAME_HOST", "0"}, {"FERRY_SOFT_TCP_STRIPE", "64"}}},
      // The same-host path on memory both sides map: every test buffer (in this process and the
      // peer processes, which inherit the variable) comes from ferry's shared-memory allocator.
      {.name = "soft_mapped",
       .device = "soft_lo",
       .env = {{"FERRY_SOFT_SAME_HOST", "1"}, {"FERRY_TEST_SHARED_MEMORY", "1"}}},
      {.name = "ibverbs_rxe", .device = "rxe0", .env = {}},
  };
  return paths;
}

bool carriesOutInThePost(const ProviderPath& path) {
  for (const auto& [name, value] : path.env) {
    if (name == "FERRY_SOFT_SAME_HOST") return value == "1";
  }
  return false;
}

bool mayFinishBeforeAPeerLeaves(const ProviderPath& path) { return path.device.rfind("soft", 0) == 0; }

std::string providerPathTestName(const ::testing::TestParamInfo<ProviderPath>& info) {
  return info.param.name;
}

void PrintTo(const ProviderPath& path, std::ostream* os) {
  *os << path.name << " (device " << path.device;
  for (const auto& [name, value] : path.env) *os << ", " << name << "=" << value;
  *os << ")";
}

ScopedEnv::ScopedEnv(const std::vector<std::pair<std::string, std::string>>& vars) {
  for (const auto& [name, value] : vars) set(name, value);
}

ScopedEnv::~ScopedEnv() {
  // Newest first, so a variable set twice ends with its original value.
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second) {
      ::setenv(it->first.c_str(), it->second->c_str(), 1);
    } else {
      ::unsetenv(it->first.c_str());
    }
  }
}

void ScopedEnv::remember(const std::string& name) {
  const char* old = std::getenv(name.c_str());
  saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
}

void ScopedEnv::set(const std::string& name, const std::string& value) {
  remember(name);
  ::setenv(name.c_str(), value.c_str(), 1);
}

void ScopedEnv::unset(const std::string& name) {
  remember(name);
  ::unsetenv(name.c_str());
}

// ---- status assertions ----

::testing::AssertionResult isOk(const Status& status) {
  if (status.isOk()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status.toString();
}

::testing::AssertionResult hasCode(const Status& status, StatusCode code, int cause) {
  if (status.code() == code && (cause == 0 || status.cause() == cause)) {
    return ::testing::AssertionSuccess();
  }
  auto failure = ::testing::AssertionFailure();
  failure << "expected " << statusCodeName(code);
  if (cause != 0) failure << " (cause " << cause << ")";
  failure << ", got " << (status.isOk() ? std::string("Ok") : status.toString());
  if (status.cause() != 0) failure << " [cause " << status.cause() << "]";
  return failure;
}

// ---- memory ----

TestBuffer::TestBuffer(size_t size) {
  if (const char* shared = std::getenv("FERRY_TEST_SHARED_MEMORY");
      shared != nullptr && std::string(shared) == "1") {
    auto memory = SharedMemory::allocate(std::max<size_t>(size, 1));
    if (!memory.isOk()) {
      ADD_FAILURE() << "shared memory of " << size << " bytes: " << memory.status().toString();
      return;
    }
    shared_ = std::move(*memory);
    data_ = static_cast<uint8_t*>(shared_->data());
    size_ = size;
    return;
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = std::max(page, (size + page - 1) / page * page);
  void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    ADD_FAILURE() << "mmap of " << mapped << " bytes failed: " << std::strerror(errno);
    return;
  }
  data_ = static_cast<uint8_t*>(memory);
  size_ = size;
  mapped_ = mapped;
}

TestBuffer::TestBuffer(TestBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      shared_(std::move(other.shared_)) {}

TestBuffer& TestBuffer::operator=(TestBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    shared_ = std::move(other.shared_);
  }
  return *this;
}

TestBuffer::~TestBuffer() { release(); }

void TestBuffer::release() {
  if (data_ != nullptr && !shared_) ::munmap(data_, mapped_);
  shared_.reset();
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
}

Result<RegisteredBuffer> registerBuffer(verbs::ProtectionDomain& pd, size_t size, uint32_t access,
                                        uint64_t seed) {
  TestBuffer memory(size);
  if (memory.data() == nullptr) return Status(StatusCode::kResourceExhausted, "mmap failed", ENOMEM);
  fillPattern(memory.bytes(), seed);
  FERRY_ASSIGN_OR_RETURN(verbs::MemoryRegion mr, pd.registerMemory(memory.data(), size, access));
  return RegisteredBuffer{std::move(memory), std::move(mr)};
}

verbs::Sge sgeOf(const verbs::MemoryRegion& mr, size_t offset, size_t length) {
  return {.addr = reinterpret_cast<uint64_t>(mr.addr()) + offset,
          .length = static_cast<uint32_t>(length),
          .lkey = mr.lkey()};
}

verbs::Sge sgeOf(const RegisteredBuffer& buffer, size_t offset, size_t length) {
  return {.addr = buffer.address(offset), .length = static_cast<uint32_t>(length), .lkey = buffer.mr.lkey()};
}

// ---- patterns ----

namespace {

uint64_t patternWord(uint64_t seed, uint64_t block) {
  // splitmix64 over (seed, block).
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + block + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr bool kLittleEndian = std::endian::native == std::endian::little;

}  // namespace

uint8_t patternByte(uint64_t seed, uint64_t position) {
  return static_cast<uint8_t>(patternWord(seed, position >> 3) >> ((position & 7) * 8));
}

void fillPattern(std::span<uint8_t> bytes, uint64_t seed, uint64_t position) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n && (!kLittleEndian || ((position + i) & 7) != 0)) {
    bytes[i] = patternByte(seed, position + i);
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    const uint64_t word = patternWord(seed, (position + i) >> 3);
    std::memcpy(bytes.data() + i, &word, 8);
  }
  for (; i < n; ++i) bytes[i] = patternByte(seed, position + i);
}

size_t firstPatternMismatch(std::span<const uint8_t> bytes, uint64_t seed, uint64_t position) {
  size_t i = 0;
  const size_t n = bytes.size();
  while (i < n && (!kLittleEndian || ((position + i) & 7) != 0)) {
    if (bytes[i] != patternByte(seed, position + i)) return i;
    ++i;
  }
  for (; i + 8 <= n; i += 8) {
    const uint64_t word = patternWord(seed, (position + i) >> 3);
    if (std::memcmp(bytes.data() + i, &word, 8) != 0) break;
  }
  for (; i < n; ++i) {
    if (bytes[i] != patternByte(seed, position + i)) return i;
  }
  return n;
}

::testing::AssertionResult matchesPattern(std::span<const uint8_t> bytes, uint64_t seed, uint64_t position) {
  const size_t at = firstPatternMismatch(bytes, seed, position);
  if (at == bytes.size()) return ::testing::AssertionSuccess();
  size_t bad = 0;
  for (size_t i = at; i < bytes.size(); ++i) bad += bytes[i] != patternByte(seed, position + i);
  return ::testing::AssertionFailure()
         << "pattern " << seed << " broken at byte " << at << " of " << bytes.size() << " (got 0x" << std::hex
         << int(bytes[at]) << ", want 0x" << int(patternByte(seed, position + at)) << std::dec << "); " << bad
         << " bytes differ";
}

::testing::AssertionResult bytesEqual(std::span<const uint8_t> actual, std::span<const uint8_t> expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  if (std::memcmp(actual.data(), expected.data(), actual.size()) == 0) return ::testing::AssertionSuccess();
  size_t at = 0;
  while (actual[at] == expected[at]) ++at;
  size_t bad = 0;
  for (size_t i = at; i < actual.size(); ++i) bad += actual[i] != expected[i];
  return ::testing::AssertionFailure() << "first difference at byte " << at << " of " << actual.size()
                                       << " (got 0x" << std::hex << int(actual[at]) << ", want 0x"
                                       << int(expected[at]) << std::dec << "); " << bad << " bytes differ";
}

// ---- connecting queue pairs ----

Result<Path> makeLocalPath(const Context& context, const QueuePair& qp) {
  Path path;
  FERRY_RETURN_IF_ERROR(verbs::fillPath(context, qp, path));
  return path;
}

Result<Path> pathTowardsPeer(const Context& context, const QueuePair& qp, const Path& local, const Path& peer,
                             const LinkOptions& link) {
  Path path = peer;
  path.reverse();
  path.sgidIndex = local.sgidIndex;
  path.portNum = local.portNum;
  // fillPath completes this side's fields and agrees MTU and READ/atomic depths with the peer's;
  // the PSN must stay the one this side announced, since the peer expects it.
  FERRY_RETURN_IF_ERROR(verbs::fillPath(context, qp, path));
  path.sqpsn = local.sqpsn;
  path.packetLifeTime = link.timeout;
  path.retries = link.retries;
  path.rnrRetries = link.rnrRetries;
  path.minRnrTimer = link.minRnrTimer;
  if (path.sqpn != local.sqpn || path.dqpn != peer.sqpn || path.dgid != peer.sgid) {
    return Status(StatusCode::kInternal,
                  "reverse()/fillPath() did not produce this side's view: " + path.toJson());
  }
  return path;
}

namespace {

// What the peer receives: the JSON text decoded again, which must equal what was sent.
Result<Path> overTheWire(const Path& sent) {
  const std::string text = sent.toJson();
  FERRY_ASSIGN_OR_RETURN(Path received, Path::fromJson(text));
  if (!(received == sent)) {
    return Status(StatusCode::kInternal,
                  "a Path did not survive toJson/fromJson: " + text + " came back as " + received.toJson());
  }
  return received;
}

}  // namespace

Status connectQps(const Context& contextA, QueuePair& qpA, const Context& contextB, QueuePair& qpB,
                  const LinkOptions& link, uint32_t accessA, uint32_t accessB, Path* establishedA,
                  Path* establishedB) {
  FERRY_ASSIGN_OR_RETURN(Path localA, makeLocalPath(contextA, qpA));
  FERRY_ASSIGN_OR_RETURN(Path localB, makeLocalPath(contextB, qpB));
  FERRY_ASSIGN_OR_RETURN(Path atB, overTheWire(localA));
  FERRY_ASSIGN_OR_RETURN(Path atA, overTheWire(localB));
  FERRY_ASSIGN_OR_RETURN(Path pathA, pathTowardsPeer(contextA, qpA, localA, atA, link));
  FERRY_ASSIGN_OR_RETURN(Path pathB, pathTowardsPeer(contextB, qpB, localB, atB, link));
  FERRY_RETURN_IF_ERROR(qpA.establish(pathA, accessA));
  FERRY_RETURN_IF_ERROR(qpB.establish(pathB, accessB));
  if (establishedA) *establishedA = pathA;
  if (establishedB) *establishedB = pathB;
  return Status::ok();
}

// ---- posting ----

namespace {

verbs::SendWr toSendWr(const SendOp& op) {
  verbs::SendWr wr;
  wr.wrId = op.wrId;
  wr.opcode = op.opcode;
  wr.sendFlags = op.flags;
  wr.sgList = op.sges;
  wr.immData = op.imm;
  switch (op.opcode) {
    case verbs::WrOpcode::kAtomicCmpAndSwp:
    case verbs::WrOpcode::kAtomicFetchAndAdd:
      wr.atomic = {
          .remoteAddr = op.remoteAddr, .compareAdd = op.compareAdd, .swap = op.swap, .rkey = op.rkey};
      break;
    default: wr.rdma = {.remoteAddr = op.remoteAddr, .rkey = op.rkey}; break;
  }
  return wr;
}

}  // namespace

Status post(QueuePair& qp, const SendOp& op) {
  const verbs::SendWr wr = toSendWr(op);
  return qp.postSend(wr);
}

Status postAll(QueuePair& qp, const std::vector<SendOp>& ops, size_t* badIndex) {
  std::vector<verbs::SendWr> wrs;
  wrs.reserve(ops.size());
  for (const SendOp& op : ops) wrs.push_back(toSendWr(op));
  return qp.postSend(wrs, badIndex);
}

Status postReceive(QueuePair& qp, uint64_t wrId, std::vector<verbs::Sge> sges) {
  const verbs::RecvWr wr{.wrId = wrId, .sgList = sges};
  return qp.postRecv(wr);
}

Status postReceive(verbs::SharedReceiveQueue& srq, uint64_t wrId, std::vector<verbs::Sge> sges) {
  const verbs::RecvWr wr{.wrId = wrId, .sgList = sges};
  return srq.postRecv(wr);
}

// ---- completions ----

::testing::AssertionResult pollCompletions(CompletionQueue& cq, size_t count,
                                           std::vector<WorkCompletion>* out,
                                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  size_t got = 0;
  int idle = 0;
  WorkCompletion batch[32];
  while (got < count) {
    const size_t want = std::min<size_t>(count - got, std::size(batch));
    Result<int> polled = cq.poll(std::span<WorkCompletion>(batch, want));
    if (!polled.isOk()) {
      return ::testing::AssertionFailure() << "poll failed after " << got << " of " << count
                                           << " completions: " << polled.status().toString();
    }
    if (*polled > 0) {
      out->insert(out->end(), batch, batch + *polled);
      got += static_cast<size_t>(*polled);
      idle = 0;
      continue;
    }
    if (Clock::now() >= deadline) {
      auto failure = ::testing::AssertionFailure();
      failure << "only " << got << " of " << count << " completions within " << timeout.count() << " ms";
      for (size_t i = out->size() - got; i < out->size(); ++i) failure << "\n  " << describe((*out)[i]);
      return failure;
    }
    if (++idle < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult pollOne(CompletionQueue& cq, WorkCompletion* out,
                                   std::chrono::milliseconds timeout) {
  std::vector<WorkCompletion> completions;
  auto result = pollCompletions(cq, 1, &completions, timeout);
  if (result) *out = completions.front();
  return result;
}

::testing::AssertionResult noCompletionFor(CompletionQueue& cq, std::chrono::milliseconds quiet) {
  const auto deadline = Clock::now() + quiet;
  WorkCompletion wc;
  do {
    Result<int> polled = cq.poll(std::span<WorkCompletion>(&wc, 1));
    if (!polled.isOk()) return ::testing::AssertionFailure() << "poll failed: " << polled.status().toString();
    if (*polled > 0) return ::testing::AssertionFailure() << "unexpected completion: " << describe(wc);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (Clock::now() < deadline);
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult reachesState(const QueuePair& qp, verbs::QpState state,
                                        std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  verbs::QpState last = verbs::QpState::kReset;
  for (;;) {
    Result<verbs::QpAttr> attr = qp.query();
    if (!attr.isOk()) return ::testing::AssertionFailure() << "query failed: " << attr.status().toString();
    last = attr->state;
    if (last == state) return ::testing::AssertionSuccess();
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ::testing::AssertionFailure()
         << "QP " << qp.qpNum() << " is in " << verbs::qpStateName(last) << ", not "
         << verbs::qpStateName(state) << ", after " << timeout.count() << " ms";
}

std::string describe(const WorkCompletion& wc) {
  std::ostringstream os;
  os << "wr_id=" << wc.wrId << " status=" << verbs::wcStatusName(wc.status)
     << " opcode=" << verbs::wcOpcodeName(wc.opcode) << " byte_len=" << wc.byteLen << " imm=0x" << std::hex
     << wc.immData << std::dec << " flags=" << wc.wcFlags << " qp=" << wc.qpNum
     << " vendor_err=" << wc.vendorErr;
  return os.str();
}

// ---- the fixture ----

namespace {

std::vector<std::string> splitList(const char* text) {
  std::vector<std::string> items;
  if (text == nullptr) return items;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    const auto begin = item.find_first_not_of(" \t");
    const auto end = item.find_last_not_of(" \t");
    if (begin != std::string::npos) items.push_back(item.substr(begin, end - begin + 1));
  }
  return items;
}

}  // namespace

void VerbsTest::SetUp() {
  const ProviderPath& path = GetParam();
  env_ = std::make_unique<ScopedEnv>(path.env);
  Result<std::vector<verbs::DeviceInfo>> devices = listDevices();
  ASSERT_TRUE(isOk(devices)) << "listDevices()";
  for (const verbs::DeviceInfo& device : *devices) {
    if (device.name == path.device) return;
  }
  std::ostringstream reason;
  reason << "provider path " << path.name << ": device " << path.device << " is not listed";
  if (const char* filter = std::getenv("FERRY_DEVICES"); filter != nullptr && *filter != '\0') {
    reason << " (FERRY_DEVICES=" << filter << ")";
  }
  for (const ProviderInfo& provider : listProviders()) {
    if (!provider.available) reason << "; provider " << provider.name << " unavailable: " << provider.reason;
  }
  const std::vector<std::string> required = splitList(std::getenv("FERRY_REQUIRE_PROVIDERS"));
  if (std::find(required.begin(), required.end(), path.name) != required.end()) {
    FAIL() << reason.str() << ", but FERRY_REQUIRE_PROVIDERS requires it";
  }
  GTEST_SKIP() << reason.str();
}

void VerbsTest::TearDown() {}

Result<Context> VerbsTest::openContext() const { return openDevice(GetParam().device); }

Status VerbsTest::openSide(Side& side, Context* shared, int cqe) const {
  if (shared != nullptr) {
    side.context = shared;
  } else {
    FERRY_ASSIGN_OR_RETURN(side.ownContext, openContext());
    side.context = &side.ownContext;
  }
  FERRY_ASSIGN_OR_RETURN(side.pd, side.context->allocPd());
  FERRY_ASSIGN_OR_RETURN(side.sendCq, side.context->createCq({.cqe = cqe}));
  FERRY_ASSIGN_OR_RETURN(side.recvCq, side.context->createCq({.cqe = cqe}));
  return Status::ok();
}

Status VerbsTest::createQp(Side& side, const QpOptions& options) const {
  FERRY_ASSIGN_OR_RETURN(side.qp, side.pd.createQp({.type = options.type,
                                                    .sendCq = &side.sendCq,
                                                    .recvCq = &side.recvCq,
                                                    .cap = options.cap,
                                                    .sqSigAll = options.sqSigAll}));
  return Status::ok();
}

Result<std::unique_ptr<ConnectedPair>> VerbsTest::makePair(const PairOptions& options) const {
  auto pair = std::make_unique<ConnectedPair>();
  FERRY_RETURN_IF_ERROR(openSide(pair->a, nullptr, options.cqe));
  FERRY_RETURN_IF_ERROR(openSide(pair->b, options.sameContext ? pair->a.context : nullptr, options.cqe));
  FERRY_RETURN_IF_ERROR(createQp(pair->a, options.qpA));
  FERRY_RETURN_IF_ERROR(createQp(pair->b, options.qpB));
  FERRY_RETURN_IF_ERROR(connectQps(*pair->a.context, pair->a.qp, *pair->b.context, pair->b.qp, options.link,
                                   options.accessA, options.accessB, &pair->a.path, &pair->b.path));
  return pair;
}

}  // namespace ferry::test

namespace ferry {

void PrintTo(StatusCode code, std::ostream* os) { *os << statusCodeName(code); }
void PrintTo(const Status& status, std::ostream* os) { *os << status.toString(); }

}  // namespace ferry

namespace ferry::verbs {

void PrintTo(WcStatus status, std::ostream* os) { *os << wcStatusName(status); }
void PrintTo(WcOpcode opcode, std::ostream* os) { *os << wcOpcodeName(opcode); }
void PrintTo(QpState state, std::ostream* os) { *os << qpStateName(state); }
void PrintTo(AsyncEventType type, std::ostream* os) { *os << asyncEventName(type); }
void PrintTo(const WorkCompletion& wc, std::ostream* os) { *os << test::describe(wc); }

}  // namespace ferry::verbs
