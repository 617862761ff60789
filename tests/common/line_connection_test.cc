// LineConnection (common/net/line_connection.h): line framing on the reactor and the bounds every
// line protocol relies on against a hostile peer.
#include "common/net/line_connection.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net/listen.h"

namespace ferry::net {
namespace {

using namespace std::chrono_literals;

// What a connection's callbacks saw, filled on the reactor's thread.
struct Seen {
  std::mutex mu;
  std::vector<std::string> lines;
  std::atomic<int> closes{0};
  Status why;
  bool connected = false;
  std::promise<void> closed;

  LineConnection::LineCb onLine() {
    return [this](LineConnection&, std::string_view line) {
      std::lock_guard<std::mutex> lock(mu);
      lines.emplace_back(line);
    };
  }
  LineConnection::CloseCb onClose() {
    return [this](LineConnection&, const Status& status, bool wasConnected) {
      std::lock_guard<std::mutex> lock(mu);
      if (++closes == 1) {
        why = status;
        connected = wasConnected;
        closed.set_value();
      }
    };
  }
  std::vector<std::string> linesNow() {
    std::lock_guard<std::mutex> lock(mu);
    return lines;
  }
};

// A reactor and an adopted connection over a socket pair; `peer` is the other end, blocking.
struct Pair {
  Reactor reactor;
  Seen seen;
  int peer = -1;
  std::shared_ptr<LineConnection> conn;

