// The agent's wireup listener against hostile clients on this host (docs/security.md): each attack
// runs beside real agents that must keep moving byte-checked data, and what the target holds
// (links, descriptors, connections) is checked from the test. Also the shared admission code
// (common/net/admission.h) every listener uses.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/wireup.h"
#include "common/json.h"
#include "common/net/admission.h"
#include "ferry/agent/address.h"
#include "ferry/agent/agent.h"
#include "ferry/agent/store.h"
#include "ferry/endpoint/endpoint.h"
#include "support/raw_socket.h"

namespace ferry::agent {
namespace {

using namespace std::chrono_literals;
constexpr auto kWait = 20s;

std::string uniqueStore() {
  static std::atomic<int> n{0};
  return "memory://guard-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

AgentOptions options(const std::string& alias, const std::string& store) {
  AgentOptions o;
  o.alias = alias;
  o.store = store;
  o.devices = {"soft_lo"};
  o.connectTimeout = 10s;
  return o;
}

std::shared_ptr<Agent> startAgent(AgentOptions o) {
  auto a = Agent::start(std::move(o));
  EXPECT_TRUE(a.isOk()) << a.status().toString();
  return a.isOk() ? *a : nullptr;
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13 + (i >> 9));
  return v;
}

sockaddr_storage v4(const char* ip) {
  sockaddr_storage s{};
  auto& a = reinterpret_cast<sockaddr_in&>(s);
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a.sin_addr);
  return s;
}

// A client of the agent's wireup port that speaks raw lines.
struct RawClient : test::RawSocket {
  explicit RawClient(uint16_t port) : RawSocket(port) {}
  bool send(const std::string& line) { return RawSocket::send(line + "\n"); }
};

using test::openFds;

uint16_t wireupPort(const Agent& a) { return a.workerAddress().control.front().port; }

// A write of `n` bytes from a's "src" to b's "dst", checked on b's side.
void expectWriteLands(Agent& a, const std::string& peer, std::vector<uint8_t>& src, std::vector<uint8_t>& dst,
                      uint8_t seed) {
  auto fill = pattern(src.size(), seed);
  std::copy(fill.begin(), fill.end(), src.begin());  // in place: the region stays where it was registered
  auto conn = a.peer(peer);
  ASSERT_TRUE(conn.isOk()) << conn.status().toString();
  NamedAssignment w{.local = std::string("src"), .remote = std::string("dst"), .length = src.size()};
  auto f = (*conn)->write(std::span(&w, 1));
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  Status st = f->wait(kWait);
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin())) << "the write did not land";
}

// Two agents of one store, connected, with 64 KiB regions "src" (a) and "dst" (b).
struct Pair {
  std::string store = uniqueStore();
  std::shared_ptr<Agent> a = startAgent(options("a", store));
  std::shared_ptr<Agent> b = startAgent(options("b", store));
  std::vector<uint8_t> src = std::vector<uint8_t>(64 << 10);
  std::vector<uint8_t> dst = std::vector<uint8_t>(64 << 10);
  bool ok() {
    if (!a || !b) return false;
    if (!a->registerMemoryRegion("src", src.data(), src.size()).isOk()) return false;
    if (!b->registerMemoryRegion("dst", dst.data(), dst.size()).isOk()) return false;
    auto c = a->connect("b");
    return c.isOk() && (*c)->waitReady(kWait).isOk();
  }
};

// ---- the shared admission code ----

