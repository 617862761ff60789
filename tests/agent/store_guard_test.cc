// `ferry store` (StoreServer) against clients that hold connections without using them
// (docs/security.md): a flood of idle connections past the server's cap does not lock a client
// out, and a connection that never sends a request is closed after its deadline. The server's
// descriptors are counted from the test.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/store/ferry_store_server.h"
#include "ferry/agent/store.h"
#include "support/raw_socket.h"

namespace ferry::agent {
namespace {

using namespace std::chrono_literals;

using test::openFds;

TEST(FerryStoreGuard, IdleConnectionsPastTheCapDoNotLockClientsOutAndAreClosedAtTheirDeadline) {
  rlimit files{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_cur < 4 * kMaxStoreConnections)
    GTEST_SKIP() << "needs " << 4 * kMaxStoreConnections << " descriptors";
  StoreServer server;
  ASSERT_TRUE(server.start("127.0.0.1", 0).isOk());
  const std::string url = "ferry://127.0.0.1:" + std::to_string(server.port());
  size_t fdsBefore = openFds();
  // More idle connections than the server serves at once.
  std::vector<std::unique_ptr<test::RawSocket>> idle;
  for (size_t i = 0; i < kMaxStoreConnections + 80; ++i) {
    idle.push_back(std::make_unique<test::RawSocket>(server.port()));
    ASSERT_TRUE(idle.back()->connected()) << "connection " << i;
  }
  // A client still gets in: it takes the place of the connection idle the longest.
  auto store = Store::open(url, {.timeout = 5000ms});
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  ASSERT_TRUE((*store)->set("/ferry/t/k", "value", 0).isOk());
  auto got = (*store)->get("/ferry/t/k");
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, "value");
  // The first connections were the idlest: closed to make room.
  EXPECT_TRUE(idle.front()->closedWithin(2s));
  // Every idle connection is closed at its deadline (10 s without a request, checked every 5 s).
  for (size_t i = 0; i < idle.size(); i += 101) {
    EXPECT_TRUE(idle[i]->closedWithin(kStoreFirstRequestTimeout + kWatchPingInterval + 2s))
        << "connection " << i;
  }
  EXPECT_TRUE(idle.back()->closedWithin(1s));
  // The server's ends are closed (the last ones by the next sweep); the test still holds its own.
  auto until = std::chrono::steady_clock::now() + kWatchPingInterval + 2s;
  while (openFds() >= fdsBefore + idle.size() + 40 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LT(openFds(), fdsBefore + idle.size() + 40);
  // The client that used its connection was served all along and still is.
  got = (*store)->get("/ferry/t/k");
  ASSERT_TRUE(got.isOk()) << got.status().toString();
}

TEST(FerryStoreGuard, ProtectedModeServesClientsOfThisHostAndAllowRemoteStillServesThem) {
  // Which addresses are this host is the shared admission's (tests/agent/guard_test.cc refuses a
  // foreign one); here, both modes serve a client of this host.
  StoreServer closed;
  ASSERT_TRUE(closed.start("127.0.0.1", 0).isOk());
  auto local = Store::open("ferry://127.0.0.1:" + std::to_string(closed.port()));
  ASSERT_TRUE(local.isOk());
  EXPECT_TRUE((*local)->set("/ferry/t/a", "1", 0).isOk());
  StoreServer open;
  ASSERT_TRUE(open.start("127.0.0.1", 0, {.allowRemote = true}).isOk());
  auto client = Store::open("ferry://127.0.0.1:" + std::to_string(open.port()));
  ASSERT_TRUE(client.isOk());
  EXPECT_TRUE((*client)->set("/ferry/t/a", "1", 0).isOk());
}

}  // namespace
}  // namespace ferry::agent
