// The discovery store's conformance suite: one set of cases, run over every backend (memory://,
// ferry:// with a StoreServer in this process, redis:// and etcd:// with a server this test starts
// on free ports of 127.0.0.1 and kills at the end; redis twice, the second time refusing CONFIG so
// that watches poll). A backend whose server program is missing is
// skipped with the reason, unless FERRY_REQUIRE_STORES (a comma list: memory,ferry,redis,etcd)
// names it; then it fails. Next to the suite: URL parsing, the ferry:// server against hostile
// clients, and the `ferry store` command.
#include "ferry/agent/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/store/ferry_store_server.h"

namespace ferry::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Each call's deadline in the suite: short, so a store that is down is noticed quickly.
constexpr milliseconds kCallTimeout{1000};
// How long a server may take to come up, and a change to reach a watcher.
constexpr milliseconds kStartLimit{20000};
constexpr milliseconds kEventLimit{5000};
// Shortest lease every backend grants as asked (etcd rounds shorter ones up to about 2 s).
constexpr seconds kLeaseTtl{2};

// Polls cond every 20 ms until it holds or limit has passed; whether it held.
bool eventually(const std::function<bool()>& cond, milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (true) {
    if (cond()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
}

uint16_t freePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The program's path, searched in PATH; empty when absent.
std::string findProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(std::string(path ? path : "") + ":/usr/bin:/usr/sbin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = dir + "/" + name;
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

bool required(const std::string& backend) {
  const char* env = std::getenv("FERRY_REQUIRE_STORES");
  std::stringstream list(env ? env : "");
  std::string item;
  while (std::getline(list, item, ',')) {
    if (item == backend) return true;
  }
  return false;
}

// A server program this test runs (redis-server, etcd), its output in a log file. It dies with
// this process (PR_SET_PDEATHSIG), and kill() ends it at once, as a crash would.
class ChildProcess {
 public:
  ~ChildProcess() { kill(); }
  bool start(const std::vector<std::string>& args, const std::string& log) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    return true;
  }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// How the suite brings one kind of store up, down and up again.
class Backend {
 public:
  virtual ~Backend() = default;
  // Why this backend cannot run here (its server program is missing); empty when it can.
  virtual std::string missing() const { return ""; }
  // Starts the server (once per process; later calls return at once).
  virtual Status up() = 0;
  // The URL of a store for one test (memory:// gets a name of its own per test).
  virtual std::string url(const std::string& test) const = 0;
  // Whether the store can go down (memory:// lives inside this process).
  virtual bool canGoDown() const { return true; }
  // Kills or stops the server; restart() brings it back on the same port.
  virtual void down() {}
  virtual Status restart() { return Status::ok(); }
};

// Waits until the store at url answers (any answer but kUnavailable).
Status waitUntilServing(const std::string& url) {
  auto store = Store::open(url, {.timeout = milliseconds(500)});
  if (!store.isOk()) return store.status();
  Status last;
  bool ok = eventually(
      [&] {
        auto got = (*store)->get("/ferry-test/ready");
        last = got.status();
        return got.isOk() || got.status().code() == StatusCode::kNotFound;
      },
      kStartLimit);
  return ok ? Status::ok() : Status(StatusCode::kUnavailable, url + " did not come up: " + last.toString());
}

class MemoryBackend : public Backend {
 public:
  Status up() override { return Status::ok(); }
  std::string url(const std::string& test) const override { return "memory://" + test; }
  bool canGoDown() const override { return false; }
};

class FerryBackend : public Backend {
 public:
  Status up() override {
    if (port_ != 0) return Status::ok();
    FERRY_RETURN_IF_ERROR(server_.start("127.0.0.1", 0));
    port_ = server_.port();
    return Status::ok();
  }
  std::string url(const std::string&) const override { return "ferry://127.0.0.1:" + std::to_string(port_); }
  void down() override { server_.stop(); }
  Status restart() override { return server_.start("127.0.0.1", port_); }

 private:
  StoreServer server_;
  uint16_t port_ = 0;
};

// A server program on free ports of 127.0.0.1, with a scratch directory for its data and log.
class ProcessBackend : public Backend {
 public:
  explicit ProcessBackend(std::string program) : program_(findProgram(program)), name_(std::move(program)) {}
  std::string missing() const override { return program_.empty() ? "no " + name_ + " in PATH" : ""; }
  Status up() override {
    if (port_ != 0) return Status::ok();
    char dir[] = "/tmp/ferry-store-test-XXXXXX";
    if (mkdtemp(dir) == nullptr) return ioError("mkdtemp");
    dir_ = dir;
    port_ = freePort();
    return restart();
  }
  std::string url(const std::string&) const override {
    return scheme() + "://127.0.0.1:" + std::to_string(port_);
  }
  void down() override { child_.kill(); }
  Status restart() override {
    if (!child_.start(arguments(), dir_ + "/server.log")) return ioError("fork");
    Status st = waitUntilServing(url(""));
    if (!st.isOk()) return Status(st.code(), st.message() + " (its log: " + dir_ + "/server.log)");
    return st;
  }
  ~ProcessBackend() override {
    child_.kill();
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }

 protected:
  virtual std::string scheme() const = 0;
  virtual std::vector<std::string> arguments() = 0;
  std::string program_;
  std::string name_;
  std::string dir_;
  uint16_t port_ = 0;
  ChildProcess child_;
};

// polling: a server that refuses CONFIG (as managed ones do), so watches fall back to SCAN.
class RedisBackend : public ProcessBackend {
 public:
  explicit RedisBackend(bool polling) : ProcessBackend("redis-server"), polling_(polling) {}

 protected:
  std::string scheme() const override { return "redis"; }
  std::vector<std::string> arguments() override {
    std::vector<std::string> args = {
        program_,       "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no",     "--daemonize",         "no",     "--dir",     dir_};
    if (polling_) args.insert(args.end(), {"--rename-command", "CONFIG", ""});
    return args;
  }

 private:
  bool polling_;
};

class EtcdBackend : public ProcessBackend {
 public:
  EtcdBackend() : ProcessBackend("etcd") {}

 protected:
  std::string scheme() const override { return "etcd"; }
  std::vector<std::string> arguments() override {
    if (peerPort_ == 0) peerPort_ = freePort();
    std::string client = "http://127.0.0.1:" + std::to_string(port_);
    std::string peer = "http://127.0.0.1:" + std::to_string(peerPort_);
    return {program_,
            "--name",
            "ferry-test",
            "--data-dir",
            dir_ + "/data",
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            "ferry-test=" + peer};
  }

 private:
  uint16_t peerPort_ = 0;
};

// The backends of this process, made on first use and torn down (servers killed) at the end.
std::map<std::string, std::unique_ptr<Backend>>& backends() {
  static auto* all = new std::map<std::string, std::unique_ptr<Backend>>();
  return *all;
}

Backend& backendNamed(const std::string& name) {
  auto& all = backends();
  auto& b = all[name];
  if (!b) {
    if (name == "memory") b = std::make_unique<MemoryBackend>();
    if (name == "ferry") b = std::make_unique<FerryBackend>();
    if (name == "redis") b = std::make_unique<RedisBackend>(false);
    if (name == "redis_polling") b = std::make_unique<RedisBackend>(true);
    if (name == "etcd") b = std::make_unique<EtcdBackend>();
  }
  return *b;
}

class BackendCleanup : public ::testing::Environment {
 public:
  void TearDown() override { backends().clear(); }
};
[[maybe_unused]] auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new BackendCleanup);

std::string describe(const StoreEvent& e) {
  return (e.kind == StoreEvent::Kind::kPut ? "put " : "delete ") + e.key +
         (e.kind == StoreEvent::Kind::kPut ? "=" + e.value : "");
}

// What a watch callback saw, in order.
class EventLog {
 public:
  WatchCb callback() {
    return [this](const StoreEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(describe(e));
    };
  }
  std::vector<std::string> events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  bool saw(const std::string& event) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(events_.begin(), events_.end(), event) != events_.end();
  }
  std::string text() {
    std::string out;
    for (const auto& e : events()) out += "  " + e + "\n";
    return out.empty() ? "  (none)\n" : out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> events_;
};

class StoreSuite : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = &backendNamed(GetParam());
    std::string missing = backend_->missing();
    if (!missing.empty()) {
      // redis_polling is a second way of running redis: FERRY_REQUIRE_STORES=redis requires both.
      if (required(GetParam().substr(0, GetParam().find('_'))))
        FAIL() << GetParam() << " is required (FERRY_REQUIRE_STORES) but " << missing;
      GTEST_SKIP() << missing;
    }
    Status st = backend_->up();
    ASSERT_TRUE(st.isOk()) << st.toString();
    std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    test = test.substr(0, test.find('/'));
    prefix_ = "/ferry-test/" + test + "/";
    auto store = Store::open(backend_->url(test), {.timeout = kCallTimeout});
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    store_ = std::move(*store);
  }

  std::string key(const std::string& name) const { return prefix_ + name; }

  Backend* backend_ = nullptr;
  std::string prefix_;
  std::unique_ptr<Store> store_;
};

