// The soft provider's shared-memory rings: bytes cross both ways and wrap, a full ring pushes back
// and wakes its producer once room appears, a sleeping consumer is woken once (not per write), a
// segment or descriptor that cannot be trusted is refused, an impossible index ends the link; and
// through the verbs API, same-host connections move to rings (also where cross-memory attach is not
// used), TCP-only contexts never do, a frame left unannounced in an attended ring is taken when the
// polls stop, and a context's ring listener shrugs off hostile setups.
#include "providers/soft/ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "ferry/common/config.h"
#include "providers/soft/same_host/share.h"
#include "providers/soft/soft.h"
#include "support/verbs_fixture.h"

namespace ferry::test {
namespace {

namespace v = ferry::verbs;
using soft::RingPair;
using soft::RingSetupMessage;

constexpr size_t kRing = 64 * 1024;

struct LinkPair {
  std::unique_ptr<RingPair> requester;
  std::unique_ptr<RingPair> responder;
};

// Both ends in this process: the responder adopts duplicates of the requester's descriptors, as
// SCM_RIGHTS would hand them over.
void makeLinks(LinkPair& pair, size_t ringBytes = kRing) {
  auto req = RingPair::create(ringBytes);
  ASSERT_TRUE(isOk(req.status()));
  pair.requester = std::move(*req);
  auto resp = RingPair::adopt(pair.requester->setupMessage(), ::dup(pair.requester->memfd()),
                              ::dup(pair.requester->peerWakeFd()), ::dup(pair.requester->ownWakeFd()));
  ASSERT_TRUE(isOk(resp.status()));
  pair.responder = std::move(*resp);
}

bool fdReadable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

bool fdClosed(int fd) { return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 31 + seed + (i >> 8));
  return out;
}

TEST(RingPair, BytesCrossBothWaysAndWrapAround) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  // 7 messages of 40 KiB through a 64 KiB ring: most of them wrap; two iovec pieces each.
  for (int i = 0; i < 7; ++i) {
    auto msg = pattern(40 * 1024, static_cast<uint8_t>(i));
    iovec out[2] = {{msg.data(), 1000}, {msg.data() + 1000, msg.size() - 1000}};
    ASSERT_EQ(p.requester->writev(out, 2), static_cast<ssize_t>(msg.size()));
    std::vector<uint8_t> got(msg.size());
    iovec in[2] = {{got.data(), 17}, {got.data() + 17, got.size() - 17}};
    ASSERT_EQ(p.responder->readv(in, 2), static_cast<ssize_t>(got.size()));
    ASSERT_EQ(got, msg) << "message " << i;
    // And back.
    ASSERT_EQ(p.responder->writev(out, 2), static_cast<ssize_t>(msg.size()));
    std::fill(got.begin(), got.end(), 0);
    ASSERT_EQ(p.requester->read(got.data(), got.size()), static_cast<ssize_t>(got.size()));
    ASSERT_EQ(got, msg) << "reply " << i;
  }
  uint8_t byte;
  EXPECT_EQ(p.responder->read(&byte, 1), -1);
  EXPECT_EQ(errno, EAGAIN) << "an empty ring says so";
}

TEST(RingPair, AFullRingPushesBackAndWakesItsProducerWhenDrained) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  auto big = pattern(kRing + 100, 3);
  iovec out{big.data(), big.size()};
  ASSERT_EQ(p.requester->writev(&out, 1), static_cast<ssize_t>(kRing)) << "takes what fits";
  p.requester->clearWake();
  iovec rest{big.data() + kRing, 100};
  EXPECT_EQ(p.requester->writev(&rest, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_FALSE(fdReadable(p.requester->ownWakeFd()));
  std::vector<uint8_t> got(4096);
  ASSERT_EQ(p.responder->read(got.data(), got.size()), 4096);
  EXPECT_TRUE(fdReadable(p.requester->ownWakeFd())) << "room appeared: the waiting producer is woken";
  p.requester->clearWake();
  EXPECT_EQ(p.requester->writev(&rest, 1), 100);
  // The bytes come out in order.
  std::vector<uint8_t> all(got.begin(), got.end());
  std::vector<uint8_t> chunk(kRing);
  ssize_t n = p.responder->read(chunk.data(), chunk.size());
  ASSERT_EQ(n, static_cast<ssize_t>(kRing - 4096 + 100));
  all.insert(all.end(), chunk.begin(), chunk.begin() + n);
  EXPECT_EQ(all, big);
}

TEST(RingPair, ASleepingConsumerIsWokenOnceNotPerWrite) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  EXPECT_FALSE(p.responder->prepareToSleep(steadyNs())) << "nothing to read: it sleeps";
  uint8_t msg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(p.requester->writev(std::array<iovec, 1>{iovec{msg, 8}}.data(), 1), 8);
  EXPECT_TRUE(fdReadable(p.responder->ownWakeFd())) << "the sleeping consumer is woken";
  p.responder->clearWake();
  ASSERT_EQ(p.requester->writev(std::array<iovec, 1>{iovec{msg, 8}}.data(), 1), 8);
  EXPECT_FALSE(fdReadable(p.responder->ownWakeFd())) << "an awake consumer costs its producer no system call";
  EXPECT_TRUE(p.responder->readable());
  EXPECT_TRUE(p.responder->prepareToSleep(steadyNs())) << "bytes are waiting: it must not sleep";
}

TEST(RingPair, AnAttendedConsumerIsNotWokenUntilItsLeaseEnds) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  EXPECT_FALSE(p.responder->prepareToSleep(steadyNs()));
  uint8_t msg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  iovec v{msg, 8};
  // Its application polls for the next ten seconds: the producer leaves the bytes unannounced.
  p.responder->attend(steadyNs() + 10'000'000'000);
  const uint64_t spared = soft::ringWakesSpared();
  ASSERT_EQ(p.requester->writev(&v, 1), 8);
  EXPECT_FALSE(fdReadable(p.responder->ownWakeFd())) << "an attended consumer is not woken";
  EXPECT_EQ(soft::ringWakesSpared(), spared + 1);
  EXPECT_TRUE(p.responder->readable()) << "the bytes are there for its poll";
  // A lease in the past is none: the sleeping consumer is woken again.
  p.responder->attend(steadyNs() - 1);
  ASSERT_EQ(p.requester->writev(&v, 1), 8);
  EXPECT_TRUE(fdReadable(p.responder->ownWakeFd())) << "a consumer whose lease ended is woken";
  p.responder->clearWake();
  EXPECT_TRUE(p.responder->prepareToSleep(steadyNs())) << "16 bytes wait";
  uint8_t in[16];
  EXPECT_EQ(p.responder->read(in, sizeof in), 16);
  // Lease 0 (ended at once, as when the application arms a CQ): woken.
  EXPECT_FALSE(p.responder->prepareToSleep(steadyNs()));
  p.responder->attend(0);
  ASSERT_EQ(p.requester->writev(&v, 1), 8);
  EXPECT_TRUE(fdReadable(p.responder->ownWakeFd()));
}

