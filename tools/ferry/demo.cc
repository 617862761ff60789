// `ferry demo`: the main job in one command. The initiator (this process) serves an embedded
// discovery store (ferry://, or uses --store URL) and starts a target process; each runs an agent
// that registers itself and its buffer there, so the initiator names the target and the wireup
// does the rest. Then the initiator moves the buffer with RDMA WRITE into the target's memory and
// back with RDMA READ; the target's stdin/stdout only carry "check"/"fill" commands. Both sides
// check every byte against a pattern neither could have had without the transfer.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/store/ferry_store_server.h"
#include "agent/wireup.h"
#include "cli_args.h"
#include "commands.h"
#include "ferry/agent/agent.h"
#include "ferry/agent/store.h"
#include "ferry/common/config.h"
#include "ferry/devices.h"

extern char** environ;

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A pattern that depends on the seed and each 8-byte word's position.
uint64_t patternWord(uint64_t seed, uint64_t index) {
  uint64_t z = seed + index * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fillPattern(uint8_t* buf, size_t len, uint64_t seed) {
  auto* words = reinterpret_cast<uint64_t*>(buf);
  for (size_t i = 0; i < len / 8; ++i) words[i] = patternWord(seed, i);
}

// Offset of the first byte that differs from the pattern, or -1.
int64_t checkPattern(const uint8_t* buf, size_t len, uint64_t seed) {
  const auto* words = reinterpret_cast<const uint64_t*>(buf);
  for (size_t i = 0; i < len / 8; ++i) {
    if (words[i] != patternWord(seed, i)) return static_cast<int64_t>(i * 8);
  }
  return -1;
}

bool demoFailed(const char* who, const Status& st) {
  std::fprintf(stderr, "ferry demo (%s): %s\n", who, st.toString().c_str());
  return false;
}

bool readLine(FILE* in, std::string* line) {
  char buf[4096];
  if (!std::fgets(buf, sizeof buf, in)) return false;
  *line = buf;
  while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
  return true;
}

// The IPv4 address of a device addressed by context, a software device ("" for other devices): the embedded
// store and the agents listen there, so a target in another network namespace reaches them.
std::string deviceAddress(const std::string& device) {
  auto devices = listDevices();
  if (!devices.isOk()) return "";
  for (const auto& d : *devices) {
    if (d.name == device && d.addressedByContext) return d.address;
  }
  return "";
}

// One side's agent and buffer: the agent registers itself and the buffer in the store, so the
// other side needs nothing but the store's URL and this side's alias.
struct Side {
  std::shared_ptr<agent::Agent> agent;
  std::unique_ptr<uint8_t[]> buf;
  size_t size = 0;
};

bool setUp(Side& s, const std::string& device, const std::string& store, const std::string& alias,
           size_t size, const char* who) {
  s.size = size;
  s.buf.reset(new (std::nothrow) uint8_t[size]);
  if (!s.buf) return demoFailed(who, resourceExhausted("cannot allocate the buffer"));
  std::memset(s.buf.get(), 0, size);
  auto a = agent::Agent::start({.alias = alias,
                                .store = store,
                                .devices = {device},
                                .listenHost = deviceAddress(device),
                                .connectTimeout = std::chrono::seconds(60)});
  if (!a.isOk()) return demoFailed(who, a.status());
  s.agent = *a;
  Status st = s.agent->registerMemoryRegion("buf", s.buf.get(), size);
  if (!st.isOk()) return demoFailed(who, st);
  return true;
}

// The initiator's arguments, checked before the target starts: the devices exist (the target's
// only when it runs here: through a launcher it may be on another host) and --store is a store URL.
Status checkArguments(const std::string& device, const std::string& targetDevice, bool targetHere,
                      const std::string& store) {
  auto devices = listDevices();
  if (!devices.isOk()) return devices.status();
  for (const std::string& name : {device, targetHere ? targetDevice : device}) {
    bool listed = false;
    for (const auto& d : *devices) listed = listed || d.name == name;
    if (!listed)
      return Status(StatusCode::kInvalidArgument, "no device named '" + name + "' (ferry info lists them)");
  }
  if (!store.empty()) {
    auto opened = agent::Store::open(store);
    if (!opened.isOk()) return Status(StatusCode::kInvalidArgument, "--store: " + opened.status().message());
  }
  return Status::ok();
}

// ---- target: serves the initiator's commands on stdin/stdout ----
int runTarget(const std::string& device, const std::string& store, const std::string& alias, size_t size) {
  Side s;
  if (!setUp(s, device, store, alias, size, "target")) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (readLine(stdin, &line)) {
    std::istringstream cmd(line);
    std::string verb;
    uint64_t seed = 0;
    cmd >> verb >> seed;
    if (verb == "check") {
      int64_t bad = checkPattern(s.buf.get(), s.size, seed);
      std::printf("%s %" PRId64 "\n", bad < 0 ? "ok" : "mismatch", bad);
    } else if (verb == "fill") {
      fillPattern(s.buf.get(), s.size, seed);
      std::printf("filled\n");
    } else if (verb == "quit") {
      std::printf("bye\n");
      std::fflush(stdout);
      return 0;
    } else {
      std::printf("unknown\n");
    }
    std::fflush(stdout);
  }
  return 0;
}

// Moves the whole buffer to or from the target's "buf". Returns seconds, or < 0.
double timeTransfer(agent::PeerConnection& conn, bool write, size_t size) {
  auto start = Clock::now();
  agent::NamedAssignment all{.local = std::string("buf"), .remote = std::string("buf"), .length = size};
  auto f = write ? conn.write(std::span(&all, 1)) : conn.read(std::span(&all, 1));
  if (!f.isOk()) return demoFailed("initiator", f.status()), -1;
  Status st = f->wait(std::chrono::seconds(120));
  if (!st.isOk()) return demoFailed("initiator", st), -1;
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int runDemo(const std::vector<std::string>& args, const std::string& self) {
  std::string device = "soft_lo";
  std::string targetDevice;
  std::string via;
  std::string store;
  std::string alias;
  size_t size = size_t{1} << 30;
  bool target = false;
  std::string sizeOption = "1G";
  CLI::App app(
      "Two processes find each other through a discovery store and move data by RDMA WRITE and READ; "
      "both check every byte, and the initiator prints the throughput.",
      "ferry demo");
  app.add_option("--device", device, "this side's device")->option_text("NAME")->capture_default_str();
  app.add_option("--target-device", targetDevice, "the target's device (default: --device)")
      ->option_text("NAME");
  app.add_option("--target-via", via, "start the target through this launcher, e.g. 'ip netns exec NS'")
      ->option_text("'LAUNCHER ...'");
  app.add_option("--size", sizeOption, "bytes to move, a multiple of 8 (4096, 64M, 1G)")
      ->option_text("BYTES")
      ->capture_default_str();
  app.add_option("--store", store, "the discovery store (default: one served from this process)")
      ->option_text("URL");
  // The target's side: the demo starts itself with these; not for users.
  app.add_option("--alias", alias)->group("");
  app.add_flag("--target", target)->group("");
  const CommandHelp help{.usage = {},
                         .commands = {},
                         .done = "the data arrived and came back intact",
                         .failed = "the target did not start, a transfer failed, or a byte differs"};
  if (auto code = parseCommand(app, help, args)) return *code;
  Result<uint64_t> bytes = config::parseByteSize(sizeOption);
  if (!bytes.isOk() || *bytes < 8 || *bytes % 8 != 0 || *bytes > (uint64_t{64} << 30)) {
    return usageError("ferry demo", "--size '" + sizeOption +
                                        "': takes a byte count, a multiple of 8, up to 64G (e.g. 64M)");
  }
  size = static_cast<size_t>(*bytes);
  if (target) {
    if (store.empty() || alias.empty())
      return usageError("ferry demo --target", "needs --store URL and --alias NAME");
    return runTarget(device, store, alias, size);
  }
  if (targetDevice.empty()) targetDevice = device;
  if (Status st = checkArguments(device, targetDevice, via.empty(), store); !st.isOk()) {
    if (st.code() == StatusCode::kInvalidArgument) return usageError("ferry demo", st.message());
    return demoFailed("initiator", st), 1;
  }

  // The two agents share a secret: this run's own unless FERRY_AGENT_SECRET gives one. The target
  // inherits it, and with it the two may be on different hosts (an agent without a secret serves
  // its own host only: docs/security.md).
  if (config::agentSecret().empty()) {
    std::string secret = agent::newNonce();
    ::setenv("FERRY_AGENT_SECRET", secret.c_str(), 1);
  }
  // The two processes find each other through a store: an embedded one (ferry's own, served from
  // this process) unless --store names one.
  agent::StoreServer embedded;
  if (store.empty()) {
    std::string host = deviceAddress(device);
    if (host.empty()) host = "127.0.0.1";
    // A target started through a launcher may be another host (a network namespace): the store
    // serves it too.
    Status st = embedded.start(host, 0, {.allowRemote = !via.empty()});
    if (!st.isOk()) return demoFailed("initiator", st), 1;
    store = "ferry://" + host + ":" + std::to_string(embedded.port());
  }
  const std::string targetAlias = "demo-target-" + std::to_string(getpid());

  // Start the target with pipes on its stdin and stdout.
  int toTarget[2], fromTarget[2];
  if (pipe2(toTarget, O_CLOEXEC) != 0 || pipe2(fromTarget, O_CLOEXEC) != 0) {
    std::perror("ferry demo: pipe");
    return 1;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, toTarget[0], 0);
  posix_spawn_file_actions_adddup2(&actions, fromTarget[1], 1);
  std::string sizeText = std::to_string(size);
  // The target may start through a launcher (e.g. "ip netns exec NS"): its words come first.
  std::vector<std::string> argvText;
  std::istringstream viaWords(via);
  for (std::string word; viaWords >> word;) argvText.push_back(word);
  std::string program = argvText.empty() ? self : argvText.front();
  for (std::string word : {self, std::string("demo"), std::string("--target"), std::string("--device"),
                           targetDevice, std::string("--size"), sizeText, std::string("--store"), store,
                           std::string("--alias"), targetAlias}) {
    argvText.push_back(word);
  }
  std::vector<char*> argv;
  for (auto& a : argvText) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
    std::perror("ferry demo: cannot start the target process");
    return 1;
  }
  posix_spawn_file_actions_destroy(&actions);
  close(toTarget[0]);
  close(fromTarget[1]);
  FILE* out = fdopen(toTarget[1], "w");
  FILE* in = fdopen(fromTarget[0], "r");
  auto finish = [&](int code) {
    std::fprintf(out, "quit\n");
    std::fflush(out);
    std::fclose(out);
    std::string line;
    while (readLine(in, &line)) {
    }
    std::fclose(in);
    int status = 0;
    waitpid(pid, &status, 0);
    return code;
  };

  std::printf("ferry demo: %s -> %s, two processes (initiator %d, target %d), %.2f GiB\n", device.c_str(),
              targetDevice.c_str(), static_cast<int>(getpid()), static_cast<int>(pid),
              static_cast<double>(size) / (1u << 30));
  Side s;
  if (!setUp(s, device, store, "demo-initiator-" + std::to_string(getpid()), size, "initiator"))
    return finish(1);
  std::string line;
  if (!readLine(in, &line) || line != "ready") {
    std::fprintf(stderr, "ferry demo: the target process did not start\n");
    return finish(1);
  }
  auto conn = s.agent->connect(targetAlias);
  if (!conn.isOk()) return demoFailed("initiator", conn.status()), finish(1);
  Status st = (*conn)->waitReady(std::chrono::seconds(60));
  if (!st.isOk()) return demoFailed("initiator", st), finish(1);
  auto lanes = (*conn)->lanes();
  std::printf("  found '%s' through %s; lane for READ/WRITE: %s (%s)\n", targetAlias.c_str(), store.c_str(),
              lanes.isOk() ? lanes->of(agent::OpClass::kRma).label().c_str() : "?",
              lanes.isOk() ? lanes->of(agent::OpClass::kRma).why.c_str() : "");

  const uint64_t writeSeed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  const uint64_t readSeed = writeSeed ^ 0x5a5a5a5a5a5a5a5aull;
  fillPattern(s.buf.get(), size, writeSeed);
  double writeSeconds = timeTransfer(**conn, true, size);
  if (writeSeconds < 0) return finish(1);
  std::fprintf(out, "check %" PRIu64 "\n", writeSeed);
  std::fflush(out);
  if (!readLine(in, &line) || line.rfind("ok", 0) != 0) {
    std::fprintf(stderr, "ferry demo: WRITE verification failed at the target: %s\n", line.c_str());
    return finish(1);
  }
  std::printf("  RDMA WRITE %.2f GiB in %.3f s: %.2f GB/s, verified by the target byte for byte\n",
              static_cast<double>(size) / (1u << 30), writeSeconds,
              static_cast<double>(size) / writeSeconds / 1e9);

  std::fprintf(out, "fill %" PRIu64 "\n", readSeed);
  std::fflush(out);
  if (!readLine(in, &line) || line != "filled") {
    std::fprintf(stderr, "ferry demo: the target could not fill its buffer\n");
    return finish(1);
  }
  std::memset(s.buf.get(), 0, size);
  double readSeconds = timeTransfer(**conn, false, size);
  if (readSeconds < 0) return finish(1);
  int64_t bad = checkPattern(s.buf.get(), size, readSeed);
  if (bad >= 0) {
    std::fprintf(stderr, "ferry demo: READ data differs at offset %" PRId64 "\n", bad);
    return finish(1);
  }
  std::printf("  RDMA READ  %.2f GiB in %.3f s: %.2f GB/s, verified byte for byte\n",
              static_cast<double>(size) / (1u << 30), readSeconds,
              static_cast<double>(size) / readSeconds / 1e9);
  int code = finish(0);
  std::printf("ferry demo: done\n");
  return code;
}

}  // namespace ferry::cli
