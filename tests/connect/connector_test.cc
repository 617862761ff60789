// The connector in one process: two connectors (each its own agent) on this host, over each lane
// the agents can use here (same_host, tcp) or the device FERRY_AGENT_TEST_DEVICE names (rxe0 in
// the rxe VM). Bytes are checked byte for byte; refusals by their status code and message; a
// cancelled transfer by the memory it must no longer touch.
#include "ferry/connect/connector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "connect/protocol.h"

namespace ferry::connect {
namespace {

using namespace std::chrono_literals;

std::string testDevice() {
  const char* d = std::getenv("FERRY_AGENT_TEST_DEVICE");
  return d && *d ? d : "soft_lo";
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  return v;
}

Buffer buf(std::vector<uint8_t>& v) { return Buffer{.addr = v.data(), .length = v.size()}; }

class ConnectorTest : public ::testing::TestWithParam<std::string> {
 protected:
  ConnectorOptions options(const std::string& name) {
    ConnectorOptions o;
    o.workerId = name + "-" + std::to_string(getpid());
    o.devices = {testDevice()};
    o.listenHost = "127.0.0.1";
    o.connectTimeout = 10s;
    if (GetParam() == "tcp") {
      o.lanes = {{agent::OpClass::kMessages, agent::LaneKind::kTcp},
                 {agent::OpClass::kRma, agent::LaneKind::kTcp},
                 {agent::OpClass::kAtomics, agent::LaneKind::kTcp}};
    }
    return o;
  }
  std::shared_ptr<Connector> start(ConnectorOptions o) {
    auto c = Connector::start(std::move(o));
    EXPECT_TRUE(c.isOk()) << c.status().toString();
    return c.isOk() ? *c : nullptr;
  }
  void SetUp() override {
    a_ = start(options("owner"));
    b_ = start(options("peer"));
    ASSERT_TRUE(a_ && b_);
  }
  void TearDown() override {
    if (a_) a_->shutdown();
    if (b_) b_->shutdown();
  }