TEST(RingPair, AConsumerDrainedUnderItsLeaseTellsItsProducerSo) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  EXPECT_FALSE(p.responder->prepareToSleep(steadyNs())) << "nothing to read: it sleeps";
  uint8_t msg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  iovec v{msg, 8};
  const int64_t now = steadyNs();
  p.responder->attend(now + 10'000'000'000);
  // Drained under the lease: not asleep but attended, so the producer has no lease to weigh.
  EXPECT_FALSE(p.responder->prepareToSleep(now)) << "nothing to read";
  const uint64_t spared = soft::ringWakesSpared();
  ASSERT_EQ(p.requester->writev(&v, 1), 8);
  EXPECT_FALSE(fdReadable(p.responder->ownWakeFd())) << "an attended consumer is not woken";
  EXPECT_EQ(soft::ringWakesSpared(), spared + 1);
  EXPECT_TRUE(p.responder->prepareToSleep(now)) << "8 bytes wait";
  uint8_t in[8];
  EXPECT_EQ(p.responder->read(in, sizeof in), 8);
  // Once the lease has ended, the next drained poll (the thread's sweep) sleeps: woken again.
  p.responder->attend(steadyNs() - 1);
  EXPECT_FALSE(p.responder->prepareToSleep(steadyNs()));
  ASSERT_EQ(p.requester->writev(&v, 1), 8);
  EXPECT_TRUE(fdReadable(p.responder->ownWakeFd())) << "a consumer that slept after its lease is woken";
}

TEST(RingPair, AdoptRefusesWhatItCannotTrust) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  auto tryAdopt = [&](RingSetupMessage msg, int memfd, int own, int peer) {
    auto r = RingPair::adopt(msg, memfd, own, peer);
    EXPECT_TRUE(fdClosed(memfd) && fdClosed(own) && fdClosed(peer)) << "a refused setup keeps no descriptor";
    return r.status().code();
  };
  auto good = p.requester->setupMessage();
  auto dupAll = [&] {
    return std::array<int, 3>{::dup(p.requester->memfd()), ::dup(p.requester->peerWakeFd()),
                              ::dup(p.requester->ownWakeFd())};
  };
  auto fds = dupAll();
  RingSetupMessage bad = good;
  bad.magic ^= 1;
  EXPECT_EQ(tryAdopt(bad, fds[0], fds[1], fds[2]), StatusCode::kProtocolError) << "magic";
  fds = dupAll();
  bad = good;
  bad.version = RingSetupMessage::kVersion + 1;
  EXPECT_EQ(tryAdopt(bad, fds[0], fds[1], fds[2]), StatusCode::kProtocolError) << "version";
  fds = dupAll();
  bad = good;
  bad.ringBytes = kRing * 2;  // the segment is smaller than that
  EXPECT_EQ(tryAdopt(bad, fds[0], fds[1], fds[2]), StatusCode::kProtocolError) << "size";
  fds = dupAll();
  bad = good;
  bad.ringBytes = kRing + 4096;
  EXPECT_EQ(tryAdopt(bad, fds[0], fds[1], fds[2]), StatusCode::kProtocolError) << "not a power of two";

  // An unsealed memfd of the right size: the peer could shrink it under our mapping.
  int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 4096 + 2 * kRing), 0);
  fds = dupAll();
  ::close(fds[0]);
  EXPECT_EQ(tryAdopt(good, unsealed, fds[1], fds[2]), StatusCode::kProtocolError) << "unsealed";

  // A pipe where an eventfd belongs.
  int pipeFds[2];
  ASSERT_EQ(::pipe2(pipeFds, O_CLOEXEC), 0);
  fds = dupAll();
  ::close(fds[2]);
  ::close(pipeFds[1]);
  EXPECT_EQ(tryAdopt(good, fds[0], fds[1], pipeFds[0]), StatusCode::kProtocolError) << "not an eventfd";
}

TEST(RingPair, AnImpossibleIndexEndsTheLink) {
  LinkPair p;
  ASSERT_NO_FATAL_FAILURE(makeLinks(p));
  // A hostile peer writes its ring's head past what the ring can hold (the layout: a 64-byte
  // header, then ring 0's control block with its head first).
  void* map = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, p.requester->memfd(), 0);
  ASSERT_NE(map, MAP_FAILED);
  uint64_t head = kRing + 1;
  std::memcpy(static_cast<uint8_t*>(map) + 64, &head, sizeof head);
  uint8_t buf[16];
  EXPECT_EQ(p.responder->read(buf, sizeof buf), -1);
  EXPECT_EQ(errno, EPROTO);
  ::munmap(map, 4096);
}

// ---- through the verbs API ----

uint64_t linksNow() { return soft::ringLinksMade(); }

// With leases of 10 ms: waits 30 ms, so that every lease runs out, then polls `cq` once and finds
// nothing, so that its context holds a lease from that poll on. *at: when the poll returned.
::testing::AssertionResult leaseFromAPollOf(v::CompletionQueue& cq,
                                            std::chrono::steady_clock::time_point* at = nullptr) {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ::testing::AssertionResult quiet = noCompletionFor(cq, std::chrono::milliseconds(1));
  if (at) *at = std::chrono::steady_clock::now();
  return quiet;
}