#define ASSERT_OK(expr)                                         \
  do {                                                          \
    ::ferry::Status st_ = (expr);                               \
    ASSERT_TRUE(st_.isOk()) << #expr << ": " << st_.toString(); \
  } while (0)

TEST_P(StoreSuite, SetGetOverwriteEraseAndSortedList) {
  ASSERT_OK(store_->set(key("b"), "2"));
  ASSERT_OK(store_->set(key("a"), "1"));
  ASSERT_OK(store_->set(key("c/x"), "3"));
  ASSERT_OK(store_->set("/ferry-test/elsewhere", "0"));
  auto got = store_->get(key("a"));
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, "1");

  ASSERT_OK(store_->set(key("a"), "one"));
  EXPECT_EQ(store_->get(key("a")).value(), "one");

  auto all = store_->list(prefix_);
  ASSERT_TRUE(all.isOk()) << all.status().toString();
  std::vector<StoreEntry> expected = {{key("a"), "one"}, {key("b"), "2"}, {key("c/x"), "3"}};
  EXPECT_EQ(*all, expected);
  auto some = store_->list(key("c"));
  ASSERT_TRUE(some.isOk());
  EXPECT_EQ(*some, (std::vector<StoreEntry>{{key("c/x"), "3"}}));
  EXPECT_TRUE(store_->list(key("zzz")).value().empty());

  ASSERT_OK(store_->erase(key("a")));
  EXPECT_EQ(store_->get(key("a")).status().code(), StatusCode::kNotFound);
  ASSERT_OK(store_->erase(key("a")));  // absent: still OK
  EXPECT_EQ(store_->list(prefix_).value().size(), 2u);
  EXPECT_EQ(store_->get("/ferry-test/elsewhere").value(), "0");
  ASSERT_OK(store_->erase("/ferry-test/elsewhere"));
}

