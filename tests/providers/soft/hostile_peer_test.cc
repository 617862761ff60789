// A hostile or broken peer talking to a soft context's listener: it only ever loses its own
// connection. The innocent QP pair of the same context keeps working, byte for byte.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "providers/soft/wire.h"
#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;
namespace wire = ferry::soft::wire;

void sendAll(int fd, const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0) return;  // the peer may close on us mid-way: that is the point
    p += n;
    len -= static_cast<size_t>(n);
  }
}

// Reads the listener's answer to a hello: a HELLO_REPLY's common header (the refusals this file
// provokes carry nothing more).
void readHelloReply(int fd, wire::FrameHeader* answer) {
  uint8_t reply[wire::kMaxHeaderLen];
  size_t have = 0;
  while (have < wire::kCommonHeaderLen) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, 3000), 0) << "no hello reply";
    ssize_t n = ::recv(fd, reply + have, wire::kCommonHeaderLen - have, 0);
    ASSERT_GT(n, 0);
    have += static_cast<size_t>(n);
  }
  ASSERT_TRUE(isOk(wire::decodeHeader(std::span<const uint8_t>(reply, wire::kCommonHeaderLen), answer)));
}

class HostilePeer : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    if (providerPath().device.rfind("soft_", 0) != 0)
      GTEST_SKIP() << "the wire protocol is the soft provider's";
  }

  // A TCP connection to the listener named by the context's GID.
  int connectTo(const v::Context& ctx) {
    auto gid = ctx.queryGid(1, 0);
    EXPECT_TRUE(isOk(gid.status()));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>((gid->raw[8] << 8) | gid->raw[9]));
    std::memcpy(&addr.sin_addr.s_addr, gid->raw.data() + 12, 4);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
    return fd;
  }

  // True when the peer closed the connection within the timeout (EOF or reset).
  static bool closedByPeer(int fd, int timeoutMs) {
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }

  // Says hello on a new connection to ctx's listener: the answer must be a HELLO_REPLY (in
  // *answer), after which the listener closes the connection.
  void helloRefused(const v::Context& ctx, const wire::FrameHeader& hello, wire::FrameHeader* answer) {
    uint8_t frame[wire::kMaxHeaderLen];
    size_t len = wire::encodeHeader(hello, frame);
    int fd = connectTo(ctx);
    sendAll(fd, frame, len);
    readHelloReply(fd, answer);
    EXPECT_EQ(answer->type, wire::FrameType::kHelloReply);
    EXPECT_TRUE(closedByPeer(fd, 3000));
    ::close(fd);
  }

  // The innocent pair still moves 1 MiB both ways, byte for byte.
  void expectPairStillWorks(ConnectedPair& pair, uint64_t seed) {
    ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair.a.pd, 1 << 20, v::access::kAll, seed));
    ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair.b.pd, 1 << 20, v::access::kAll, seed + 1));
    ASSERT_OK(post(pair.a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                               .wrId = seed,
                               .sges = {sgeOf(src, 0, 1 << 20)},
                               .remoteAddr = dst.address(),
                               .rkey = dst.mr.rkey()}));
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(pair.a.sendCq, &wc));
    ASSERT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
    EXPECT_EQ(firstPatternMismatch(bytesOf(dst), seed), dst.size());
  }
};

TEST_P(HostilePeer, GarbageClosesOnlyThatConnection) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  std::vector<std::vector<uint8_t>> attacks;
  attacks.push_back(std::vector<uint8_t>(64, 0xab));  // bad magic
  uint8_t frame[wire::kMaxHeaderLen];
  wire::FrameHeader h;
  h.type = wire::FrameType::kWrite;  // a request before any hello
  h.payloadLen = 16;
  size_t len = wire::encodeHeader(h, frame);
  attacks.emplace_back(frame, frame + len);
  std::vector<uint8_t> badVersion(frame, frame + len);
  badVersion[2] = 99;
  attacks.push_back(badVersion);
  std::vector<uint8_t> lyingLength(frame, frame + len);
  lyingLength[4] = 0xff;  // headerLen far beyond the limit
  lyingLength[5] = 0xff;
  attacks.push_back(lyingLength);
  for (size_t i = 0; i < attacks.size(); ++i) {
    int fd = connectTo(*pair->b.context);
    sendAll(fd, attacks[i].data(), attacks[i].size());
    EXPECT_TRUE(closedByPeer(fd, 3000)) << "attack " << i << " was not refused";
    ::close(fd);
  }
  expectPairStillWorks(*pair, 40);
}

TEST_P(HostilePeer, ForgedHelloIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  // A hello that claims to be A's QP but comes with the wrong source GID and PSN.
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  hello.qpn = pair->b.qp.qpNum();
  hello.srcQpn = pair->a.qp.qpNum();
  hello.psn = 1;
  wire::FrameHeader answer;
  ASSERT_NO_FATAL_FAILURE(helloRefused(*pair->b.context, hello, &answer));
  EXPECT_NE(answer.aux, static_cast<uint32_t>(wire::HelloResult::kAccepted));
  expectPairStillWorks(*pair, 50);
}

TEST_P(HostilePeer, AStripeHelloWithoutItsConnectionsTicketIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  expectPairStillWorks(*pair, 55);  // B's QP has a live responder connection from A now
  // Everything right but the ticket, which only A's connection saw: guessed, or none at all.
  auto gidA = pair->a.context->queryGid(1, 0);
  ASSERT_TRUE(isOk(gidA.status()));
  for (uint64_t guess : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    wire::FrameHeader hello;
    hello.type = wire::FrameType::kHello;
    hello.flags = wire::kFlagStripe;
    hello.qpn = pair->b.qp.qpNum();
    hello.srcQpn = pair->a.qp.qpNum();
    hello.srcGid = gidA->raw;
    hello.nonce = guess;
    wire::FrameHeader answer;
    ASSERT_NO_FATAL_FAILURE(helloRefused(*pair->b.context, hello, &answer));
    EXPECT_EQ(answer.aux, static_cast<uint32_t>(wire::HelloResult::kMismatch)) << "ticket " << guess;
  }
  expectPairStillWorks(*pair, 56);
}

TEST_P(HostilePeer, SilentConnectionsAndHalfFramesDoNotStallOthers) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  // Connections that say nothing, and one that stops in the middle of a header.
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) idle.push_back(connectTo(*pair->b.context));
  uint8_t frame[wire::kMaxHeaderLen];
  wire::FrameHeader hello;
  hello.type = wire::FrameType::kHello;
  size_t len = wire::encodeHeader(hello, frame);
  sendAll(idle[0], frame, len / 2);
  expectPairStillWorks(*pair, 60);
  for (int fd : idle) ::close(fd);
  expectPairStillWorks(*pair, 70);
}

TEST_P(HostilePeer, MalformedDatagramsAreDropped) {
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  auto gid = pair->b.context->queryGid(1, 0);
  ASSERT_TRUE(isOk(gid.status()));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((gid->raw[8] << 8) | gid->raw[9]));
  std::memcpy(&addr.sin_addr.s_addr, gid->raw.data() + 12, 4);
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> junk(3000, 0x5a);
  for (int i = 0; i < 50; ++i) {
    ::sendto(fd, junk.data(), static_cast<size_t>(i * 60), 0, reinterpret_cast<sockaddr*>(&addr),
             sizeof addr);
  }
  ::close(fd);
  expectPairStillWorks(*pair, 80);
}

INSTANTIATE_TEST_SUITE_P(Providers, HostilePeer, ::testing::ValuesIn(providerPaths()), providerPathTestName);

}  // namespace
}  // namespace ferry::test
