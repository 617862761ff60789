// The object server and its client (include/ferry/cuobj_server.h, cuobj_client.h) in one process,
// each with its own agent, over each lane this host offers (same_host, tcp) or the device
// FERRY_DEVICES names (rxe0 in the rxe VM). The client's callbacks are the "control path": they
// call the server directly. Bytes are checked byte for byte, failures by their exact return value
// and completion status, and refused requests by the memory they must leave untouched.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/agent/agent.h"
#include "ferry/cuobj_client.h"
#include "ferry/cuobj_server.h"
#include "objects/descriptor.h"
#include "support/host_backed_device.h"

namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 11));
  return v;
}

// What the callbacks need: the server side of the control path.
struct Route {
  cuObjServer* server = nullptr;
  rdma_buffer* buf = nullptr;
  uint16_t channel = 0;
  uint64_t localBase = 0;  // the object's offset 0 is this offset of buf
  std::string lastDescriptor;
  ibv_wc_status status = IBV_WC_GENERAL_ERR;
  int calls = 0;
};

Route makeRoute(cuObjServer* server, rdma_buffer* buf, uint16_t channel) {
  Route r;
  r.server = server;
  r.buf = buf;
  r.channel = channel;
  return r;
}

ssize_t routeGet(const void* handle, char* ptr, size_t size, loff_t offset, const cufileRDMAInfo_t* info) {
  auto* r = static_cast<Route*>(cuObjClient::getCtx(handle));
  if (r == nullptr || info == nullptr || info->version != 1 ||
      info->desc_len != (int)std::strlen(info->desc_str) + 1)
    return -EINVAL;
  ++r->calls;
  r->lastDescriptor = info->desc_str;
  return r->server->handleGetObject("obj/get", r->buf, reinterpret_cast<uint64_t>(ptr), size, info->desc_str,
                                    r->channel, r->localBase + static_cast<uint64_t>(offset), &r->status);
}

ssize_t routePut(const void* handle, const char* ptr, size_t size, loff_t offset,
                 const cufileRDMAInfo_t* info) {
  auto* r = static_cast<Route*>(cuObjClient::getCtx(handle));
  if (r == nullptr || info == nullptr) return -EINVAL;
  ++r->calls;
  r->lastDescriptor = info->desc_str;
  return r->server->handlePutObject("obj/put", r->buf, reinterpret_cast<uint64_t>(ptr), size, info->desc_str,
                                    r->channel, r->localBase + static_cast<uint64_t>(offset), &r->status);
}

CUObjOps_t gOps{.get = routeGet, .put = routePut};

namespace obj = ferry::objects;

// An agent of the test's own in the client's place: its memory is a region with full remote access
// (as any agent's published region), and it answers the server's claims as the test says: it grants
// a descriptor text the test handed it (with the copy the test chose, as often as asked), refuses
// any other, or, when silent, answers nothing (an agent that is no object client).
class TestClientAgent {
 public:
  explicit TestClientAgent(bool answers) {
    auto a = ferry::agent::Agent::start(ferry::agent::AgentOptions{});
    EXPECT_TRUE(a.isOk()) << a.status().toString();
    if (!a.isOk()) return;
    agent_ = *a;
    if (answers) {
      agent_->onMessage(std::string(obj::kGrantChannel),
                        [this](std::shared_ptr<ferry::agent::PeerConnection> from, std::string_view body) {
                          onClaim(from, body);
                        });
    }
  }
  ~TestClientAgent() {
    if (!agent_) return;
    agent_->onMessage(std::string(obj::kGrantChannel), nullptr);
    agent_->shutdown();
  }
  // Registers [p, +n) as region `name`: a descriptor of it for op with the region's real keys,
  // naming this agent, valid for a minute.
  obj::Descriptor describe(void* p, size_t n, cuObjOpType_t op, const std::string& name) {
    obj::Descriptor d;
    if (!agent_) return d;
    EXPECT_TRUE(agent_->registerMemoryRegion(name, p, n).isOk());
    auto keys = agent_->regionKeys(name);
    EXPECT_TRUE(keys.isOk());
    if (!keys.isOk()) return d;
    d.op = static_cast<uint8_t>(op);
    d.addr = reinterpret_cast<uint64_t>(p);
    d.length = n;
    d.expiresNs = obj::realtimeNs() + 60'000'000'000ull;
    for (const auto& [device, view] : *keys) d.keys.emplace_back(device, view.rkey);
    d.agentAddress = agent_->address();
    return d;
  }
  // Grants `text` when claimed, answering with `copy`.
  void grant(const std::string& text, const obj::Descriptor& copy) {
    std::lock_guard<std::mutex> lock(mu_);
    grants_[obj::descriptorDigest(text)] = copy;
  }
  int claims() const { return claims_.load(); }

 private:
  void onClaim(const std::shared_ptr<ferry::agent::PeerConnection>& from, std::string_view body) {
    auto claim = obj::decodeClaim(body);
    if (!claim.isOk()) return;
    ++claims_;
    obj::GrantAnswer answer;
    answer.id = claim->id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = grants_.find(claim->digest);
      answer.granted = it != grants_.end();
      if (answer.granted) answer.descriptor = it->second;
    }
    if (!answer.granted) answer.reason = "not granted by the test";
    (void)from->sendMessage(obj::kGrantChannel, obj::encodeAnswer(answer));
  }

  std::shared_ptr<ferry::agent::Agent> agent_;
  std::mutex mu_;
  std::map<std::string, obj::Descriptor> grants_;  // by digest
  std::atomic<int> claims_{0};
};

class ObjectsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const char* devices = std::getenv("FERRY_DEVICES");
    rdma_ = devices && std::string(devices).find("rxe") != std::string::npos;
    if (rdma_ && GetParam() != "same_host") GTEST_SKIP() << "the RDMA device's lane is tested once";
    if (!rdma_) setenv("FERRY_AGENT_LANES", ("rma=" + GetParam()).c_str(), 1);
    server_ = std::make_unique<cuObjServer>("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1);
    client_ = std::make_unique<cuObjClient>(gOps);
    ASSERT_TRUE(server_->isConnected());
    ASSERT_TRUE(client_->isConnected());
    channel_ = server_->allocateChannelId();
    ASSERT_EQ(channel_, 0);
  }
  void TearDown() override {
    // Tokens still out are put back (freeing their text); those a test revoked another way are freed.
    for (char* t : tokens_) {
      if (t != nullptr && (!client_ || client_->cuMemObjPutRDMAToken(t) != CU_OBJ_SUCCESS)) free(t);
    }
    tokens_.clear();
    if (server_ && channel_ != INVALID_CHANNEL_ID) server_->freeChannelId(channel_);
    client_.reset();
    server_.reset();
    unsetenv("FERRY_AGENT_LANES");
  }
  // A GET token for v's bytes (registering v first when asked).
  std::string token(std::vector<uint8_t>& v, cuObjOpType_t op, size_t offset = 0, size_t size = 0) {
    char* text = nullptr;
    EXPECT_EQ(client_->cuMemObjGetRDMAToken(v.data(), size ? size : v.size() - offset, offset, op, &text),
              CU_OBJ_SUCCESS);
    std::string out = text ? text : "";
    tokens_.push_back(text);
    return out;
  }

  bool rdma_ = false;
  std::unique_ptr<cuObjServer> server_;
  std::unique_ptr<cuObjClient> client_;
  uint16_t channel_ = INVALID_CHANNEL_ID;
  std::vector<char*> tokens_;
};