class RingPath : public VerbsTest {
 protected:
  void SetUp() override {
    VerbsTest::SetUp();
    if (IsSkipped()) return;
    const auto& name = providerPath().name;
    if (name != "soft_same_host" && name != "soft_ring" && name != "soft_tcp") {
      GTEST_SKIP() << "shared-memory rings are the soft provider's";
    }
  }
  bool ringsExpected() const { return providerPath().name != "soft_tcp"; }
  // A pair whose contexts give leases of 10 ms (FERRY_SOFT_ATTEND_US), so that a test's pauses
  // of 30 ms decide which side holds one.
  Result<std::unique_ptr<ConnectedPair>> makePairWithLeasesOf10Ms() const {
    ScopedEnv env;
    env.set("FERRY_SOFT_ATTEND_US", "10000");
    return makePair();
  }
};

TEST_P(RingPath, SameHostConnectionsMoveToRingsAndTcpOnlyOnesNever) {
  const uint64_t linksBefore = linksNow();
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 1 << 20, v::access::kLocalWrite, 11));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 1 << 20, v::access::kAll, 12));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 4096)}));
  const uint64_t bytesBefore = soft::ringBytesWritten();
  const uint64_t cmaBefore = soft::sameHostOpsDone();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(src, 0, 4096)}}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 4096), bytesOf(src, 0, 4096)));
  // An atomic, then a WRITE and a READ of 1 MiB.
  uint64_t original;
  std::memcpy(&original, dst.data() + 8192, 8);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kAtomicFetchAndAdd,
                              .wrId = 3,
                              .sges = {sgeOf(src, 0, 8)},
                              .remoteAddr = dst.address(8192),
                              .rkey = dst.mr.rkey(),
                              .compareAdd = 5}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  uint64_t returned, now;
  std::memcpy(&returned, src.data(), 8);
  std::memcpy(&now, dst.data() + 8192, 8);
  EXPECT_EQ(returned, original) << "the atomic returns the original value";
  EXPECT_EQ(now, original + 5) << "and adds at the target";
  fillPattern(src.memory.bytes(), 13);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 4,
                              .sges = {sgeOf(src, 0, 1 << 20)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(matchesPattern(bytesOf(dst), 13));
  fillPattern(dst.memory.bytes(), 14);
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaRead,
                              .wrId = 5,
                              .sges = {sgeOf(src, 0, 1 << 20)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(matchesPattern(bytesOf(src), 14));

  const uint64_t links = linksNow() - linksBefore;
  const uint64_t ringBytes = soft::ringBytesWritten() - bytesBefore;
  if (!ringsExpected()) {
    EXPECT_EQ(links, 0u) << "FERRY_SOFT_SAME_HOST=0 keeps every connection on TCP";
    EXPECT_EQ(ringBytes, 0u);
    return;
  }
  // Both connections of the pair (one per direction), each counted at both of its ends here.
  EXPECT_EQ(links, 4u);
  EXPECT_GE(ringBytes, 4096u) << "the SEND's bytes went through a ring";
  if (providerPath().name == "soft_ring") {
    EXPECT_EQ(soft::sameHostOpsDone(), cmaBefore) << "rings only: no cross-memory attach";
    EXPECT_GE(ringBytes, 4096u + 2u * (1u << 20)) << "the WRITE's data and the READ's response were staged";
  } else if (soft::sameHostAllowed()) {
    EXPECT_EQ(soft::sameHostOpsDone(), cmaBefore + 2) << "WRITE and READ took one copy each";
    EXPECT_LT(ringBytes, 1u << 20) << "their data did not go through a ring";
  }
}

// How many fds ctx's loop watches as data (Reactor::FdUse::kData), read on the loop.
size_t dataFdsOf(verbs::Context& ctx) {
  auto* soft = dynamic_cast<soft::SoftContext*>(ctx.impl().get());
  if (soft == nullptr) return SIZE_MAX;
  size_t count = SIZE_MAX;
  if (!soft->reactor().runSync([&] { count = soft->reactor().dataFds(); }).isOk()) return SIZE_MAX;
  return count;
}

// Waits until ctx's loop watches `want` data fds (within 10 s); the count last seen.
size_t awaitDataFds(verbs::Context& ctx, size_t want) {
  const int64_t until = steadyNs() + 10'000'000'000;
  size_t count = dataFdsOf(ctx);
  while (count != want && steadyNs() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    count = dataFdsOf(ctx);
  }
  return count;
}

// A context whose connections all moved to rings watches no data fd, so that a caller's empty poll
// makes no system call: the TCP connection that carried the hello and its ring reply is gone at
// both ends (the responder's drains until the requester closes it, 5 s at most).
TEST_P(RingPath, AContextWhoseConnectionsAreRingsWatchesNoDataFd) {
  if (!ringsExpected()) GTEST_SKIP() << "FERRY_SOFT_SAME_HOST=0: every connection is a TCP socket";
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, v::access::kLocalWrite, 21));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, v::access::kAll, 22));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kRdmaWrite,
                              .wrId = 2,
                              .sges = {sgeOf(src, 0, 4096)},
                              .remoteAddr = dst.address(),
                              .rkey = dst.mr.rkey()}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  EXPECT_EQ(awaitDataFds(*pair->a.context, 0), 0u) << "the requester's context";
  EXPECT_EQ(awaitDataFds(*pair->b.context, 0), 0u) << "the responder's context";
}

// The UDP socket's datagrams wait a few of the callers' runs while no UD QP reads them, and are
// data while one does.
TEST_P(RingPath, TheUdpSocketIsDataOnlyWhileAUdQpReadsIt) {
  Side side;
  ASSERT_OK(openSide(side, nullptr, 64));
  EXPECT_EQ(dataFdsOf(*side.context), 0u) << "a context without connections or UD QPs";
  const v::QpInit ud{.type = v::QpType::kUd,
                     .sendCq = &side.sendCq,
                     .recvCq = &side.recvCq,
                     .cap = {.maxSendWr = 8, .maxRecvWr = 8, .maxSendSge = 1, .maxRecvSge = 1}};
  {
    auto first = side.pd.createQp(ud);
    ASSERT_OK(first.status());
    EXPECT_EQ(dataFdsOf(*side.context), 1u) << "the UDP socket, while the UD QP exists";
    auto second = side.pd.createQp(ud);
    ASSERT_OK(second.status());
    EXPECT_EQ(dataFdsOf(*side.context), 1u) << "one socket, however many UD QPs read it";
  }
  EXPECT_EQ(dataFdsOf(*side.context), 0u) << "control again once no UD QP reads it";
}

