// The agent layer in one process: two or three agents on this host, found through an in-process
// store (memory://) or by address, moving bytes that are checked byte for byte. The scenarios of
// the wireup document: operations posted before the peer exists, reply endpoints, simultaneous
// connect, lost wireup messages, the deadline, a peer that leaves or restarts, the shared secret.
#include "ferry/agent/agent.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent_impl.h"
#include "ferry/agent/address.h"
#include "ferry/agent/lanes.h"
#include "support/path_memory.h"

namespace ferry::agent {
namespace {

using namespace std::chrono_literals;
namespace ep = ferry::endpoint;

constexpr auto kWait = 20s;

std::string uniqueStore() {
  static std::atomic<int> n{0};
  return "memory://agent-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// The device the agents use: soft_lo, or FERRY_AGENT_TEST_DEVICE (rxe0 in the rxe VM, where the
// lanes are rdma:rxe0 and a dead peer must be found without the QP's retry count).
std::string testDevice() {
  const char* d = std::getenv("FERRY_AGENT_TEST_DEVICE");
  return d && *d ? d : "soft_lo";
}

std::string expectedLane() { return testDevice() == "soft_lo" ? "same_host" : "rdma:" + testDevice(); }

AgentOptions options(const std::string& alias, const std::string& store) {
  AgentOptions o;
  o.alias = alias;
  o.store = store;
  o.devices = {testDevice()};
  o.listenHost = "127.0.0.1";
  o.connectTimeout = 10s;
  return o;
}

std::shared_ptr<Agent> startAgent(AgentOptions o) {
  auto a = Agent::start(std::move(o));
  EXPECT_TRUE(a.isOk()) << a.status().toString();
  return a.isOk() ? *a : nullptr;
}

test::Bytes pattern(size_t n, uint8_t seed) {
  test::Bytes v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

TEST(AgentAddress, RoundTripsAndRefusesEveryTruncation) {
  WorkerAddress a;
  a.uuid = newUuid();
  a.startNs = 123456789;
  a.alias = "prefill-0";
  a.hostId = localHostId();
  a.control = {{.ipv6 = false, .ip = "127.0.0.1", .port = 4000}, {.ipv6 = true, .ip = "::1", .port = 4000}};
  DeviceAddress soft{
      .kind = DeviceAddress::Kind::kSoft, .name = "soft_lo", .ip = "127.0.0.1", .prefixLength = 8};
  DeviceAddress rdma{.kind = DeviceAddress::Kind::kRdma, .name = "rxe0", .port = 1, .linkLayer = 2, .lid = 0};
  rdma.gid[0] = 0xfe;
  rdma.gid[15] = 7;
  a.devices = {soft, rdma};
  std::string bytes = a.encode();
  auto back = WorkerAddress::decode(bytes);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(*back, a);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto cut = WorkerAddress::decode(std::string_view(bytes).substr(0, n));
    EXPECT_FALSE(cut.isOk()) << "a truncation to " << n << " bytes was accepted";
    if (!cut.isOk()) EXPECT_EQ(cut.status().code(), StatusCode::kProtocolError);
  }
  std::string bad = bytes;
  bad[0] = 'X';
  EXPECT_EQ(WorkerAddress::decode(bad).status().code(), StatusCode::kProtocolError);
}

TEST(AgentAddress, SkipsFieldsOfANewerVersion) {
  WorkerAddress a;
  a.uuid = newUuid();
  a.alias = "x";
  a.control = {{.ipv6 = false, .ip = "10.0.0.1", .port = 9}};
  std::string bytes = a.encode();
  // Append an unknown field (tag 200, 3 bytes) and fix the body length.
  bytes += std::string(
      "\xc8\x03\x00"
      "abc",
      6);
  uint32_t body = static_cast<uint32_t>(bytes.size() - 10);
  std::memcpy(&bytes[6], &body, 4);
  auto back = WorkerAddress::decode(bytes);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back->alias, "x");
}

WorkerAddress host(const std::string& alias, const std::string& hostId, std::vector<DeviceAddress> devices) {
  WorkerAddress a;
  a.uuid = newUuid();
  a.alias = alias;
  a.hostId = hostId;
  a.control = {{.ipv6 = false, .ip = "10.0.0.1", .port = 9}};
  a.devices = std::move(devices);
  return a;
}

TEST(AgentLanes, BothSidesChooseTheSameLanes) {
  DeviceAddress lo{
      .kind = DeviceAddress::Kind::kSoft, .name = "soft_lo", .ip = "127.0.0.1", .prefixLength = 8};
  DeviceAddress eth1{
      .kind = DeviceAddress::Kind::kSoft, .name = "soft_eth0", .ip = "10.0.0.1", .prefixLength = 24};
  DeviceAddress eth2{
      .kind = DeviceAddress::Kind::kSoft, .name = "soft_eth0", .ip = "10.0.0.2", .prefixLength = 24};
  DeviceAddress other{
      .kind = DeviceAddress::Kind::kSoft, .name = "soft_eth1", .ip = "10.9.0.2", .prefixLength = 24};
  DeviceAddress ib1{.kind = DeviceAddress::Kind::kRdma, .name = "mlx5_0", .linkLayer = 1, .lid = 3};
  DeviceAddress ib2{.kind = DeviceAddress::Kind::kRdma, .name = "mlx5_1", .linkLayer = 1, .lid = 4};
  ib1.gid[0] = ib2.gid[0] = 0xfe;
  ib1.gid[15] = 1;
  ib2.gid[15] = 2;

  struct Case {
    WorkerAddress a, b;
    LaneKind want;
    std::string aDevice, bDevice;
  };
  std::vector<Case> cases = {
      {host("a", "h1", {lo, eth1}), host("b", "h1", {lo, eth1}), LaneKind::kSameHost, "soft_lo", "soft_lo"},
      {host("a", "h1", {lo, eth1, ib1}), host("b", "h2", {lo, eth2, ib2}), LaneKind::kRdma, "mlx5_0",
       "mlx5_1"},
      {host("a", "h1", {lo, eth1}), host("b", "h2", {lo, other, eth2}), LaneKind::kTcp, "soft_eth0",
       "soft_eth0"},
  };
  for (auto& c : cases) {
    auto ab = selectLanes(c.a, c.b);
    auto ba = selectLanes(c.b, c.a);
    ASSERT_TRUE(ab.isOk()) << ab.status().toString();
    ASSERT_TRUE(ba.isOk()) << ba.status().toString();
    for (int i = 0; i < kNumOpClasses; ++i) {
      EXPECT_EQ(ab->lanes[i].kind, c.want);
      EXPECT_EQ(ab->lanes[i].kind, ba->lanes[i].kind);
      EXPECT_EQ(ab->lanes[i].localDevice, c.aDevice);
      EXPECT_EQ(ab->lanes[i].remoteDevice, c.bDevice);
      EXPECT_EQ(ba->lanes[i].localDevice, ab->lanes[i].remoteDevice);
      EXPECT_EQ(ba->lanes[i].remoteDevice, ab->lanes[i].localDevice);
      EXPECT_FALSE(ab->lanes[i].why.empty());
    }
  }
  // Loopback never crosses hosts; nothing in common is a clear error.
  auto none = selectLanes(host("a", "h1", {lo}), host("b", "h2", {lo}));
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no device pair"), std::string::npos);
  // An override is honoured where possible and refused where not.
  auto forced = selectLanes(host("a", "h1", {lo, eth1}), host("b", "h1", {lo, eth2}),
                            {{OpClass::kRma, LaneKind::kTcp}});
  ASSERT_TRUE(forced.isOk()) << forced.status().toString();
  EXPECT_EQ(forced->of(OpClass::kRma).kind, LaneKind::kTcp);
  EXPECT_EQ(forced->of(OpClass::kMessages).kind, LaneKind::kSameHost);
  auto impossible =
      selectLanes(host("a", "h1", {lo}), host("b", "h1", {lo}), {{OpClass::kRma, LaneKind::kRdma}});
  EXPECT_EQ(impossible.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parseLaneOverrides("rma=tcp,messages=same_host")->size(), 2u);
  EXPECT_FALSE(parseLaneOverrides("rma=carrier-pigeon").isOk());
  EXPECT_FALSE(parseLaneOverrides("bulk=tcp").isOk());
}

TEST(Agent, OperationsBeforeThePeerExistsAreReplayedInOrder) {
  std::string store = uniqueStore();
  auto a = startAgent(options("prefill-0", store));
  ASSERT_TRUE(a);
  auto src = pattern(64 * 1024, 3);
  ASSERT_TRUE(a->registerMemoryRegion("kv", src.data(), src.size()).isOk());
  auto conn = a->connect("decode-0");
  ASSERT_TRUE(conn.isOk()) << conn.status().toString();
  EXPECT_FALSE((*conn)->isConnected());
  // Four writes to the same remote bytes, queued before decode-0 exists: the last one must win,
  // which only holds when they are replayed in order.
  std::vector<ep::ReadWriteFuture> futures;
  for (int i = 0; i < 4; ++i) {
    NamedAssignment w{.local = std::string("kv"),
                      .remote = std::string("kv"),
                      .localOffset = uint64_t(i) * 4096,
                      .remoteOffset = 0,
                      .length = 4096};
    auto f = (*conn)->write(std::span(&w, 1));
    ASSERT_TRUE(f.isOk()) << f.status().toString();
    futures.push_back(*f);
  }
  std::this_thread::sleep_for(300ms);  // decode-0 starts later
  EXPECT_FALSE(futures[0].done());
  test::Bytes dst(64 * 1024, 0);
  auto b = startAgent(options("decode-0", store));
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->registerMemoryRegion("kv", dst.data(), dst.size()).isOk());
  Status ready = (*conn)->waitReady(kWait);
  ASSERT_TRUE(ready.isOk()) << ready.toString();
  for (auto& f : futures) {
    Status st = f.wait(kWait);
    EXPECT_TRUE(st.isOk()) << st.toString();
  }
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 3 * 4096, 4096), 0)
      << "the writes were not replayed in order";
  auto lanes = (*conn)->lanes();
  ASSERT_TRUE(lanes.isOk());
  EXPECT_EQ(lanes->of(OpClass::kRma).label(), expectedLane());
  EXPECT_GE(a->stats().operationsQueued, 4u);
}