  std::shared_ptr<Connector> a_, b_;
};

Status waitDone(const std::shared_ptr<Operation>& op, std::chrono::milliseconds t = 30s) {
  return op->completion().wait(t);
}

TEST_P(ConnectorTest, ReadAndWriteMoveEveryByteOfEveryDescriptor) {
  // Read: three descriptors of the owner into three of the peer.
  std::vector<uint8_t> s0 = pattern(4096, 1), s1 = pattern(1 << 20, 2), s2 = pattern(9 << 20, 3);
  std::vector<uint8_t> d0(s0.size()), d1(s1.size()), d2(s2.size());
  auto readable = a_->createReadable({buf(s0), buf(s1), buf(s2)});
  ASSERT_TRUE(readable.isOk()) << readable.status().toString();
  EXPECT_EQ((*readable)->status(), OperationStatus::kInitialized);
  EXPECT_TRUE((*readable)->passive());
  std::string text = (*readable)->metadata().value();
  auto read = b_->beginRead(text, {buf(d0), buf(d1), buf(d2)});
  ASSERT_TRUE(read.isOk()) << read.status().toString();
  EXPECT_EQ((*read)->status(), OperationStatus::kInProgress);
  ASSERT_TRUE(waitDone(*read).isOk()) << (*read)->error().toString();
  ASSERT_TRUE(waitDone(*readable).isOk()) << (*readable)->error().toString();
  EXPECT_EQ((*read)->status(), OperationStatus::kComplete);
  EXPECT_EQ((*readable)->status(), OperationStatus::kComplete);
  EXPECT_EQ(d0, s0);
  EXPECT_EQ(d1, s1);
  EXPECT_EQ(d2, s2);
  EXPECT_EQ((*readable)->bytes(), s0.size() + s1.size() + s2.size());

  // Write: one descriptor of the peer into the owner's writable.
  std::vector<uint8_t> target(5 << 20, 0), source = pattern(5 << 20, 9);
  auto writable = a_->createWritable({buf(target)});
  ASSERT_TRUE(writable.isOk());
  auto write = b_->beginWrite({buf(source)}, (*writable)->metadata().value());
  ASSERT_TRUE(write.isOk()) << write.status().toString();
  ASSERT_TRUE(waitDone(*write).isOk()) << (*write)->error().toString();
  ASSERT_TRUE(waitDone(*writable).isOk());
  EXPECT_EQ(target, source);
  EXPECT_EQ(a_->stats().served, 2u);
  EXPECT_EQ(b_->stats().begun, 2u);
  EXPECT_EQ(a_->stats().live, 0u);
}

TEST_P(ConnectorTest, MetadataThatWasChangedReusedOrExpiredIsRefused) {
  std::vector<uint8_t> src = pattern(8192, 4), dst(8192, 0);
  auto readable = a_->createReadable({buf(src)});
  ASSERT_TRUE(readable.isOk());
  std::string text = (*readable)->metadata().value();

  // Truncated, not JSON, unknown member: refused by begin itself.
  for (std::string bad : {text.substr(0, text.size() / 2), std::string("garbage"),
                          text.substr(0, text.size() - 1) + ",\"extra\":1}"}) {
    auto r = b_->beginRead(bad, {buf(dst)});
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().toString();
  }
  // Changed (a later expiry, a nonce digit): the owner refuses the tag; nothing moves.
  auto md = decodeMetadata(text).value();
  Metadata later = md;
  later.expires += 3600 * 1000;
  Metadata nonce = md;
  nonce.nonce[0] = nonce.nonce[0] == 'a' ? 'b' : 'a';
  for (const Metadata& changed : {later, nonce}) {
    auto r = b_->beginRead(encodeMetadata(changed), {buf(dst)});
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    Status st = waitDone(*r);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
    EXPECT_NE(st.message().find("tag"), std::string::npos) << st.message();
    EXPECT_EQ((*r)->status(), OperationStatus::kErrored);
  }
  EXPECT_EQ(dst, std::vector<uint8_t>(8192, 0));
  EXPECT_EQ((*readable)->status(), OperationStatus::kInitialized);  // still usable by the real text
  EXPECT_EQ(a_->stats().refused, 2u);

  // Used once: a second use is refused, saying so.
  auto first = b_->beginRead(text, {buf(dst)});
  ASSERT_TRUE(first.isOk());
  ASSERT_TRUE(waitDone(*first).isOk());
  EXPECT_EQ(dst, src);
  std::vector<uint8_t> again(8192, 0);
  auto second = b_->beginRead(text, {buf(again)});
  ASSERT_TRUE(second.isOk());
  Status st = waitDone(*second);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
  EXPECT_NE(st.message().find("used once"), std::string::npos) << st.message();
  EXPECT_EQ(again, std::vector<uint8_t>(8192, 0));

  // Expired: refused before anything is sent.
  b_->shutdown();
  auto o = options("short");
  o.metadataTtl = 50ms;
  auto shortLived = start(o);
  ASSERT_TRUE(shortLived);
  auto expiring = shortLived->createReadable({buf(src)});
  ASSERT_TRUE(expiring.isOk());
  std::this_thread::sleep_for(120ms);
  auto late = a_->beginRead((*expiring)->metadata().value(), {buf(again)});
  ASSERT_FALSE(late.isOk());
  EXPECT_EQ(late.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(late.status().message().find("expired"), std::string::npos) << late.status().message();
  shortLived->shutdown();
}

TEST_P(ConnectorTest, SizesKindsAndBuffersAreCheckedBeforeAnythingMoves) {
  std::vector<uint8_t> src = pattern(4096, 5), small(4095), right(4096), other(4096);
  auto readable = a_->createReadable({buf(src)});
  ASSERT_TRUE(readable.isOk());
  std::string text = (*readable)->metadata().value();
  auto mismatch = b_->beginRead(text, {buf(small)});
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("4095"), std::string::npos) << mismatch.status().message();
  auto count = b_->beginRead(text, {buf(right), buf(other)});
  EXPECT_EQ(count.status().code(), StatusCode::kInvalidArgument);
  auto kind = b_->beginWrite({buf(right)}, text);
  EXPECT_EQ(kind.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(kind.status().message().find("begin_read"), std::string::npos) << kind.status().message();
  Buffer readOnly = buf(right);
  readOnly.readOnly = true;
  EXPECT_EQ(b_->beginRead(text, {readOnly}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->createWritable({readOnly}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->createReadable({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->createReadable({Buffer{.addr = nullptr, .length = 8}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->createReadable({Buffer{.addr = right.data(), .length = 0}}).status().code(),
            StatusCode::kInvalidArgument);
  // Its own metadata: a connector moves bytes between workers.
  EXPECT_EQ(a_->beginRead(text, {buf(right)}).status().code(), StatusCode::kInvalidArgument);
  // A descriptor on a device metadata has no name for (the owner's are "cpu" and "cuda:N").
  auto md = decodeMetadata(text).value();
  EXPECT_EQ(md.descriptors[0].device, "cpu");
  for (const char* device : {"tpu:0", "cuda:", "cuda:x", "cuda:-1", "cuda:123456", "CPU", ""}) {
    md.descriptors[0].device = device;
    auto unknown = b_->beginRead(encodeMetadata(md), {buf(right)});
    EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument) << device;
    EXPECT_NE(unknown.status().message().find("unknown device"), std::string::npos)
        << unknown.status().message();
  }
  // Nothing of the above reached the owner: the operation is still waiting, and works.
  EXPECT_EQ((*readable)->status(), OperationStatus::kInitialized);
  EXPECT_EQ(a_->stats().refused, 0u);
  auto ok = b_->beginRead(text, {buf(right)});
  ASSERT_TRUE(ok.isOk());
  ASSERT_TRUE(waitDone(*ok).isOk());
  EXPECT_EQ(right, src);
}

TEST_P(ConnectorTest, AnOwnerThatCancelsBeforeTheBeginRefusesIt) {
  std::vector<uint8_t> src = pattern(4096, 6), dst(4096, 0);
  auto readable = a_->createReadable({buf(src)});
  ASSERT_TRUE(readable.isOk());
  std::string text = (*readable)->metadata().value();
  (*readable)->cancel();
  EXPECT_EQ((*readable)->status(), OperationStatus::kCancelled);
  EXPECT_EQ(waitDone(*readable).code(), StatusCode::kCancelled);
  auto read = b_->beginRead(text, {buf(dst)});
  ASSERT_TRUE(read.isOk());
  Status st = waitDone(*read);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
  EXPECT_NE(st.message().find("CANCELLED"), std::string::npos) << st.message();
  EXPECT_EQ(dst, std::vector<uint8_t>(4096, 0));
}

// A transfer long enough to be cancelled in flight: 512 MiB in 1 MiB batches, two at a time (64 MiB
// on an RDMA device: the rxe VM has 2 GiB and a slower CPU).
TEST_P(ConnectorTest, AnOperationNoPeerBeganEndsAtItsMetadataExpiryOnBothSides) {
  // The owner never sees the BEGIN (its connector's channel has no handler): its readable ends at
  // the expiry, and the reader, never answered STARTED, ends cancelGrace after it.
  a_->shutdown();
  auto o = options("owner-deaf");
  o.metadataTtl = 300ms;
  a_ = start(o);
  ASSERT_TRUE(a_);
  b_->shutdown();
  auto p = options("reader");
  p.cancelGrace = 500ms;
  b_ = start(p);
  ASSERT_TRUE(b_);
  std::vector<uint8_t> src = pattern(4096, 6), dst(4096, 0);
  auto created = std::chrono::steady_clock::now();
  auto readable = a_->createReadable({buf(src)});
  ASSERT_TRUE(readable.isOk());
  a_->agent()->onMessage("connect", nullptr);
  auto read = b_->beginRead((*readable)->metadata().value(), {buf(dst)});
  ASSERT_TRUE(read.isOk()) << read.status().toString();

  Status st = waitDone(*readable, 5s);
  auto ownerEnded = std::chrono::steady_clock::now() - created;
  EXPECT_EQ(st.code(), StatusCode::kTimedOut) << st.toString();
  EXPECT_NE(st.message().find("expired"), std::string::npos) << st.message();
  EXPECT_GE(ownerEnded, 290ms);  // the expiry is in whole milliseconds
  EXPECT_LT(ownerEnded, 1300ms);
  EXPECT_EQ((*readable)->status(), OperationStatus::kErrored);

  st = waitDone(*read, 10s);
  auto readerEnded = std::chrono::steady_clock::now() - created;
  EXPECT_EQ(st.code(), StatusCode::kTimedOut) << st.toString();
  EXPECT_NE(st.message().find("expired"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("owner-deaf"), std::string::npos) << st.message();
  EXPECT_GE(readerEnded, 790ms);
  EXPECT_LT(readerEnded, 1800ms);
  EXPECT_EQ((*read)->status(), OperationStatus::kErrored);
  EXPECT_EQ(dst, std::vector<uint8_t>(4096, 0));
  EXPECT_EQ(a_->stats().live, 0u);
  EXPECT_EQ(b_->stats().live, 0u);
}

TEST_P(ConnectorTest, AnOperationThatBeganIsNotEndedByItsMetadataExpiry) {
  // The metadata grants the begin until it expires, not the transfer's end: a read that began in
  // time and runs past the expiry (4 KiB batches, one at a time), and past the cancelGrace after
  // it that a reader gives its owner to answer STARTED, completes on both sides.
  a_->shutdown();
  b_->shutdown();
  auto o = options("owner-short");
  o.metadataTtl = 200ms;
  o.chunkBytes = 4096;
  o.window = 1;
  a_ = start(o);
  auto p = options("reader");
  p.cancelGrace = 100ms;
  b_ = start(p);
  ASSERT_TRUE(a_ && b_);
  std::vector<uint8_t> warmSrc = pattern(4096, 7), warmDst(4096, 0);
  auto warm = a_->createReadable({buf(warmSrc)});
  ASSERT_TRUE(warm.isOk());
  auto warmRead = b_->beginRead((*warm)->metadata().value(), {buf(warmDst)});
  ASSERT_TRUE(warmRead.isOk());
  ASSERT_TRUE(waitDone(*warmRead).isOk()) << (*warmRead)->error().toString();  // wired up

  std::vector<uint8_t> src = pattern(128 << 20, 8), dst(128 << 20, 0);
  auto created = std::chrono::steady_clock::now();
  auto readable = a_->createReadable({buf(src)});
  ASSERT_TRUE(readable.isOk());
  auto read = b_->beginRead((*readable)->metadata().value(), {buf(dst)});
  ASSERT_TRUE(read.isOk());
  ASSERT_TRUE(waitDone(*readable, 60s).isOk()) << (*readable)->error().toString();
  ASSERT_TRUE(waitDone(*read, 60s).isOk()) << (*read)->error().toString();
  EXPECT_GT(std::chrono::steady_clock::now() - created, 300ms) << "it did not outlast the expiry and grace";
  EXPECT_EQ(dst, src);
  EXPECT_EQ((*readable)->status(), OperationStatus::kComplete);
  EXPECT_EQ((*read)->status(), OperationStatus::kComplete);
}

const size_t kBig = testDevice() == "soft_lo" ? size_t{512} << 20 : size_t{64} << 20;

ConnectorOptions slow(ConnectorOptions o) {
  o.chunkBytes = 1 << 20;
  o.window = 2;
  return o;
}

// Waits until op moved some bytes (or ended); true when it is still running then.
bool waitForBytes(const std::shared_ptr<Operation>& op) {
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (op->bytes() == 0 && !op->completion().done() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(200us);
  }
  return !op->completion().done();
}

TEST_P(ConnectorTest, AWritableOwnerThatCancelsInFlightStopsAndItsMemoryIsNotTouchedAfter) {
  a_->shutdown();
  a_ = start(slow(options("owner-slow")));
  std::vector<uint8_t> target(kBig, 0), source(kBig, 0xab);
  auto writable = a_->createWritable({buf(target)});
  ASSERT_TRUE(writable.isOk());
  auto write = b_->beginWrite({buf(source)}, (*writable)->metadata().value());
  ASSERT_TRUE(write.isOk());
  ASSERT_TRUE(waitForBytes(*writable)) << "the transfer ended before it could be cancelled";
  (*writable)->cancel();
  EXPECT_EQ((*writable)->status(), OperationStatus::kCancelled);
  std::vector<uint8_t> snapshot = target;
  Status peer = waitDone(*write);
  EXPECT_EQ(peer.code(), StatusCode::kCancelled) << peer.toString();
  EXPECT_EQ((*write)->status(), OperationStatus::kErrored);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(snapshot == target) << "the owner's memory changed after cancel() returned";
  EXPECT_LT(std::count(target.begin(), target.end(), 0xab), static_cast<long>(kBig))
      << "everything had landed";
}

TEST_P(ConnectorTest, AReaderThatCancelsInFlightStopsTheOwnerAndItsMemoryIsNotTouchedAfter) {
  a_->shutdown();
  a_ = start(slow(options("owner-slow")));
  std::vector<uint8_t> source(kBig, 0xcd), target(kBig, 0);
  auto readable = a_->createReadable({buf(source)});
  ASSERT_TRUE(readable.isOk());
  auto read = b_->beginRead((*readable)->metadata().value(), {buf(target)});
  ASSERT_TRUE(read.isOk());
  ASSERT_TRUE(waitForBytes(*readable)) << "the transfer ended before it could be cancelled";
  (*read)->cancel();
  EXPECT_EQ((*read)->status(), OperationStatus::kCancelled);
  std::vector<uint8_t> snapshot = target;
  Status owner = waitDone(*readable);
  EXPECT_EQ(owner.code(), StatusCode::kCancelled) << owner.toString();
  EXPECT_EQ((*readable)->status(), OperationStatus::kErrored);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(snapshot == target) << "the reader's memory changed after cancel() returned";
  // The connection between them survived the cancel: another operation works.
  std::vector<uint8_t> s = pattern(65536, 7), d(65536, 0);
  auto next = a_->createReadable({buf(s)});
  auto r2 = b_->beginRead((*next)->metadata().value(), {buf(d)});
  ASSERT_TRUE(r2.isOk());
  ASSERT_TRUE(waitDone(*r2).isOk()) << (*r2)->error().toString();
  EXPECT_EQ(d, s);
}

// A connection whose endpoint failed (here the owner's agent WRITEs with a forged key on it, which
// ends the RC connection both ways) is replaced: the operation that finds it failed errors, and
// the connectors' operations after it run on a new wireup and move every byte.
TEST_P(ConnectorTest, AConnectionWhoseEndpointFailedIsReplacedForTheNextOperations) {
  auto readOnce = [&](uint8_t seed) -> Status {
    std::vector<uint8_t> s = pattern(256 << 10, seed), d(256 << 10, 0);
    auto readable = a_->createReadable({buf(s)});
    if (!readable.isOk()) return readable.status();
    auto read = b_->beginRead((*readable)->metadata().value(), {buf(d)});
    if (!read.isOk()) return read.status();
    Status st = waitDone(*read);
    (void)waitDone(*readable);
    if (st.isOk() && d != s) return Status(StatusCode::kInternal, "the bytes differ");
    return st;
  };
  ASSERT_TRUE(readOnce(1).isOk());
  // Break the wired connection from the owner's side.
  auto conn = a_->agent()->connectAddress(b_->agent()->address());
  ASSERT_TRUE(conn.isOk()) << conn.status().toString();
  ASSERT_TRUE((*conn)->waitReady(10s).isOk());
  auto endpoint = (*conn)->endpoint();
  ASSERT_TRUE(endpoint);
  std::vector<uint8_t> scratch(4096, 1);
  ASSERT_TRUE(a_->agent()->registerMemoryRegion("scratch", scratch.data(), scratch.size()).isOk());
  std::string info = "{\"addr\":" + std::to_string(reinterpret_cast<uint64_t>(scratch.data())) +
                     ",\"length\":4096,\"rkey\":4242,\"writable\":true}";
  auto remote = endpoint->registerRemoteMemoryRegion("forged", info);
  auto local = endpoint->localHandle("scratch");
  ASSERT_TRUE(remote.isOk() && local.isOk());
  endpoint::Assignment w{.local = *local, .remote = *remote, .length = 4096};
  auto f = endpoint->write(std::span(&w, 1));
  EXPECT_FALSE(f.isOk() && f->wait(10s).isOk());
  ASSERT_FALSE(endpoint->failure().isOk());
  // The next operations: at most the first errors (it found the failed connection); then they work.
  int failed = 0;
  for (uint8_t seed = 2; seed < 6; ++seed) {
    Status st = readOnce(seed);
    if (!st.isOk()) {
      ++failed;
      EXPECT_EQ(seed, 2) << "operation " << int(seed) << " failed too: " << st.toString();
    }
  }
  EXPECT_LE(failed, 1);
}

TEST_P(ConnectorTest, DroppingAnOperationCancelsIt) {
  std::vector<uint8_t> src = pattern(4096, 8), dst(4096, 0);
  std::string text;
  {
    auto readable = a_->createReadable({buf(src)});
    ASSERT_TRUE(readable.isOk());
    text = (*readable)->metadata().value();
  }  // disposed
  auto read = b_->beginRead(text, {buf(dst)});
  ASSERT_TRUE(read.isOk());
  Status st = waitDone(*read);
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.toString();
  EXPECT_EQ(a_->stats().cancelled, 1u);
  EXPECT_EQ(a_->stats().live, 0u);
}

TEST_P(ConnectorTest, AnOwnerThatShutsDownFailsTheTransferOfItsPeer) {
  a_->shutdown();
  a_ = start(slow(options("owner-slow")));
  std::vector<uint8_t> source(kBig, 0x11), target(kBig, 0);
  auto readable = a_->createReadable({buf(source)});
  ASSERT_TRUE(readable.isOk());
  auto read = b_->beginRead((*readable)->metadata().value(), {buf(target)});
  ASSERT_TRUE(read.isOk());
  ASSERT_TRUE(waitForBytes(*readable));
  a_->shutdown();
  EXPECT_EQ((*readable)->status(), OperationStatus::kErrored);
  Status st = waitDone(*read, 20s);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.code(), StatusCode::kTimedOut) << st.toString();
  EXPECT_EQ((*read)->status(), OperationStatus::kErrored);
}

TEST_P(ConnectorTest, AThousandOperationsAtOnceAreEachByteExact) {
  constexpr int kOps = 1000;
  std::vector<std::vector<uint8_t>> src, dst;
  std::vector<std::shared_ptr<Operation>> readables, reads;
  for (int i = 0; i < kOps; ++i) {
    src.push_back(pattern(4096 + 64 * (i % 17), static_cast<uint8_t>(i)));
    dst.emplace_back(src.back().size(), 0);
  }
  for (int i = 0; i < kOps; ++i) {
    auto r = a_->createReadable({buf(src[i])});
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    readables.push_back(*r);
  }
  for (int i = 0; i < kOps; ++i) {
    auto r = b_->beginRead(readables[i]->metadata().value(), {buf(dst[i])});
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    reads.push_back(*r);
  }
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(waitDone(reads[i]).isOk()) << i << ": " << reads[i]->error().toString();
    ASSERT_TRUE(waitDone(readables[i]).isOk()) << i;
    ASSERT_EQ(dst[i], src[i]) << i;
  }
  EXPECT_EQ(a_->stats().completed, static_cast<uint64_t>(kOps));
  EXPECT_EQ(b_->stats().live, 0u);
}

std::vector<std::string> lanes() {
  if (testDevice() != "soft_lo") return {"device"};
  return {"same_host", "tcp"};
}

INSTANTIATE_TEST_SUITE_P(Lanes, ConnectorTest, ::testing::ValuesIn(lanes()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry::connect