  explicit Pair(LineLimits limits) {
    EXPECT_TRUE(reactor.start("line-test").isOk());
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    int flags = ::fcntl(fds[0], F_GETFL);
    ::fcntl(fds[0], F_SETFL, flags | O_NONBLOCK);  // the connection's end never blocks
    peer = fds[1];
    EXPECT_TRUE(reactor
                    .runSync([&] {
                      conn = LineConnection::adopt(reactor, fds[0], limits, seen.onLine(), seen.onClose());
                    })
                    .isOk());
  }
  ~Pair() {
    (void)reactor.runSync([&] { conn.reset(); });
    reactor.stop();
    ::close(peer);
  }
  void write(const std::string& bytes) {
    ASSERT_EQ(::send(peer, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  bool waitForLines(size_t n) {
    for (int i = 0; i < 1000 && seen.linesNow().size() < n; ++i) std::this_thread::sleep_for(5ms);
    return seen.linesNow().size() >= n;
  }
  bool waitClosed() { return seen.closed.get_future().wait_for(10s) == std::future_status::ready; }
  // Everything the peer can read until the connection's end of file.
  std::string readAll() {
    std::string all;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(peer, buf, sizeof buf, 0)) > 0) all.append(buf, static_cast<size_t>(n));
    return all;
  }
};

// A loopback port nothing listens on (a connection to it is refused at once); 0 when none was found.
uint16_t refusingPort() {
  auto bound = listenTcp("127.0.0.1", 0, {.nonBlocking = false});
  if (!bound.isOk()) return 0;
  ::close(bound->fd);
  return bound->port;
}

TEST(LineConnection, LinesCutAnywhereArriveWholeInOrderAndEmptyOnesAreSkipped) {
  Pair p({.maxLine = 64, .maxPendingOutput = 1 << 20});
  p.write("fir");
  p.write("st\n\nsec");
  p.write("ond\nthird\n");
  ASSERT_TRUE(p.waitForLines(3));
  EXPECT_EQ(p.seen.linesNow(), (std::vector<std::string>{"first", "second", "third"}));
  p.write(std::string(64, 'x') + "\n");  // exactly the bound: fine
  ASSERT_TRUE(p.waitForLines(4));
  EXPECT_EQ(p.seen.closes, 0);
}

TEST(LineConnection, ALineLongerThanTheBoundEndsTheConnectionAfterItsFarewell) {
  Pair p({.maxLine = 64, .maxPendingOutput = 1 << 20});
  ASSERT_TRUE(
      p.reactor
          .runSync([&] { p.conn->setFarewell([](const Status& why) { return "bye: " + why.message(); }); })
          .isOk());
  p.write("ok\n" + std::string(65, 'x'));
  ASSERT_TRUE(p.waitClosed());
  EXPECT_EQ(p.seen.why.code(), StatusCode::kProtocolError);
  EXPECT_NE(p.seen.why.message().find("longer than 64 bytes"), std::string::npos);
  EXPECT_TRUE(p.seen.connected);
  EXPECT_EQ(p.seen.linesNow(), (std::vector<std::string>{"ok"}));
  EXPECT_EQ(p.readAll(), "bye: " + p.seen.why.message() + "\n");
}

TEST(LineConnection, APeerThatLeavesAnswersUnreadIsDroppedAtTheOutputBound) {
  Pair p({.maxLine = 64, .maxPendingOutput = 256 << 10});
  const std::string line(16 << 10, 'a');
  int sent = 0;
  // The socket pair's buffers take a few hundred KiB; past them, queued output reaches the bound.
  for (; sent < 1000 && p.seen.closes == 0; ++sent) {
    ASSERT_TRUE(p.reactor.runSync([&] { p.conn->send(line); }).isOk());
  }
  ASSERT_TRUE(p.waitClosed());
  EXPECT_EQ(p.seen.why.code(), StatusCode::kResourceExhausted);
  EXPECT_LT(sent, 1000);
  bool open = true;
  ASSERT_TRUE(p.reactor.runSync([&] { open = p.conn->open(); }).isOk());
  EXPECT_FALSE(open);
}

TEST(LineConnection, CloseCallsNoCallbackAndCloseWithSendsItsLineFirst) {
  Pair p({.maxLine = 64, .maxPendingOutput = 1 << 20});
  ASSERT_TRUE(p.reactor
                  .runSync([&] {
                    p.conn->send("answer");
                    p.conn->closeWith("dropped: why");
                  })
                  .isOk());
  EXPECT_EQ(p.readAll(), "answer\ndropped: why\n");
  EXPECT_EQ(p.seen.closes, 0);
}

TEST(LineConnection, ConnectTriesTheTargetsInOrderAndKeepsWhatWasSentBeforehand) {
  auto listener = listenTcp("127.0.0.1", 0, {.nonBlocking = false});
  ASSERT_TRUE(listener.isOk()) << listener.status().toString();
  const uint16_t deadPort = refusingPort();
  ASSERT_NE(deadPort, 0);

  Reactor reactor;
  ASSERT_TRUE(reactor.start("line-test").isOk());
  Seen seen;
  std::shared_ptr<LineConnection> conn;
  ASSERT_TRUE(reactor
                  .runSync([&] {
                    conn = LineConnection::connect(
                        reactor,
                        {{.ip = "127.0.0.1", .port = deadPort}, {.ip = "127.0.0.1", .port = listener->port}},
                        "test", {}, seen.onLine(), seen.onClose());
                    conn->send("early");
                  })
                  .isOk());
  int peer = ::accept(listener->fd, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  char buf[16] = {};
  ASSERT_EQ(::recv(peer, buf, 6, MSG_WAITALL), 6);
  EXPECT_EQ(std::string(buf, 6), "early\n");
  bool connected = false;
  ASSERT_TRUE(reactor.runSync([&] { connected = conn->connected(); }).isOk());
  EXPECT_TRUE(connected);
  EXPECT_EQ(seen.closes, 0);
  ::close(peer);
  ASSERT_EQ(seen.closed.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(seen.why.isOk());  // an orderly end of file
  (void)reactor.runSync([&] { conn.reset(); });
  reactor.stop();
  ::close(listener->fd);
}

TEST(LineConnection, ConnectWithEveryTargetRefusedEndsNamingTheLastOne) {
  const uint16_t deadPort = refusingPort();
  ASSERT_NE(deadPort, 0);
  Reactor reactor;
  ASSERT_TRUE(reactor.start("line-test").isOk());
  Seen seen;
  std::shared_ptr<LineConnection> conn;
  ASSERT_TRUE(reactor
                  .runSync([&] {
                    conn = LineConnection::connect(
                        reactor, {{.ip = "not-an-address", .port = 1}, {.ip = "127.0.0.1", .port = deadPort}},
                        "test", {}, seen.onLine(), seen.onClose());
                  })
                  .isOk());
  ASSERT_EQ(seen.closed.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(seen.why.code(), StatusCode::kUnavailable);
  EXPECT_NE(seen.why.message().find("test: cannot connect to 127.0.0.1:" + std::to_string(deadPort)),
            std::string::npos)
      << seen.why.toString();
  EXPECT_FALSE(seen.connected);
  (void)reactor.runSync([&] { conn.reset(); });
  reactor.stop();
}

}  // namespace
}  // namespace ferry::net
