// ferry_agent_bench: what the agent layer (include/ferry/agent/agent.h) costs, on soft_lo between
// processes of this host. Nothing here asserts a time; docs/performance.md ("Agent") has figures.
//
//   ferry_agent_bench --mode first-write [--iters 20]
//       connect() to the first completed WRITE, the peer in another process found through a
//       ferry:// store this process embeds; a fresh connecting agent per iteration. Each iteration
//       also measures the same split in two: connect() to waitReady(), then the WRITE after it.
//   ferry_agent_bench --mode overhead [--iters 20000] [--rounds 10] [--batch 64]
//       once wired, WRITE-and-wait through the agent (regions by name and by handle) against the
//       same through conn->endpoint() (the Endpoint API on the same queue pairs), interleaved in
//       rounds so drift hits every variant; batch 1 and --batch assignments per call.
//   ferry_agent_bench --mode scale [--endpoints 1000] [--procs 4] [--idle-seconds 10]
//       --procs processes host --endpoints agents between them; one connecting process connects to
//       every alias with a WRITE queued on each, and reports the time until all are ready and done,
//       resident memory before and after (per endpoint on each side), and the CPU every process
//       spends once everything is idle.
//   Common: [--size 8] (bytes per assignment; K/M/G suffixes) [--timeout 60] (seconds, every wait)
//   [--heartbeat S] (every agent's AgentOptions::heartbeat; absent: the agent's default)
//   [--json FILE] (the figures as one JSON document besides the table on stdout).
//
// Processes: this program runs itself (/proc/self/exe) in the roles --serve (hosts agents
// <prefix>-0 .. <prefix>-<count-1>, each with a region "buf") and --connector (scale's connecting
// agent). A child talks to this process by lines on its stdin and stdout: it prints "started" (or
// "error <why>"), the connector "done k=v ..." after "go"; closing its stdin tells it to shut
// down. Every child is killed (SIGKILL, by pid) if it has not exited 10 s after that.
//
// Exit codes: 0 done; 1 a failure (printed; scale still prints its report first); 2 bad options.
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/store/ferry_store_server.h"
#include "common/json.h"
#include "ferry/agent/agent.h"
#include "ferry/common/config.h"

namespace {

using ferry::Result;
using ferry::Status;
using ferry::StatusCode;
using ferry::agent::Agent;
using ferry::agent::AgentOptions;
using ferry::agent::NamedAssignment;
using ferry::agent::PeerConnection;
namespace ep = ferry::endpoint;
namespace json = ferry::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* kProgram = "ferry_agent_bench";
constexpr const char* kDevice = "soft_lo";
constexpr int kBadOptions = 2;

enum class Mode : uint8_t { kFirstWrite, kOverhead, kScale };
enum class Role : uint8_t { kMain, kServe, kConnector };

struct Options {
  Mode mode = Mode::kFirstWrite;
  Role role = Role::kMain;
  uint64_t iters = 0;  // 0: the mode's default
  uint64_t rounds = 10;
  uint64_t batch = 64;
  uint64_t size = 8;
  uint64_t endpoints = 1000;
  uint64_t procs = 4;
  double idleSeconds = 10;
  double timeoutSeconds = 60;
  double heartbeatSeconds = 0;  // 0: the agent's default (AgentOptions::heartbeat)
  std::string jsonPath;
  // Child roles.
  std::string store;
  std::string prefix;
  uint64_t count = 1;
};

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double microsSince(Clock::time_point t0) { return secondsSince(t0) * 1e6; }
milliseconds timeoutOf(const Options& o) {
  return milliseconds(static_cast<int64_t>(o.timeoutSeconds * 1000));
}

// ---------------------------------------------------------------- options

// A count or size in ferry's one size syntax ("8", "4K", "16M", "1G"; config::parseByteSize), at
// most 2^40; false for anything else or for 0.
bool parseCount(const char* text, uint64_t* out) {
  if (text == nullptr) return false;
  ferry::Result<uint64_t> v = ferry::config::parseByteSize(text);
  if (!v.isOk() || *v > (uint64_t{1} << 40)) return false;
  *out = *v;
  return true;
}

bool parseSeconds(const char* text, double* out) {
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(v > 0) || v > 86400) return false;
  *out = v;
  return true;
}

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: %s --mode first-write|overhead|scale [--iters N] [--rounds N] [--batch N]\n"
      "       [--size N] [--endpoints N] [--procs N] [--idle-seconds S] [--timeout S] [--heartbeat S]\n"
      "       [--json FILE]\n",
      kProgram);
}

[[noreturn]] void badOption(const std::string& why) {
  std::fprintf(stderr, "%s: %s (see --help)\n", kProgram, why.c_str());
  std::exit(kBadOptions);
}

bool parseMode(const std::string& text, Mode* mode) {
  if (text == "first-write")
    *mode = Mode::kFirstWrite;
  else if (text == "overhead")
    *mode = Mode::kOverhead;
  else if (text == "scale")
    *mode = Mode::kScale;
  else
    return false;
  return true;
}

enum OptionId : int {
  kOptMode = 256,
  kOptIters,
  kOptRounds,
  kOptBatch,
  kOptSize,
  kOptEndpoints,
  kOptProcs,
  kOptIdle,
  kOptTimeout,
  kOptHeartbeat,
  kOptJson,
  kOptHelp,
  kOptServe,
  kOptConnector,
  kOptStore,
  kOptPrefix,
  kOptCount,
};