TEST_P(StoreSuite, BinaryValuesRoundTrip) {
  std::string bytes;
  for (int round = 0; round < 3; ++round) {
    for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  }
  ASSERT_OK(store_->set(key("binary"), bytes));
  ASSERT_OK(store_->set(key("empty"), ""));
  EXPECT_EQ(store_->get(key("binary")).value(), bytes);
  EXPECT_EQ(store_->get(key("empty")).value(), "");
  auto all = store_->list(prefix_);
  ASSERT_TRUE(all.isOk()) << all.status().toString();
  EXPECT_EQ(*all, (std::vector<StoreEntry>{{key("binary"), bytes}, {key("empty"), ""}}));
  // A key is text: UTF-8 beyond ASCII is fine.
  ASSERT_OK(store_->set(key("grüße/東京"), "x"));
  EXPECT_EQ(store_->get(key("grüße/東京")).value(), "x");
}

TEST_P(StoreSuite, LimitsAreRefusedAndNothingChanges) {
  ASSERT_OK(store_->set(key("limited"), "before"));
  std::string longKey = prefix_ + std::string(1025 - prefix_.size(), 'k');
  EXPECT_EQ(store_->set(longKey, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->set("", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->set(key("bad\nkey"), "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->set(key("bad\xff"), "x").code(), StatusCode::kInvalidArgument);
  Status tooLarge = store_->set(key("limited"), std::string((1 << 20) + 1, 'v'));
  EXPECT_EQ(tooLarge.code(), StatusCode::kInvalidArgument) << tooLarge.toString();
  EXPECT_EQ(store_->get(key("limited")).value(), "before");
  EXPECT_EQ(store_->list(prefix_).value(), (std::vector<StoreEntry>{{key("limited"), "before"}}));
  EXPECT_EQ(store_->grantLease(seconds(0)).status().code(), StatusCode::kInvalidArgument);

  // The limits themselves are accepted.
  std::string maxKey = prefix_ + std::string(1024 - prefix_.size(), 'k');
  std::string maxValue((1 << 20), 'v');
  ASSERT_OK(store_->set(maxKey, maxValue));
  EXPECT_EQ(store_->get(maxKey).value(), maxValue);
}

TEST_P(StoreSuite, LeaseKeptAliveSurvivesThenExpiresAndWatchersSeeIt) {
  EventLog log;
  auto watch = store_->watch(prefix_, log.callback());
  ASSERT_TRUE(watch.isOk()) << watch.status().toString();
  auto lease = store_->grantLease(kLeaseTtl);
  ASSERT_TRUE(lease.isOk()) << lease.status().toString();
  ASSERT_OK(store_->set(key("leased"), "alive", *lease));
  ASSERT_OK(store_->set(key("kept"), "no lease"));

  // Kept alive for longer than its TTL: the key stays.
  auto until = Clock::now() + kLeaseTtl + milliseconds(1000);
  while (Clock::now() < until) {
    ASSERT_OK(store_->keepAlive(*lease));
    std::this_thread::sleep_for(milliseconds(300));
  }
  EXPECT_EQ(store_->get(key("leased")).value(), "alive");

  // Left alone: the key goes, and the watcher sees it go.
  EXPECT_TRUE(eventually([&] { return store_->get(key("leased")).status().code() == StatusCode::kNotFound; },
                         kLeaseTtl + milliseconds(6000)))
      << "a key of an expired lease is still there";
  EXPECT_TRUE(eventually([&] { return log.saw("delete " + key("leased")); }, kEventLimit)) << log.text();
  EXPECT_EQ(store_->get(key("kept")).value(), "no lease");
  EXPECT_EQ(store_->keepAlive(*lease).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->set(key("late"), "x", *lease).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->get(key("late")).status().code(), StatusCode::kNotFound);
  store_->unwatch(*watch);
}

TEST_P(StoreSuite, RevokeDeletesTheLeasesKeysAtOnce) {
  auto lease = store_->grantLease(seconds(30));
  ASSERT_TRUE(lease.isOk()) << lease.status().toString();
  ASSERT_OK(store_->set(key("one"), "1", *lease));
  ASSERT_OK(store_->set(key("two"), "2", *lease));
  ASSERT_OK(store_->set(key("other"), "3"));
  ASSERT_OK(store_->revokeLease(*lease));
  EXPECT_EQ(store_->get(key("one")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->get(key("two")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->list(prefix_).value(), (std::vector<StoreEntry>{{key("other"), "3"}}));
  EXPECT_EQ(store_->keepAlive(*lease).code(), StatusCode::kNotFound);
  ASSERT_OK(store_->revokeLease(*lease));  // again: OK
}

TEST_P(StoreSuite, WatchSeesPutsAndDeletesUntilUnwatched) {
  ASSERT_OK(store_->set(key("before"), "old"));
  EventLog log;
  EventLog sentinel;
  auto watch = store_->watch(prefix_, log.callback());
  ASSERT_TRUE(watch.isOk()) << watch.status().toString();
  auto second = store_->watch(prefix_, sentinel.callback());
  ASSERT_TRUE(second.isOk()) << second.status().toString();

  // One change at a time, each awaited: Redis reports a key's new value by reading it when the
  // notification arrives (and its polling fallback scans), so changes in quick succession may be
  // coalesced there; each change on its own must be seen.
  std::vector<std::string> expected;
  auto change = [&](Status st, const std::string& event) {
    ASSERT_TRUE(st.isOk()) << st.toString();
    expected.push_back(event);
    EXPECT_TRUE(eventually([&] { return log.events().size() >= expected.size(); }, kEventLimit))
        << "waiting for " << event << ", saw:\n"
        << log.text();
  };
  change(store_->set(key("k1"), "v1"), "put " + key("k1") + "=v1");
  change(store_->set(key("k2"), "v2"), "put " + key("k2") + "=v2");
  ASSERT_OK(store_->set("/ferry-test/not-watched", "x"));
  change(store_->set(key("k1"), "v1'"), "put " + key("k1") + "=v1'");
  change(store_->erase(key("k1")), "delete " + key("k1"));
  change(store_->erase(key("before")), "delete " + key("before"));
  EXPECT_EQ(log.events(), expected) << "nothing before watch(), nothing outside the prefix, in order";

  // After unwatch, the other watch still sees a change, this one does not.
  store_->unwatch(*watch);
  ASSERT_OK(store_->set(key("k3"), "v3"));
  EXPECT_TRUE(eventually([&] { return sentinel.saw("put " + key("k3") + "=v3"); }, kEventLimit))
      << sentinel.text();
  EXPECT_EQ(log.events(), expected) << "an event after unwatch():\n" << log.text();
  store_->unwatch(*second);
  store_->unwatch(*second);  // unknown by now: nothing happens
}

TEST_P(StoreSuite, StoreDownIsUnavailableWithinTheTimeoutAndUsedAgainWhenBack) {
  if (!backend_->canGoDown())
    GTEST_SKIP() << GetParam() << ":// lives inside this process: it cannot go down";
  ASSERT_OK(store_->set(key("before"), "1"));
  EventLog log;
  auto watch = store_->watch(prefix_, log.callback());
  ASSERT_TRUE(watch.isOk()) << watch.status().toString();

  backend_->down();
  auto start = Clock::now();
  Status st = store_->set(key("during"), "2");
  auto took = Clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.toString();
  EXPECT_NE(st.message().find(store_->url()), std::string::npos)
      << "the URL is in the message: " << st.toString();
  EXPECT_LT(took, kCallTimeout + milliseconds(1000)) << "the deadline was not kept";
  EXPECT_EQ(store_->get(key("before")).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(store_->list(prefix_).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(store_->grantLease(seconds(5)).status().code(), StatusCode::kUnavailable);
  // A new handle (and a watch) on a store that is down: open() works, the calls say unavailable.
  auto fresh = Store::open(store_->url(), {.timeout = kCallTimeout});
  ASSERT_TRUE(fresh.isOk());
  EXPECT_EQ((*fresh)->watch(prefix_, [](const StoreEvent&) {}).status().code(), StatusCode::kUnavailable);

  Status back = backend_->restart();
  ASSERT_TRUE(back.isOk()) << back.toString();
  // The same handle works again without reopening.
  ASSERT_OK(store_->set(key("after"), "3"));
  EXPECT_EQ(store_->get(key("after")).value(), "3");
  // The existing watch was re-established and sees new changes.
  EXPECT_TRUE(eventually([&] { return log.saw("put " + key("after") + "=3"); }, milliseconds(10000)))
      << log.text();
  ASSERT_OK(store_->set(key("later"), "4"));
  EXPECT_TRUE(eventually([&] { return log.saw("put " + key("later") + "=4"); }, kEventLimit)) << log.text();
  store_->unwatch(*watch);
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreSuite,
                         ::testing::Values("memory", "ferry", "redis", "redis_polling", "etcd"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(StoreUrl, MalformedUrlsAreInvalidArguments) {
  for (const char* url :
       {"", "ferry", "nope://127.0.0.1:1", "ferry://127.0.0.1", "ferry://:4479", "ferry://127.0.0.1:0",
        "ferry://127.0.0.1:65536", "ferry://127.0.0.1:x", "ferry://127.0.0.1:1/x", "etcd://127.0.0.1:1/x",
        "redis://127.0.0.1:1/x", "redis://127.0.0.1:1/-1", "ferry://::1:4479", "ferry://[::1:4479",
        "memory://a/b", "ferry://h st:1"}) {
    auto store = Store::open(url);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << "'" << url << "'";
    if (!store.isOk() && std::string(url).size() > 0) {
      EXPECT_NE(store.status().message().find(url), std::string::npos) << store.status().toString();
    }
  }
  for (const char* url : {"memory://", "memory://x", "ferry://localhost:4479", "ferry://[::1]:4479",
                          "redis://127.0.0.1:6379", "redis://127.0.0.1:6379/3", "etcd://127.0.0.1:2379"}) {
    auto store = Store::open(url);
    ASSERT_TRUE(store.isOk()) << url << ": " << store.status().toString();
    EXPECT_EQ((*store)->url(), url);
  }
}

TEST(MemoryStore, HandlesOfOneNameShareOneStore) {
  auto a = Store::open("memory://shared-by-name").value();
  auto b = Store::open("memory://shared-by-name").value();
  auto other = Store::open("memory://another-name").value();
  ASSERT_OK(a->set("/k", "v"));
  EXPECT_EQ(b->get("/k").value(), "v");
  EXPECT_EQ(other->get("/k").status().code(), StatusCode::kNotFound);
}

// A raw TCP client of the ferry:// server, to say what no ferry client would.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { close(fd_); }
  bool connected() const { return connected_; }
  void send(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may drop us in the middle of a long line
      off += static_cast<size_t>(n);
    }
  }
  // Everything the server sends until it closes the connection (or limit passes: nullopt).
  std::optional<std::string> readUntilClosed(milliseconds limit) {
    std::string got;
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) != 1) continue;
      char buf[4096];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) return got;
      got.append(buf, static_cast<size_t>(n));
    }
    return std::nullopt;
  }
  // One line from the server.
  std::string readLine(milliseconds limit) {
    std::string got;
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline && got.find('\n') == std::string::npos) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) != 1) continue;
      char c;
      if (read(fd_, &c, 1) != 1) break;
      got.push_back(c);
    }
    return got;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

TEST(FerryStoreServer, HostileClientsAreDroppedWhileOthersKeepWorking) {
  StoreServer server;
  ASSERT_OK(server.start("127.0.0.1", 0));
  std::string url = "ferry://127.0.0.1:" + std::to_string(server.port());
  auto store = Store::open(url, {.timeout = kCallTimeout}).value();
  ASSERT_OK(store->set("/k", "v"));
  EventLog log;
  auto watch = store->watch("/", log.callback());
  ASSERT_TRUE(watch.isOk()) << watch.status().toString();

  // A well-formed request first, so the bad ones below are judged on their own.
  RawClient polite(server.port());
  ASSERT_TRUE(polite.connected());
  polite.send(R"({"ferry_store":1,"type":"get","id":7,"key":"/k"})"
              "\n");
  EXPECT_EQ(polite.readLine(milliseconds(2000)), R"({"ferry_store":1,"type":"value","id":7,"value":"dg=="})"
                                                 "\n");

  const std::vector<std::pair<std::string, std::string>> hostile = {
      {"garbage", "GET / HTTP/1.0\r\n\r\n"},
      {"not an object", "[1,2,3]\n"},
      {"no version", R"({"type":"get","id":1,"key":"/k"})"
                     "\n"},
      {"wrong version", R"({"ferry_store":2,"type":"get","id":1,"key":"/k"})"
                        "\n"},
      {"unknown type", R"({"ferry_store":1,"type":"flush","id":1})"
                       "\n"},
      {"extra member", R"({"ferry_store":1,"type":"get","id":1,"key":"/k","x":1})"
                       "\n"},
      {"id of another kind", R"({"ferry_store":1,"type":"get","id":"1","key":"/k"})"
                             "\n"},
      {"fractional lease", R"({"ferry_store":1,"type":"set","id":1,"key":"/k","value":"eA==","lease":1.5})"
                           "\n"},
      {"bad base64", R"({"ferry_store":1,"type":"set","id":1,"key":"/k","value":"e===","lease":0})"
                     "\n"},
      {"empty key", R"({"ferry_store":1,"type":"set","id":1,"key":"","value":"eA==","lease":0})"
                    "\n"},
      {"oversized line", std::string(kMaxStoreLine + 16, 'a')},
      {"requests on a watch connection", R"({"ferry_store":1,"type":"watch","id":1,"prefix":"/"})"
                                         "\n"
                                         R"({"ferry_store":1,"type":"erase","id":2,"key":"/k"})"
                                         "\n"},
  };
  for (const auto& [what, bytes] : hostile) {
    RawClient client(server.port());
    ASSERT_TRUE(client.connected()) << what;
    client.send(bytes);
    auto answer = client.readUntilClosed(milliseconds(3000));
    ASSERT_TRUE(answer.has_value()) << what << ": the server did not drop the connection";
    // (Dropped in the middle of a long line, the socket may be reset before the reason arrives.)
    if (what != "oversized line") {
      EXPECT_NE(answer->find(R"("type":"error")"), std::string::npos)
          << what << ": no reason given: " << *answer;
    }
    // Nothing changed, and everyone else is still served.
    auto got = store->get("/k");
    ASSERT_TRUE(got.isOk()) << what << ": " << got.status().toString();
    EXPECT_EQ(*got, "v") << what;
  }
  polite.send(R"({"ferry_store":1,"type":"get","id":8,"key":"/k"})"
              "\n");
  EXPECT_EQ(polite.readLine(milliseconds(2000)), R"({"ferry_store":1,"type":"value","id":8,"value":"dg=="})"
                                                 "\n")
      << "a connection opened before the hostile ones is still served";
  // The watch is still live, and saw nothing from the hostile clients.
  ASSERT_OK(store->set("/after", "x"));
  EXPECT_TRUE(eventually([&] { return log.saw("put /after=x"); }, kEventLimit)) << log.text();
  EXPECT_EQ(log.events(), std::vector<std::string>{"put /after=x"});
  store->unwatch(*watch);
}

TEST(FerryStoreServer, DecoderIsStrict) {
  auto ok =
      decodeStoreRequest(R"({"ferry_store":1,"type":"set","id":3,"key":"/a","value":"AAEC","lease":9})");
  ASSERT_TRUE(ok.isOk()) << ok.status().toString();
  EXPECT_EQ(ok->type, StoreRequest::Type::kSet);
  EXPECT_EQ(ok->value, std::string("\0\1\2", 3));
  EXPECT_EQ(ok->lease, 9);
  for (const char* bad : {R"({"ferry_store":1,"type":"set","id":3,"key":"/a","value":"AAEC"})",
                          R"({"ferry_store":1,"type":"set","id":0,"key":"/a","value":"AAEC","lease":0})",
                          R"({"ferry_store":1.0,"type":"get","id":3,"key":"/a"})",
                          R"({"ferry_store":1,"type":"grant","id":3,"ttl":0})",
                          R"({"ferry_store":1,"type":"get","id":3,"key":"/a","key":"/b"})",
                          R"({"ferry_store":1,"type":"get","id":3,"key":"/a"} x)"}) {
    EXPECT_EQ(decodeStoreRequest(bad).status().code(), StatusCode::kProtocolError) << bad;
  }
}

// `ferry store`: the CLI's server, as a user starts it.
std::string ferryProgram() { return std::string(FERRY_TEST_BIN_DIR) + "/../ferry"; }

struct Spawned {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
};

Spawned spawnFerry(const std::vector<std::string>& args) {
  int out[2];
  int err[2];
  Spawned s;
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return s;
  std::vector<std::string> words = {ferryProgram()};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  s.pid = fork();
  if (s.pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  s.out = out[0];
  s.err = err[0];
  return s;
}

// Reads fd until a newline (or end of file, or limit).
std::string readLineFrom(int fd, milliseconds limit) {
  std::string line;
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) != 1) continue;
    char c;
    if (read(fd, &c, 1) != 1) break;
    line.push_back(c);
    if (c == '\n') break;
  }
  return line;
}