// Every abstract socket name of a ring listener of this process (from /proc/net/unix).
std::vector<std::string> ringListeners() {
  std::vector<std::string> names;
  std::ifstream in("/proc/net/unix");
  std::string line;
  const std::string prefix = "@ferry-soft-ring-" + std::to_string(::getpid()) + "-";
  while (std::getline(in, line)) {
    auto at = line.find(prefix);
    if (at != std::string::npos) names.push_back(line.substr(at + 1));
  }
  return names;
}

int connectTo(const std::string& name) {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&un), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void sendWithFds(int sock, const void* data, size_t len, std::vector<int> fds) {
  iovec iov{const_cast<void*>(data), len};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  if (!fds.empty()) {
    mh.msg_control = control.data();
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  (void)::sendmsg(sock, &mh, MSG_NOSIGNAL);
}

// Whether the peer of sock closed it (a read returns 0 or an error) within the time given.
bool hungUpWithin(int sock, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    pollfd p{sock, POLLIN, 0};
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n == 1) {
      char byte;
      ssize_t r = ::recv(sock, &byte, 1, MSG_DONTWAIT);
      if (r <= 0 && !(r < 0 && (errno == EAGAIN || errno == EINTR))) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

// A poll of b's CQ vouches that b's application polls: a's SEND lands in b's ring without waking
// b's progress thread. b then stops polling without arming its CQ; the lease's timer on b's
// thread must take the frame and acknowledge it, or a's SEND never completes (a's own polls do not
// progress b). Arming a CQ ends the lease at once: the next SEND wakes b's thread again. Leases of
// 10 ms here, so that the test's own pauses (30 ms) decide which side holds one; nothing polls
// while the counter of spared wake-ups is read.
TEST_P(RingPath, AFrameLeftInAnAttendedRingIsTakenWhenThePollsStop) {
  if (!ringsExpected()) GTEST_SKIP() << "no rings on this path";
  if (!ferry::config::softCallerProgress()) GTEST_SKIP() << "no leases without FERRY_SOFT_CALLER_PROGRESS";
  ASSERT_OK_AND_ASSIGN(auto pair, makePairWithLeasesOf10Ms());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, v::access::kLocalWrite, 21));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, v::access::kAll, 22));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 64)}));
  v::WorkCompletion wc;
  // A first SEND, both sides polling, sets the connections up (a consumer that just took its
  // hello is awake, and a producer does not wake an awake one).
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 6, .sges = {sgeOf(src, 128, 64)}}));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.wrId, 1u);
  auto sparedAfter = [](uint64_t before) {
    for (int i = 0; i < 2000 && soft::ringWakesSpared() == before; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return soft::ringWakesSpared() - before;
  };
  // b's lease holds for 9 ms after its polls below, a's SEND must come within it. A scheduler can
  // keep the test from its next step for longer on two busy cores (under a sanitizer it did): an
  // attempt whose SEND came 5 ms or more after b's last poll proves nothing of the lease, and the
  // test tries again. Whatever the attempt, the SEND completes and its bytes land.
  bool leaseHeld = false;
  for (uint64_t attempt = 0; attempt < 5 && !leaseHeld; ++attempt) {
    const uint64_t recvId = 10 + attempt;
    ASSERT_OK(postReceive(pair->b.qp, recvId, {sgeOf(dst, 64, 64)}));
    std::chrono::steady_clock::time_point polled;
    ASSERT_TRUE(leaseFromAPollOf(pair->b.recvCq, &polled));
    const uint64_t spared = soft::ringWakesSpared();
    const size_t from = 1024 + 64 * attempt;  // each attempt's bytes differ from the last one's
    ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 7, .sges = {sgeOf(src, from, 64)}}));
    leaseHeld = std::chrono::steady_clock::now() - polled < std::chrono::milliseconds(5);
    if (leaseHeld) {
      EXPECT_GT(sparedAfter(spared), 0u) << "the SEND woke b's thread: b held no lease";
    }
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc, std::chrono::seconds(10)))
        << "b's thread never took the frame its peer left unannounced";
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
    ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
    EXPECT_EQ(wc.wrId, recvId);
    EXPECT_TRUE(bytesEqual(bytesOf(dst, 64, 64), bytesOf(src, from, 64)));
  }
  ASSERT_TRUE(leaseHeld) << "in five attempts, a's SEND never came within 5 ms of b's poll";

  // a's lease (its polls above) runs out; b renews its own, then arms a CQ of its context to sleep
  // on its channel: b's lease ends at once, and the next SEND wakes b's thread.
  ASSERT_TRUE(leaseFromAPollOf(pair->b.recvCq));
  ASSERT_OK_AND_ASSIGN(auto channel, pair->b.context->createCompChannel());
  ASSERT_OK_AND_ASSIGN(auto armed, pair->b.context->createCq({.cqe = 4, .channel = &channel}));
  ASSERT_OK(armed.reqNotify(false));
  ASSERT_OK(postReceive(pair->b.qp, 3, {sgeOf(dst, 128, 64)}));
  const uint64_t spared = soft::ringWakesSpared();
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 8, .sges = {sgeOf(src, 64, 64)}}));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(soft::ringWakesSpared(), spared)
      << "the producer still saw the lease of a context that armed a CQ";
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc, std::chrono::seconds(10)));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.wrId, 3u);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 128, 64), bytesOf(src, 64, 64)));
}