TEST_P(ObjectsTest, SyncGetAndPutMoveEveryByteThroughTheClientsCallbacks) {
  const size_t n = 6 << 20;
  std::vector<uint8_t> object = pattern(n, 1);
  void* sbuf = server_->allocHostBuffer(n);
  ASSERT_NE(sbuf, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(sbuf) % sysconf(_SC_PAGESIZE), 0u);
  std::memcpy(sbuf, object.data(), n);
  rdma_buffer* rb = server_->registerBuffer(sbuf, n);
  ASSERT_NE(rb, nullptr);

  std::vector<uint8_t> dst(n + 4096, 0xee);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst.data(), dst.size()), CU_OBJ_SUCCESS);
  EXPECT_EQ(client_->cuMemObjGetMaxRequestCallbackSize(dst.data()), static_cast<ssize_t>(dst.size()));
  Route route = makeRoute(server_.get(), rb, channel_);
  // The object's bytes 4096.. into dst + 100.
  ssize_t got = client_->cuObjGet(&route, dst.data(), n - 4096, 4096, 100);
  ASSERT_EQ(got, static_cast<ssize_t>(n - 4096)) << "status " << route.status;
  EXPECT_EQ(route.status, IBV_WC_SUCCESS);
  EXPECT_EQ(route.calls, 1);
  EXPECT_EQ(std::memcmp(dst.data() + 100, object.data() + 4096, n - 4096), 0);
  EXPECT_EQ(dst[99], 0xee);
  EXPECT_EQ(dst[100 + n - 4096], 0xee);
  const std::string getDescriptor = route.lastDescriptor;

  // PUT: the client's bytes into the server's buffer at object offset 8192.
  std::vector<uint8_t> src = pattern(1 << 20, 9);
  std::memcpy(dst.data(), src.data(), src.size());
  ssize_t put = client_->cuObjPut(&route, dst.data(), src.size(), 8192, 0);
  ASSERT_EQ(put, static_cast<ssize_t>(src.size()));
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(sbuf) + 8192, src.data(), src.size()), 0);
  EXPECT_EQ(std::memcmp(sbuf, object.data(), 8192), 0);

  // The callback's token was revoked when the callback returned: using it again fails and writes nothing.
  std::vector<uint8_t> before = dst;
  ibv_wc_status st = IBV_WC_SUCCESS;
  EXPECT_EQ(server_->handleGetObject("stale", rb, reinterpret_cast<uint64_t>(dst.data()) + 100, 4096,
                                     getDescriptor, channel_, 0, &st),
            -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(dst, before);

  EXPECT_EQ(client_->cuMemObjPutDescriptor(dst.data()), CU_OBJ_SUCCESS);
  EXPECT_EQ(client_->cuMemObjPutDescriptor(dst.data()), CU_OBJ_FAIL);
  server_->deRegisterBuffer(rb);
  free(sbuf);
}

// The client's memory on a GPU (a test device whose memory the host cannot touch,
// tests/support/host_backed_device.h): cuMemObjGetDescriptor takes it as cuObject's users call it,
// a GET lands in it and a PUT leaves from it, byte for byte, through the client's own callbacks.
TEST_P(ObjectsTest, DeviceMemoryTakesGetsAndGivesPuts) {
  if (rdma_) GTEST_SKIP() << "the RDMA device moves host memory only (docs/gpu.md)";
  ferry::test::HostBackedDevice device(64 << 20);
  const size_t n = 3 << 20;
  std::vector<uint8_t> object = pattern(n, 3);
  void* sbuf = server_->allocHostBuffer(n);
  ASSERT_NE(sbuf, nullptr);
  std::memcpy(sbuf, object.data(), n);
  rdma_buffer* rb = server_->registerBuffer(sbuf, n);
  ASSERT_NE(rb, nullptr);

  uint8_t* dst = device.allocate(n + 4096);
  ASSERT_TRUE(device.write(dst, std::vector<uint8_t>(n + 4096, 0xee)));
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst, n + 4096), CU_OBJ_SUCCESS);
  Route route = makeRoute(server_.get(), rb, channel_);
  // The object's bytes 4096.. into dst + 100, on the device.
  ssize_t got = client_->cuObjGet(&route, dst, n - 4096, 4096, 100);
  ASSERT_EQ(got, static_cast<ssize_t>(n - 4096)) << "status " << route.status;
  std::vector<uint8_t> held = device.read(dst, n + 4096);
  ASSERT_EQ(held.size(), n + 4096);
  EXPECT_EQ(std::memcmp(held.data() + 100, object.data() + 4096, n - 4096), 0);
  EXPECT_EQ(held[99], 0xee);
  EXPECT_EQ(held[100 + n - 4096], 0xee);

  // PUT: bytes the device holds into the server's buffer at object offset 8192.
  std::vector<uint8_t> src = pattern(1 << 20, 9);
  ASSERT_TRUE(device.write(dst, src));
  ssize_t put = client_->cuObjPut(&route, dst, src.size(), 8192, 0);
  ASSERT_EQ(put, static_cast<ssize_t>(src.size())) << "status " << route.status;
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(sbuf) + 8192, src.data(), src.size()), 0);
  EXPECT_EQ(std::memcmp(sbuf, object.data(), 8192), 0);

  EXPECT_EQ(client_->cuMemObjPutDescriptor(dst), CU_OBJ_SUCCESS);
  server_->deRegisterBuffer(rb);
  free(sbuf);
  client_.reset();  // before the device goes
}