TEST(Admission, ProtectedModeAdmitsThisHostOnlyAndSaysWhy) {
  auto admission = net::Admission::create({.thisHostOnly = true}, "test listener");
  auto local = admission->admit(v4("127.0.0.1"));
  ASSERT_TRUE(local.isOk()) << local.status().toString();
  auto far = admission->admit(v4("203.0.113.9"));  // TEST-NET-3: never this host
  ASSERT_FALSE(far.isOk());
  EXPECT_EQ(far.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(far.status().message().find("203.0.113.9"), std::string::npos) << far.status().message();
  EXPECT_NE(far.status().message().find("this host only"), std::string::npos) << far.status().message();
  EXPECT_EQ(admission->refused(), 1u);
  auto open = net::Admission::create({.thisHostOnly = false}, "open listener");
  EXPECT_TRUE(open->admit(v4("203.0.113.9")).isOk());
}

TEST(Admission, AnAddressOfThisHostsInterfacesIsThisHost) {
  EXPECT_TRUE(net::isThisHost(v4("127.0.0.1")));
  EXPECT_TRUE(net::isThisHost(v4("127.3.4.5")));
  EXPECT_FALSE(net::isThisHost(v4("203.0.113.9")));
  auto o = options("probe", "");
  o.allowRemoteWithoutSecret = true;
  auto agent = startAgent(o);  // held: it owns the addresses the loop reads
  ASSERT_TRUE(agent);
  for (const auto& c : agent->workerAddress().control) {
    if (c.ipv6) continue;
    EXPECT_TRUE(net::isThisHost(v4(c.ip.c_str()))) << c.ip;
  }
}

TEST(Admission, CapsPerSourceAndInAllAndReleasesWithTheTicket) {
  auto admission =
      net::Admission::create({.thisHostOnly = false, .maxPerSource = 2, .maxTotal = 3}, "capped");
  auto t1 = admission->admit(v4("198.51.100.1"));
  auto t2 = admission->admit(v4("198.51.100.1"));
  ASSERT_TRUE(t1.isOk() && t2.isOk());
  auto t3 = admission->admit(v4("198.51.100.1"));
  ASSERT_FALSE(t3.isOk());
  EXPECT_EQ(t3.status().code(), StatusCode::kResourceExhausted);
  auto other = admission->admit(v4("198.51.100.2"));
  ASSERT_TRUE(other.isOk());
  auto fourth = admission->admit(v4("198.51.100.3"));
  EXPECT_EQ(fourth.status().code(), StatusCode::kResourceExhausted) << "the total cap is 3";
  EXPECT_EQ(admission->held(), 3u);
  t1->release();
  EXPECT_EQ(admission->heldFrom("198.51.100.1"), 1u);
  { auto moved = std::move(*t2); }  // destroyed: released
  EXPECT_EQ(admission->heldFrom("198.51.100.1"), 0u);
  EXPECT_TRUE(admission->admit(v4("198.51.100.1")).isOk());
}

TEST(Admission, LogLimiterLetsABurstThroughThenOneLineAnIntervalAndCountsTheRest) {
  net::LogLimiter limiter(200ms, 3);
  uint64_t held = 0;
  int allowed = 0;
  for (int i = 0; i < 100; ++i) allowed += limiter.allow(&held) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  EXPECT_EQ(limiter.suppressedTotal(), 97u);
  std::this_thread::sleep_for(250ms);
  ASSERT_TRUE(limiter.allow(&held));
  EXPECT_EQ(held, 97u) << "the next line says how many were held back";
}

// ---- the agent's listener ----

TEST(AgentGuard, WithoutASecretTheAgentListensOnLoopbackOnly) {
  auto a = startAgent(options("solo", ""));
  ASSERT_TRUE(a);
  ASSERT_FALSE(a->workerAddress().control.empty());
  for (const auto& c : a->workerAddress().control) EXPECT_TRUE(c.ip == "127.0.0.1" || c.ip == "::1") << c.ip;
  EXPECT_EQ(a->workerAddress().control.front().ip, "127.0.0.1");
  auto withSecret = options("secret", "");
  withSecret.secret = "s3cret";
  auto b = startAgent(withSecret);
  ASSERT_TRUE(b);
  bool anyOther = false;
  for (const auto& c : b->workerAddress().control) anyOther |= c.ip != "127.0.0.1";
  // With a secret every address of the host is offered (where the host has another one).
  if (!anyOther) GTEST_LOG_(INFO) << "this host has no address but loopback";
}

TEST(AgentGuard, AnIdleLinkIsClosedAndAFloodOfLinksDoesNotLockPeersOut) {
  Pair p;
  ASSERT_TRUE(p.ok());
  size_t fdsBefore = openFds();
  std::vector<std::unique_ptr<RawClient>> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(std::make_unique<RawClient>(wireupPort(*p.b)));
  // A third agent connects while the links are held, and a and b keep moving data.
  auto c = startAgent(options("c", p.store));
  ASSERT_TRUE(c);
  std::vector<uint8_t> cs(4096);
  ASSERT_TRUE(c->registerMemoryRegion("src", cs.data(), cs.size()).isOk());
  expectWriteLands(*c, "b", cs, p.dst, 3);  // c's 4 KiB land at the front of b's region
  expectWriteLands(*p.a, "b", p.src, p.dst, 4);
  // Idle links carry no wireup: each is closed within the deadline (10 s, swept every second).
  EXPECT_TRUE(idle.back()->closedWithin(13s));
  for (size_t i = 0; i < idle.size(); i += 37) EXPECT_TRUE(idle[i]->closedWithin(1s)) << "link " << i;
  auto until = std::chrono::steady_clock::now() + 3s;  // the sweep of the last ones may still run
  while (p.b->stats().connectionsRefused < 300 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_GE(p.b->stats().connectionsRefused, 300u);
  // The test holds its 300 ends; the agent closed its 300 (c and its connection add a few dozen).
  EXPECT_LT(openFds(), fdsBefore + 300 + 100) << "the agent still holds the idle links";
  expectWriteLands(*p.a, "b", p.src, p.dst, 5);
}

TEST(AgentGuard, AByeOrARestartClaimOnAnotherLinkDoesNotDropTheConnection) {
  Pair p;
  ASSERT_TRUE(p.ok());
  const WorkerAddress& b = p.b->workerAddress();
  const WorkerAddress& a = p.a->workerAddress();
  {
    RawClient spoof(wireupPort(*p.a));
    WireupMessage bye = wireupHeader(WireupType::kBye, b.uuid, a.uuid);
    bye.reason = "forged";
    ASSERT_TRUE(spoof.send(encodeWireup(bye, "")));
    // A REQUEST claiming that b restarted: another uuid, the same alias, a later start.
    WorkerAddress life = b;
    life.uuid = newUuid();
    life.startNs = b.startNs + 1000000000ull;
    life.control = {{.ipv6 = false, .ip = "127.0.0.1", .port = 1}};
    WireupMessage req = wireupHeader(WireupType::kRequest, life.uuid, a.uuid, 1);
    req.fromAddress = life.encode();
    req.numQp = 1;
    req.lanes = "";
    req.endpoints = json::parse("{\"soft_lo\": {}}").value();
    req.nonce = newNonce();
    req.time =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    ASSERT_TRUE(spoof.send(encodeWireup(req, "")));
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_EQ(p.a->stats().peersGone, 0u) << "a forged bye or restart dropped the connection";
  expectWriteLands(*p.a, "b", p.src, p.dst, 7);
  // b's own goodbye, on its link, still counts.
  p.b->shutdown();
  auto until = std::chrono::steady_clock::now() + 5s;
  while (p.a->stats().peersGone == 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(p.a->stats().peersGone, 1u);
}

// The forged agents' address: a listener of the test's. b's CHALLENGEs (and REPLYs) to the
// forged agents come to it; the test reads them only where it echoes a cookie.
struct Sink {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
  Sink() {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 && listen(fd, 1024) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
      port = ntohs(sa.sin_port);
    }
  }
  ~Sink() { ::close(fd); }
  // The cookies of the CHALLENGEs that arrive within `within`, by the forged agent they answer.
  std::map<Uuid, std::string> challenges(size_t want, std::chrono::milliseconds within) {
    std::map<Uuid, std::string> out;
    std::vector<int> conns;
    std::map<int, std::string> pending;
    auto end = std::chrono::steady_clock::now() + within;
    while (out.size() < want && std::chrono::steady_clock::now() < end) {
      std::vector<pollfd> fds{{.fd = fd, .events = POLLIN, .revents = 0}};
      for (int c : conns) fds.push_back({.fd = c, .events = POLLIN, .revents = 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) conns.push_back(accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        char buf[65536];
        ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        if (n <= 0) continue;
        std::string& text = pending[fds[i].fd];
        text.append(buf, static_cast<size_t>(n));
        for (size_t nl; (nl = text.find('\n')) != std::string::npos; text.erase(0, nl + 1)) {
          auto m = decodeWireup(std::string_view(text).substr(0, nl), "");
          if (m.isOk() && m->type == WireupType::kChallenge) out[m->to] = m->cookie;
        }
      }
    }
    for (int c : conns) ::close(c);
    return out;
  }
};

// A REQUEST of a forged agent of this host with b's devices, at the sink's address.
WireupMessage forgedRequest(const WorkerAddress& b, const json::Value& endpoints, uint16_t sinkPort, int i) {
  WorkerAddress forged = b;
  forged.uuid = newUuid();
  forged.alias = "forged-" + std::to_string(i);
  forged.control = {{.ipv6 = false, .ip = "127.0.0.1", .port = sinkPort}};
  WireupMessage req = wireupHeader(WireupType::kRequest, forged.uuid, b.uuid, 1);
  req.fromAddress = forged.encode();
  req.numQp = 1;
  req.endpoints = endpoints;
  req.nonce = newNonce();
  return req;
}

TEST(AgentGuard, AFloodOfForgedRequestsHoldsBoundedStateAndPeersStillConnect) {
  Pair p;
  ASSERT_TRUE(p.ok());
  // Each REQUEST carries a real endpoint's metadata, so that b gets as far as it would go.
  auto target = endpoint::Endpoint::create(endpoint::ContextOptions{.deviceName = "soft_lo", .linkType = ""});
  ASSERT_TRUE(target.isOk()) << target.status().toString();
  auto metadata = json::parse((*target)->endpointInfo());
  ASSERT_TRUE(metadata.isOk());
  json::Value endpoints = json::Value::emptyObject();
  endpoints.set("soft_lo", *metadata);
  Sink sink;
  ASSERT_NE(sink.port, 0);
  const WorkerAddress& b = p.b->workerAddress();
  size_t fdsBefore = openFds();
  {
    // 400 REQUESTs that echo no cookie: each is challenged (at most 64 links to unknown agents at
    // once) and makes nothing.
    std::vector<std::unique_ptr<RawClient>> links;
    for (int l = 0; l < 10; ++l) links.push_back(std::make_unique<RawClient>(wireupPort(*p.b)));
    for (int i = 0; i < 400; ++i) {
      (void)links[i % links.size()]->send(encodeWireup(forgedRequest(b, endpoints, sink.port, i), ""));
    }
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(p.b->stats().repliesSent, 1u) << "a REQUEST without its cookie made a connection";
    EXPECT_GE(p.b->stats().challengesSent, 64u);
    EXPECT_LT(openFds(), fdsBefore + 10 + 64 + 40) << "descriptors grew with the forged REQUESTs";
    auto c = startAgent(options("c", p.store));
    ASSERT_TRUE(c);
    std::vector<uint8_t> cs(4096);
    ASSERT_TRUE(c->registerMemoryRegion("src", cs.data(), cs.size()).isOk());
    expectWriteLands(*c, "b", cs, p.dst, 11);
    expectWriteLands(*p.a, "b", p.src, p.dst, 12);
  }
  std::this_thread::sleep_for(2500ms);  // the links of the challenges are closed once quiet
  {
    // 40 REQUESTs over 4 links that do echo their cookies: handshakes are capped at 4 a link.
    Sink fresh;  // the first sink's backlog still holds the first flood's challenges
    ASSERT_NE(fresh.port, 0);
    std::vector<std::unique_ptr<RawClient>> links;
    for (int l = 0; l < 4; ++l) links.push_back(std::make_unique<RawClient>(wireupPort(*p.b)));
    std::vector<WireupMessage> reqs;
    for (int i = 0; i < 40; ++i) {
      reqs.push_back(forgedRequest(b, endpoints, fresh.port, 1000 + i));
      (void)links[i % links.size()]->send(encodeWireup(reqs.back(), ""));
    }
    auto cookies = fresh.challenges(reqs.size(), 5s);
    ASSERT_EQ(cookies.size(), reqs.size()) << "not every REQUEST was challenged";
    const uint64_t refusedBefore = p.b->stats().messagesRefused;
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].cookie = cookies[reqs[i].from];
      (void)links[i % links.size()]->send(encodeWireup(reqs[i], ""));
    }
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(p.b->stats().messagesRefused - refusedBefore, reqs.size() - 4 * links.size())
        << "the handshakes past the cap of 4 a link were not refused (replies sent: "
        << p.b->stats().repliesSent << ", challenges: " << p.b->stats().challengesSent << ")";
    EXPECT_LT(openFds(), fdsBefore + 4 + 16 * 8 + 64 + 40) << "descriptors grew past the handshake caps";
    expectWriteLands(*p.a, "b", p.src, p.dst, 13);
  }
}

TEST(AgentGuard, TheStoreHoldsNoRegionKeysAndGetMrInfoAsksThePeer) {
  Pair p;
  ASSERT_TRUE(p.ok());
  auto store = Store::open(p.store);
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  auto entry = (*store)->get("/ferry/default/regions/b/dst");
  ASSERT_TRUE(entry.isOk()) << entry.status().toString();
  auto parsed = json::parse(*entry);
  ASSERT_TRUE(parsed.isOk());
  EXPECT_EQ(parsed->find("rkey"), nullptr) << *entry;
  EXPECT_EQ(parsed->find("addr"), nullptr) << *entry;
  EXPECT_EQ(entry->find("rkey"), std::string::npos) << *entry;
  ASSERT_NE(parsed->find("length"), nullptr) << *entry;
  auto info = p.a->getMrInfo("b", "dst");
  ASSERT_TRUE(info.isOk()) << info.status().toString();
  auto fields = json::parse(*info);
  ASSERT_TRUE(fields.isOk());
  EXPECT_NE(fields->find("rkey"), nullptr) << *info;
  EXPECT_NE(fields->find("addr"), nullptr) << *info;
  EXPECT_EQ(p.a->getMrInfo("b", "ghost").status().code(), StatusCode::kNotFound);
}

TEST(AgentGuard, AnAliasWhoseRegisteredAddressRefusesFailsAtOnceWithPeerGone) {
  std::string url = uniqueStore();
  auto a = startAgent(options("a", url));
  auto gone = startAgent(options("ghost-life", ""));
  ASSERT_TRUE(a && gone);
  std::string stale = gone->address();
  gone->shutdown();  // its listener closes: its address refuses
  auto store = Store::open(url);
  ASSERT_TRUE(store.isOk());
  ASSERT_TRUE((*store)->set("/ferry/default/agents/ghost", stale, 0).isOk());
  std::vector<uint8_t> buf(4096);
  ASSERT_TRUE(a->registerMemoryRegion("src", buf.data(), buf.size()).isOk());
  auto conn = a->connect("ghost");
  ASSERT_TRUE(conn.isOk());
  NamedAssignment w{.local = std::string("src"), .remote = std::string("dst"), .length = 4096};
  auto started = std::chrono::steady_clock::now();
  auto f = (*conn)->write(std::span(&w, 1));
  ASSERT_TRUE(f.isOk());
  Status st = f->wait(kWait);
  auto took = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(st.code(), StatusCode::kPeerGone) << st.toString();
  EXPECT_NE(st.message().find("no agent listens"), std::string::npos) << st.toString();
  EXPECT_LT(took, 5s) << "waited for the wireup deadline instead";
}

}  // namespace
}  // namespace ferry::agent