// A poll of b's CQ that takes a's SEND returns its completion before b acknowledges it: the ACK
// goes at the start of b's next run. Here b never runs its loop again (it neither polls nor
// arms): its thread must send the ACK when b's lease ends, or a's SEND never completes (a's own
// polls do not progress b). On rings and on TCP alike. An attempt whose frame b's thread took
// (the test held off the core past b's lease) defers nothing and is tried again; every attempt's
// SEND completes and lands.
TEST_P(RingPath, AnAckAPollLeftIsSentWhenThePollsStop) {
  if (!ferry::config::softCallerProgress()) GTEST_SKIP() << "no leases without FERRY_SOFT_CALLER_PROGRESS";
  ASSERT_OK_AND_ASSIGN(auto pair, makePairWithLeasesOf10Ms());
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 4096, v::access::kLocalWrite, 23));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 4096, v::access::kAll, 24));
  v::WorkCompletion wc;
  // A first SEND, both sides polling, sets the connections up.
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 64)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 6, .sges = {sgeOf(src, 128, 64)}}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  bool deferred = false;
  for (uint64_t attempt = 0; attempt < 5 && !deferred; ++attempt) {
    const uint64_t recvId = 10 + attempt;
    const size_t from = 1024 + 64 * attempt;
    ASSERT_OK(postReceive(pair->b.qp, recvId, {sgeOf(dst, 64, 64)}));
    ASSERT_TRUE(leaseFromAPollOf(pair->b.recvCq));
    const uint64_t before = soft::acksDeferred();
    ASSERT_OK(post(pair->a.qp,
                   {.opcode = v::WrOpcode::kSend, .wrId = 20 + attempt, .sges = {sgeOf(src, from, 64)}}));
    ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));  // b's poll takes the SEND; then b stops
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
    EXPECT_EQ(wc.wrId, recvId);
    deferred = soft::acksDeferred() > before;
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc, std::chrono::seconds(10)))
        << "b's ACK never left: the run after the poll that deferred it never came";
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
    EXPECT_EQ(wc.wrId, 20 + attempt);
    EXPECT_TRUE(bytesEqual(bytesOf(dst, 64, 64), bytesOf(src, from, 64)));
  }
  EXPECT_TRUE(deferred) << "in five attempts, no poll of b took the SEND itself";
}

// A poll of b's that finds frames on two links returns with the first link's: in a ping-pong
// that is the request its application waits for, and the ACK a's poll wrote on the other link
// right after it waits for b's next poll. The next poll starts at the link after that one, so each
// of the two completions comes with one poll, whichever link came first. Frames left in a link
// under b's lease are taken by b's polls (no wake-up needed). An attempt whose frames b's thread
// took (the test held off the core past b's 10 ms lease) proves nothing and is tried again;
// every attempt's SENDs complete and land.
TEST_P(RingPath, ACallersPollReturnsWithOneLinksFramesAndTheNextTakesTheOthers) {
  if (!ringsExpected()) GTEST_SKIP() << "no rings on this path: a poll takes what the sockets bring";
  if (!ferry::config::softCallerProgress()) GTEST_SKIP() << "no leases without FERRY_SOFT_CALLER_PROGRESS";
  ASSERT_OK_AND_ASSIGN(auto pair, makePairWithLeasesOf10Ms());
  ASSERT_OK_AND_ASSIGN(auto srcA, registerBuffer(pair->a.pd, 4096, v::access::kAll, 25));
  ASSERT_OK_AND_ASSIGN(auto srcB, registerBuffer(pair->b.pd, 4096, v::access::kAll, 26));
  v::WorkCompletion wc;
  // Both ways once, both sides polling: the two connections are set up.
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(srcB, 0, 64)}));
  ASSERT_OK(postReceive(pair->a.qp, 2, {sgeOf(srcA, 0, 64)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(srcA, 128, 64)}}));
  ASSERT_OK(post(pair->b.qp, {.opcode = v::WrOpcode::kSend, .wrId = 4, .sges = {sgeOf(srcB, 128, 64)}}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  ASSERT_TRUE(pollOne(pair->a.recvCq, &wc));
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  ASSERT_TRUE(pollOne(pair->b.sendCq, &wc));
  auto pollOnce = [](v::CompletionQueue& cq, v::WorkCompletion* out) {
    auto got = cq.poll(std::span<v::WorkCompletion>(out, 1));
    return got.isOk() ? *got : -1;
  };
  bool cutShort = false;
  for (uint64_t attempt = 0; attempt < 5 && !cutShort; ++attempt) {
    const uint64_t recvB = 10 + attempt, recvA = 20 + attempt, sendA = 30 + attempt, sendB = 40 + attempt;
    const size_t from = 1024 + 64 * attempt;  // each attempt's bytes differ from the last one's
    ASSERT_OK(postReceive(pair->b.qp, recvB, {sgeOf(srcB, 256, 64)}));
    ASSERT_OK(postReceive(pair->a.qp, recvA, {sgeOf(srcA, 256, 64)}));
    std::chrono::steady_clock::time_point leased;
    ASSERT_TRUE(leaseFromAPollOf(pair->b.recvCq, &leased));
    // b's SEND to a, which a takes; a's SEND to b on the other link, then a's poll, which sends its
    // ACK of b's SEND (if the poll that took it deferred it). b's two links both hold frames now.
    ASSERT_OK(
        post(pair->b.qp, {.opcode = v::WrOpcode::kSend, .wrId = sendB, .sges = {sgeOf(srcB, from, 64)}}));
    ASSERT_TRUE(pollOne(pair->a.recvCq, &wc));
    EXPECT_EQ(wc.wrId, recvA);
    ASSERT_OK(
        post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = sendA, .sges = {sgeOf(srcA, from, 64)}}));
    ASSERT_EQ(pollOnce(pair->a.recvCq, &wc), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a post handed to a's thread is out
    const uint64_t before = soft::linkPollsCutShort();
    const int first = pollOnce(pair->b.recvCq, &wc);
    ASSERT_GE(first, 0);
    const bool inLease = std::chrono::steady_clock::now() - leased < std::chrono::milliseconds(8);
    cutShort = inLease && soft::linkPollsCutShort() == before + 1;
    if (cutShort) {
      // One link's frames came with that poll; the other's come with the next poll of either CQ.
      // Unless they had not arrived yet: a's thread (slow under a sanitizer on a busy machine) had
      // not written them within the millisecond above. Such an attempt proves nothing and is tried
      // again; a poll that never takes the other link's frames still fails the test below.
      if (first == 1) {
        EXPECT_EQ(wc.wrId, recvB);
      } else {
        ASSERT_EQ(pollOnce(pair->b.sendCq, &wc), 1) << "the poll took neither link's frames";
        EXPECT_EQ(wc.wrId, sendB);
      }
      v::CompletionQueue& otherCq = first == 1 ? pair->b.sendCq : pair->b.recvCq;
      const int next = pollOnce(otherCq, &wc);
      ASSERT_GE(next, 0);
      if (next == 0) {
        cutShort = false;
        ASSERT_TRUE(pollOne(otherCq, &wc)) << "the other link's frames never came";
      }
      EXPECT_EQ(wc.wrId, first == 1 ? sendB : recvB);
      EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
    } else {
      if (first == 0) {
        ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
      }
      EXPECT_EQ(wc.wrId, recvB);
      ASSERT_TRUE(pollOne(pair->b.sendCq, &wc));
      EXPECT_EQ(wc.wrId, sendB);
    }
    EXPECT_TRUE(bytesEqual(bytesOf(srcB, 256, 64), bytesOf(srcA, from, 64)));
    EXPECT_TRUE(bytesEqual(bytesOf(srcA, 256, 64), bytesOf(srcB, from, 64)));
    ASSERT_TRUE(pollOne(pair->a.sendCq, &wc, std::chrono::seconds(10)));
    EXPECT_EQ(wc.wrId, sendA);
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  }
  EXPECT_TRUE(cutShort) << "in five attempts, no poll of b found both links holding frames under its lease";
}