// Applies one parsed option; false when its value is bad.
bool applyOption(Options& o, int id, const char* arg) {
  switch (id) {
    case kOptMode: return parseMode(arg, &o.mode);
    case kOptIters: return parseCount(arg, &o.iters);
    case kOptRounds: return parseCount(arg, &o.rounds);
    case kOptBatch: return parseCount(arg, &o.batch) && o.batch <= 65536;
    case kOptSize: return parseCount(arg, &o.size) && o.size <= (uint64_t{1} << 30);
    case kOptEndpoints: return parseCount(arg, &o.endpoints) && o.endpoints <= 100000;
    case kOptProcs: return parseCount(arg, &o.procs) && o.procs <= 256;
    case kOptIdle: return parseSeconds(arg, &o.idleSeconds);
    case kOptTimeout: return parseSeconds(arg, &o.timeoutSeconds);
    case kOptHeartbeat: return parseSeconds(arg, &o.heartbeatSeconds);
    case kOptJson: o.jsonPath = arg; return !o.jsonPath.empty();
    case kOptServe: o.role = Role::kServe; return true;
    case kOptConnector: o.role = Role::kConnector; return true;
    case kOptStore: o.store = arg; return true;
    case kOptPrefix: o.prefix = arg; return !o.prefix.empty();
    case kOptCount: return parseCount(arg, &o.count);
    default: return false;
  }
}

Options parseOptions(int argc, char** argv) {
  static const option kLong[] = {{"mode", required_argument, nullptr, kOptMode},
                                 {"iters", required_argument, nullptr, kOptIters},
                                 {"rounds", required_argument, nullptr, kOptRounds},
                                 {"batch", required_argument, nullptr, kOptBatch},
                                 {"size", required_argument, nullptr, kOptSize},
                                 {"endpoints", required_argument, nullptr, kOptEndpoints},
                                 {"procs", required_argument, nullptr, kOptProcs},
                                 {"idle-seconds", required_argument, nullptr, kOptIdle},
                                 {"timeout", required_argument, nullptr, kOptTimeout},
                                 {"json", required_argument, nullptr, kOptJson},
                                 {"heartbeat", required_argument, nullptr, kOptHeartbeat},
                                 {"help", no_argument, nullptr, kOptHelp},
                                 {"serve", no_argument, nullptr, kOptServe},
                                 {"connector", no_argument, nullptr, kOptConnector},
                                 {"store", required_argument, nullptr, kOptStore},
                                 {"prefix", required_argument, nullptr, kOptPrefix},
                                 {"count", required_argument, nullptr, kOptCount},
                                 {nullptr, 0, nullptr, 0}};
  Options o;
  opterr = 0;
  int id;
  while ((id = getopt_long(argc, argv, ":", kLong, nullptr)) != -1) {
    if (id == kOptHelp) {
      usage(stdout);
      std::exit(0);
    }
    if (id == '?') badOption(std::string("unknown option '") + argv[optind - 1] + "'");
    if (id == ':') badOption(std::string("option '") + argv[optind - 1] + "' needs a value");
    if (!applyOption(o, id, optarg))
      badOption(std::string("bad value '") + optarg + "' for " + argv[optind - 2]);
  }
  if (optind < argc) badOption(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.role != Role::kMain && (o.store.empty() || o.prefix.empty()))
    badOption("a child role needs --store and --prefix");
  if (o.mode == Mode::kScale && o.procs > o.endpoints) badOption("--procs is larger than --endpoints");
  if (o.iters == 0) o.iters = o.mode == Mode::kOverhead ? 20000 : 20;
  if (o.size * o.batch > (uint64_t{1} << 30)) badOption("--size x --batch is over 1 GiB");
  return o;
}

// ---------------------------------------------------------------- statistics and /proc

struct Summary {
  double min = 0, median = 0, p99 = 0, avg = 0, max = 0;
};

Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size() + 0.999999) - 1)];
  };
  s.min = v.front();
  s.max = v.back();
  s.median = rank(0.5);
  s.p99 = rank(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  s.avg = sum / v.size();
  return s;
}

json::Value summaryJson(const Summary& s) {
  json::Value o = json::Value::emptyObject();
  o.set("min", s.min);
  o.set("median", s.median);
  o.set("p99", s.p99);
  o.set("avg", s.avg);
  o.set("max", s.max);
  return o;
}

// One process as /proc shows it.
struct ProcSample {
  int64_t rssKb = -1;
  int64_t threads = -1;
  int64_t fds = -1;
  double cpuSeconds = -1;  // utime + stime, every thread
};

ProcSample sampleProc(pid_t pid) {
  ProcSample s;
  std::string dir = "/proc/" + std::to_string(pid);
  std::ifstream status(dir + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) s.rssKb = std::atoll(line.c_str() + 6);
    if (line.rfind("Threads:", 0) == 0) s.threads = std::atoll(line.c_str() + 8);
  }
  std::ifstream statFile(dir + "/stat");
  std::string stat((std::istreambuf_iterator<char>(statFile)), std::istreambuf_iterator<char>());
  size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    // Fields after the command: state is field 3, utime 14, stime 15.
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
      if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
    }
    s.cpuSeconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  if (DIR* d = opendir((dir + "/fd").c_str())) {
    s.fds = 0;
    while (dirent* e = readdir(d)) s.fds += e->d_name[0] != '.';
    closedir(d);
  }
  return s;
}

// ---------------------------------------------------------------- child processes

// A child of this program in another role, with its stdin and stdout as pipes.
struct Child {
  std::string name;
  pid_t pid = -1;
  int in = -1;   // its stdin
  int out = -1;  // its stdout
  std::string pending;
};

// Kills (by pid) every child still running when it goes out of scope, after closing their stdin
// (their signal to shut down) and waiting up to 10 s.
class ChildSet {
 public:
  ChildSet() = default;
  ChildSet(const ChildSet&) = delete;
  ChildSet& operator=(const ChildSet&) = delete;
  ~ChildSet() { stopAll(); }