TEST(Agent, AReplyEndpointWritesBackWithoutConnecting) {
  std::string store = uniqueStore();
  auto a = startAgent(options("a", store));
  auto b = startAgent(options("b", store));
  ASSERT_TRUE(a && b);
  auto bufA = pattern(8192, 1), bufB = pattern(8192, 2);
  ASSERT_TRUE(a->registerMemoryRegion("buf", bufA.data(), bufA.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("buf", bufB.data(), bufB.size()).isOk());
  auto conn = a->connect("b");
  ASSERT_TRUE(conn.isOk());
  ASSERT_TRUE((*conn)->waitReady(kWait).isOk());
  // b never called connect(): a's REQUEST made its endpoint for replies.
  auto back = b->peer("a");
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  ASSERT_TRUE((*back)->waitReady(kWait).isOk());
  NamedAssignment w{.local = std::string("buf"),
                    .remote = std::string("buf"),
                    .localOffset = 0,
                    .remoteOffset = 4096,
                    .length = 4096};
  auto f = (*back)->write(std::span(&w, 1));
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  ASSERT_TRUE(f->wait(kWait).isOk());
  EXPECT_EQ(std::memcmp(bufA.data() + 4096, bufB.data(), 4096), 0);
  EXPECT_EQ(b->stats().requestsSent, 0u) << "the reply endpoint must not wire up a second time";
  auto lanesA = a->lanes("b");
  auto lanesB = b->lanes("a");
  ASSERT_TRUE(lanesA.isOk() && lanesB.isOk());
  for (int i = 0; i < kNumOpClasses; ++i) EXPECT_EQ(lanesA->lanes[i].label(), lanesB->lanes[i].label());
}

TEST(Agent, SimultaneousConnectEndsWithOneConnection) {
  for (int round = 0; round < 5; ++round) {
    std::string store = uniqueStore();
    auto a = startAgent(options("left", store));
    auto b = startAgent(options("right", store));
    ASSERT_TRUE(a && b);
    auto bufA = pattern(4096, 5), bufB = pattern(4096, 6);
    ASSERT_TRUE(a->registerMemoryRegion("m", bufA.data(), bufA.size()).isOk());
    ASSERT_TRUE(b->registerMemoryRegion("m", bufB.data(), bufB.size()).isOk());
    std::shared_ptr<PeerConnection> ca, cb;
    std::thread t([&] { ca = *a->connect("right"); });
    cb = *b->connect("left");
    t.join();
    ASSERT_TRUE(ca->waitReady(kWait).isOk());
    ASSERT_TRUE(cb->waitReady(kWait).isOk());
    // Bytes move both ways on the one connection each side has.
    NamedAssignment w{.local = std::string("m"), .remote = std::string("m"), .length = 2048};
    ASSERT_TRUE(ca->write(std::span(&w, 1))->wait(kWait).isOk());
    NamedAssignment w2{.local = std::string("m"),
                       .remote = std::string("m"),
                       .localOffset = 2048,
                       .remoteOffset = 2048,
                       .length = 2048};
    ASSERT_TRUE(cb->write(std::span(&w2, 1))->wait(kWait).isOk());
    EXPECT_EQ(std::memcmp(bufB.data(), bufA.data(), 4096), 0);
    EXPECT_EQ(a->peers().size(), 1u);
    EXPECT_EQ(b->peers().size(), 1u);
    // The endpoint each side uses is connected to the other's: one per pair and lane.
    EXPECT_EQ(ca->endpoint()->connected(), true);
    EXPECT_EQ(cb->endpoint()->connected(), true);
    EXPECT_EQ(a->stats().acksSent + b->stats().acksSent, 1u) << "more than one wireup completed";
  }
}

TEST(Agent, LostRequestReplyAndAckAreRetried) {
  for (const char* lost : {"request", "reply", "ack"}) {
    SCOPED_TRACE(lost);
    std::string store = uniqueStore();
    auto oa = options("a", store);
    auto ob = options("b", store);
    oa.retryInterval = ob.retryInterval = 50ms;
    oa.dropFirst[lost] = 2;
    ob.dropFirst[lost] = 2;
    auto a = startAgent(oa);
    auto b = startAgent(ob);
    ASSERT_TRUE(a && b);
    auto bufA = pattern(4096, 7);
    test::Bytes bufB(4096);
    ASSERT_TRUE(a->registerMemoryRegion("m", bufA.data(), bufA.size()).isOk());
    ASSERT_TRUE(b->registerMemoryRegion("m", bufB.data(), bufB.size()).isOk());
    auto conn = a->connect("b");
    NamedAssignment w{.local = std::string("m"), .remote = std::string("m"), .length = 4096};
    auto f = (*conn)->write(std::span(&w, 1));
    ASSERT_TRUE(f.isOk());
    Status st = f->wait(kWait);
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_EQ(bufA, bufB);
    if (std::string(lost) != "ack") {
      EXPECT_GE(a->stats().retries + b->stats().retries, 2u);
    } else {
      // A lost ACK: the responder resends its REPLY, which the initiator answers again; the
      // responder's side becomes usable then.
      auto back = b->peer("a");
      ASSERT_TRUE(back.isOk());
      EXPECT_TRUE((*back)->waitReady(kWait).isOk());
      EXPECT_GE(b->stats().retries, 1u);
    }
  }
}

TEST(Agent, WireupDeadlineFailsQueuedOperationsClearly) {
  std::string store = uniqueStore();
  auto o = options("lonely", store);
  o.connectTimeout = 600ms;
  auto a = startAgent(o);
  ASSERT_TRUE(a);
  test::Bytes buf(4096);
  ASSERT_TRUE(a->registerMemoryRegion("m", buf.data(), buf.size()).isOk());
  auto conn = a->connect("nobody");
  ASSERT_TRUE(conn.isOk());
  NamedAssignment w{.local = std::string("m"), .remote = std::string("m"), .length = 4096};
  auto f = (*conn)->write(std::span(&w, 1));
  ASSERT_TRUE(f.isOk());
  auto t0 = std::chrono::steady_clock::now();
  Status st = f->wait(kWait);
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(st.code(), StatusCode::kTimedOut) << st.toString();
  EXPECT_NE(st.message().find("nobody"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not registered"), std::string::npos) << st.message();
  EXPECT_LT(took, 5s);
  EXPECT_EQ((*conn)->ready().wait(1s).code(), StatusCode::kTimedOut);
}

TEST(Agent, BadInputIsRefusedBeforeAnythingIsQueued) {
  std::string store = uniqueStore();
  auto a = startAgent(options("a", store));
  ASSERT_TRUE(a);
  test::Bytes buf(4096);
  ASSERT_TRUE(a->registerMemoryRegion("m", buf.data(), buf.size()).isOk());
  auto conn = a->connect("b");
  ASSERT_TRUE(conn.isOk());
  NamedAssignment unknown{.local = std::string("nope"), .remote = std::string("m"), .length = 8};
  EXPECT_EQ((*conn)->write(std::span(&unknown, 1)).status().code(), StatusCode::kInvalidArgument);
  NamedAssignment outside{
      .local = std::string("m"), .remote = std::string("m"), .localOffset = 4090, .length = 8};
  EXPECT_EQ((*conn)->write(std::span(&outside, 1)).status().code(), StatusCode::kInvalidArgument);
  NamedAssignment wrap{
      .local = std::string("m"), .remote = std::string("m"), .localOffset = 8, .length = ~uint64_t{0} - 4};
  EXPECT_EQ((*conn)->read(std::span(&wrap, 1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*conn)->write({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->stats().operationsQueued, 0u);
  EXPECT_EQ(a->connect("a").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->connect("b", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->connectAddress("garbage").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->registerMemoryRegion("", buf.data(), buf.size()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->registerMemoryRegion("a/b", buf.data(), buf.size()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->unregisterMemoryRegion("never").code(), StatusCode::kNotFound);
  EXPECT_EQ(Agent::start({.alias = "x", .store = "gopher://nowhere"}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Agent::start({.alias = "bad/alias"}).status().code(), StatusCode::kInvalidArgument);
}

TEST(Agent, ConnectsByAddressWithoutAStore) {
  auto oa = options("a", "");
  auto ob = options("b", "");
  auto a = startAgent(oa);
  auto b = startAgent(ob);
  ASSERT_TRUE(a && b);
  auto src = pattern(1 << 20, 9);
  test::Bytes dst(1 << 20);
  ASSERT_TRUE(a->registerMemoryRegion("src", src.data(), src.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("dst", dst.data(), dst.size()).isOk());
  auto conn = a->connectAddress(b->address());
  ASSERT_TRUE(conn.isOk()) << conn.status().toString();
  NamedAssignment w{.local = std::string("src"), .remote = std::string("dst"), .length = src.size()};
  auto f = (*conn)->write(std::span(&w, 1));
  ASSERT_TRUE(f.isOk());
  ASSERT_TRUE(f->wait(kWait).isOk());
  EXPECT_EQ(src, dst);
  // A region registered after the wireup is looked up from the peer when first named.
  test::Bytes late(4096, 0x5a), into(4096);
  ASSERT_TRUE(b->registerMemoryRegion("late", late.data(), late.size()).isOk());
  ASSERT_TRUE(a->registerMemoryRegion("into", into.data(), into.size()).isOk());
  NamedAssignment r{.local = std::string("into"), .remote = std::string("late"), .length = 4096};
  auto rf = (*conn)->read(std::span(&r, 1));
  ASSERT_TRUE(rf.isOk()) << rf.status().toString();
  ASSERT_TRUE(rf->wait(kWait).isOk());
  EXPECT_EQ(into, late);
  // A region the peer does not have fails that operation only.
  NamedAssignment missing{.local = std::string("into"), .remote = std::string("ghost"), .length = 8};
  auto mf = (*conn)->read(std::span(&missing, 1));
  ASSERT_TRUE(mf.isOk());
  Status st = mf->wait(kWait);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.toString();
  ASSERT_TRUE((*conn)->write(std::span(&w, 1))->wait(kWait).isOk());
  EXPECT_FALSE(a->listAgents().isOk());  // no store
}

// A caller that uses a connection's endpoint directly (the object server does) and has it fail
// (here a WRITE with a forged key, which ends an RC connection) gets a new connection from the next
// lookup: the agent retires the failed one itself, instead of handing it back. retireIfFailed()
// does the same at once, on request.
TEST(Agent, AConnectionWhoseEndpointFailedIsRetiredByTheNextLookup) {
  auto a = startAgent(options("a", ""));
  auto b = startAgent(options("b", ""));
  ASSERT_TRUE(a && b);
  auto src = pattern(64 << 10, 3);
  test::Bytes dst(64 << 10);
  ASSERT_TRUE(a->registerMemoryRegion("src", src.data(), src.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("dst", dst.data(), dst.size()).isOk());
  auto keys = b->regionKeys("dst");
  ASSERT_TRUE(keys.isOk() && !keys->empty());
  const ep::RegionView view = keys->begin()->second;
  auto conn = a->connectAddress(b->address());
  ASSERT_TRUE(conn.isOk()) << conn.status().toString();
  ASSERT_TRUE((*conn)->waitReady(kWait).isOk());
  EXPECT_TRUE((*conn)->retireIfFailed().isOk());  // sound: nothing happens
  auto endpoint = (*conn)->endpoint();
  ASSERT_TRUE(endpoint);
  auto directWrite = [&](const std::shared_ptr<ep::Endpoint>& e, uint32_t rkey) -> Status {
    std::string info = "{\"addr\":" + std::to_string(view.addr) +
                       ",\"length\":" + std::to_string(view.length) + ",\"rkey\":" + std::to_string(rkey) +
                       ",\"writable\":true}";
    auto remote = e->registerRemoteMemoryRegion("direct", info);
    if (!remote.isOk()) return remote.status();
    auto local = e->localHandle("src");
    if (!local.isOk()) return local.status();
    ep::Assignment w{.local = *local, .remote = *remote, .length = src.size()};
    auto f = e->write(std::span(&w, 1));
    Status st = f.isOk() ? f->wait(kWait) : f.status();
    (void)e->unregisterRemoteMemoryRegion(*remote);
    return st;
  };
  Status forged = directWrite(endpoint, view.rkey ^ 0x5a5a00);
  EXPECT_FALSE(forged.isOk());
  EXPECT_FALSE(endpoint->failure().isOk()) << "a refused access ends the connection";
  // At once, with nothing asked: the next connect is a new wireup with a sound endpoint, and the
  // data moves on it.
  auto again = a->connectAddress(b->address());
  ASSERT_TRUE(again.isOk()) << again.status().toString();
  ASSERT_TRUE((*again)->waitReady(kWait).isOk());
  auto fresh = (*again)->endpoint();
  ASSERT_TRUE(fresh);
  EXPECT_NE(fresh, endpoint) << "the lookup handed back the connection whose endpoint failed";
  ASSERT_TRUE(directWrite(fresh, view.rkey).isOk());
  EXPECT_EQ(src, dst);
  // The same on request: retireIfFailed() says why, and the next connect wires up anew too.
  EXPECT_FALSE(directWrite(fresh, view.rkey ^ 0x5a5a00).isOk());
  Status retired = (*again)->retireIfFailed();
  EXPECT_EQ(retired.code(), StatusCode::kPeerGone) << retired.toString();
  auto third = a->connectAddress(b->address());
  ASSERT_TRUE(third.isOk()) << third.status().toString();
  ASSERT_TRUE((*third)->waitReady(kWait).isOk());
  ASSERT_TRUE((*third)->endpoint());
  EXPECT_NE((*third)->endpoint(), fresh);
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_TRUE(directWrite((*third)->endpoint(), view.rkey).isOk());
  EXPECT_EQ(src, dst);
}

TEST(Agent, MessagesAndImmediatesFlowBothWays) {
  std::string store = uniqueStore();
  auto a = startAgent(options("a", store));
  auto b = startAgent(options("b", store));
  ASSERT_TRUE(a && b);
  auto out = pattern(10000, 4);
  test::Bytes in(10000), img(4096);
  ASSERT_TRUE(a->registerMemoryRegion("out", out.data(), out.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("in", in.data(), in.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("img", img.data(), img.size()).isOk());
  auto conn = a->connect("b");
  ASSERT_TRUE(conn.isOk());
  // Posted before the wireup: a send, then a write with an immediate.
  NamedChunk c{.region = std::string("out"), .offset = 0, .length = out.size()};
  auto sf = (*conn)->send(std::span(&c, 1));
  ASSERT_TRUE(sf.isOk());
  NamedAssignment w{.local = std::string("out"), .remote = std::string("img"), .length = 4096};
  auto wf = (*conn)->writeWithImm(std::span(&w, 1), 77);
  ASSERT_TRUE(wf.isOk());
  ASSERT_TRUE((*conn)->waitReady(kWait).isOk());
  auto back = b->peer("a");
  ASSERT_TRUE(back.isOk());
  NamedChunk rc{.region = std::string("in"), .offset = 0, .length = in.size()};
  auto rf = (*back)->recv(std::span(&rc, 1));
  ASSERT_TRUE(rf.isOk());
  ASSERT_TRUE(rf->wait(kWait).isOk());
  EXPECT_EQ(rf->bytes(), out.size());
  EXPECT_EQ(in, out);
  auto imm = (*back)->immRecv();
  ASSERT_TRUE(imm.isOk());
  ASSERT_TRUE(imm->wait(kWait).isOk());
  EXPECT_EQ(imm->immData(), 77u);
  EXPECT_EQ(std::memcmp(img.data(), out.data(), 4096), 0);
  ASSERT_TRUE(sf->wait(kWait).isOk());
  ASSERT_TRUE(wf->wait(kWait).isOk());
}

// Upper layers' messages (the connector's BEGIN / DONE / CANCEL): in order, to the channel's
// handler, with the sender's connection; refused before the wireup and for a bad channel; a
// connection's closed() future reports the peer's end; a private region is neither published nor
// answered to a peer's query.
TEST(Agent, UpperLayerMessagesArriveInOrderAndClosedReportsThePeersEnd) {
  std::string store = uniqueStore();
  auto a = startAgent(options("a", store));
  auto b = startAgent(options("b", store));
  ASSERT_TRUE(a && b);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got;
  std::string fromAlias;
  b->onMessage("test", [&](std::shared_ptr<PeerConnection> from, std::string_view body) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(body);
    fromAlias = from->peerAlias();
    cv.notify_all();
  });
  auto conn = a->connect("b");
  ASSERT_TRUE(conn.isOk());
  EXPECT_EQ((*conn)->sendMessage("", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*conn)->sendMessage(std::string(65, 'c'), "x").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*conn)->waitReady(kWait).isOk());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE((*conn)->sendMessage("test", "{\"n\":" + std::to_string(i) + ",\"q\":\"\\\"\"}").isOk());
  }
  ASSERT_TRUE((*conn)->sendMessage("nobody-listens", "dropped").isOk());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, kWait, [&] { return got.size() == 100; }));
    for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], "{\"n\":" + std::to_string(i) + ",\"q\":\"\\\"\"}");
    EXPECT_EQ(fromAlias, "a");
  }
  // Work posted on the agent's thread runs there.
  std::promise<bool> onThread;
  a->post([&] { onThread.set_value(a->onAgentThread()); });
  EXPECT_TRUE(onThread.get_future().get());
  EXPECT_FALSE(a->onAgentThread());

  // A private region: not in the store, not answered to the peer.
  test::Bytes secret(4096, 0x5a), dst(4096, 0);
  ep::RegionOptions hidden;
  hidden.published = false;
  hidden.remote = ep::RegionOptions::Remote::kNone;
  ASSERT_TRUE(b->registerMemoryRegion("hidden", secret.data(), secret.size(), hidden).isOk());
  ASSERT_TRUE(a->registerMemoryRegion("dst", dst.data(), dst.size()).isOk());
  EXPECT_EQ(a->getMrInfo("b", "hidden").status().code(), StatusCode::kNotFound);
  NamedAssignment r{.local = std::string("dst"), .remote = std::string("hidden"), .length = 4096};
  auto rf = (*conn)->read(std::span(&r, 1));
  ASSERT_TRUE(rf.isOk());
  EXPECT_EQ(rf->wait(kWait).code(), StatusCode::kNotFound);
  EXPECT_EQ(dst, test::Bytes(4096, 0));

  // The peer's end.
  auto closed = (*conn)->closed();
  EXPECT_FALSE(closed.done());
  b->shutdown();
  Status why = closed.wait(kWait);
  EXPECT_EQ(why.code(), StatusCode::kPeerGone) << why.toString();
}

TEST(Agent, APeerThatLeavesFailsPendingWorkAndARestartIsWiredAgain) {
  std::string store = uniqueStore();
  auto a = startAgent(options("a", store));
  ASSERT_TRUE(a);
  auto src = pattern(4096, 8);
  ASSERT_TRUE(a->registerMemoryRegion("m", src.data(), src.size()).isOk());
  test::Bytes dst1(4096), dst2(4096);
  {
    auto b = startAgent(options("b", store));
    ASSERT_TRUE(b->registerMemoryRegion("m", dst1.data(), dst1.size()).isOk());
    auto conn = a->connect("b");
    ASSERT_TRUE((*conn)->waitReady(kWait).isOk());
    // A recv that waits on the peer: its shutdown fails it with kPeerGone.
    auto back = b->peer("a");
    auto rf = (*conn)->recv(std::vector<NamedChunk>{{.region = std::string("m"), .offset = 0, .length = 16}});
    ASSERT_TRUE(rf.isOk());
    b->shutdown();
    Status st = rf->wait(kWait);
    EXPECT_EQ(st.code(), StatusCode::kPeerGone) << st.toString();
    EXPECT_NE(st.message().find("'b'"), std::string::npos) << st.message();
  }
  // b restarts under the same alias (a new uuid): the next operation wires up anew.
  auto b2 = startAgent(options("b", store));
  ASSERT_TRUE(b2->registerMemoryRegion("m", dst2.data(), dst2.size()).isOk());
  auto conn = a->peer("b");
  ASSERT_TRUE(conn.isOk());
  NamedAssignment w{.local = std::string("m"), .remote = std::string("m"), .length = 4096};
  auto f = (*conn)->write(std::span(&w, 1));
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  Status st = f->wait(kWait);
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(dst2, src);
  EXPECT_EQ((*conn)->peerUuid(), uuidText(b2->workerAddress().uuid));
  EXPECT_GE(a->stats().peersGone, 1u);
}

TEST(Agent, ASilentPeerIsGoneAfterThePeerTimeout) {
  std::string store = uniqueStore();
  auto oa = options("a", store);
  oa.peerTimeout = 800ms;
  oa.heartbeat = 200ms;
  auto a = startAgent(oa);
  auto ob = options("b", store);
  auto b = startAgent(ob);
  test::Bytes buf(64);
  ASSERT_TRUE(a->registerMemoryRegion("m", buf.data(), buf.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("m", buf.data(), buf.size()).isOk());
  auto conn = a->connect("b");
  ASSERT_TRUE((*conn)->waitReady(kWait).isOk());
  // b goes silent without a goodbye: its wireup thread answers nothing any more, while its
  // queue pairs still work (as a hung process would look from outside).
  b->impl()->loop().post([] { std::this_thread::sleep_for(3s); });
  auto rf = (*conn)->recv(std::vector<NamedChunk>{{.region = std::string("m"), .offset = 0, .length = 16}});
  ASSERT_TRUE(rf.isOk());
  auto t0 = std::chrono::steady_clock::now();
  Status st = rf->wait(kWait);
  EXPECT_EQ(st.code(), StatusCode::kPeerGone) << st.toString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4 * oa.peerTimeout);
}

TEST(Agent, SharedSecretIsAMutualChallenge) {
  std::string store = uniqueStore();
  auto oa = options("a", store);
  auto ob = options("b", store);
  oa.secret = ob.secret = "s3cret";
  auto a = startAgent(oa);
  auto b = startAgent(ob);
  test::Bytes x = pattern(256, 1), y(256);
  ASSERT_TRUE(a->registerMemoryRegion("m", x.data(), x.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("m", y.data(), y.size()).isOk());
  auto conn = a->connect("b");
  NamedAssignment w{.local = std::string("m"), .remote = std::string("m"), .length = 256};
  ASSERT_TRUE((*conn)->write(std::span(&w, 1))->wait(kWait).isOk());
  EXPECT_EQ(x, y);
  // Another secret: refused, and the wireup times out saying why it may have.
  auto oc = options("c", store);
  oc.secret = "wrong";
  oc.connectTimeout = 800ms;
  auto c = startAgent(oc);
  ASSERT_TRUE(c->registerMemoryRegion("m", y.data(), y.size()).isOk());
  auto bad = c->connect("b");
  Status st = (*bad)->write(std::span(&w, 1))->wait(kWait);
  EXPECT_EQ(st.code(), StatusCode::kTimedOut) << st.toString();
  EXPECT_NE(st.message().find("shared secret"), std::string::npos);
  EXPECT_GE(b->stats().messagesRefused, 1u);
  // No secret at all against a secret: refused too.
  auto od = options("d", store);
  od.connectTimeout = 800ms;
  auto d = startAgent(od);
  ASSERT_TRUE(d->registerMemoryRegion("m", y.data(), y.size()).isOk());
  EXPECT_EQ((*d->connect("b"))->write(std::span(&w, 1))->wait(kWait).code(), StatusCode::kTimedOut);
}

TEST(Agent, StoreListsAgentsAndPublishesRegions) {
  std::string store = uniqueStore();
  auto a = startAgent(options("a", store));
  auto b = startAgent(options("b", store));
  test::Bytes buf(1000);
  ASSERT_TRUE(b->registerMemoryRegion("kv", buf.data(), buf.size()).isOk());
  auto list = a->listAgents();
  ASSERT_TRUE(list.isOk()) << list.status().toString();
  EXPECT_EQ(*list, (std::vector<std::string>{"a", "b"}));
  // The region's entry appears once the store thread wrote it.
  Result<std::string> info = Status(StatusCode::kNotFound, "");
  for (int i = 0; i < 100 && !info.isOk(); ++i) {
    info = a->getMrInfo("b", "kv");
    if (!info.isOk()) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  EXPECT_NE(info->find("\"length\":1000"), std::string::npos) << *info;
  EXPECT_EQ(a->getMrInfo("b", "nothing").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(b->unregisterMemoryRegion("kv").isOk());
  b->shutdown();
  auto after = a->listAgents();
  ASSERT_TRUE(after.isOk());
  EXPECT_EQ(*after, (std::vector<std::string>{"a"})) << "a shut-down agent's lease must be revoked";
}

}  // namespace
}  // namespace ferry::agent

namespace ferry::agent {
namespace {

TEST(Agent, WiresUpOverIPv6Loopback) {
  auto oa = options("six-a", "");
  auto ob = options("six-b", "");
  oa.listenHost = ob.listenHost = "::1";
  auto a = Agent::start(oa);
  if (!a.isOk() && a.status().code() == StatusCode::kIoError)
    GTEST_SKIP() << "no IPv6 here: " << a.status().toString();
  ASSERT_TRUE(a.isOk()) << a.status().toString();
  auto b = startAgent(ob);
  ASSERT_TRUE(b);
  ASSERT_EQ((*a)->workerAddress().control.size(), 1u);
  EXPECT_TRUE((*a)->workerAddress().control[0].ipv6);
  auto x = pattern(4096, 1);
  test::Bytes y(4096);
  ASSERT_TRUE((*a)->registerMemoryRegion("m", x.data(), x.size()).isOk());
  ASSERT_TRUE(b->registerMemoryRegion("m", y.data(), y.size()).isOk());
  auto conn = (*a)->connectAddress(b->address());
  ASSERT_TRUE(conn.isOk());
  NamedAssignment w{.local = std::string("m"), .remote = std::string("m"), .length = 4096};
  ASSERT_TRUE((*conn)->write(std::span(&w, 1))->wait(kWait).isOk());
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace ferry::agent