// An application blocked on its completion channel takes its peer's frames itself: the waiting
// thread sleeps on the device's sockets and rings too and runs the loop when they bring something
// (Reactor::waitHere), instead of the progress thread taking the frame and then waking it. Each
// SEND here comes while b waits; the first may find b's thread still watching (it goes quiet when
// it next wakes), so the test asks for most of them, not all. Every SEND lands whole.
TEST_P(RingPath, AFrameForAnApplicationWaitingOnItsChannelIsTakenByTheWaitingThread) {
  if (!ferry::config::softCallerProgress()) {
    GTEST_SKIP() << "the waiting thread runs no loop without FERRY_SOFT_CALLER_PROGRESS";
  }
  ASSERT_OK_AND_ASSIGN(auto pair, makePairWithLeasesOf10Ms());
  Side b;
  b.context = pair->b.context;
  ASSERT_OK_AND_ASSIGN(v::CompletionChannel channel, b.context->createCompChannel());
  ASSERT_OK_AND_ASSIGN(b.pd, b.context->allocPd());
  ASSERT_OK_AND_ASSIGN(b.sendCq, b.context->createCq({.cqe = 64}));
  ASSERT_OK_AND_ASSIGN(b.recvCq, b.context->createCq({.cqe = 64, .channel = &channel}));
  ASSERT_OK(createQp(b, {}));
  Side& a = pair->a;
  ASSERT_OK_AND_ASSIGN(v::QueuePair qpA,
                       a.pd.createQp({.sendCq = &a.sendCq, .recvCq = &a.recvCq, .cap = QpOptions{}.cap}));
  ASSERT_OK(connectQps(*a.context, qpA, *b.context, b.qp));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(a.pd, 4096, v::access::kLocalWrite, 25));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(b.pd, 4096, v::access::kAll, 26));
  auto* softB = dynamic_cast<soft::SoftContext*>(b.context->impl().get());
  ASSERT_NE(softB, nullptr);
  constexpr int kSends = 20;
  const uint64_t before = softB->reactor().fdsTakenByWaiters();
  for (int i = 0; i < kSends; ++i) {
    ASSERT_OK(postReceive(b.qp, 100 + i, {sgeOf(dst, 64 * (i % 8), 64)}));
    ASSERT_OK(b.recvCq.reqNotify());
    std::thread sender([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // b waits by then, in its lease
      ASSERT_OK(
          post(qpA, {.opcode = v::WrOpcode::kSend, .wrId = 200u + i, .sges = {sgeOf(src, 64 * i, 64)}}));
    });
    auto event = channel.getEvent(10000);
    sender.join();
    ASSERT_OK(event.status()) << "SEND " << i;
    EXPECT_EQ(event->cqId, b.recvCq.id());
    v::WorkCompletion wc;
    ASSERT_TRUE(pollOne(b.recvCq, &wc));
    EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
    EXPECT_EQ(wc.wrId, 100u + i);
    EXPECT_TRUE(bytesEqual(bytesOf(dst, 64 * (i % 8), 64), bytesOf(src, 64 * i, 64)));
    ASSERT_TRUE(pollOne(a.sendCq, &wc));
    EXPECT_EQ(wc.wrId, 200u + i);
  }
  EXPECT_GE(softB->reactor().fdsTakenByWaiters() - before, static_cast<uint64_t>(kSends / 2))
      << "the progress thread took the frames the waiting application was to take";
}