std::string readAll(int fd) {
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  return text;
}

int waitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(FerryStoreCommand, ServesOnTheAnnouncedPortUntilSigterm) {
  if (access(ferryProgram().c_str(), X_OK) != 0) FAIL() << "no ferry program at " << ferryProgram();
  Spawned s = spawnFerry({"store", "--host", "127.0.0.1", "--port", "0"});
  ASSERT_GT(s.pid, 0);
  std::string line = readLineFrom(s.out, milliseconds(10000));
  std::smatch m;
  ASSERT_TRUE(std::regex_match(line, m, std::regex("ferry store: listening on 127\\.0\\.0\\.1:([0-9]+)\n")))
      << line;
  std::string url = "ferry://127.0.0.1:" + m[1].str();
  EXPECT_NE(m[1].str(), "0") << "the real port is printed";
  auto store = Store::open(url, {.timeout = kCallTimeout}).value();
  ASSERT_OK(store->set("/from-test", "hello"));
  EXPECT_EQ(store->get("/from-test").value(), "hello");
  kill(s.pid, SIGTERM);
  EXPECT_EQ(waitExit(s.pid), 0);
  close(s.out);
  close(s.err);
  EXPECT_EQ(store->get("/from-test").status().code(), StatusCode::kUnavailable);
}

TEST(FerryStoreCommand, BadOptionsExitTwoWithOneLine) {
  if (access(ferryProgram().c_str(), X_OK) != 0) FAIL() << "no ferry program at " << ferryProgram();
  for (const auto& args : std::vector<std::vector<std::string>>{{"store", "--port", "x"},
                                                                {"store", "--port", "70000"},
                                                                {"store", "--port"},
                                                                {"store", "--frobnicate"}}) {
    Spawned s = spawnFerry(args);
    ASSERT_GT(s.pid, 0);
    std::string out = readAll(s.out);
    std::string err = readAll(s.err);
    EXPECT_EQ(waitExit(s.pid), 2) << args.back();
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_EQ(err.rfind("ferry store: ", 0), 0u) << err;
    EXPECT_EQ(out, "");
    close(s.out);
    close(s.err);
  }
}

}  // namespace
}  // namespace ferry::agent