TEST_P(ObjectsTest, TokensGrantOneRangeInOneDirectionUntilPutBack) {
  std::vector<uint8_t> mem(1 << 20, 0x11);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(mem.data(), mem.size()), CU_OBJ_SUCCESS);
  std::vector<uint8_t> sdata = pattern(1 << 20, 3);
  rdma_buffer* rb = server_->registerBuffer(sdata.data(), sdata.size());
  ASSERT_NE(rb, nullptr);
  // GET token for [4096, +65536).
  std::string get = token(mem, CUOBJ_GET, 4096, 65536);
  uint64_t base = reinterpret_cast<uint64_t>(mem.data()) + 4096;
  ibv_wc_status st = IBV_WC_GENERAL_ERR;
  ASSERT_EQ(server_->handleGetObject("k1", rb, base + 1024, 4096, get, channel_, 0, &st), 4096);
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(mem.data() + 4096 + 1024, sdata.data(), 4096), 0);
  std::vector<uint8_t> before = mem;
  // Outside the range, by one byte either side: refused before anything moves.
  EXPECT_EQ(server_->handleGetObject("k2", rb, base - 1, 4096, get, channel_), -EIO);
  EXPECT_EQ(server_->handleGetObject("k3", rb, base + 65536 - 4095, 4096, get, channel_), -EIO);
  // The other direction.
  EXPECT_EQ(server_->handlePutObject("k4", rb, base, 4096, get, channel_), -EIO);
  EXPECT_EQ(mem, before);
  // A forged key: the descriptor decodes, the client's device refuses the access.
  auto d = ferry::objects::decodeDescriptor(get);
  ASSERT_TRUE(d.isOk());
  for (auto& k : d->keys) k.second ^= 0x5a5a00;
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(
      server_->handleGetObject("k5", rb, base, 4096, ferry::objects::encodeDescriptor(*d), channel_, 0, &st),
      -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  // A widened range with the real keys: the keys only grant the token's range.
  d = ferry::objects::decodeDescriptor(get);
  d->addr -= 4096;
  d->length += 8192;
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(server_->handleGetObject("k6", rb, d->addr, 4096, ferry::objects::encodeDescriptor(*d), channel_,
                                     0, &st),
            -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  // A forged direction (GET relabelled PUT, read through a write-only token).
  d = ferry::objects::decodeDescriptor(get);
  d->op = CUOBJ_PUT;
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(
      server_->handlePutObject("k7", rb, base, 4096, ferry::objects::encodeDescriptor(*d), channel_, 0, &st),
      -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(mem, before);
  EXPECT_EQ(std::memcmp(sdata.data(), pattern(1 << 20, 3).data(), sdata.size()), 0);

  // PUT token: the server reads it; revoked by cuMemObjPutRDMAToken.
  char* put = nullptr;
  ASSERT_EQ(client_->cuMemObjGetRDMAToken(mem.data(), 8192, 0, CUOBJ_PUT, &put), CU_OBJ_SUCCESS);
  std::string putText = put;
  ASSERT_EQ(
      server_->handlePutObject("k8", rb, reinterpret_cast<uint64_t>(mem.data()), 8192, putText, channel_),
      8192);
  EXPECT_EQ(std::memcmp(sdata.data(), mem.data(), 8192), 0);
  ASSERT_EQ(client_->cuMemObjPutRDMAToken(put), CU_OBJ_SUCCESS);
  std::vector<uint8_t> serverBefore = sdata;
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(server_->handlePutObject("k9", rb, reinterpret_cast<uint64_t>(mem.data()), 8192, putText,
                                     channel_, 0, &st),
            -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(sdata, serverBefore);
  // Not a live token: refused, nothing freed.
  char bogus[] = "ferry-obj1:AAAA";
  EXPECT_EQ(client_->cuMemObjPutRDMAToken(bogus), CU_OBJ_FAIL);
  // Token refusals: outside any registration, bad op, size 0, null output.
  char* out = nullptr;
  std::vector<uint8_t> other(4096);
  EXPECT_EQ(client_->cuMemObjGetRDMAToken(other.data(), 4096, 0, CUOBJ_GET, &out), CU_OBJ_FAIL);
  EXPECT_EQ(client_->cuMemObjGetRDMAToken(mem.data(), mem.size(), 1, CUOBJ_GET, &out), CU_OBJ_FAIL);
  EXPECT_EQ(client_->cuMemObjGetRDMAToken(mem.data(), 4096, 0, CUOBJ_INVALID, &out), CU_OBJ_FAIL);
  EXPECT_EQ(client_->cuMemObjGetRDMAToken(mem.data(), 0, 0, CUOBJ_GET, &out), CU_OBJ_FAIL);
  EXPECT_EQ(client_->cuMemObjGetRDMAToken(mem.data(), 4096, 0, CUOBJ_GET, nullptr), CU_OBJ_FAIL);
  EXPECT_EQ(out, nullptr);

  // cuMemObjPutDescriptor revokes every token inside.
  std::string late = token(mem, CUOBJ_GET, 0, 4096);
  ASSERT_EQ(client_->cuMemObjPutDescriptor(mem.data()), CU_OBJ_SUCCESS);
  before = mem;
  EXPECT_EQ(server_->handleGetObject("k10", rb, reinterpret_cast<uint64_t>(mem.data()), 4096, late, channel_),
            -EIO);
  EXPECT_EQ(mem, before);
  server_->deRegisterBuffer(rb);
}

TEST_P(ObjectsTest, AsyncRequestsCompleteThroughPollWithTheirHandles) {
  const size_t piece = 64 << 10, count = 40;
  std::vector<uint8_t> sdata = pattern(piece * count, 5);
  rdma_buffer* rb = server_->registerBuffer(sdata.data(), sdata.size());
  ASSERT_NE(rb, nullptr);
  std::vector<uint8_t> dst(piece * count, 0);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst.data(), dst.size()), CU_OBJ_SUCCESS);
  for (size_t i = 0; i < count; ++i) {  // a descriptor serves one request: one per piece
    std::string get = token(dst, CUOBJ_GET, i * piece, piece);
    ASSERT_EQ(server_->handleGetObject("async-" + std::to_string(i), rb,
                                       reinterpret_cast<uint64_t>(dst.data()) + i * piece, piece, get,
                                       channel_, i * piece, nullptr, reinterpret_cast<void*>(i + 1)),
              0);
  }
  std::vector<bool> seen(count + 1, false);
  size_t done = 0;
  cuObjAsyncEvent_t events[64];
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (done < count && std::chrono::steady_clock::now() < deadline) {
    int n = server_->poll(events, 64, channel_);
    ASSERT_GE(n, 0);
    ASSERT_LE(n, 16);  // the cap
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(events[i].status, IBV_WC_SUCCESS);
      auto h = reinterpret_cast<uintptr_t>(events[i].async_handle);
      ASSERT_GE(h, 1u);
      ASSERT_LE(h, count);
      EXPECT_FALSE(seen[h]);
      seen[h] = true;
      ++done;
    }
  }
  EXPECT_EQ(done, count);
  EXPECT_EQ(server_->poll(events, 16, channel_), 0);
  EXPECT_EQ(dst, sdata);
  // poll's refusals.
  EXPECT_EQ(server_->poll(nullptr, 16, channel_), -EINVAL);
  EXPECT_EQ(server_->poll(events, -1, channel_), -EINVAL);
  EXPECT_EQ(server_->poll(events, 16, 77), -EINVAL);
  // A forged asynchronous request: the client does not confirm it, so it is refused at submission
  // (-EIO, the status filled) and nothing is queued.
  std::vector<uint8_t> before = dst;
  std::string get = token(dst, CUOBJ_GET, 0, piece);
  auto forged = ferry::objects::decodeDescriptor(get);
  for (auto& k : forged->keys) k.second ^= 0x330000;
  ibv_wc_status st = IBV_WC_SUCCESS;
  EXPECT_EQ(server_->handleGetObject("async-bad", rb, reinterpret_cast<uint64_t>(dst.data()), piece,
                                     ferry::objects::encodeDescriptor(*forged), channel_, 0, &st,
                                     reinterpret_cast<void*>(0xbad)),
            -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(server_->poll(events, 16, channel_), 0);
  EXPECT_EQ(dst, before);
  // The real descriptor still serves its request.
  std::fill(sdata.begin(), sdata.begin() + piece, 0x77);
  st = IBV_WC_GENERAL_ERR;
  EXPECT_EQ(server_->handleGetObject("after", rb, reinterpret_cast<uint64_t>(dst.data()), piece, get,
                                     channel_, 0, &st),
            static_cast<ssize_t>(piece));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  EXPECT_EQ(dst[0], 0x77);
  EXPECT_EQ(dst[piece - 1], 0x77);
  server_->deRegisterBuffer(rb);
}

// A client's connection that ends while a request on it is still in flight (not polled yet) is
// replaced for the next request; without qp_reset_on_failure nothing else closes it. Before, the
// ended connection stayed in the server's client table while in use, and the next request looked
// it up again until its connect deadline (10 s), then failed with -EIO. The client is the test's
// agent: only a client that confirms a bad key makes the server use one (an object client confirms
// only what it minted), and the access it refuses is what ends the connection.
TEST_P(ObjectsTest, AConnectionThatEndedWithARequestInFlightIsReplacedForTheNextRequest) {
  cuObjRDMATunable keep;
  keep.setQPResetOnFailure(false);
  cuObjServer server("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1, keep);
  ASSERT_TRUE(server.isConnected());
  const uint16_t channel = server.allocateChannelId();
  ASSERT_NE(channel, INVALID_CHANNEL_ID);
  const size_t piece = 4096;
  std::vector<uint8_t> sdata = pattern(piece, 9);
  rdma_buffer* rb = server.registerBuffer(sdata.data(), sdata.size());
  ASSERT_NE(rb, nullptr);
  std::vector<uint8_t> dst(3 * piece, 0);
  TestClientAgent client(/*answers=*/true);
  const obj::Descriptor d = client.describe(dst.data(), dst.size(), CUOBJ_GET, "dst");
  ASSERT_FALSE(d.keys.empty());
  // Descriptors of that range (distinct texts: one expiry nanosecond apart), each granted as is.
  auto granted = [&](uint64_t n, bool badKeys) {
    obj::Descriptor x = d;
    x.expiresNs += n;
    if (badKeys) {
      for (auto& k : x.keys) k.second ^= 0x5a5a00;
    }
    std::string text = obj::encodeDescriptor(x);
    client.grant(text, x);
    return text;
  };
  const uint64_t base = reinterpret_cast<uint64_t>(dst.data());
  // In flight until polled: the connection stays in use.
  ASSERT_EQ(server.handleGetObject("held", rb, base, piece, granted(1, false), channel, 0, nullptr,
                                   reinterpret_cast<void*>(1)),
            0);
  // A bad key, confirmed: the client's device refuses the access, which ends the RC connection.
  ibv_wc_status st = IBV_WC_SUCCESS;
  EXPECT_EQ(server.handleGetObject("forged", rb, base + piece, piece, granted(2, true), channel, 0, &st),
            -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  std::vector<uint8_t> untouched(piece, 0);
  EXPECT_EQ(std::memcmp(dst.data() + piece, untouched.data(), piece), 0);
  // The next request goes over a new connection.
  st = IBV_WC_GENERAL_ERR;
  EXPECT_EQ(server.handleGetObject("after", rb, base + 2 * piece, piece, granted(3, false), channel, 0, &st),
            static_cast<ssize_t>(piece));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(dst.data() + 2 * piece, sdata.data(), piece), 0);
  // The request held in flight completed before the connection ended, and is reaped.
  cuObjAsyncEvent_t events[4];
  int n = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (n == 0 && std::chrono::steady_clock::now() < deadline) n = server.poll(events, 4, channel);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(events[0].async_handle, reinterpret_cast<void*>(1));
  EXPECT_EQ(events[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(dst.data(), sdata.data(), piece), 0);
  server.deRegisterBuffer(rb);
  server.freeChannelId(channel);
}

// A descriptor is claimed from the client that minted it, for one request: an edited one (keys,
// range, expiry) is not confirmed and moves nothing, the real one serves one GET or PUT in full,
// and replayed afterwards it moves nothing either.
TEST_P(ObjectsTest, ADescriptorServesOneRequestAndAnEditedOneNone) {
  const size_t n = 64 << 10;
  std::vector<uint8_t> sdata = pattern(n, 61);
  rdma_buffer* rb = server_->registerBuffer(sdata.data(), n);
  ASSERT_NE(rb, nullptr);
  std::vector<uint8_t> dst(n, 0x11);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst.data(), n), CU_OBJ_SUCCESS);
  const uint64_t addr = reinterpret_cast<uint64_t>(dst.data());
  const std::string get = token(dst, CUOBJ_GET);
  auto edited = [&](auto change) {
    auto d = obj::decodeDescriptor(get);
    change(*d);
    return obj::encodeDescriptor(*d);
  };
  const std::vector<std::string> forged = {
      edited([](obj::Descriptor& d) { d.keys.front().second ^= 1; }),
      edited([](obj::Descriptor& d) { d.length -= 4096; }),
      edited([](obj::Descriptor& d) {
        d.addr += 4096;
        d.length -= 4096;
      }),
      edited([](obj::Descriptor& d) { d.expiresNs += 1; }),
  };
  for (const auto& text : forged) {
    ibv_wc_status st = IBV_WC_SUCCESS;
    EXPECT_EQ(server_->handleGetObject("edited", rb, addr + 4096, 4096, text, channel_, 0, &st), -EIO);
    EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  }
  EXPECT_EQ(dst, std::vector<uint8_t>(n, 0x11));
  // The real one: every byte, once.
  ibv_wc_status st = IBV_WC_GENERAL_ERR;
  ASSERT_EQ(server_->handleGetObject("once", rb, addr, n, get, channel_, 0, &st), static_cast<ssize_t>(n));
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  EXPECT_EQ(dst, sdata);
  std::fill(sdata.begin(), sdata.end(), 0x99);
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(server_->handleGetObject("replayed", rb, addr, n, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(dst, pattern(n, 61));
  // PUT: once in full; replayed, nothing is read (the object keeps the first PUT's bytes).
  const std::vector<uint8_t> src = pattern(n, 62);
  std::copy(src.begin(), src.end(), dst.begin());
  const std::string put = token(dst, CUOBJ_PUT);
  st = IBV_WC_GENERAL_ERR;
  ASSERT_EQ(server_->handlePutObject("put-once", rb, addr, n, put, channel_, 0, &st),
            static_cast<ssize_t>(n));
  EXPECT_EQ(sdata, src);
  std::fill(dst.begin(), dst.end(), 0x44);
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(server_->handlePutObject("put-replayed", rb, addr, n, put, channel_, 0, &st), -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(sdata, src);
  server_->deRegisterBuffer(rb);
}

// A descriptor naming an agent that never minted it, with the real key of a region that agent
// registered (full remote access, as a published region): the server asks that agent, which does
// not answer (it is no object client), and the request fails within the wait the tunables set; the
// agent's memory is not written (GET), nor read into the object (PUT). An agent that answers with
// another descriptor than the request's is refused as well.
TEST_P(ObjectsTest, ADescriptorOfAnAgentThatNeverMintedItMovesNothing) {
  cuObjRDMATunable quick;
  quick.setTimeout(12);  // the wait for an answer: 4.096 us * 2^12 * (7 + 1) = 134 ms
  cuObjServer server("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1, quick);
  ASSERT_TRUE(server.isConnected());
  const uint16_t channel = server.allocateChannelId();
  const size_t n = 64 << 10;
  std::vector<uint8_t> sdata = pattern(n, 71);
  rdma_buffer* rb = server.registerBuffer(sdata.data(), n);
  ASSERT_NE(rb, nullptr);
  std::vector<uint8_t> victim = pattern(n, 72);
  TestClientAgent silent(/*answers=*/false);
  obj::Descriptor d = silent.describe(victim.data(), n, CUOBJ_GET, "victim");
  ASSERT_FALSE(d.keys.empty());
  ibv_wc_status st = IBV_WC_SUCCESS;
  EXPECT_EQ(server.handleGetObject("forged-get", rb, d.addr, 4096, obj::encodeDescriptor(d), channel, 0, &st),
            -EIO);
  EXPECT_EQ(st, IBV_WC_RESP_TIMEOUT_ERR);
  EXPECT_EQ(victim, pattern(n, 72));
  d.op = CUOBJ_PUT;
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(server.handlePutObject("forged-put", rb, d.addr, n, obj::encodeDescriptor(d), channel, 0, &st),
            -EIO);
  EXPECT_EQ(st, IBV_WC_RESP_TIMEOUT_ERR);
  EXPECT_EQ(sdata, pattern(n, 71));

  // An agent that answers, but grants something else (wider) than the request's descriptor.
  TestClientAgent liar(/*answers=*/true);
  obj::Descriptor asked = liar.describe(victim.data(), 4096, CUOBJ_GET, "victim");
  obj::Descriptor wider = liar.describe(victim.data(), n, CUOBJ_GET, "victim-whole");
  const std::string text = obj::encodeDescriptor(asked);
  liar.grant(text, wider);
  st = IBV_WC_SUCCESS;
  EXPECT_EQ(server.handleGetObject("other-grant", rb, asked.addr, 4096, text, channel, 0, &st), -EIO);
  EXPECT_EQ(st, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(liar.claims(), 1);
  EXPECT_EQ(victim, pattern(n, 72));
  // Granted as asked: the bytes land (the claim is what the server waited for).
  liar.grant(text, asked);
  st = IBV_WC_GENERAL_ERR;
  EXPECT_EQ(server.handleGetObject("granted", rb, asked.addr, 4096, text, channel, 0, &st), 4096);
  EXPECT_EQ(st, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(victim.data(), sdata.data(), 4096), 0);
  server.deRegisterBuffer(rb);
  server.freeChannelId(channel);
}

TEST_P(ObjectsTest, EveryListedFailureValue) {
  std::vector<uint8_t> sdata = pattern(1 << 16, 2);
  rdma_buffer* rb = server_->registerBuffer(sdata.data(), sdata.size());
  ASSERT_NE(rb, nullptr);
  std::vector<uint8_t> dst(1 << 16, 0);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst.data(), dst.size()), CU_OBJ_SUCCESS);
  std::string get = token(dst, CUOBJ_GET);
  uint64_t addr = reinterpret_cast<uint64_t>(dst.data());
  ibv_wc_status st = IBV_WC_WR_FLUSH_ERR;
  // Pre-submission refusals: -EIO, status not touched.
  EXPECT_EQ(server_->handleGetObject("a", nullptr, addr, 4096, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("b", rb, 0, 4096, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("c", rb, addr, 0, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("d", rb, addr, 4096, get, 1, 0, &st), -EIO);  // not allocated
  EXPECT_EQ(server_->handleGetObject("e", rb, addr, 4096, get, INVALID_CHANNEL_ID, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("f", rb, addr, 4096, get, channel_, (1 << 16) - 4095, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("g", rb, addr, (1 << 16) + 1, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("h", rb, addr, (size_t{1} << 30) + 1, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("i", rb, addr, 4096, "not a descriptor", channel_, 0, &st), -EIO);
  EXPECT_EQ(server_->handleGetObject("j", rb, addr, 4096, get.substr(0, get.size() / 2), channel_, 0, &st),
            -EIO);
  EXPECT_EQ(server_->handleGetObject("k", rb, addr, 4096, "", channel_, 0, &st), -EIO);
  rdma_buffer* fake = reinterpret_cast<rdma_buffer*>(sdata.data());
  EXPECT_EQ(server_->handleGetObject("l", fake, addr, 4096, get, channel_, 0, &st), -EIO);
  EXPECT_EQ(st, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(dst, std::vector<uint8_t>(1 << 16, 0));
  // Registration refusals.
  EXPECT_EQ(server_->registerBuffer(nullptr, 4096), nullptr);
  EXPECT_EQ(server_->registerBuffer(sdata.data(), 0), nullptr);
  EXPECT_EQ(server_->registerBuffer(std::vector<cuObjScatterGatherEntry_t>{}), nullptr);
  std::vector<cuObjScatterGatherEntry_t> eleven(11, {sdata.data(), 16});
  EXPECT_EQ(server_->registerBuffer(eleven), nullptr);
  EXPECT_EQ(
      server_->registerBuffer(std::vector<cuObjScatterGatherEntry_t>{{sdata.data(), 16}, {nullptr, 16}}),
      nullptr);
  EXPECT_EQ(
      server_->registerBuffer(std::vector<cuObjScatterGatherEntry_t>{{sdata.data(), 16}, {sdata.data(), 0}}),
      nullptr);
  void* unmapped = mmap(nullptr, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(unmapped, MAP_FAILED);
  munmap(unmapped, 8192);
  EXPECT_EQ(server_->registerBuffer(unmapped, 8192), nullptr);
  EXPECT_EQ(server_->allocHostBuffer(0), nullptr);
  server_->deRegisterBuffer(nullptr);  // a no-op
  // View refusals.
  std::vector<cuObjScatterGatherEntryWithOffset_t> none;
  EXPECT_EQ(server_->getRDMABufferFromSgList(rb, none), nullptr);
  EXPECT_EQ(server_->getRDMABufferFromSgList(nullptr, {{0, 16}}), nullptr);
  EXPECT_EQ(server_->getRDMABufferFromSgList(fake, {{0, 16}}), nullptr);
  EXPECT_EQ(server_->getRDMABufferFromSgList(rb, {{0, 1 << 15}, {0, (1 << 15) + 1}}),
            nullptr);                                                               // sum too big
  EXPECT_EQ(server_->getRDMABufferFromSgList(rb, {{(1 << 16) - 8, 16}}), nullptr);  // outside
  rdma_buffer* v = server_->getRDMABufferFromSgList(rb, {{0, 16}});
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(server_->getRDMABufferFromSgList(v, {{0, 8}}), nullptr);  // a view of a view
  server_->putRDMABufferFromSgList(nullptr);                          // logged, nothing else
  server_->putRDMABufferFromSgList(rb);                               // not a view: logged
  server_->putRDMABufferFromSgList(v);
  // Channels: freeing an id past num_dcis is a no-op; exhaustion gives INVALID_CHANNEL_ID.
  server_->freeChannelId(5000);
  cuObjRDMATunable small;
  small.setNumDcis(3);
  cuObjServer three("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1, small);
  ASSERT_TRUE(three.isConnected());
  EXPECT_EQ(three.allocateChannelId(), 0);
  EXPECT_EQ(three.allocateChannelId(), 1);
  EXPECT_EQ(three.allocateChannelId(), 2);
  EXPECT_EQ(three.allocateChannelId(), INVALID_CHANNEL_ID);
  three.freeChannelId(1);
  EXPECT_EQ(three.allocateChannelId(), 1);
  // Not connected: -ENODEV, nullptr, INVALID_CHANNEL_ID.
  cuObjServer bad("not-an-address", 18515, CUOBJ_PROTO_RDMA_DC_V1);
  EXPECT_FALSE(bad.isConnected());
  EXPECT_EQ(bad.startRDMASession(), -1);
  EXPECT_EQ(bad.handleGetObject("x", rb, addr, 16, get, uint16_t{0}), -ENODEV);
  EXPECT_EQ(bad.poll(nullptr, 1, 0), -ENODEV);
  EXPECT_EQ(bad.registerBuffer(sdata.data(), 16), nullptr);
  EXPECT_EQ(bad.allocateChannelId(), INVALID_CHANNEL_ID);
  cuObjServer notHere("192.0.2.77", 18515, CUOBJ_PROTO_RDMA_DC_V1);  // TEST-NET: not this host's
  EXPECT_FALSE(notHere.isConnected());
  cuObjServer defaulted;
  EXPECT_FALSE(defaulted.isConnected());
  EXPECT_EQ(defaulted.handlePutObject("x", rb, addr, 16, get), -ENODEV);
  cuObjRDMATunable tooMany;
  tooMany.setNumDcis(70000);
  cuObjServer over("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1, tooMany);
  EXPECT_FALSE(over.isConnected());
  // Tunables: the document's defaults, and a traffic class of 256 or more is not applied.
  cuObjRDMATunable t;
  EXPECT_EQ(t.getNumDcis(), 128);
  EXPECT_EQ(t.getCqDepth(), 640u);
  EXPECT_EQ(t.getDcKey(), 0xffeeddccul);
  EXPECT_EQ(t.getTimeout(), 16);
  EXPECT_EQ(t.getHopLimit(), 4u);
  EXPECT_EQ(t.getMaxSge(), 10);
  EXPECT_EQ(t.getDelayInterval(), 5000u);
  EXPECT_EQ(t.getDelayMode(), CUOBJ_DELAY_BATCH);
  EXPECT_TRUE(t.getQPResetOnFailure());
  EXPECT_EQ(t.getRetryCount(), 7);
  EXPECT_EQ(t.getTrafficClass(), 96u);
  EXPECT_EQ(t.getMaxRdAtomic(), 0);
  t.setTrafficClass(300);
  EXPECT_EQ(t.getTrafficClass(), 96u);
  t.setTrafficClass(32);
  EXPECT_EQ(t.getTrafficClass(), 32u);
  cuObjRDMATunableParam p{};
  server_->getConfigTunableParam(&p);
  EXPECT_EQ(p.num_dcis, 128);
  EXPECT_GT(p.max_rd_atomic, 0);  // 0 asked: the device's maximum
  server_->getConfigTunableParam(nullptr);
  EXPECT_STREQ(server_->getChannelIP(nullptr), "127.0.0.1");
  EXPECT_GT(server_->getChannelPort(nullptr), 0);
  server_->deRegisterBuffer(rb);
}

TEST_P(ObjectsTest, ScatterGatherBuffersAndViews) {
  void* b1 = server_->allocHostBuffer(4096);
  void* b2 = server_->allocHostBuffer(8192);
  auto p1 = pattern(4096, 21), p2 = pattern(8192, 22);
  std::memcpy(b1, p1.data(), 4096);
  std::memcpy(b2, p2.data(), 8192);
  rdma_buffer* sg = server_->registerBuffer(std::vector<cuObjScatterGatherEntry_t>{{b1, 4096}, {b2, 8192}});
  ASSERT_NE(sg, nullptr);
  std::vector<uint8_t> dst(12288, 0);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst.data(), dst.size()), CU_OBJ_SUCCESS);
  std::string get = token(dst, CUOBJ_GET);
  uint64_t addr = reinterpret_cast<uint64_t>(dst.data());
  ASSERT_EQ(server_->handleGetObject("sg-get", sg, addr, 12288, get, channel_), 12288);
  EXPECT_EQ(std::memcmp(dst.data(), p1.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(dst.data() + 4096, p2.data(), 8192), 0);
  // Several entries: a nonzero local_offset that fits is taken as 0.
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_EQ(server_->handleGetObject("sg-off", sg, addr, 4096, token(dst, CUOBJ_GET), channel_, 100), 4096);
  EXPECT_EQ(std::memcmp(dst.data(), p1.data(), 4096), 0);
  // ... and one that does not fit is refused.
  EXPECT_EQ(server_->handleGetObject("sg-over", sg, addr, 12288, get, channel_, 1), -EIO);
  // max_sge below the entry count: -EIO.
  cuObjRDMATunable one;
  one.setMaxSge(1);
  cuObjServer narrow("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1, one);
  ASSERT_TRUE(narrow.isConnected());
  uint16_t ch = narrow.allocateChannelId();
  rdma_buffer* sg2 = narrow.registerBuffer(std::vector<cuObjScatterGatherEntry_t>{{b1, 4096}, {b2, 8192}});
  ASSERT_NE(sg2, nullptr);
  EXPECT_EQ(narrow.handleGetObject("sg-sge", sg2, addr, 12288, get, ch), -EIO);
  narrow.deRegisterBuffer(sg2);
  narrow.freeChannelId(ch);
  // A PUT into the scatter-gather buffer.
  auto src = pattern(12288, 23);
  std::memcpy(dst.data(), src.data(), src.size());
  std::string put = token(dst, CUOBJ_PUT);
  ASSERT_EQ(server_->handlePutObject("sg-put", sg, addr, 12288, put, channel_), 12288);
  EXPECT_EQ(std::memcmp(b1, src.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(b2, src.data() + 4096, 8192), 0);
  server_->deRegisterBuffer(sg);

  // Views of one registered buffer: (0, 4096) and (16384, 8192).
  void* base = server_->allocHostBuffer(1 << 20);
  auto pb = pattern(1 << 20, 24);
  std::memcpy(base, pb.data(), pb.size());
  rdma_buffer* bb = server_->registerBuffer(base, 1 << 20);
  ASSERT_NE(bb, nullptr);
  rdma_buffer* view = server_->getRDMABufferFromSgList(bb, {{0, 4096}, {16384, 8192}});
  ASSERT_NE(view, nullptr);
  std::fill(dst.begin(), dst.end(), 0);
  ASSERT_EQ(server_->handleGetObject("view-get", view, addr, 12288, token(dst, CUOBJ_GET), channel_), 12288);
  EXPECT_EQ(std::memcmp(dst.data(), pb.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(dst.data() + 4096, pb.data() + 16384, 8192), 0);
  server_->putRDMABufferFromSgList(view);
  EXPECT_EQ(server_->handleGetObject("view-gone", view, addr, 12288, get, channel_), -EIO);
  // Deregistering the base ends its views too.
  rdma_buffer* v2 = server_->getRDMABufferFromSgList(bb, {{0, 4096}});
  ASSERT_NE(v2, nullptr);
  server_->deRegisterBuffer(bb);
  EXPECT_EQ(server_->handleGetObject("view-base-gone", v2, addr, 4096, get, channel_), -EIO);
  free(base);
  free(b1);
  free(b2);
}

TEST_P(ObjectsTest, ManyChannelsFromManyThreads) {
  const int threads = 8, rounds = 25;
  const size_t piece = 256 << 10;
  std::vector<uint8_t> sdata = pattern(piece * threads, 31);
  std::vector<uint8_t> back(piece * threads, 0);
  rdma_buffer* rb = server_->registerBuffer(sdata.data(), sdata.size());
  rdma_buffer* rback = server_->registerBuffer(back.data(), back.size());
  ASSERT_TRUE(rb && rback);
  std::vector<std::vector<uint8_t>> dst(threads, std::vector<uint8_t>(piece));
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      uint16_t ch = server_->allocateChannelId();
      if (ch == INVALID_CHANNEL_ID) return (void)++failures;
      if (client_->cuMemObjGetDescriptor(dst[t].data(), piece) != CU_OBJ_SUCCESS) return (void)++failures;
      for (int r = 0; r < rounds; ++r) {
        char* g = nullptr;
        char* p = nullptr;
        uint64_t a = reinterpret_cast<uint64_t>(dst[t].data());
        if (client_->cuMemObjGetRDMAToken(dst[t].data(), piece, 0, CUOBJ_GET, &g) != CU_OBJ_SUCCESS)
          ++failures;
        if (server_->handleGetObject("t" + std::to_string(t), rb, a, piece, g, ch, t * piece) !=
            static_cast<ssize_t>(piece)) {
          ++failures;
        }
        if (std::memcmp(dst[t].data(), sdata.data() + t * piece, piece) != 0) ++failures;
        dst[t][r] ^= 0xff;  // a change the PUT must carry back
        if (client_->cuMemObjGetRDMAToken(dst[t].data(), piece, 0, CUOBJ_PUT, &p) != CU_OBJ_SUCCESS)
          ++failures;
        if (server_->handlePutObject("t" + std::to_string(t), rback, a, piece, p, ch, t * piece) !=
            static_cast<ssize_t>(piece)) {
          ++failures;
        }
        if (std::memcmp(back.data() + t * piece, dst[t].data(), piece) != 0) ++failures;
        client_->cuMemObjPutRDMAToken(g);
        client_->cuMemObjPutRDMAToken(p);
      }
      client_->cuMemObjPutDescriptor(dst[t].data());
      server_->freeChannelId(ch);
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(failures.load(), 0);
  server_->deRegisterBuffer(rb);
  server_->deRegisterBuffer(rback);
}

TEST_P(ObjectsTest, DelayModesAllComplete) {
  std::vector<uint8_t> sdata = pattern(1 << 20, 41);
  std::vector<uint8_t> dst(1 << 20);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(dst.data(), dst.size()), CU_OBJ_SUCCESS);
  for (cuObjDelayMode_t mode :
       {CUOBJ_DELAY_NONE, CUOBJ_DELAY_BATCH, CUOBJ_DELAY_ENTRY, CUOBJ_DELAY_ADAPTIVE, CUOBJ_DELAY_INVALID}) {
    cuObjRDMATunable t;
    t.setDelayMode(mode);
    cuObjServer s("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1, t);
    ASSERT_TRUE(s.isConnected());
    uint16_t ch = s.allocateChannelId();
    rdma_buffer* rb = s.registerBuffer(sdata.data(), sdata.size());
    std::fill(dst.begin(), dst.end(), 0);
    std::string get = token(dst, CUOBJ_GET);
    EXPECT_EQ(
        s.handleGetObject("delay", rb, reinterpret_cast<uint64_t>(dst.data()), dst.size(), get, 20000u, ch),
        static_cast<ssize_t>(dst.size()))
        << "mode " << mode;
    EXPECT_EQ(dst, sdata);
    s.deRegisterBuffer(rb);
    s.freeChannelId(ch);
  }
}

TEST_P(ObjectsTest, OneGibibyteObjects) {
  if (rdma_) GTEST_SKIP() << "the VM's memory";
  const size_t n = size_t{1} << 30;
  uint8_t* sbuf = static_cast<uint8_t*>(server_->allocHostBuffer(n));
  uint8_t* cbuf = static_cast<uint8_t*>(server_->allocHostBuffer(n));
  ASSERT_TRUE(sbuf && cbuf);
  for (size_t i = 0; i < n; i += 4096) sbuf[i] = static_cast<uint8_t>(i >> 12), sbuf[i + 4095] = 0x5a;
  std::memset(cbuf, 0, n);
  rdma_buffer* rb = server_->registerBuffer(sbuf, n);
  ASSERT_NE(rb, nullptr);
  ASSERT_EQ(client_->cuMemObjGetDescriptor(cbuf, n), CU_OBJ_SUCCESS);
  EXPECT_EQ(client_->cuMemObjGetMaxRequestCallbackSize(cbuf), static_cast<ssize_t>(n));
  Route route = makeRoute(server_.get(), rb, channel_);
  ASSERT_EQ(client_->cuObjGet(&route, cbuf, n), static_cast<ssize_t>(n));
  EXPECT_EQ(std::memcmp(cbuf, sbuf, n), 0);
  for (size_t i = 0; i < n; i += 4096) cbuf[i] ^= 0xff;
  ASSERT_EQ(client_->cuObjPut(&route, cbuf, n), static_cast<ssize_t>(n));
  EXPECT_EQ(std::memcmp(cbuf, sbuf, n), 0);
  // 1 GiB + 1 is two callbacks (the per-callback cap is 1 GiB).
  EXPECT_EQ(client_->cuMemObjPutDescriptor(cbuf), CU_OBJ_SUCCESS);
  server_->deRegisterBuffer(rb);
  free(sbuf);
  free(cbuf);
}

TEST_P(ObjectsTest, TelemetryNamesEachRequestsKey) {
  std::ostringstream log;
  cuObjServer::setupTelemetry(false, &log);
  cuObjServer::setTelemFlags(CUOBJ_LOG_PATH_ERROR | CUOBJ_LOG_PATH_INFO | CUOBJ_LOG_PATH_DEBUG);
  // The sink is made by the first object: drop ours so the next server takes the new settings.
  client_.reset();
  server_->freeChannelId(channel_);
  channel_ = INVALID_CHANNEL_ID;
  server_.reset();
  {
    cuObjServer s("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1);
    cuObjClient c(gOps);
    ASSERT_TRUE(s.isConnected() && c.isConnected());
    uint16_t ch = s.allocateChannelId();
    std::vector<uint8_t> sdata = pattern(4096, 1), dst(4096);
    rdma_buffer* rb = s.registerBuffer(sdata.data(), 4096);
    ASSERT_EQ(c.cuMemObjGetDescriptor(dst.data(), 4096), CU_OBJ_SUCCESS);
    char* g = nullptr;
    ASSERT_EQ(c.cuMemObjGetRDMAToken(dst.data(), 4096, 0, CUOBJ_GET, &g), CU_OBJ_SUCCESS);
    EXPECT_EQ(
        s.handleGetObject("bucket/telemetry-ok", rb, reinterpret_cast<uint64_t>(dst.data()), 4096, g, ch),
        4096);
    EXPECT_EQ(s.handleGetObject("bucket/telemetry-bad", rb, 0, 4096, g, ch), -EIO);
    c.cuMemObjPutRDMAToken(g);
    s.deRegisterBuffer(rb);
    s.freeChannelId(ch);
  }
  cuObjServer::shutdownTelemetry();
  cuObjServer::setTelemFlags(CUOBJ_LOG_PATH_ERROR);
  std::string text = log.str();
  EXPECT_NE(text.find(" cuobj INFO pid="), std::string::npos) << text;
  EXPECT_NE(text.find("key=bucket/telemetry-ok op=GET size=4096"), std::string::npos) << text;
  EXPECT_NE(text.find("status=SUCCESS"), std::string::npos) << text;
  EXPECT_NE(text.find(" cuobj DEBUG "), std::string::npos) << text;
  EXPECT_NE(text.find(" cuobj ERROR pid="), std::string::npos) << text;
  EXPECT_NE(text.find("key=bucket/telemetry-bad"), std::string::npos) << text;
  // Flags 0: nothing.
  std::ostringstream quiet;
  cuObjServer::setupTelemetry(false, &quiet);
  cuObjServer::setTelemFlags(0);
  {
    cuObjServer s("not-an-address", 1, CUOBJ_PROTO_RDMA_DC_V1);
    EXPECT_FALSE(s.isConnected());
  }
  cuObjServer::shutdownTelemetry();
  cuObjServer::setTelemFlags(CUOBJ_LOG_PATH_ERROR);
  EXPECT_EQ(quiet.str(), "");
}

INSTANTIATE_TEST_SUITE_P(Lanes, ObjectsTest, ::testing::Values("same_host", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(ObjectsIpv6, AServerOnIpv6LoopbackServesAClient) {
  cuObjServer server("::1", 0, CUOBJ_PROTO_RDMA_DC_V1);
  ASSERT_TRUE(server.isConnected());
  EXPECT_STREQ(server.getChannelIP(nullptr), "::1");
  cuObjClient client(gOps);
  ASSERT_TRUE(client.isConnected());
  uint16_t ch = server.allocateChannelId();
  std::vector<uint8_t> sdata = pattern(1 << 20, 51), dst(1 << 20);
  rdma_buffer* rb = server.registerBuffer(sdata.data(), sdata.size());
  ASSERT_EQ(client.cuMemObjGetDescriptor(dst.data(), dst.size()), CU_OBJ_SUCCESS);
  Route route = makeRoute(&server, rb, ch);
  ASSERT_EQ(client.cuObjGet(&route, dst.data(), dst.size()), static_cast<ssize_t>(dst.size()));
  EXPECT_EQ(dst, sdata);
  server.deRegisterBuffer(rb);
  server.freeChannelId(ch);
}

TEST(ObjectsDescriptor, DecoderRefusesEveryMalformedForm) {
  ferry::objects::Descriptor d;
  d.op = 0;
  d.addr = 0x1000;
  d.length = 4096;
  d.expiresNs = 1;
  d.keys = {{"soft_lo", 0x1234}};
  cuObjClient client(gOps);
  ASSERT_TRUE(client.isConnected());
  // A real agent address, from a real token.
  std::vector<uint8_t> mem(4096);
  ASSERT_EQ(client.cuMemObjGetDescriptor(mem.data(), mem.size()), CU_OBJ_SUCCESS);
  char* t = nullptr;
  ASSERT_EQ(client.cuMemObjGetRDMAToken(mem.data(), 4096, 0, CUOBJ_GET, &t), CU_OBJ_SUCCESS);
  auto real = ferry::objects::decodeDescriptor(t);
  ASSERT_TRUE(real.isOk()) << real.status().toString();
  EXPECT_EQ(real->addr, reinterpret_cast<uint64_t>(mem.data()));
  EXPECT_EQ(real->length, 4096u);
  client.cuMemObjPutRDMAToken(t);
  d.agentAddress = real->agentAddress;
  std::string good = ferry::objects::encodeDescriptor(d);
  ASSERT_TRUE(ferry::objects::decodeDescriptor(good).isOk());
  auto refused = [](const ferry::objects::Descriptor& x) {
    return !ferry::objects::decodeDescriptor(ferry::objects::encodeDescriptor(x)).isOk();
  };
  auto x = d;
  x.op = 2;
  EXPECT_TRUE(refused(x));
  x = d;
  x.length = 0;
  EXPECT_TRUE(refused(x));
  x = d;
  x.addr = UINT64_MAX - 10;
  EXPECT_TRUE(refused(x));
  x = d;
  x.keys.clear();
  EXPECT_TRUE(refused(x));
  x = d;
  x.keys = {{"", 1}};
  EXPECT_TRUE(refused(x));
  x = d;
  x.keys = {{"a", 1}, {"a", 2}};
  EXPECT_TRUE(refused(x));
  x = d;
  x.agentAddress = "garbage";
  EXPECT_TRUE(refused(x));
  for (size_t cut = 0; cut < good.size(); cut += 3) {
    EXPECT_FALSE(ferry::objects::decodeDescriptor(good.substr(0, cut)).isOk()) << cut;
  }
  EXPECT_FALSE(ferry::objects::decodeDescriptor(good + "AAAA").isOk());
  EXPECT_FALSE(ferry::objects::decodeDescriptor("ferry-obj2:" + good.substr(11)).isOk());
}

}  // namespace