// The listener answers only after a hello reply named it, but its name can be found on the host:
// whatever a stranger sends it is refused, and the context serves its own peers as before.
TEST_P(RingPath, HostileRingSetupsAreRefusedAndChangeNothing) {
  if (!ringsExpected()) GTEST_SKIP() << "no ring listener with FERRY_SOFT_SAME_HOST=0";
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  const uint64_t refusedBefore = soft::ringSetupsRefused();
  auto names = ringListeners();
  ASSERT_FALSE(names.empty()) << "the contexts listen for rings";
  auto genuine = RingPair::create(kRing);
  ASSERT_TRUE(isOk(genuine.status()));
  int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(unsealed, 4096 + 2 * kRing), 0);
  std::vector<int> open;
  for (const auto& name : names) {
    RingSetupMessage msg = (*genuine)->setupMessage();
    int s;
    if ((s = connectTo(name)) >= 0) open.push_back(s);  // says nothing at all
    if ((s = connectTo(name)) >= 0) ::close(s);         // hangs up at once
    if ((s = connectTo(name)) >= 0) {
      sendWithFds(s, "garbage", 7, {});
      open.push_back(s);
    }
    if ((s = connectTo(name)) >= 0) {
      sendWithFds(s, &msg, sizeof msg, {});  // no descriptors
      open.push_back(s);
    }
    if ((s = connectTo(name)) >= 0) {
      sendWithFds(s, &msg, sizeof msg, {unsealed, (*genuine)->ownWakeFd(), (*genuine)->peerWakeFd()});
      open.push_back(s);
    }
    if ((s = connectTo(name)) >= 0) {
      // A valid setup whose wake-up eventfds block (counter zero, or preset to its limit), then
      // silence: the listener's progress thread must never wait on them.
      int zero = ::eventfd(0, EFD_CLOEXEC), full = ::eventfd(0, EFD_CLOEXEC);
      const uint64_t nearLimit = UINT64_MAX - 1;
      ASSERT_EQ(::write(full, &nearLimit, sizeof nearLimit), static_cast<ssize_t>(sizeof nearLimit));
      auto blocking = RingPair::create(kRing);
      ASSERT_TRUE(isOk(blocking.status()));
      RingSetupMessage theirs = (*blocking)->setupMessage();
      sendWithFds(s, &theirs, sizeof theirs, {(*blocking)->memfd(), full, zero});
      uint8_t hello[32];
      std::memset(hello, 0, sizeof hello);
      iovec iov{hello, sizeof hello};
      (void)(*blocking)->writev(&iov, 1);  // data, and the listener reads its (blocking) wake-up
      ::close(zero);
      ::close(full);
      open.push_back(s);
    }
    if ((s = connectTo(name)) >= 0) {
      // A genuine ring, then frames that are not a hello.
      sendWithFds(s, &msg, sizeof msg,
                  {(*genuine)->memfd(), (*genuine)->ownWakeFd(), (*genuine)->peerWakeFd()});
      uint8_t junk[64];
      std::memset(junk, 0xab, sizeof junk);
      iovec iov{junk, sizeof junk};
      (void)(*genuine)->writev(&iov, 1);
      open.push_back(s);
    }
  }
  // The genuine setup and descriptors, with no ticket or a forged one: the listener's name is no
  // secret, the ticket of a hello reply is.
  std::vector<int> refusedWithoutTicket;
  for (const auto& name : names) {
    for (uint64_t ticket : {uint64_t{0}, uint64_t{0x0123456789abcdefull}}) {
      auto link = RingPair::create(kRing);
      ASSERT_TRUE(isOk(link.status()));
      RingSetupMessage msg = (*link)->setupMessage();
      msg.ticket = ticket;
      int s = connectTo(name);
      ASSERT_GE(s, 0);
      sendWithFds(s, &msg, sizeof msg, {(*link)->memfd(), (*link)->ownWakeFd(), (*link)->peerWakeFd()});
      refusedWithoutTicket.push_back(s);
    }
  }
  for (int s : refusedWithoutTicket) {
    EXPECT_TRUE(hungUpWithin(s, std::chrono::seconds(5))) << "a setup without its ticket is refused at once";
    ::close(s);
  }
  ::close(unsealed);
  // The pair still moves data both ways.
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair->a.pd, 64 * 1024, v::access::kLocalWrite, 21));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair->b.pd, 64 * 1024, v::access::kAll, 22));
  ASSERT_OK(postReceive(pair->b.qp, 1, {sgeOf(dst, 0, 64 * 1024)}));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 2, .sges = {sgeOf(src, 0, 64 * 1024)}}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  ASSERT_TRUE(pollOne(pair->a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_TRUE(bytesEqual(bytesOf(dst), bytesOf(src)));
  // And a new pair connects over rings as before.
  const uint64_t before = linksNow();
  ASSERT_OK_AND_ASSIGN(auto second, makePair());
  ASSERT_OK(postReceive(second->b.qp, 1, {}));
  ASSERT_OK(post(second->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 3}));
  ASSERT_TRUE(pollOne(second->b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  EXPECT_GE(linksNow() - before, 2u);
  // Per listener: the hang-up, the garbage, the setup without descriptors, the unsealed segment,
  // the blocking eventfds, the genuine ring without a ticket, and the two ticketless setups above.
  EXPECT_GE(soft::ringSetupsRefused() - refusedBefore, 8u * names.size());
  for (int s : open) ::close(s);
}

// Only so many ring connections may be waiting for their setup at once, and only for a while: a
// local process that opens connections and says nothing costs the listener a bounded number of
// descriptors, for a bounded time, and the context serves its peers throughout.
TEST_P(RingPath, SilentRingConnectionsAreBoundedInNumberAndTime) {
  if (!ringsExpected()) GTEST_SKIP() << "no ring listener with FERRY_SOFT_SAME_HOST=0";
  constexpr size_t kBound = 1024;  // the listener's kMaxPendingRingSockets
  constexpr size_t kExtra = 32;
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  rlimit saved = lim;
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < 2 * kBound + 3 * kExtra + 256) {
    GTEST_SKIP() << "needs room for " << 2 * kBound << " descriptors (RLIMIT_NOFILE " << saved.rlim_max
                 << ")";
  }
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  auto names = ringListeners();
  ASSERT_FALSE(names.empty());
  const std::string name = names.front();
  std::vector<int> silent;
  for (size_t i = 0; i < kBound + kExtra; ++i) {
    int s = connectTo(name);
    if (s < 0) break;  // the kernel's accept queue is full: also a bound
    silent.push_back(s);
  }
  ASSERT_GE(silent.size(), kBound) << "the listener accepts up to its bound";
  // Past the bound, a new connection is closed at once; the ones within it stay open for now.
  int later = -1;
  for (int attempt = 0; attempt < 50 && later < 0; ++attempt) {
    later = connectTo(name);
    if (later < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(later, 0);
  EXPECT_TRUE(hungUpWithin(later, std::chrono::seconds(3)))
      << "a connection past the bound is closed at once";
  ::close(later);
  size_t stillOpen = 0;
  for (int s : silent) stillOpen += hungUpWithin(s, std::chrono::milliseconds(0)) ? 0 : 1;
  EXPECT_GE(stillOpen, kBound - kExtra) << "the connections within the bound wait for their setup";
  // The pair moves data meanwhile.
  v::WorkCompletion wc;
  ASSERT_OK(postReceive(pair->b.qp, 1, {}));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 1}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
  // And every silent connection is dropped once the handshake's time (5 s) has passed.
  size_t dropped = 0;
  for (int s : silent) dropped += hungUpWithin(s, std::chrono::seconds(10)) ? 1 : 0;
  EXPECT_EQ(dropped, silent.size()) << "silent ring connections are dropped after the handshake timeout";
  for (int s : silent) ::close(s);
  ::setrlimit(RLIMIT_NOFILE, &saved);
}

// A crowd of silent connections on a ring listener cannot keep a new QP from its peer: the QP
// whose rings the peer's listener drops before they carried a hello goes on over TCP, and its
// messages arrive byte for byte. (Before, it offered rings again on every reconnection and failed
// with RETRY_EXC_ERR once its transport timeout ran out.)
TEST_P(RingPath, AQpWhoseRingsTheListenerDropsGoesOnOverTcp) {
  if (!ringsExpected()) GTEST_SKIP() << "no ring listener with FERRY_SOFT_SAME_HOST=0";
  constexpr size_t kBound = 1024;  // the listener's kMaxPendingRingSockets
  rlimit lim{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &lim), 0);
  rlimit saved = lim;
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < 2 * kBound + 256) {
    GTEST_SKIP() << "needs room for " << 2 * kBound << " descriptors (RLIMIT_NOFILE " << saved.rlim_max
                 << ")";
  }
  ConnectedPair pair;
  ASSERT_OK(openSide(pair.a, nullptr, 64));
  ASSERT_OK(openSide(pair.b, nullptr, 64));
  ASSERT_OK(createQp(pair.a, {}));
  ASSERT_OK(createQp(pair.b, {}));
  // Every ring listener of this process (the two contexts') is full before the QPs connect.
  std::vector<int> silent;
  for (const std::string& name : ringListeners()) {
    for (size_t i = 0; i < kBound; ++i) {
      int s = connectTo(name);
      if (s < 0) break;  // the kernel's accept queue is full: also a bound
      silent.push_back(s);
    }
  }
  ASSERT_GE(silent.size(), kBound) << "the listeners took the crowd";
  ASSERT_OK(connectQps(*pair.a.context, pair.a.qp, *pair.b.context, pair.b.qp));
  ASSERT_OK_AND_ASSIGN(auto src, registerBuffer(pair.a.pd, 4096, v::access::kLocalWrite, 21));
  ASSERT_OK_AND_ASSIGN(auto dst, registerBuffer(pair.b.pd, 4096, v::access::kAll, 22));
  ASSERT_OK(postReceive(pair.b.qp, 1, {sgeOf(dst, 0, 4096)}));
  const uint64_t ringBytesBefore = soft::ringBytesWritten();
  ASSERT_OK(post(pair.a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 3, .sges = {sgeOf(src, 0, 4096)}}));
  v::WorkCompletion wc;
  ASSERT_TRUE(pollOne(pair.a.sendCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
  ASSERT_TRUE(pollOne(pair.b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess) << describe(wc);
  EXPECT_TRUE(bytesEqual(bytesOf(dst, 0, 4096), bytesOf(src, 0, 4096)));
  // Over TCP: the 4 KiB message did not cross a ring (a hello to a dropped ring may have).
  EXPECT_LT(soft::ringBytesWritten() - ringBytesBefore, 4096u) << "the message went over rings";
  for (int s : silent) ::close(s);
  ::setrlimit(RLIMIT_NOFILE, &saved);
}

// A ring listener takes rings from processes of its own user only: another user's process is
// refused at once, whatever it sends (it could name the listener, as anyone can).
TEST_P(RingPath, RingListenerRefusesAnotherUser) {
  if (!ringsExpected()) GTEST_SKIP() << "no ring listener with FERRY_SOFT_SAME_HOST=0";
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
  ASSERT_OK_AND_ASSIGN(auto pair, makePair());
  auto names = ringListeners();
  ASSERT_FALSE(names.empty());
  const uint64_t refusedBefore = soft::ringSetupsRefused();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) ::_exit(3);
    int s = connectTo(names.front());
    if (s < 0) ::_exit(4);
    RingSetupMessage msg;
    msg.ringBytes = kRing;
    sendWithFds(s, &msg, sizeof msg, {});
    ::_exit(hungUpWithin(s, std::chrono::seconds(5)) ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3/4: could not become another user or connect; 5: not refused";
  EXPECT_GE(soft::ringSetupsRefused() - refusedBefore, 1u);
  // The pair is untouched.
  v::WorkCompletion wc;
  ASSERT_OK(postReceive(pair->b.qp, 1, {}));
  ASSERT_OK(post(pair->a.qp, {.opcode = v::WrOpcode::kSend, .wrId = 1}));
  ASSERT_TRUE(pollOne(pair->b.recvCq, &wc));
  EXPECT_EQ(wc.status, v::WcStatus::kSuccess);
}

// Where the kernel refuses cross-memory attach (here: a seccomp filter, as container runtimes
// install), the same-host path says so and stages WRITE and READ data through the rings; `ferry
// demo` (two processes, both under the filter) still moves and verifies its bytes, and `ferry info`
// shows the path.
std::string runRefusingCrossMemoryAttach(const std::vector<std::string>& args, int* exitCode) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(filter)), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      ::_exit(90);
    }
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::unsetenv("FERRY_SOFT_SAME_HOST");
    ::execv(argv[0], argv.data());
    ::_exit(91);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  *exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return text;
}

