// The endpoint layer against ferry's first device (soft_lo where the software provider runs): two
// endpoints of one process, connected to each other, moving bytes that are checked byte for byte.
#include "ferry/endpoint/endpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/host_backed_device.h"
#include "support/path_memory.h"

namespace ferry::endpoint {
namespace {

using namespace std::chrono_literals;

constexpr auto kWait = 20s;

// A byte pattern that depends on the seed and the position.
uint8_t patternByte(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  return static_cast<uint8_t>((z ^ (z >> 29)) >> 7);
}

void fill(test::Bytes& buf, uint64_t seed) {
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = patternByte(seed, i);
}

// Offset of the first byte of buf[off, off+len) that differs from the pattern at patternOff, or -1.
int64_t mismatch(const test::Bytes& buf, size_t off, size_t len, uint64_t seed, size_t patternOff) {
  for (size_t i = 0; i < len; ++i) {
    if (buf[off + i] != patternByte(seed, patternOff + i)) return static_cast<int64_t>(off + i);
  }
  return -1;
}

struct Pair {
  std::shared_ptr<Endpoint> a;
  std::shared_ptr<Endpoint> b;
};

std::shared_ptr<Endpoint> makeEndpoint(EndpointOptions options) {
  auto ep = Endpoint::create(ContextOptions{}, std::move(options));
  EXPECT_TRUE(ep.isOk()) << ep.status().toString();
  return ep.isOk() ? *ep : nullptr;
}

Pair connectedPair(EndpointOptions a = {}, EndpointOptions b = {}) {
  Pair p{makeEndpoint(a), makeEndpoint(b)};
  if (!p.a || !p.b) return {};
  Status st = p.a->connect(p.b->endpointInfo());
  EXPECT_TRUE(st.isOk()) << st.toString();
  st = p.b->connect(p.a->endpointInfo());
  EXPECT_TRUE(st.isOk()) << st.toString();
  return p;
}

// The mr_info entry of a local region of ep, as the peer receives it.
std::string entryOf(const Endpoint& ep, MrHandle handle) {
  auto r = ep.pool()->find(handle);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  if (!r.isOk()) return "{}";
  return "{\"addr\":" + std::to_string(r->addr) + ",\"length\":" + std::to_string(r->length) +
         ",\"rkey\":" + std::to_string(r->rkey) + ",\"handle\":" + std::to_string(handle) + "}";
}

// Registers buf on ep under name, and on other as the peer's region of that name.
std::pair<MrHandle, MrHandle> share(Endpoint& ep, Endpoint& other, const std::string& name,
                                    test::Bytes& buf) {
  auto local = ep.registerMemoryRegion(name, buf.data(), buf.size());
  EXPECT_TRUE(local.isOk()) << local.status().toString();
  if (!local.isOk()) return {0, 0};
  auto remote = other.registerRemoteMemoryRegion(name, entryOf(ep, *local));
  EXPECT_TRUE(remote.isOk()) << remote.status().toString();
  return {*local, remote.isOk() ? *remote : 0};
}

TEST(EndpointTest, DocumentReadAndWriteTuples) {
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  test::Bytes local(16, 0), remote(16, 1);
  for (size_t i = 0; i < 16; ++i) remote[i] = static_cast<uint8_t>(100 + i);
  auto [lh, unused] = share(*p.a, *p.b, "buffer", local);
  auto [unused2, rh] = share(*p.b, *p.a, "buffer", remote);
  (void)unused;
  (void)unused2;

  // read [(local, remote, 0, 8, 8)]: the 8 bytes at remote offset 8 land at local offset 0.
  Assignment a = fromTuple(OpKind::kRead, lh, rh, 0, 8, 8);
  EXPECT_EQ(a.localOffset, 0u);
  EXPECT_EQ(a.remoteOffset, 8u);
  auto f = p.a->read({&a, 1});
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  ASSERT_TRUE(f->wait(kWait).isOk());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(local[i], 108 + i) << i;
  for (size_t i = 8; i < 16; ++i) EXPECT_EQ(local[i], 0) << i;

  // write [(local, remote, 0, 8, 8)] (the peer example): local offset 8 goes to remote offset 0.
  std::fill(local.begin(), local.end(), 0);
  std::fill(remote.begin(), remote.end(), 1);
  Assignment w = fromTuple(OpKind::kWrite, lh, rh, 0, 8, 8);
  auto g = p.a->write({&w, 1});
  ASSERT_TRUE(g.isOk());
  ASSERT_TRUE(g->wait(kWait).isOk());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(remote[i], 0) << i;
  for (size_t i = 8; i < 16; ++i) EXPECT_EQ(remote[i], 1) << i;
}

// A shutdown right after a WRITE_WITH_IMM completed at the writer (its peer leaving at once) still
// delivers the immediate that arrived: what completed before the shutdown succeeds. Made certain:
// b's worker is held in a callback of another endpoint it progresses, so the immediate is still in
// b's completion queue, untaken, when the shutdown comes (no waiter polls b either).
TEST(EndpointTest, AnImmediateThatArrivedIsDeliveredByAShutdownThatFollows) {
  auto worker = Worker::create();
  ASSERT_TRUE(worker.isOk()) << worker.status().toString();
  Pair p = connectedPair({}, {.worker = *worker});
  Pair q = connectedPair({.worker = *worker}, {});
  ASSERT_TRUE(p.a && p.b && q.a && q.b);

  // Hold the worker: q.a's recv completes on it, and the callback waits until released.
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  struct Releaser {
    std::promise<void>& release;
    bool done = false;
    void operator()() {
      if (!done) release.set_value();
      done = true;
    }
    ~Releaser() { (*this)(); }
  } releaser{release};
  test::Bytes out(64, 5), in(64, 0);
  auto oh = q.b->registerMemoryRegion("out", out.data(), out.size());
  auto ih = q.a->registerMemoryRegion("in", in.data(), in.size());
  ASSERT_TRUE(oh.isOk() && ih.isOk());
  Chunk rc{.mr = *ih, .offset = 0, .length = 64};
  auto held = q.a->recv({&rc, 1});
  ASSERT_TRUE(held.isOk()) << held.status().toString();
  held->state()->onDone([&entered, released](const Completion&) {
    entered.set_value();
    released.wait();
  });
  Chunk sc{.mr = *oh, .offset = 0, .length = 64};
  auto sent = q.b->send({&sc, 1});
  ASSERT_TRUE(sent.isOk());
  ASSERT_EQ(entered.get_future().wait_for(kWait), std::future_status::ready)
      << "the worker never took q.a's message";

  test::Bytes src(4096), dst(4096, 0);
  fill(src, 40);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [unusedB, dr] = share(*p.b, *p.a, "dst", dst);
  (void)unusedA;
  (void)unusedB;
  auto imm = p.b->immRecv();
  ASSERT_TRUE(imm.isOk());
  Assignment a{.local = sl, .remote = dr, .length = 4096};
  auto w = p.a->writeWithImm({&a, 1}, 77);
  ASSERT_TRUE(w.isOk());
  ASSERT_TRUE(w->wait(kWait).isOk());
  EXPECT_FALSE(imm->done()) << "b's worker is held: nothing took the immediate yet";
  p.b->shutdown(Status(StatusCode::kPeerGone, "the peer left"));
  ASSERT_TRUE(imm->done()) << "the shutdown completes every operation";
  Status st = imm->status();
  EXPECT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(imm->immData(), 77u);
  EXPECT_EQ(dst, src);
  releaser();
  EXPECT_TRUE(held->wait(kWait).isOk());
  EXPECT_TRUE(sent->wait(kWait).isOk());
}

// MemoryPool::allocMemoryRegion: zero-filled memory the pool allocates and holds, moving READ and
// WRITE like any region; refused for length 0 or a bad name, with nothing registered.
TEST(EndpointTest, AllocatedRegionsHoldTheirMemoryAndMoveBytes) {
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  auto srcMade = p.a->pool()->allocMemoryRegion("src", 6000);
  auto dstMade = p.b->pool()->allocMemoryRegion("dst", 6000);
  ASSERT_TRUE(srcMade.isOk() && dstMade.isOk()) << srcMade.status().toString() << dstMade.status().toString();
  std::shared_ptr<SharedMemory> src = std::move(*srcMade), dst = std::move(*dstMade);
  std::span<uint8_t> s(static_cast<uint8_t*>(src->data()), 6000), d(static_cast<uint8_t*>(dst->data()), 6000);
  EXPECT_TRUE(std::all_of(d.begin(), d.end(), [](uint8_t b) { return b == 0; }));
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(i * 13 + 5);
  auto local = p.a->pool()->handleOf("src");
  auto dh = p.b->pool()->handleOf("dst");
  ASSERT_TRUE(local.isOk() && dh.isOk());
  auto remote = p.a->registerRemoteMemoryRegion("dst", entryOf(*p.b, *dh));
  ASSERT_TRUE(remote.isOk()) << remote.status().toString();
  Assignment w{.local = *local, .remote = *remote, .localOffset = 0, .remoteOffset = 1000, .length = 5000};
  {
    auto f = p.a->write({&w, 1});
    ASSERT_TRUE(f.isOk()) << f.status().toString();
    ASSERT_TRUE(f->wait(kWait).isOk());
  }
  EXPECT_TRUE(std::equal(s.begin(), s.begin() + 5000, d.begin() + 1000));
  EXPECT_TRUE(std::all_of(d.begin(), d.begin() + 1000, [](uint8_t b) { return b == 0; }));
  // The pool holds the memory: dropping ours leaves the region usable.
  std::weak_ptr<SharedMemory> held = dst;
  dst.reset();
  EXPECT_FALSE(held.expired());
  ASSERT_TRUE(p.b->pool()->unregisterMemoryRegion("dst").isOk());
  EXPECT_TRUE(held.expired()) << "unregistered, the region lets its memory go";
  EXPECT_EQ(p.a->pool()->allocMemoryRegion("zero", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.a->pool()->allocMemoryRegion("", 64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.a->pool()->handleOf("zero").status().code(), StatusCode::kNotFound);
}

// What a region grants a peer holding its keys (RegionOptions::remote), and what mr_info lists
// (published). Each refused access is tried on a fresh pair: a remote access error ends the queue pair.
TEST(EndpointTest, RegionsGrantOnlyTheirRemoteAccessAndPrivateOnesAreNotListed) {
  test::Bytes owner(4096), mine(4096, 0);
  fill(owner, 3);
  using Remote = RegionOptions::Remote;
  struct Case {
    Remote remote;
    bool write;  // the peer WRITEs (else READs)
    bool allowed;
  };
  for (const Case c : {Case{Remote::kNone, false, false}, Case{Remote::kNone, true, false},
                       Case{Remote::kWriteOnly, false, false}, Case{Remote::kWriteOnly, true, true},
                       Case{Remote::kDefault, false, true}}) {
    Pair p = connectedPair();
    ASSERT_TRUE(p.a && p.b);
    RegionOptions o;
    o.remote = c.remote;
    o.published = false;
    auto h = p.b->registerMemoryRegion("private", owner.data(), owner.size(), o);
    ASSERT_TRUE(h.isOk()) << h.status().toString();
    EXPECT_EQ(p.b->mrInfo().find("private"), std::string::npos);
    auto info = p.b->pool()->regionInfo(*h);
    ASSERT_TRUE(info.isOk());
    auto remote = p.a->registerRemoteMemoryRegion("private", *info);
    ASSERT_TRUE(remote.isOk()) << remote.status().toString();
    auto local = p.a->registerMemoryRegion("mine", mine.data(), mine.size());
    ASSERT_TRUE(local.isOk());
    test::Bytes before = owner;
    std::fill(mine.begin(), mine.end(), 0);
    Assignment a{.local = *local, .remote = *remote, .length = 4096};
    auto f = c.write ? p.a->write({&a, 1}) : p.a->read({&a, 1});
    ASSERT_TRUE(f.isOk());
    Status st = f->wait(kWait);
    EXPECT_EQ(st.isOk(), c.allowed) << static_cast<int>(c.remote) << (c.write ? " write: " : " read: ")
                                    << st.toString();
    if (!c.allowed) {
      EXPECT_EQ(owner, before) << "a refused access changed the owner's memory";
      if (!c.write) {
        EXPECT_EQ(mine, test::Bytes(4096, 0)) << "a refused READ delivered bytes";
      }
    }
    ASSERT_TRUE(p.a->unregisterRemoteMemoryRegion(*remote).isOk());
    EXPECT_EQ(p.a->unregisterRemoteMemoryRegion(*remote).code(), StatusCode::kNotFound);
  }
}

TEST(EndpointTest, NamedFieldsAndHandles) {
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  test::Bytes src(4096), dst(4096, 0);
  fill(src, 7);
  auto key = p.a->registerMemoryRegion(uint64_t{42}, src.data(), src.size());
  ASSERT_TRUE(key.isOk());
  EXPECT_EQ(*key, 42u);  // an integer key is its own handle
  auto named = p.b->registerMemoryRegion("dst", dst.data(), dst.size());
  ASSERT_TRUE(named.isOk());
  EXPECT_GE(*named, kNamedHandleBase);
  // connect() recorded the peer's regions that existed then; these came later.
  auto remote = p.a->registerRemoteMemoryRegion("dst", entryOf(*p.b, *named));
  ASSERT_TRUE(remote.isOk()) << remote.status().toString();
  EXPECT_EQ(*remote, *named);  // the peer's handle, where free
  Assignment a{.local = 42, .remote = *remote, .localOffset = 100, .remoteOffset = 200, .length = 1000};
  auto f = p.a->write({&a, 1});
  ASSERT_TRUE(f.isOk());
  ASSERT_TRUE(f->wait(kWait).isOk());
  EXPECT_EQ(std::memcmp(dst.data() + 200, src.data() + 100, 1000), 0);
  EXPECT_EQ(dst[199], 0);
  EXPECT_EQ(dst[1200], 0);
}

class EndpointStriping : public ::testing::TestWithParam<size_t> {};

TEST_P(EndpointStriping, LargeTransferUsesEveryQueuePair) {
  const size_t numQp = GetParam();
  EndpointOptions o{.numQp = numQp, .maxWorkRequestBytes = 1 << 20, .minStripeBytes = 64 << 10};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  const size_t size = 8u << 20;
  test::Bytes src(size), dst(size, 0), back(size, 0);
  fill(src, 11);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [dl, dr] = share(*p.b, *p.a, "dst", dst);
  auto [bl, unusedB] = share(*p.a, *p.b, "back", back);
  (void)unusedA;
  (void)unusedB;
  (void)dl;
  Assignment w{.local = sl, .remote = dr, .length = size};
  auto f = p.a->write({&w, 1});
  ASSERT_TRUE(f.isOk());
  ASSERT_TRUE(f->wait(kWait).isOk()) << f->status().toString();
  EXPECT_EQ(mismatch(dst, 0, size, 11, 0), -1);
  Assignment r{.local = bl, .remote = dr, .length = size};
  auto g = p.a->read({&r, 1});
  ASSERT_TRUE(g.isOk());
  ASSERT_TRUE(g->wait(kWait).isOk()) << g->status().toString();
  EXPECT_EQ(mismatch(back, 0, size, 11, 0), -1);

  EndpointStats s = p.a->stats();
  ASSERT_EQ(s.qps.size(), numQp);
  for (size_t i = 0; i < numQp; ++i) {
    // Both transfers were split evenly enough that every queue pair carried a share.
    EXPECT_GE(s.qps[i].bytes, 2 * size / numQp / 2) << "queue pair " << i;
    EXPECT_GE(s.qps[i].workRequests, 2u) << "queue pair " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(NumQp, EndpointStriping, ::testing::Values(1, 2, 4));

TEST(EndpointTest, HundredThousandAssignmentsStayWithinQueueDepth) {
  EndpointOptions o{.numQp = 2, .sendDepth = 64};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  const size_t count = 100000;
  const size_t piece = 8;
  test::Bytes src(count * piece), dst(count * piece, 0);
  fill(src, 3);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [unusedB, dr] = share(*p.b, *p.a, "dst", dst);
  (void)unusedA;
  (void)unusedB;
  // Scattered: assignment i moves source piece i to destination piece (i * 7919) % count.
  std::vector<Assignment> batch(count);
  for (size_t i = 0; i < count; ++i) {
    batch[i] = {.local = sl,
                .remote = dr,
                .localOffset = i * piece,
                .remoteOffset = (i * 7919) % count * piece,
                .length = piece};
  }
  auto start = std::chrono::steady_clock::now();
  auto f = p.a->write(batch);
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  ASSERT_TRUE(f->wait(60s).isOk()) << f->status().toString();
  auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < count; ++i) {
    size_t to = (i * 7919) % count * piece;
    ASSERT_EQ(std::memcmp(dst.data() + to, src.data() + i * piece, piece), 0) << "assignment " << i;
  }
  EndpointStats s = p.a->stats();
  for (const auto& qp : s.qps) {
    EXPECT_LE(qp.maxOutstanding, 64u);
    EXPECT_GT(qp.workRequests, count / 4);
  }
  EXPECT_EQ(s.operationsQueued, 0u);
  std::printf("100000 x 8-byte WRITE assignments over 2 queue pairs: %.3f s (%.2f us each)\n", seconds,
              seconds * 1e6 / count);
}

TEST(EndpointTest, ConsecutiveRangesShareWorkRequests) {
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  const size_t pages = 1024, page = 4096;
  test::Bytes src(pages * page), dst(pages * page, 0);
  fill(src, 13);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [unusedB, dr] = share(*p.b, *p.a, "dst", dst);
  (void)unusedA;
  (void)unusedB;
  std::vector<Assignment> batch;
  for (size_t i = 0; i < pages; ++i) {
    batch.push_back(
        {.local = sl, .remote = dr, .localOffset = i * page, .remoteOffset = i * page, .length = page});
  }
  auto f = p.a->write(batch);
  ASSERT_TRUE(f.isOk());
  ASSERT_TRUE(f->wait(kWait).isOk());
  EXPECT_EQ(dst, src);
  // 4 MiB of consecutive pages: one work request of maxWorkRequestBytes, not 1024.
  EXPECT_EQ(p.a->stats().qps[0].workRequests, 1u);
}

class EndpointManyOperations : public ::testing::TestWithParam<size_t> {};

TEST_P(EndpointManyOperations, MoreThanTheQueueDepthInFlight) {
  const size_t numQp = GetParam();
  EndpointOptions o{.numQp = numQp, .sendDepth = 8, .recvDepth = 4, .recvBufferSize = 1024};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  const size_t ops = 600;
  const size_t piece = 3000;  // not a multiple of anything in particular
  test::Bytes src(ops * piece), dst(ops * piece, 0), back(ops * piece, 0);
  fill(src, 5);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [unusedB, dr] = share(*p.b, *p.a, "dst", dst);
  auto [bl, unusedC] = share(*p.a, *p.b, "back", back);
  (void)unusedA;
  (void)unusedB;
  (void)unusedC;
  std::vector<ReadWriteFuture> writes;
  for (size_t i = 0; i < ops; ++i) {
    Assignment a{
        .local = sl, .remote = dr, .localOffset = i * piece, .remoteOffset = i * piece, .length = piece};
    auto f = p.a->write({&a, 1});
    ASSERT_TRUE(f.isOk()) << f.status().toString();
    writes.push_back(*f);
  }
  for (auto& f : writes) ASSERT_TRUE(f.wait(kWait).isOk()) << f.status().toString();
  EXPECT_EQ(mismatch(dst, 0, dst.size(), 5, 0), -1);
  std::vector<ReadWriteFuture> reads;
  for (size_t i = 0; i < ops; ++i) {
    Assignment a{
        .local = bl, .remote = dr, .localOffset = i * piece, .remoteOffset = i * piece, .length = piece};
    auto f = p.a->read({&a, 1});
    ASSERT_TRUE(f.isOk());
    reads.push_back(*f);
  }
  for (auto& f : reads) ASSERT_TRUE(f.wait(kWait).isOk()) << f.status().toString();
  EXPECT_EQ(mismatch(back, 0, back.size(), 5, 0), -1);
  for (const auto& qp : p.a->stats().qps) EXPECT_LE(qp.maxOutstanding, 8u);

  // Messages too: many more than the receive depth, several fragments each.
  test::Bytes sendBuf(ops * 2500), recvBuf(ops * 2500, 0);
  fill(sendBuf, 9);
  auto sh = p.a->registerMemoryRegion("send", sendBuf.data(), sendBuf.size());
  auto rh = p.b->registerMemoryRegion("recv", recvBuf.data(), recvBuf.size());
  ASSERT_TRUE(sh.isOk() && rh.isOk());
  std::vector<SendFuture> sends;
  std::vector<RecvFuture> recvs;
  for (size_t i = 0; i < ops; ++i) {
    Chunk c{.mr = *sh, .offset = i * 2500, .length = 2500};
    auto s = p.a->send({&c, 1});
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    sends.push_back(*s);
    if (i % 3 == 0) {  // some recv()s come before their message, some after
      Chunk r{.mr = *rh, .offset = recvs.size() * 2500, .length = 2500};
      auto f = p.b->recv({&r, 1});
      ASSERT_TRUE(f.isOk());
      recvs.push_back(*f);
    }
  }
  while (recvs.size() < ops) {
    Chunk r{.mr = *rh, .offset = recvs.size() * 2500, .length = 2500};
    auto f = p.b->recv({&r, 1});
    ASSERT_TRUE(f.isOk());
    recvs.push_back(*f);
  }
  for (auto& s : sends) ASSERT_TRUE(s.wait(kWait).isOk()) << s.status().toString();
  for (auto& r : recvs) {
    ASSERT_TRUE(r.wait(kWait).isOk()) << r.status().toString();
    EXPECT_EQ(r.bytes(), 2500u);
  }
  EXPECT_EQ(mismatch(recvBuf, 0, recvBuf.size(), 9, 0), -1);
}

INSTANTIATE_TEST_SUITE_P(NumQp, EndpointManyOperations, ::testing::Values(1, 2, 4));

class EndpointImmediates : public ::testing::TestWithParam<size_t> {};

TEST_P(EndpointImmediates, ExactlyOnceInOrderWhateverCameFirst) {
  const size_t numQp = GetParam();
  EndpointOptions o{.numQp = numQp, .sendDepth = 16, .recvDepth = 8, .minStripeBytes = 4096};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  const size_t block = 64 << 10;
  const size_t rounds = 40;
  test::Bytes src(block * rounds), dst(block * rounds, 0);
  fill(src, 21);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [unusedB, dr] = share(*p.b, *p.a, "dst", dst);
  (void)unusedA;
  (void)unusedB;
  auto writeBlock = [&](size_t i) {
    Assignment a{
        .local = sl, .remote = dr, .localOffset = i * block, .remoteOffset = i * block, .length = block};
    auto f = p.a->writeWithImm({&a, 1}, static_cast<uint32_t>(1000 + i));
    EXPECT_TRUE(f.isOk()) << f.status().toString();
    return *f;
  };
  auto expectImm = [&](ImmRecvFuture& f, size_t i) {
    ASSERT_TRUE(f.wait(kWait).isOk()) << f.status().toString();
    EXPECT_EQ(f.immData(), 1000 + i);
    // The data of that write is in place when its immediate is seen.
    EXPECT_EQ(mismatch(dst, i * block, block, 21, i * block), -1) << "round " << i;
  };
  size_t i = 0;
  // Pre-posted: immRecv() before the write.
  for (; i < 10; ++i) {
    auto r = p.b->immRecv();
    ASSERT_TRUE(r.isOk());
    auto w = writeBlock(i);
    ASSERT_TRUE(w.wait(kWait).isOk());
    expectImm(*r, i);
  }
  // Write first: all arrive before anyone asks.
  std::vector<ReadWriteFuture> writes;
  for (; i < 25; ++i) writes.push_back(writeBlock(i));
  for (auto& w : writes) ASSERT_TRUE(w.wait(kWait).isOk());
  // The peer's completions reach its worker thread shortly after the writes complete here.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (p.b->stats().immediatesQueued < 15 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(p.b->stats().immediatesQueued, 15u);
  for (size_t k = 10; k < 25; ++k) {
    auto r = p.b->immRecv();
    ASSERT_TRUE(r.isOk());
    expectImm(*r, k);
  }
  // Interleaved from two threads.
  std::vector<ImmRecvFuture> recvs;
  std::thread writer([&] {
    for (size_t k = 25; k < rounds; ++k) {
      auto w = writeBlock(k);
      EXPECT_TRUE(w.wait(kWait).isOk());
    }
  });
  for (size_t k = 25; k < rounds; ++k) {
    auto r = p.b->immRecv();
    ASSERT_TRUE(r.isOk());
    recvs.push_back(*r);
    if (k % 4 == 0) std::this_thread::sleep_for(1ms);
  }
  writer.join();
  for (size_t k = 25; k < rounds; ++k) expectImm(recvs[k - 25], k);
  // Exactly once: nothing is left over.
  auto extra = p.b->immRecv();
  ASSERT_TRUE(extra.isOk());
  EXPECT_EQ(extra->wait(200ms).code(), StatusCode::kTimedOut);
  EXPECT_EQ(p.b->stats().immediatesQueued, 0u);
}

INSTANTIATE_TEST_SUITE_P(NumQp, EndpointImmediates, ::testing::Values(1, 3));

TEST(EndpointTest, SendRecvSizesAndChecks) {
  EndpointOptions o{.numQp = 2, .recvDepth = 4, .recvBufferSize = 4096, .maxUnexpectedBytes = 16 << 10};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  test::Bytes src(256 << 10), dst(256 << 10, 0);
  fill(src, 33);
  auto sh = p.a->registerMemoryRegion("src", src.data(), src.size());
  auto rh = p.b->registerMemoryRegion("dst", dst.data(), dst.size());
  ASSERT_TRUE(sh.isOk() && rh.isOk());

  auto roundTrip = [&](std::vector<Chunk> sendChunks, std::vector<Chunk> recvChunks) {
    auto r = p.b->recv(recvChunks);
    EXPECT_TRUE(r.isOk());
    auto s = p.a->send(sendChunks);
    EXPECT_TRUE(s.isOk());
    EXPECT_TRUE(s->wait(kWait).isOk()) << s->status().toString();
    Status st = r->wait(kWait);
    return std::make_pair(st, r->bytes());
  };
  // One fragment, many fragments, empty.
  for (uint64_t len : {uint64_t{100}, uint64_t{4096}, uint64_t{4097}, uint64_t{200000}, uint64_t{0}}) {
    std::fill(dst.begin(), dst.end(), 0);
    auto [st, bytes] =
        roundTrip({{.mr = *sh, .offset = 5, .length = len}}, {{.mr = *rh, .offset = 0, .length = 250000}});
    ASSERT_TRUE(st.isOk()) << len << ": " << st.toString();
    EXPECT_EQ(bytes, len);
    EXPECT_EQ(mismatch(dst, 0, len, 33, 5), -1) << len;
    EXPECT_EQ(dst[len], 0) << len;
  }
  // Gather and scatter over several chunks.
  std::fill(dst.begin(), dst.end(), 0);
  auto [st, bytes] =
      roundTrip({{.mr = *sh, .offset = 0, .length = 3000}, {.mr = *sh, .offset = 3000, .length = 7000}},
                {{.mr = *rh, .offset = 0, .length = 1}, {.mr = *rh, .offset = 1, .length = 20000}});
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(bytes, 10000u);
  EXPECT_EQ(mismatch(dst, 0, 10000, 33, 0), -1);

  // Longer than the receive buffer: that recv() fails clearly; the next message is unaffected.
  auto small = p.b->recv(std::vector<Chunk>{{.mr = *rh, .offset = 0, .length = 1000}});
  auto big = p.a->send(std::vector<Chunk>{{.mr = *sh, .offset = 0, .length = 5000}});
  ASSERT_TRUE(small.isOk() && big.isOk());
  EXPECT_TRUE(big->wait(kWait).isOk());
  Status tooLong = small->wait(kWait);
  EXPECT_EQ(tooLong.code(), StatusCode::kInvalidArgument) << tooLong.toString();
  EXPECT_NE(tooLong.message().find("longer than the receive buffer"), std::string::npos) << tooLong.message();
  auto [st2, bytes2] =
      roundTrip({{.mr = *sh, .offset = 64, .length = 64}}, {{.mr = *rh, .offset = 0, .length = 64}});
  EXPECT_TRUE(st2.isOk()) << st2.toString();
  EXPECT_EQ(mismatch(dst, 0, 64, 33, 64), -1);

  // Messages ahead of their recv(): more than the receive depth and than maxUnexpectedBytes.
  std::vector<SendFuture> early;
  for (int i = 0; i < 12; ++i) {
    auto s = p.a->send(std::vector<Chunk>{{.mr = *sh, .offset = uint64_t(i) * 8192, .length = 8192}});
    ASSERT_TRUE(s.isOk());
    early.push_back(*s);
  }
  std::this_thread::sleep_for(100ms);
  std::fill(dst.begin(), dst.end(), 0);
  for (int i = 0; i < 12; ++i) {
    auto r = p.b->recv(std::vector<Chunk>{{.mr = *rh, .offset = uint64_t(i) * 8192, .length = 8192}});
    ASSERT_TRUE(r.isOk());
    ASSERT_TRUE(r->wait(kWait).isOk()) << r->status().toString();
  }
  for (auto& s : early) EXPECT_TRUE(s.wait(kWait).isOk());
  EXPECT_EQ(mismatch(dst, 0, 12 * 8192, 33, 0), -1);
  EXPECT_EQ(p.b->stats().unexpectedBytes, 0u);
}

// 200 writes of 8 bytes, each after a 200 us pause and finished by `finish` (a wait, a poll
// loop); the fewest worker wake-ups of up to five rounds (a round the scheduler held past the
// lease proves nothing) and every byte checked.
void expectPolledWritesSpareTheWorker(uint8_t seed,
                                      const std::function<void(const ReadWriteFuture&)>& finish) {
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  test::Bytes local(4096), remote(4096, 0);
  fill(local, seed);
  auto [lh, unused] = share(*p.a, *p.b, "local", local);
  auto [unused2, rh] = share(*p.b, *p.a, "remote", remote);
  (void)unused;
  (void)unused2;
  constexpr uint64_t kOps = 200;
  uint64_t fewest = kOps;
  for (int round = 0; round < 5 && fewest >= kOps / 4; ++round) {
    const uint64_t before = p.a->stats().workerWakeups;
    for (uint64_t i = 0; i < kOps; ++i) {
      std::this_thread::sleep_for(200us);
      const uint64_t off = i * 8;
      Assignment w{.local = lh, .remote = rh, .localOffset = off, .remoteOffset = off, .length = 8};
      auto f = p.a->write({&w, 1});
      ASSERT_TRUE(f.isOk()) << f.status().toString();
      ASSERT_NO_FATAL_FAILURE(finish(*f));
    }
    fewest = std::min(fewest, p.a->stats().workerWakeups - before);
  }
  EXPECT_LT(fewest, kOps / 4) << "the worker was woken " << fewest << " times for " << kOps
                              << " polled writes";
  EXPECT_EQ(mismatch(remote, 0, kOps * 8, seed, 0), -1);
  EXPECT_EQ(remote[kOps * 8], 0);
}

// A waiter that polls takes its completions itself. While waiters keep polling (and for
// FERRY_WAIT_LEASE_US after one got its operation), the worker leaves the CQ unarmed, so it is not
// woken for each completion. Each write follows a pause well within the lease and long enough for
// a woken worker to run: without the lease, nearly every write wakes it. A round in which the
// scheduler held the loop past the lease proves nothing, so the fewest wake-ups of up to five
// rounds is judged. (Fails with FERRY_WAIT_LEASE_US=0.)
TEST(EndpointTest, WaitersThatPollSpareTheWorkerAWakeUpPerOperation) {
  expectPolledWritesSpareTheWorker(
      7, [](const ReadWriteFuture& f) { ASSERT_TRUE(f.wait(kWait).isOk()) << f.status().toString(); });
}

// A poll loop (Future::poll) completes operations on its own thread: the worker is not woken for
// each of them, and every byte lands. An empty future polls as not done.
TEST(EndpointTest, APollLoopCompletesOperationsWithoutTheWorker) {
  EXPECT_FALSE(Future().poll());
  expectPolledWritesSpareTheWorker(9, [](const ReadWriteFuture& f) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!f.poll()) ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the poll loop never ended";
    ASSERT_TRUE(f.status().isOk()) << f.status().toString();
    EXPECT_TRUE(f.poll()) << "a done operation polls as done";
  });
}

// What needs the worker while pollers hold the CQ unarmed still completes: a waiter that sleeps
// (its message comes long after its poll ended) and a callback nobody waits for. Both follow
// polled operations on the same endpoint, so the lease holds when they begin.
TEST(EndpointTest, ASleepingWaiterAndACallbackCompleteWhileWaitersPoll) {
  EndpointOptions o{.numQp = 1, .recvDepth = 4, .recvBufferSize = 4096};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  test::Bytes src(4096), dst(4096, 0);
  fill(src, 11);
  auto [sh, srcOnB] = share(*p.a, *p.b, "src", src);  // a's region, and b's handle of it
  auto dstOnB = p.b->registerMemoryRegion("dst", dst.data(), dst.size());
  ASSERT_TRUE(dstOnB.isOk()) << dstOnB.status().toString();
  const MrHandle dh = *dstOnB;
  auto chunks = [](MrHandle mr, uint64_t offset, uint64_t length) {
    return std::vector<Chunk>{{.mr = mr, .offset = offset, .length = length}};
  };
  auto pollSome = [&, srcOnB = srcOnB] {
    for (int i = 0; i < 20; ++i) {
      Assignment r{.local = dh, .remote = srcOnB, .localOffset = 0, .remoteOffset = 0, .length = 64};
      auto f = p.b->read({&r, 1});
      ASSERT_TRUE(f.isOk()) << f.status().toString();
      ASSERT_TRUE(f->wait(kWait).isOk()) << f->status().toString();
    }
  };

  // A waiter that sleeps: the message is sent 30 ms after its recv() began.
  pollSome();
  auto r1 = p.b->recv(chunks(dh, 100, 100));
  ASSERT_TRUE(r1.isOk()) << r1.status().toString();
  std::thread late([&] {
    std::this_thread::sleep_for(30ms);
    auto s = p.a->send(chunks(sh, 1, 100));
    EXPECT_TRUE(s.isOk() && s->wait(kWait).isOk());
  });
  Status st = r1->wait(kWait);
  late.join();
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(mismatch(dst, 100, 100, 11, 1), -1);

  // A callback, with nobody waiting on b: the worker runs it.
  pollSome();
  auto r2 = p.b->recv(chunks(dh, 300, 200));
  ASSERT_TRUE(r2.isOk()) << r2.status().toString();
  std::promise<Status> called;
  r2->state()->onDone([&called](const Completion& op) { called.set_value(op.status()); });
  auto s2 = p.a->send(chunks(sh, 2, 200));
  ASSERT_TRUE(s2.isOk());
  ASSERT_TRUE(s2->wait(kWait).isOk());
  auto done = called.get_future();
  ASSERT_EQ(done.wait_for(kWait), std::future_status::ready) << "the callback never ran";
  EXPECT_TRUE(done.get().isOk());
  EXPECT_EQ(mismatch(dst, 300, 200, 11, 2), -1);
}

TEST(EndpointTest, BadInputIsRefusedBeforeAnythingMoves) {
  auto lone = makeEndpoint({});
  ASSERT_TRUE(lone);
  test::Bytes buf(64);
  auto h = lone->registerMemoryRegion("buf", buf.data(), buf.size());
  ASSERT_TRUE(h.isOk());
  Assignment a{.local = *h, .remote = *h, .length = 8};
  // Not connected yet.
  EXPECT_EQ(lone->read({&a, 1}).status().code(), StatusCode::kInvalidArgument);  // no such remote region
  auto self = lone->registerRemoteMemoryRegion(
      "buf",
      "{\"addr\":" + std::to_string(reinterpret_cast<uintptr_t>(buf.data())) + ",\"length\":64,\"rkey\":1}");
  ASSERT_TRUE(self.isOk());
  Assignment b{.local = *h, .remote = *self, .length = 8};
  EXPECT_EQ(lone->read({&b, 1}).status().code(), StatusCode::kUnavailable);
  // Out of range, unknown handles.
  Assignment c{.local = *h, .remote = *self, .localOffset = 60, .length = 8};
  EXPECT_EQ(lone->write({&c, 1}).status().code(), StatusCode::kInvalidArgument);
  Assignment d{.local = *h, .remote = *self, .remoteOffset = uint64_t(-4), .length = 8};
  EXPECT_EQ(lone->write({&d, 1}).status().code(), StatusCode::kInvalidArgument);
  Assignment e{.local = 12345, .remote = *self, .length = 8};
  EXPECT_EQ(lone->write({&e, 1}).status().code(), StatusCode::kInvalidArgument);
  // Registration errors.
  EXPECT_EQ(lone->registerMemoryRegion("buf", buf.data() + 1, 8).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lone->registerMemoryRegion("buf", buf.data(), buf.size()).value(),
            *h);  // same range: same handle
  EXPECT_EQ(lone->registerMemoryRegion(uint64_t{1} << 40, buf.data(), 8).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lone->registerRemoteMemoryRegion("x", "{\"addr\":1}").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lone->registerRemoteMemoryRegion("x", "{\"addr\":1,\"length\":2,\"rkey\":-1}").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(lone->registerRemoteMemoryRegion("x", "not json").status().code(), StatusCode::kInvalidArgument);
}

TEST(EndpointTest, MalformedPeerInfoChangesNothing) {
  auto a = makeEndpoint({.numQp = 2});
  auto b = makeEndpoint({.numQp = 2});
  auto c = makeEndpoint({.numQp = 1});
  ASSERT_TRUE(a && b && c);
  std::string good = b->endpointInfo();
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  std::vector<std::string> bad = {
      "",
      "[]",
      "{}",
      "{\"io_info\":{}}",
      good.substr(0, good.size() / 2),
      replace("\"ferry_endpoint\":1", "\"ferry_endpoint\":99"),
      replace("\"ferry_endpoint\":1", "\"ferry_endpoint\":\"1\""),
      replace("\"num_qp\":2", "\"num_qp\":3"),
      replace("\"qp_paths\":[", "\"qp_paths\":[{},"),
      replace("\"qp_paths\":[", "\"qp_paths\":7,\"x\":["),
      replace("\"recv_buffer_size\":65536", "\"recv_buffer_size\":1"),
      replace("\"mr_info\":{", "\"mr_info\":{\"evil\":{\"addr\":-1,\"length\":1,\"rkey\":1},"),
      replace("\"sqpn\":", "\"sqpn\":-"),
      c->endpointInfo(),
  };
  for (const auto& info : bad) {
    Status st = a->connect(info);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << info << " -> " << st.toString();
    EXPECT_FALSE(a->connected());
    EXPECT_TRUE(a->failure().isOk()) << a->failure().toString();
    EXPECT_EQ(a->remoteHandle("evil").status().code(), StatusCode::kNotFound);
  }
  // Still usable: the real thing connects and moves bytes.
  ASSERT_TRUE(a->connect(good).isOk());
  ASSERT_TRUE(b->connect(a->endpointInfo()).isOk());
  EXPECT_EQ(a->connect(good).code(), StatusCode::kInvalidArgument);  // already connected
  test::Bytes x(1000), y(1000, 0);
  fill(x, 1);
  auto [xl, unusedA] = share(*a, *b, "x", x);
  auto [unusedB, yr] = share(*b, *a, "y", y);
  (void)unusedA;
  (void)unusedB;
  Assignment w{.local = xl, .remote = yr, .length = 1000};
  auto f = a->write({&w, 1});
  ASSERT_TRUE(f.isOk());
  ASSERT_TRUE(f->wait(kWait).isOk());
  EXPECT_EQ(x, y);
}

TEST(EndpointTest, ShutdownFailsPendingWaitsPromptly) {
  EndpointOptions o{.numQp = 2, .sendDepth = 4};
  Pair p = connectedPair(o, o);
  ASSERT_TRUE(p.a && p.b);
  test::Bytes src(32 << 20), dst(32 << 20), rbuf(4096);
  auto [sl, unusedA] = share(*p.a, *p.b, "src", src);
  auto [unusedB, dr] = share(*p.b, *p.a, "dst", dst);
  (void)unusedA;
  (void)unusedB;
  auto rh = p.a->registerMemoryRegion("r", rbuf.data(), rbuf.size());
  ASSERT_TRUE(rh.isOk());
  std::vector<Future> pending;
  for (int i = 0; i < 3; ++i) pending.push_back(*p.a->recv(std::vector<Chunk>{{.mr = *rh, .length = 4096}}));
  for (int i = 0; i < 3; ++i) pending.push_back(*p.a->immRecv());
  std::vector<Assignment> many(2000, Assignment{.local = sl, .remote = dr, .length = 16 << 10});
  for (int i = 0; i < 3; ++i) pending.push_back(*p.a->write(many));

  std::atomic<int> returned{0};
  std::vector<StatusCode> codes(pending.size());
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < pending.size(); ++i) {
    waiters.emplace_back([&, i] {
      codes[i] = pending[i].wait(30s).code();
      ++returned;
    });
  }
  std::this_thread::sleep_for(50ms);
  auto start = std::chrono::steady_clock::now();
  p.a->shutdown();
  for (auto& t : waiters) t.join();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 5s);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(codes[i], StatusCode::kCancelled) << i;
  for (size_t i = 6; i < codes.size(); ++i) {
    // A write may have finished before the shutdown; otherwise it was cancelled.
    EXPECT_TRUE(codes[i] == StatusCode::kCancelled || codes[i] == StatusCode::kOk) << i;
  }
  p.a->shutdown();  // idempotent
  EXPECT_EQ(p.a->read({&many[0], 1}).status().code(), StatusCode::kClosed);
  EXPECT_EQ(p.a->recv(std::vector<Chunk>{{.mr = *rh, .length = 1}}).status().code(), StatusCode::kClosed);
}

TEST(EndpointTest, PeerGoneFailsPendingOperations) {
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  test::Bytes buf(1 << 20), rbuf(4096);
  auto [bl, unusedA] = share(*p.a, *p.b, "buf", buf);
  auto [unusedB, br] = share(*p.b, *p.a, "buf", buf);
  (void)unusedA;
  (void)unusedB;
  auto rh = p.a->registerMemoryRegion("r", rbuf.data(), rbuf.size());
  ASSERT_TRUE(rh.isOk());
  // The peer answered once (before that, a silent peer may still be connecting: no probing).
  Assignment first{.local = bl, .remote = br, .length = 8};
  auto once = p.a->write({&first, 1});
  ASSERT_TRUE(once.isOk());
  ASSERT_TRUE(once->wait(kWait).isOk());
  auto recv = p.a->recv(std::vector<Chunk>{{.mr = *rh, .length = 4096}});
  auto imm = p.a->immRecv();
  ASSERT_TRUE(recv.isOk() && imm.isOk());
  auto start = std::chrono::steady_clock::now();
  p.b->shutdown();  // its queue pairs are gone: like a peer process that died
  Status r = recv->wait(15s);
  Status i = imm->wait(15s);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.code(), StatusCode::kWorkCompletionError) << r.toString();
  EXPECT_EQ(i.code(), StatusCode::kWorkCompletionError) << i.toString();
  EXPECT_LT(took, 6s);
  // Later operations fail at once with the same cause.
  Assignment a{.local = bl, .remote = br, .length = 8};
  EXPECT_EQ(p.a->write({&a, 1}).status().code(), StatusCode::kWorkCompletionError);
}

TEST(EndpointTest, SharedPoolAndWorker) {
  auto ctx = RdmaContext::open({});
  ASSERT_TRUE(ctx.isOk()) << ctx.status().toString();
  auto pool = MemoryPool::create(*ctx);
  ASSERT_TRUE(pool.isOk());
  auto worker = Worker::create({.id = 7});
  ASSERT_TRUE(worker.isOk());
  test::Bytes shared(1 << 16);
  fill(shared, 77);
  auto h = (*pool)->registerMemoryRegion("shared", shared.data(), shared.size());
  ASSERT_TRUE(h.isOk());
  // Two endpoints on the same pool and worker, each connected to its own peer.
  std::vector<std::shared_ptr<Endpoint>> mine, peers;
  std::vector<test::Bytes> sinks(2, test::Bytes(1 << 16, 0));
  for (int i = 0; i < 2; ++i) {
    auto ep = Endpoint::create(*pool, {.numQp = 2, .worker = *worker});
    ASSERT_TRUE(ep.isOk()) << ep.status().toString();
    auto peer = makeEndpoint({.numQp = 2, .worker = *worker});
    ASSERT_TRUE(peer);
    ASSERT_TRUE(peer->registerMemoryRegion("sink", sinks[i].data(), sinks[i].size()).isOk());
    ASSERT_TRUE((*ep)->connect(peer->endpointInfo()).isOk());
    ASSERT_TRUE(peer->connect((*ep)->endpointInfo()).isOk());
    mine.push_back(*ep);
    peers.push_back(peer);
  }
  EXPECT_EQ((*worker)->endpointCount(), 4u);
  EXPECT_EQ(mine[0]->context().get(), mine[1]->context().get());
  for (int i = 0; i < 2; ++i) {
    auto sink = mine[i]->remoteHandle("sink");
    ASSERT_TRUE(sink.isOk());
    Assignment a{.local = *h, .remote = *sink, .length = shared.size()};
    auto f = mine[i]->write({&a, 1});
    ASSERT_TRUE(f.isOk());
    ASSERT_TRUE(f->wait(kWait).isOk());
    EXPECT_EQ(sinks[i], shared);
  }
  // The peer's mr_info names the pool's region for both endpoints of the pool.
  EXPECT_NE(mine[1]->endpointInfo().find("\"shared\""), std::string::npos);
  (*worker)->stop();
  EXPECT_TRUE(mine[0]->isShutdown());
  EXPECT_FALSE((*worker)->running());
}

TEST(EndpointTest, LinkTypeAndPortAreChecked) {
  auto nics = availableNics();
  ASSERT_TRUE(nics.isOk());
  ASSERT_FALSE(nics->empty());
  auto ok = RdmaContext::open({.deviceName = nics->front(), .ibPort = 1, .linkType = "RoCE"});
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_EQ((*ok)->linkType(), "RoCE");
  EXPECT_TRUE(RdmaContext::open({.deviceName = nics->front(), .linkType = (*ok)->info().transport}).isOk());
  auto ib = RdmaContext::open({.deviceName = nics->front(), .linkType = "IB"});
  EXPECT_EQ(ib.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ib.status().message().find("RoCE"), std::string::npos) << ib.status().message();
  EXPECT_EQ(RdmaContext::open({.deviceName = nics->front(), .ibPort = 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RdmaContext::open({.deviceName = "no_such_device"}).status().code(), StatusCode::kNotFound);
  EXPECT_GE(socketId(nics->front()), 0);
  EXPECT_EQ(socketId("no_such_device"), 0);
}

// CUDA device memory (a test device the host cannot touch: HostBackedDevice) registers with the
// endpoint as with verbs, and READ, WRITE, WRITE_WITH_IMM and send/recv move every byte to and from
// it; a recv into device memory copies each fragment through the driver.
TEST(EndpointTest, DeviceMemoryMovesLikeHostMemory) {
  const char* devices = std::getenv("FERRY_DEVICES");
  if (devices != nullptr && std::string(devices).find("rxe") != std::string::npos) {
    GTEST_SKIP() << "the RDMA device moves host memory only (docs/gpu.md)";
  }
  test::HostBackedDevice device(64 * 1024 * 1024);
  Pair p = connectedPair();
  ASSERT_TRUE(p.a && p.b);
  constexpr size_t kSize = 300 * 1000 + 7;  // several fragments of a message, not a whole one
  uint8_t* onA = device.allocate(kSize);
  uint8_t* onB = device.allocate(kSize);
  auto fillDevice = [&](uint8_t* at, uint64_t seed) {
    auto held = device.held(at, kSize);
    for (size_t i = 0; i < kSize; ++i) held[i] = patternByte(seed, i);
  };
  auto holds = [&](uint8_t* at, uint64_t seed) {
    auto held = device.held(at, kSize);
    for (size_t i = 0; i < kSize; ++i) {
      if (held[i] != patternByte(seed, i)) return static_cast<int64_t>(i);
    }
    return int64_t{-1};
  };
  auto la = p.a->registerMemoryRegion("on-device", onA, kSize);
  auto lb = p.b->registerMemoryRegion("on-device", onB, kSize);
  ASSERT_TRUE(la.isOk() && lb.isOk()) << la.status().toString() << " " << lb.status().toString();
  EXPECT_TRUE(p.a->pool()->find(*la)->location.onDevice());
  auto rb = p.a->registerRemoteMemoryRegion("on-device", entryOf(*p.b, *lb));
  ASSERT_TRUE(rb.isOk()) << rb.status().toString();

  fillDevice(onA, 1);
  Assignment w{.local = *la, .remote = *rb, .length = kSize};
  auto written = p.a->write({&w, 1});
  ASSERT_TRUE(written.isOk() && written->wait(kWait).isOk());
  EXPECT_EQ(holds(onB, 1), -1) << "WRITE to device memory";

  fillDevice(onB, 2);
  Assignment r{.local = *la, .remote = *rb, .length = kSize};
  auto read = p.a->read({&r, 1});
  ASSERT_TRUE(read.isOk() && read->wait(kWait).isOk());
  EXPECT_EQ(holds(onA, 2), -1) << "READ from device memory";

  fillDevice(onA, 3);
  fillDevice(onB, 4);
  Chunk into{.mr = *lb, .offset = 0, .length = kSize};
  auto received = p.b->recv({&into, 1});
  ASSERT_TRUE(received.isOk());
  Chunk from{.mr = *la, .offset = 0, .length = kSize};
  auto sent = p.a->send({&from, 1});
  ASSERT_TRUE(sent.isOk() && sent->wait(kWait).isOk());
  ASSERT_TRUE(received->wait(kWait).isOk());
  EXPECT_EQ(holds(onB, 3), -1) << "send/recv into device memory";
  p = {};  // the endpoints go before the device
}

}  // namespace
}  // namespace ferry::endpoint
