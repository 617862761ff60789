// The links under the soft provider's connections (link.h), on their own, over a real TCP
// connection on loopback: a TCP link told to await n bytes of a payload says it is readable only
// once that many wait (never more than asked, so a payload's last bytes are never stranded), a
// read still returns what there is, and the peer's hang-up says so at once.
#include "providers/soft/link.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/reactor.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

// Counts what the link says; reads nothing (the socket stays readable once it is).
class EventCounter : public soft::Link::Events {
 public:
  std::atomic<int> readable{0};
  void onLinkConnected(const Status&) override {}
  void onLinkReadable() override { readable.fetch_add(1); }
  void onLinkWritable() override {}
  void onLinkBroken(const Status&) override {}
};

class TcpLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(listener, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(listener, 1), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    peer_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(::connect(peer_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    ::close(listener);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(reactor_.start("link-test").isOk());
    link_ = soft::makeTcpLink(fd, /*connecting=*/false);
    Status attached;
    ASSERT_TRUE(reactor_.runSync([&] { attached = link_->attach(reactor_, events_); }).isOk());
    ASSERT_TRUE(attached.isOk()) << attached.toString();
  }

  void TearDown() override {
    if (link_) (void)reactor_.runSync([&] { link_->close(); });
    reactor_.stop();
    if (peer_ >= 0) ::close(peer_);
  }

  void awaitBytes(size_t n) {
    ASSERT_TRUE(reactor_.runSync([&] { link_->awaitBytes(n); }).isOk());
  }

  void peerSends(size_t n) {
    std::vector<uint8_t> bytes(n, 0x5a);
    size_t sent = 0;
    while (sent < n) {
      ssize_t k = ::send(peer_, bytes.data() + sent, n - sent, MSG_NOSIGNAL);
      ASSERT_GT(k, 0);
      sent += static_cast<size_t>(k);
    }
  }

  // Whether the link said it is readable within the time given.
  bool readableWithin(std::chrono::milliseconds limit) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      if (events_->readable.load() > 0) return true;
      std::this_thread::sleep_for(1ms);
    }
    return events_->readable.load() > 0;
  }

  // Reads what waits, on the loop (as the connection does).
  ssize_t readNow(std::vector<uint8_t>* into) {
    ssize_t n = -1;
    EXPECT_TRUE(reactor_.runSync([&] { n = link_->read(into->data(), into->size()); }).isOk());
    return n;
  }

  Reactor reactor_;
  std::shared_ptr<EventCounter> events_ = std::make_shared<EventCounter>();
  std::unique_ptr<soft::Link> link_;
  int peer_ = -1;
};

TEST_F(TcpLinkTest, AwaitedBytesHoldTheWakeUpUntilThatManyWaitAndAReadStillTakesWhatThereIs) {
  awaitBytes(100'000);
  peerSends(60'000);
  EXPECT_FALSE(readableWithin(200ms)) << "readable with 60,000 of the 100,000 bytes awaited";
  peerSends(40'000);
  EXPECT_TRUE(readableWithin(5000ms)) << "not readable once the 100,000 bytes awaited were there";
  std::vector<uint8_t> buf(1 << 20);
  EXPECT_EQ(readNow(&buf), 100'000);
  EXPECT_EQ(buf[0], 0x5a);
  EXPECT_EQ(buf[99'999], 0x5a);
}

TEST_F(TcpLinkTest, AReadTakesWhatWaitsBeforeTheAwaitedCountIsReached) {
  awaitBytes(100'000);
  peerSends(30'000);
  std::this_thread::sleep_for(50ms);
  std::vector<uint8_t> buf(1 << 20);
  EXPECT_EQ(readNow(&buf), 30'000) << "a read must not wait for the awaited count";
}

TEST_F(TcpLinkTest, AwaitingNoBytesWakesForAnyByte) {
  awaitBytes(100'000);
  awaitBytes(0);
  peerSends(1);
  EXPECT_TRUE(readableWithin(5000ms)) << "one byte did not make the link readable after awaitBytes(0)";
}

TEST_F(TcpLinkTest, AHugeAwaitIsCappedSoThePayloadsBytesAlwaysWakeIt) {
  // A 1 GiB payload is read in pieces: the link must not wait for more than the socket can hold.
  awaitBytes(size_t{1} << 30);
  peerSends(512 * 1024);  // the cap
  EXPECT_TRUE(readableWithin(5000ms)) << "512 KiB waiting did not make the link readable";
}

TEST_F(TcpLinkTest, TheAwaitedCountNeverStrandsAPayloadsLastBytes) {
  // The connection awaits exactly what is left of its payload: those bytes wake it.
  awaitBytes(12'345);
  peerSends(12'345);
  EXPECT_TRUE(readableWithin(5000ms)) << "the last 12,345 bytes of a payload did not wake the link";
}

TEST_F(TcpLinkTest, APeerThatHangsUpWakesTheLinkAtOnce) {
  awaitBytes(100'000);
  peerSends(10);
  ::shutdown(peer_, SHUT_WR);
  EXPECT_TRUE(readableWithin(5000ms)) << "the peer's hang-up did not make the link readable";
  std::vector<uint8_t> buf(1 << 20);
  EXPECT_EQ(readNow(&buf), 10);
  EXPECT_EQ(readNow(&buf), 0) << "the end of the peer's stream";
}

}  // namespace
}  // namespace ferry::test