  Result<Child*> spawn(std::string name, const std::vector<std::string>& args);
  void stopAll();
  std::vector<std::unique_ptr<Child>>& children() { return children_; }

 private:
  std::vector<std::unique_ptr<Child>> children_;
};

Result<Child*> ChildSet::spawn(std::string name, const std::vector<std::string>& args) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return Status(StatusCode::kIoError, "readlink /proc/self/exe: " + std::string(strerror(errno)));
  self[n] = '\0';
  int toChild[2], fromChild[2];
  if (pipe2(toChild, O_CLOEXEC) != 0)
    return Status(StatusCode::kIoError, "pipe: " + std::string(strerror(errno)));
  if (pipe2(fromChild, O_CLOEXEC) != 0) {
    ::close(toChild[0]);
    ::close(toChild[1]);
    return Status(StatusCode::kIoError, "pipe: " + std::string(strerror(errno)));
  }
  std::vector<char*> argv{self};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(toChild[0], STDIN_FILENO);
    dup2(fromChild[1], STDOUT_FILENO);
    execv(self, argv.data());
    _exit(127);
  }
  ::close(toChild[0]);
  ::close(fromChild[1]);
  if (pid < 0) {
    ::close(toChild[1]);
    ::close(fromChild[0]);
    return Status(StatusCode::kIoError, "fork: " + std::string(strerror(errno)));
  }
  auto c = std::make_unique<Child>(
      Child{.name = std::move(name), .pid = pid, .in = toChild[1], .out = fromChild[0], .pending = {}});
  children_.push_back(std::move(c));
  return children_.back().get();
}

void ChildSet::stopAll() {
  for (auto& c : children_) {
    if (c->in >= 0) ::close(c->in);
    c->in = -1;
  }
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (auto& c : children_) {
    while (c->pid > 0) {
      int status = 0;
      pid_t r = waitpid(c->pid, &status, WNOHANG);
      if (r == c->pid || (r < 0 && errno != EINTR)) {
        c->pid = -1;
      } else if (Clock::now() >= deadline) {
        std::fprintf(stderr, "%s: %s (pid %d) did not exit; killing it\n", kProgram, c->name.c_str(), c->pid);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, &status, 0);
        c->pid = -1;
      } else {
        std::this_thread::sleep_for(milliseconds(20));
      }
    }
    if (c->out >= 0) ::close(c->out);
    c->out = -1;
  }
  children_.clear();
}

