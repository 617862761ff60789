// `ferry store` (StoreServer) against clients that hold connections without using them
// (docs/security.md): a flood of idle connections past the server's cap does not lock a client
// out, and a connection that never sends a request is closed after its deadline. The server's
// descriptors are counted from the test.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/store/ferry_store_server.h"
#include "ferry/agent/store.h"

namespace ferry::agent {
namespace {

using namespace std::chrono_literals;

size_t openFds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

int rawConnect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed fd within `within` (lines it sent before are read and ignored).
bool closedWithin(int fd, std::chrono::milliseconds within) {
  auto end = std::chrono::steady_clock::now() + within;
  char buf[4096];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (::recv(fd, buf, sizeof buf, 0) <= 0) return true;
  }
  return false;
}

TEST(FerryStoreGuard, IdleConnectionsPastTheCapDoNotLockClientsOutAndAreClosedAtTheirDeadline) {
  rlimit files{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &files), 0);
  files.rlim_cur = files.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_cur < 4 * kMaxStoreConnections) GTEST_SKIP() << "needs " << 4 * kMaxStoreConnections << " descriptors";
  StoreServer server;
  ASSERT_TRUE(server.start("127.0.0.1", 0).isOk());
  const std::string url = "ferry://127.0.0.1:" + std::to_string(server.port());
  size_t fdsBefore = openFds();
  // More idle connections than the server serves at once.
  std::vector<int> idle;
  for (size_t i = 0; i < kMaxStoreConnections + 80; ++i) {
    int fd = rawConnect(server.port());
    ASSERT_GE(fd, 0) << "connection " << i;
    idle.push_back(fd);
  }
  // A client still gets in: it takes the place of the connection idle the longest.
  auto store = Store::open(url, {.timeout = 5000ms});
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  ASSERT_TRUE((*store)->set("/ferry/t/k", "value", 0).isOk());
  auto got = (*store)->get("/ferry/t/k");
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, "value");
  // The first connections were the idlest: closed to make room.
  EXPECT_TRUE(closedWithin(idle.front(), 2s));
  // Every idle connection is closed at its deadline (10 s without a request, checked every 5 s).
  for (size_t i = 0; i < idle.size(); i += 101) {
    EXPECT_TRUE(closedWithin(idle[i], kStoreFirstRequestTimeout + kWatchPingInterval + 2s)) << "connection " << i;
  }
  EXPECT_TRUE(closedWithin(idle.back(), 1s));
  // The server's ends are closed; the test still holds its own.
  EXPECT_LT(openFds(), fdsBefore + idle.size() + 40);
  // The client that used its connection was served all along and still is.
  got = (*store)->get("/ferry/t/k");
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  for (int fd : idle) ::close(fd);
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