TEST(CrossMemoryAttachRefused, TheRingsStageTheDataAndSayWhy) {
  const std::string ferry = std::string(FERRY_TEST_BIN_DIR) + "/../ferry";
  if (::access(ferry.c_str(), X_OK) != 0) GTEST_SKIP() << "no ferry program at " << ferry;
  int code = -1;
  std::string info = runRefusingCrossMemoryAttach({ferry, "info", "--device", "soft_lo"}, &code);
  ASSERT_EQ(code, 0) << info;
  EXPECT_NE(info.find("without cross-memory attach"), std::string::npos) << info;
  EXPECT_NE(info.find("staged through shared-memory rings"), std::string::npos) << info;
  std::string demo = runRefusingCrossMemoryAttach({ferry, "demo", "--size", std::to_string(64 << 20)}, &code);
  ASSERT_EQ(code, 0) << demo;
  EXPECT_NE(demo.find("cross-memory attach unavailable"), std::string::npos) << "the fallback is logged:\n"
                                                                             << demo;
  EXPECT_NE(demo.find("RDMA WRITE"), std::string::npos) << demo;
  EXPECT_NE(demo.find("verified byte for byte"), std::string::npos) << demo;
}

INSTANTIATE_TEST_SUITE_P(Providers, RingPath, ::testing::ValuesIn(providerPaths()), providerPathTestName);

}  // namespace
}  // namespace ferry::test