Status sendLine(Child& c, const std::string& line) {
  std::string text = line + "\n";
  if (::write(c.in, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Status(StatusCode::kIoError, c.name + ": writing to its stdin: " + strerror(errno));
  }
  return Status::ok();
}

// The child's next line; kTimedOut at the deadline, kIoError when it exited; its "error <why>"
// line becomes a failure naming it.
Result<std::string> readLine(Child& c, Clock::time_point deadline) {
  for (;;) {
    size_t nl = c.pending.find('\n');
    if (nl != std::string::npos) {
      std::string line = c.pending.substr(0, nl);
      c.pending.erase(0, nl + 1);
      if (line.rfind("error ", 0) == 0) return Status(StatusCode::kInternal, c.name + ": " + line.substr(6));
      return line;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      return Status(StatusCode::kTimedOut,
                    c.name + " (pid " + std::to_string(c.pid) + ") said nothing in time");
    pollfd p{.fd = c.out, .events = POLLIN, .revents = 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(c.out, buf, sizeof buf);
    if (n <= 0) return Status(StatusCode::kIoError, c.name + " (pid " + std::to_string(c.pid) + ") exited");
    c.pending.append(buf, static_cast<size_t>(n));
  }
}

// "done a=1 b=x" -> {"": "done", "a": "1", "b": "x"}; the value of "error_text" runs to the end.
std::map<std::string, std::string> parseFields(const std::string& line) {
  std::map<std::string, std::string> f;
  std::istringstream in(line);
  in >> f[""];
  for (std::string tok; in >> tok;) {
    size_t eq = tok.find('=');
    if (eq == std::string::npos) continue;
    std::string key = tok.substr(0, eq);
    if (key == "error_text") {
      std::string rest;
      std::getline(in, rest);
      f[key] = tok.substr(eq + 1) + rest;
      break;
    }
    f[key] = tok.substr(eq + 1);
  }
  return f;
}

// ---------------------------------------------------------------- agents

AgentOptions agentOptions(const Options& o, std::string alias, std::string store) {
  AgentOptions a;
  a.alias = std::move(alias);
  a.store = std::move(store);
  a.devices = {kDevice};
  a.listenHost = "127.0.0.1";
  a.connectTimeout = timeoutOf(o);
  if (o.heartbeatSeconds > 0) a.heartbeat = milliseconds(static_cast<int64_t>(o.heartbeatSeconds * 1000));
  return a;
}

struct BenchAgent {
  std::shared_ptr<Agent> agent;
  std::vector<uint8_t> buffer;
};

Result<BenchAgent> startAgent(const Options& o, std::string alias, const std::string& store) {
  BenchAgent a;
  FERRY_ASSIGN_OR_RETURN(a.agent, Agent::start(agentOptions(o, std::move(alias), store)));
  a.buffer.assign(std::max<uint64_t>(o.size * o.batch, 8), 0);
  FERRY_RETURN_IF_ERROR(a.agent->registerMemoryRegion("buf", a.buffer.data(), a.buffer.size()));
  return a;
}

// The alias of agent i of serving process p.
std::string servingAlias(uint64_t p, uint64_t i) { return "s" + std::to_string(p) + "-" + std::to_string(i); }
uint64_t servingCount(const Options& o, uint64_t p) {
  return o.endpoints / o.procs + (p < o.endpoints % o.procs ? 1 : 0);
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Blocks until this process's stdin says `word` (true) or closes (false).
bool awaitWord(const char* word) {
  char line[256];
  while (std::fgets(line, sizeof line, stdin)) {
    if (std::strncmp(line, word, std::strlen(word)) == 0) return true;
  }
  return false;
}

// --serve: agents <prefix>-0 .. <prefix>-<count-1> until stdin closes.
int runServe(const Options& o) {
  std::vector<BenchAgent> agents;
  agents.reserve(o.count);
  for (uint64_t i = 0; i < o.count; ++i) {
    auto a = startAgent(o, o.prefix + "-" + std::to_string(i), o.store);
    if (!a.isOk()) {
      say("error starting agent " + std::to_string(i) + " of " + std::to_string(o.count) + ": " +
          a.status().toString());
      return 1;
    }
    agents.push_back(std::move(*a));
  }
  say("started agents=" + std::to_string(agents.size()));
  awaitWord("quit");
  for (auto& a : agents) a.agent->shutdown();
  return 0;
}

struct ScaleOutcome {
  double connectSeconds = 0, readySeconds = 0, writesSeconds = 0;
  uint64_t readyOk = 0, writesOk = 0, failed = 0;  // failed: connect(), write() or waitReady()
  uint64_t writesFailed = 0;                       // queued WRITEs whose future failed
  std::string firstError;
};

// Connects to every serving alias with a WRITE queued on each, then waits for all.
ScaleOutcome connectAll(const Options& o, BenchAgent& self,
                        std::vector<std::shared_ptr<PeerConnection>>& conns) {
  ScaleOutcome out;
  auto noteError = [&](const Status& st) {
    ++out.failed;
    if (out.firstError.empty()) out.firstError = st.toString();
  };
  std::vector<ep::ReadWriteFuture> writes;
  NamedAssignment w{.local = "buf", .remote = "buf", .length = o.size};
  auto t0 = Clock::now();
  for (uint64_t p = 0; p < o.procs; ++p) {
    for (uint64_t i = 0; i < servingCount(o, p); ++i) {
      auto c = self.agent->connect(servingAlias(p, i));
      if (!c.isOk()) {
        noteError(c.status());
        continue;
      }
      auto f = (*c)->write(std::span(&w, 1));
      if (f.isOk())
        writes.push_back(*f);
      else
        noteError(f.status());
      conns.push_back(*c);
    }
  }
  out.connectSeconds = secondsSince(t0);
  auto deadline = t0 + timeoutOf(o);
  auto left = [&] {
    return std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  for (auto& c : conns) {
    Status st = c->waitReady(left());
    if (st.isOk())
      ++out.readyOk;
    else
      noteError(st);
  }
  out.readySeconds = secondsSince(t0);
  for (auto& f : writes) {
    Status st = f.wait(left());
    if (st.isOk()) {
      ++out.writesOk;
    } else {
      ++out.writesFailed;
      if (out.firstError.empty()) out.firstError = st.toString();
    }
  }
  out.writesSeconds = secondsSince(t0);
  return out;
}

// --connector: one agent; on "go" connects to every serving alias, says "done ...", and holds the
// connections until stdin closes.
int runConnector(const Options& o) {
  auto self = startAgent(o, o.prefix, o.store);
  if (!self.isOk()) {
    say("error starting the connecting agent: " + self.status().toString());
    return 1;
  }
  say("started agents=1");
  if (!awaitWord("go")) return 0;
  std::vector<std::shared_ptr<PeerConnection>> conns;
  ScaleOutcome r = connectAll(o, *self, conns);
  char line[256];
  std::snprintf(line, sizeof line,
                "done connect_s=%.6f ready_s=%.6f writes_s=%.6f ready_ok=%llu writes_ok=%llu failed=%llu "
                "writes_failed=%llu",
                r.connectSeconds, r.readySeconds, r.writesSeconds, static_cast<unsigned long long>(r.readyOk),
                static_cast<unsigned long long>(r.writesOk), static_cast<unsigned long long>(r.failed),
                static_cast<unsigned long long>(r.writesFailed));
  std::string text = line;
  if (!r.firstError.empty()) text += " error_text=" + r.firstError;
  std::replace(text.begin(), text.end(), '\n', ' ');
  say(text);
  awaitWord("quit");
  self->agent->shutdown();
  return 0;
}

// ---------------------------------------------------------------- the main process's setup

// A ferry:// store on loopback, embedded in this process.
struct Harness {
  ferry::agent::StoreServer store;
  std::string storeUrl;
  ChildSet children;
};

Status startStore(Harness& h) {
  FERRY_RETURN_IF_ERROR(h.store.start("127.0.0.1", 0));
  h.storeUrl = "ferry://127.0.0.1:" + std::to_string(h.store.port());
  return Status::ok();
}

std::vector<std::string> childArgs(const Options& o, const char* role, const std::string& store,
                                   const std::string& prefix, uint64_t count) {
  char timeout[32];
  std::snprintf(timeout, sizeof timeout, "%g", o.timeoutSeconds);
  std::vector<std::string> args{role,
                                "--store",
                                store,
                                "--prefix",
                                prefix,
                                "--count",
                                std::to_string(count),
                                "--size",
                                std::to_string(o.size),
                                "--batch",
                                std::to_string(o.batch),
                                "--timeout",
                                timeout,
                                "--endpoints",
                                std::to_string(o.endpoints),
                                "--procs",
                                std::to_string(o.procs)};
  if (o.heartbeatSeconds > 0) {
    char heartbeat[32];
    std::snprintf(heartbeat, sizeof heartbeat, "%g", o.heartbeatSeconds);
    args.insert(args.end(), {"--heartbeat", heartbeat});
  }
  return args;
}

Result<Child*> spawnAndAwaitStart(Harness& h, const Options& o, std::string name, const char* role,
                                  const std::string& prefix, uint64_t count) {
  FERRY_ASSIGN_OR_RETURN(Child * c,
                         h.children.spawn(std::move(name), childArgs(o, role, h.storeUrl, prefix, count)));
  FERRY_ASSIGN_OR_RETURN(std::string line, readLine(*c, Clock::now() + timeoutOf(o)));
  if (line.rfind("started", 0) != 0)
    return Status(StatusCode::kProtocolError, c->name + " said '" + line + "'");
  return c;
}

json::Value documentHead(const char* mode, const Options& o) {
  json::Value doc = json::Value::emptyObject();
  doc.set("ferry_agent_bench", 1);
  doc.set("mode", mode);
  doc.set("device", kDevice);
  doc.set("size", static_cast<int64_t>(o.size));
  // null: the agent's default heartbeat.
  doc.set("heartbeat_seconds", o.heartbeatSeconds > 0 ? json::Value(o.heartbeatSeconds) : json::Value());
  const char* sameHost = std::getenv("FERRY_SOFT_SAME_HOST");
  doc.set("ferry_soft_same_host", sameHost ? json::Value(sameHost) : json::Value());
  // Other work on the machine moves every figure: the 1-minute load average when the run began.
  double load[1] = {-1};
  doc.set("load_average_1min", getloadavg(load, 1) == 1 ? json::Value(load[0]) : json::Value());
  return doc;
}

Status writeJson(const Options& o, const json::Value& doc) {
  if (o.jsonPath.empty()) return Status::ok();
  std::ofstream out(o.jsonPath);
  out << json::serialize(doc) << "\n";
  out.close();
  if (!out) return Status(StatusCode::kIoError, "writing " + o.jsonPath);
  return Status::ok();
}

// ---------------------------------------------------------------- first-write

struct FirstWriteSamples {
  std::vector<double> start, total, ready, writeAfter;  // microseconds
};

// One iteration: a fresh agent connects and writes at once; another connects, waits for ready,
// then writes.
Status firstWriteIteration(const Options& o, const Harness& h, uint64_t i, FirstWriteSamples& s) {
  NamedAssignment w{.local = "buf", .remote = "buf", .length = o.size};
  for (int split = 0; split < 2; ++split) {
    auto t0 = Clock::now();
    FERRY_ASSIGN_OR_RETURN(
        BenchAgent a, startAgent(o, "fw-" + std::to_string(i) + "-" + std::to_string(split), h.storeUrl));
    s.start.push_back(microsSince(t0));
    auto t1 = Clock::now();
    FERRY_ASSIGN_OR_RETURN(auto conn, a.agent->connect("peer-0"));
    if (split == 1) {
      FERRY_RETURN_IF_ERROR(conn->waitReady(timeoutOf(o)));
      s.ready.push_back(microsSince(t1));
    }
    auto t2 = Clock::now();
    FERRY_ASSIGN_OR_RETURN(auto f, conn->write(std::span(&w, 1)));
    FERRY_RETURN_IF_ERROR(f.wait(timeoutOf(o)));
    if (split == 1)
      s.writeAfter.push_back(microsSince(t2));
    else
      s.total.push_back(microsSince(t1));
    a.agent->shutdown();
  }
  return Status::ok();
}

int runFirstWrite(const Options& o) {
  Harness h;
  Status st = startStore(h);
  if (!st.isOk()) return std::fprintf(stderr, "%s: store: %s\n", kProgram, st.toString().c_str()), 1;
  if (auto c = spawnAndAwaitStart(h, o, "peer", "--serve", "peer", 1); !c.isOk()) {
    return std::fprintf(stderr, "%s: %s\n", kProgram, c.status().toString().c_str()), 1;
  }
  FirstWriteSamples s;
  for (uint64_t i = 0; i < o.iters; ++i) {
    st = firstWriteIteration(o, h, i, s);
    if (!st.isOk())
      return std::fprintf(stderr, "%s: iteration %llu: %s\n", kProgram, (unsigned long long)i,
                          st.toString().c_str()),
             1;
  }
  struct Row {
    const char* name;
    const std::vector<double>* samples;
  };
  const Row rows[] = {{"connect_to_first_write", &s.total},
                      {"connect_to_ready", &s.ready},
                      {"write_after_ready", &s.writeAfter},
                      {"agent_start", &s.start}};
  std::printf("first-write: %llu iterations, %llu B WRITE, peer in another process, store %s\n",
              (unsigned long long)o.iters, (unsigned long long)o.size, h.storeUrl.c_str());
  std::printf("%-24s %10s %10s %10s %10s %10s\n", "measure", "min[us]", "median[us]", "p99[us]", "avg[us]",
              "max[us]");
  json::Value doc = documentHead("first-write", o);
  doc.set("iterations", static_cast<int64_t>(o.iters));
  json::Array results;
  for (const Row& r : rows) {
    Summary m = summarize(*r.samples);
    std::printf("%-24s %10.1f %10.1f %10.1f %10.1f %10.1f\n", r.name, m.min, m.median, m.p99, m.avg, m.max);
    json::Value row = json::Value::emptyObject();
    row.set("measure", r.name);
    row.set("samples", static_cast<int64_t>(r.samples->size()));
    row.set("us", summaryJson(m));
    results.push_back(std::move(row));
  }
  doc.set("results", std::move(results));
  st = writeJson(o, doc);
  if (!st.isOk()) return std::fprintf(stderr, "%s: %s\n", kProgram, st.toString().c_str()), 1;
  return 0;
}

// ---------------------------------------------------------------- overhead

enum class Path : uint8_t { kAgentNames, kAgentHandles, kEndpoint };
constexpr Path kPaths[] = {Path::kAgentNames, Path::kAgentHandles, Path::kEndpoint};
const char* pathName(Path p) {
  return p == Path::kAgentNames ? "agent_names" : p == Path::kAgentHandles ? "agent_handles" : "endpoint";
}

// The same batch in the three forms: every assignment the same range, as `ferry bench` posts them.
struct Batches {
  std::vector<NamedAssignment> names, handles;
  std::vector<ep::Assignment> raw;
};

Result<Batches> makeBatches(const Options& o, const PeerConnection& conn, uint64_t n) {
  auto e = conn.endpoint();
  if (!e) return Status(StatusCode::kInternal, "no endpoint after waitReady");
  FERRY_ASSIGN_OR_RETURN(ep::MrHandle local, e->localHandle("buf"));
  FERRY_ASSIGN_OR_RETURN(ep::MrHandle remote, e->remoteHandle("buf"));
  Batches b;
  for (uint64_t i = 0; i < n; ++i) {
    b.names.push_back({.local = "buf", .remote = "buf", .length = o.size});
    b.handles.push_back({.local = local, .remote = remote, .length = o.size});
    b.raw.push_back({.local = local, .remote = remote, .length = o.size});
  }
  return b;
}

// `iters` WRITE-and-wait calls on one path; the mean microseconds per call.
Result<double> timeWrites(const Options& o, PeerConnection& conn, const Batches& b, Path path,
                          uint64_t iters) {
  const auto& e = conn.endpoint();
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < iters; ++i) {
    Result<ep::ReadWriteFuture> f = path == Path::kEndpoint       ? e->write(b.raw)
                                    : path == Path::kAgentHandles ? conn.write(b.handles)
                                                                  : conn.write(b.names);
    if (!f.isOk()) return f.status();
    FERRY_RETURN_IF_ERROR(f->wait(timeoutOf(o)));
  }
  return microsSince(t0) / static_cast<double>(iters);
}

struct OverheadRow {
  uint64_t batch = 1;
  std::map<Path, std::vector<double>> perRound;  // us per call, one per round
};

// Rounds in which every path runs once, the order rotating, so drift hits each path alike.
Status measureOverhead(const Options& o, PeerConnection& conn, OverheadRow& row) {
  FERRY_ASSIGN_OR_RETURN(Batches b, makeBatches(o, conn, row.batch));
  uint64_t iters = std::max<uint64_t>(1, o.iters / row.batch);
  for (Path p : kPaths)
    FERRY_RETURN_IF_ERROR(timeWrites(o, conn, b, p, std::max<uint64_t>(1, iters / 10)).status());
  for (uint64_t r = 0; r < o.rounds; ++r) {
    for (size_t k = 0; k < 3; ++k) {
      Path p = kPaths[(k + r) % 3];
      FERRY_ASSIGN_OR_RETURN(double us, timeWrites(o, conn, b, p, iters));
      row.perRound[p].push_back(us);
    }
  }
  return Status::ok();
}

json::Value overheadRowJson(const OverheadRow& row, uint64_t iters) {
  json::Value o = json::Value::emptyObject();
  o.set("batch", static_cast<int64_t>(row.batch));
  o.set("iterations_per_round", static_cast<int64_t>(iters));
  double endpointMedian = summarize(row.perRound.at(Path::kEndpoint)).median;
  for (Path p : kPaths) {
    Summary s = summarize(row.perRound.at(p));
    json::Value v = summaryJson(s);
    v.set("us_per_assignment", s.median / static_cast<double>(row.batch));
    v.set("ratio_to_endpoint", s.median / endpointMedian);
    o.set(std::string(pathName(p)) + "_us_per_call", std::move(v));
  }
  return o;
}

void printOverheadRow(const OverheadRow& row) {
  double endpointMedian = summarize(row.perRound.at(Path::kEndpoint)).median;
  for (Path p : kPaths) {
    Summary s = summarize(row.perRound.at(p));
    std::printf("%6llu %-14s %10.3f %10.3f %10.3f %12.4f %8.3f\n", (unsigned long long)row.batch, pathName(p),
                s.min, s.median, s.max, s.median / static_cast<double>(row.batch), s.median / endpointMedian);
  }
}

int runOverhead(const Options& o) {
  Harness h;
  Status st = startStore(h);
  if (st.isOk()) st = spawnAndAwaitStart(h, o, "peer", "--serve", "peer", 1).status();
  auto self = st.isOk() ? startAgent(o, "overhead", h.storeUrl) : Result<BenchAgent>(st);
  std::shared_ptr<PeerConnection> conn;
  if (self.isOk()) {
    auto c = self->agent->connect("peer-0");
    st = c.isOk() ? (*c)->waitReady(timeoutOf(o)) : c.status();
    if (c.isOk()) conn = *c;
  } else {
    st = self.status();
  }
  std::vector<OverheadRow> rows(o.batch > 1 ? 2 : 1);
  rows.back().batch = o.batch;
  for (auto& row : rows) {
    if (st.isOk()) st = measureOverhead(o, *conn, row);
  }
  if (!st.isOk()) return std::fprintf(stderr, "%s: overhead: %s\n", kProgram, st.toString().c_str()), 1;
  std::printf(
      "overhead: %llu B WRITE-and-wait, %llu rounds of about %llu assignments per path, peer in another "
      "process\n",
      (unsigned long long)o.size, (unsigned long long)o.rounds, (unsigned long long)o.iters);
  std::printf("%6s %-14s %10s %10s %10s %12s %8s\n", "batch", "path", "min[us]", "median[us]", "max[us]",
              "us/assign", "ratio");
  json::Value doc = documentHead("overhead", o);
  doc.set("rounds", static_cast<int64_t>(o.rounds));
  json::Array results;
  for (const auto& row : rows) {
    printOverheadRow(row);
    results.push_back(overheadRowJson(row, std::max<uint64_t>(1, o.iters / row.batch)));
  }
  doc.set("results", std::move(results));
  self->agent->shutdown();
  st = writeJson(o, doc);
  if (!st.isOk()) return std::fprintf(stderr, "%s: %s\n", kProgram, st.toString().c_str()), 1;
  return 0;
}

// ---------------------------------------------------------------- scale

struct ScaleProcess {
  ScaleProcess(Child* c, std::string r, uint64_t n) : child(c), role(std::move(r)), agents(n) {}
  Child* child = nullptr;  // nullptr: this process (the store)
  std::string role;
  uint64_t agents = 0;
  ProcSample before, after, idleStart, idleEnd;
};

// Starts the serving processes and the connector; `before` is sampled once all have started.
Status startScale(const Options& o, Harness& h, std::vector<ScaleProcess>& procs) {
  FERRY_RETURN_IF_ERROR(startStore(h));
  procs.emplace_back(nullptr, "store", 0);
  for (uint64_t p = 0; p < o.procs; ++p) {
    uint64_t n = servingCount(o, p);
    FERRY_ASSIGN_OR_RETURN(Child * c,
                           h.children.spawn("serving process " + std::to_string(p),
                                            childArgs(o, "--serve", h.storeUrl, "s" + std::to_string(p), n)));
    procs.emplace_back(c, "serving", n);
  }
  // Started in parallel: each announces itself when all its agents registered.
  auto deadline = Clock::now() + timeoutOf(o);
  for (auto& p : procs) {
    if (!p.child) continue;
    FERRY_ASSIGN_OR_RETURN(std::string line, readLine(*p.child, deadline));
    if (line.rfind("started", 0) != 0)
      return Status(StatusCode::kProtocolError, p.child->name + " said '" + line + "'");
  }
  FERRY_ASSIGN_OR_RETURN(Child * c,
                         spawnAndAwaitStart(h, o, "connecting process", "--connector", "connector", 1));
  procs.emplace_back(c, "connecting", 1);
  for (auto& p : procs) p.before = sampleProc(p.child ? p.child->pid : getpid());
  return Status::ok();
}

// Samples every process over idleSeconds once everything is ready.
void sampleIdle(const Options& o, std::vector<ScaleProcess>& procs) {
  for (auto& p : procs) p.after = sampleProc(p.child ? p.child->pid : getpid());
  for (auto& p : procs) p.idleStart = p.after;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.idleSeconds));
  for (auto& p : procs) p.idleEnd = sampleProc(p.child ? p.child->pid : getpid());
}

double idlePercent(const Options& o, const ScaleProcess& p) {
  return 100.0 * (p.idleEnd.cpuSeconds - p.idleStart.cpuSeconds) / o.idleSeconds;
}

json::Value scaleProcessJson(const Options& o, const ScaleProcess& p) {
  json::Value v = json::Value::emptyObject();
  v.set("role", p.role);
  v.set("pid", static_cast<int64_t>(p.child ? p.child->pid : getpid()));
  v.set("agents", static_cast<int64_t>(p.agents));
  v.set("rss_kb_before", p.before.rssKb);
  v.set("rss_kb_after", p.after.rssKb);
  v.set("threads_before", p.before.threads);
  v.set("threads_after", p.after.threads);
  v.set("fds_before", p.before.fds);
  v.set("fds_after", p.after.fds);
  v.set("idle_cpu_seconds", p.idleEnd.cpuSeconds - p.idleStart.cpuSeconds);
  v.set("idle_cpu_percent", idlePercent(o, p));
  return v;
}

struct ScaleTotals {
  double connectorKbPerEndpoint = 0, servingKbPerEndpoint = 0;
  double connectorIdle = 0, servingIdle = 0, storeIdle = 0;
};

ScaleTotals scaleTotals(const Options& o, const std::vector<ScaleProcess>& procs) {
  ScaleTotals t;
  double m = static_cast<double>(o.endpoints);
  for (const auto& p : procs) {
    double delta = static_cast<double>(p.after.rssKb - p.before.rssKb);
    if (p.role == "connecting") t.connectorKbPerEndpoint = delta / m, t.connectorIdle = idlePercent(o, p);
    if (p.role == "serving") t.servingKbPerEndpoint += delta / m, t.servingIdle += idlePercent(o, p);
    if (p.role == "store") t.storeIdle = idlePercent(o, p);
  }
  return t;
}

void printScale(const Options& o, const ScaleOutcome& r, const std::vector<ScaleProcess>& procs) {
  std::printf("scale: %llu endpoints, %llu serving processes, one connecting agent; idle sampled over %g s\n",
              (unsigned long long)o.endpoints, (unsigned long long)o.procs, o.idleSeconds);
  std::printf(
      "connect() calls %.3f s; all ready %.3f s (%llu of %llu ready); queued WRITEs done %.3f s (%llu ok, "
      "%llu failed); other failures %llu\n",
      r.connectSeconds, r.readySeconds, (unsigned long long)r.readyOk, (unsigned long long)o.endpoints,
      r.writesSeconds, (unsigned long long)r.writesOk, (unsigned long long)r.writesFailed,
      (unsigned long long)r.failed);
  if (!r.firstError.empty()) std::printf("first error: %s\n", r.firstError.c_str());
  std::printf("%-11s %8s %7s %12s %12s %9s %9s %7s %7s %9s\n", "process", "pid", "agents", "rss_before_kB",
              "rss_after_kB", "thr_after", "fds_after", "idle_s", "idle_%", "kB/endp");
  for (const auto& p : procs) {
    double perEndpoint =
        p.role == "store"
            ? 0
            : static_cast<double>(p.after.rssKb - p.before.rssKb) /
                  static_cast<double>(p.role == "connecting" ? o.endpoints : std::max<uint64_t>(p.agents, 1));
    std::printf("%-11s %8d %7llu %12lld %12lld %9lld %9lld %7.2f %7.2f %9.1f\n", p.role.c_str(),
                p.child ? p.child->pid : getpid(), (unsigned long long)p.agents, (long long)p.before.rssKb,
                (long long)p.after.rssKb, (long long)p.after.threads, (long long)p.after.fds,
                p.idleEnd.cpuSeconds - p.idleStart.cpuSeconds, idlePercent(o, p), perEndpoint);
  }
  ScaleTotals t = scaleTotals(o, procs);
  std::printf("memory per endpoint: connecting side %.1f kB, serving side %.1f kB\n",
              t.connectorKbPerEndpoint, t.servingKbPerEndpoint);
  std::printf(
      "idle CPU (%% of one core): connecting agent with %llu endpoints %.2f; all serving processes %.2f; "
      "store %.2f\n",
      (unsigned long long)o.endpoints, t.connectorIdle, t.servingIdle, t.storeIdle);
}

json::Value scaleJson(const Options& o, const ScaleOutcome& r, const std::vector<ScaleProcess>& procs) {
  json::Value doc = documentHead("scale", o);
  doc.set("endpoints", static_cast<int64_t>(o.endpoints));
  doc.set("procs", static_cast<int64_t>(o.procs));
  doc.set("idle_seconds", o.idleSeconds);
  doc.set("connect_calls_seconds", r.connectSeconds);
  doc.set("ready_seconds", r.readySeconds);
  doc.set("writes_seconds", r.writesSeconds);
  doc.set("ready_ok", static_cast<int64_t>(r.readyOk));
  doc.set("writes_ok", static_cast<int64_t>(r.writesOk));
  doc.set("failed", static_cast<int64_t>(r.failed));
  doc.set("writes_failed", static_cast<int64_t>(r.writesFailed));
  doc.set("first_error", r.firstError.empty() ? json::Value() : json::Value(r.firstError));
  json::Array list;
  for (const auto& p : procs) list.push_back(scaleProcessJson(o, p));
  doc.set("processes", std::move(list));
  ScaleTotals t = scaleTotals(o, procs);
  json::Value mem = json::Value::emptyObject();
  mem.set("connecting", t.connectorKbPerEndpoint);
  mem.set("serving", t.servingKbPerEndpoint);
  doc.set("memory_kb_per_endpoint", std::move(mem));
  json::Value idle = json::Value::emptyObject();
  idle.set("connecting", t.connectorIdle);
  idle.set("serving_total", t.servingIdle);
  idle.set("store", t.storeIdle);
  doc.set("idle_cpu_percent", std::move(idle));
  return doc;
}

Result<ScaleOutcome> awaitConnector(const Options& o, Child& connector) {
  FERRY_RETURN_IF_ERROR(sendLine(connector, "go"));
  // The connector's own waits end at --timeout; a little more for it to report.
  FERRY_ASSIGN_OR_RETURN(std::string line,
                         readLine(connector, Clock::now() + timeoutOf(o) + std::chrono::seconds(30)));
  auto f = parseFields(line);
  if (f[""] != "done")
    return Status(StatusCode::kProtocolError, "the connecting process said '" + line + "'");
  ScaleOutcome r;
  r.connectSeconds = std::atof(f["connect_s"].c_str());
  r.readySeconds = std::atof(f["ready_s"].c_str());
  r.writesSeconds = std::atof(f["writes_s"].c_str());
  r.readyOk = std::strtoull(f["ready_ok"].c_str(), nullptr, 10);
  r.writesOk = std::strtoull(f["writes_ok"].c_str(), nullptr, 10);
  r.failed = std::strtoull(f["failed"].c_str(), nullptr, 10);
  r.writesFailed = std::strtoull(f["writes_failed"].c_str(), nullptr, 10);
  r.firstError = f["error_text"];
  return r;
}

int runScale(const Options& o) {
  // Each agent holds a few descriptors per connection and the store's server one per agent.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }
  Harness h;
  std::vector<ScaleProcess> procs;
  Status st = startScale(o, h, procs);
  if (!st.isOk()) return std::fprintf(stderr, "%s: scale: %s\n", kProgram, st.toString().c_str()), 1;
  auto r = awaitConnector(o, *procs.back().child);
  if (!r.isOk()) return std::fprintf(stderr, "%s: scale: %s\n", kProgram, r.status().toString().c_str()), 1;
  sampleIdle(o, procs);
  printScale(o, *r, procs);
  st = writeJson(o, scaleJson(o, *r, procs));
  if (!st.isOk()) return std::fprintf(stderr, "%s: %s\n", kProgram, st.toString().c_str()), 1;
  if (r->readyOk != o.endpoints || r->writesOk != o.endpoints) {
    std::fprintf(stderr, "%s: scale: %llu of %llu endpoints ready, %llu WRITEs done\n", kProgram,
                 (unsigned long long)r->readyOk, (unsigned long long)o.endpoints,
                 (unsigned long long)r->writesOk);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parseOptions(argc, argv);
  // A child whose parent went away gets EPIPE, not a signal.
  std::signal(SIGPIPE, SIG_IGN);
  if (o.role == Role::kServe) return runServe(o);
  if (o.role == Role::kConnector) return runConnector(o);
  switch (o.mode) {
    case Mode::kFirstWrite: return runFirstWrite(o);
    case Mode::kOverhead: return runOverhead(o);
    case Mode::kScale: return runScale(o);
  }
  return 1;
}
