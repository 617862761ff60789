#include "ferry/common/config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "common/log.h"

extern char** environ;

namespace ferry::config {
namespace {

Status refuse(const char* name, std::string_view raw, const std::string& why) {
  return invalidArgument(std::string(name) + "=" + std::string(raw) + ": " + why);
}

// A whole number in [lo, hi], or nullopt.
std::optional<int64_t> wholeNumber(std::string_view text, int64_t lo, int64_t hi) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value < lo || value > hi) return std::nullopt;
  return value;
}

std::vector<std::string> splitNames(std::string_view text) {
  std::vector<std::string> out;
  std::stringstream list{std::string(text)};
  std::string item;
  while (std::getline(list, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Result<std::string> parseDevices(std::string_view raw) {
  std::vector<std::string> names = splitNames(raw);
  if (names.empty()) return refuse("FERRY_DEVICES", raw, "expected device names separated by commas");
  std::string joined;
  for (const auto& n : names) {
    for (char c : n) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-' || c == '.' || c == ':';
      if (!ok) return refuse("FERRY_DEVICES", raw, "'" + n + "' is not a device name");
    }
    joined += (joined.empty() ? "" : ",") + n;
  }
  return joined;
}

Result<std::string> parseSameHost(std::string_view raw) {
  if (raw == "0" || raw == "off") return std::string("0");
  if (raw == "ring") return std::string("ring");
  if (raw == "1" || raw == "auto") return std::string("auto");
  return refuse("FERRY_SOFT_SAME_HOST", raw,
                "expected 0 (TCP only), ring (rings, no cross-memory attach) or auto");
}

Result<std::string> parseAllowRemote(std::string_view raw) {
  if (raw == "0" || raw == "off") return std::string("0");
  if (raw == "1" || raw == "on") return std::string("1");
  return refuse("FERRY_AGENT_ALLOW_REMOTE", raw, "expected 1 (on) or 0 (off)");
}

Result<std::string> parseCallerProgress(std::string_view raw) {
  if (raw == "0" || raw == "off") return std::string("0");
  if (raw == "1" || raw == "on") return std::string("1");
  return refuse("FERRY_SOFT_CALLER_PROGRESS", raw, "expected 1 (on) or 0 (off)");
}

constexpr uint64_t kDefaultStripeMinBytes = 1024 * 1024;

// The smallest WRITE or READ a stripe shares, as a number of bytes ("0": no stripe).
Result<std::string> parseTcpStripe(std::string_view raw) {
  if (raw == "0" || raw == "off") return std::string("0");
  if (raw == "1" || raw == "on") return std::to_string(kDefaultStripeMinBytes);
  Result<uint64_t> bytes = parseByteSize(raw);
  if (!bytes.isOk() || *bytes < 2 || *bytes > (uint64_t{1} << 31)) {
    return refuse("FERRY_SOFT_TCP_STRIPE", raw,
                  "expected 1 (on), 0 (off) or the smallest WRITE or READ to share, 2..2G, such as 64K");
  }
  return std::to_string(*bytes);
}

constexpr uint64_t kMinRingBytes = 64 * 1024;
constexpr uint64_t kMaxRingBytes = 64 * 1024 * 1024;

Result<std::string> parseRingBytes(std::string_view raw) {
  Result<uint64_t> bytes = parseByteSize(raw);
  if (!bytes.isOk() || *bytes < kMinRingBytes || *bytes > kMaxRingBytes) {
    return refuse("FERRY_SOFT_RING_BYTES", raw, "expected a size from 64K to 64M, such as 1M");
  }
  return std::to_string(*bytes);
}

// A time in microseconds of the variable Name (a spin, a lease): 0..10000.
constexpr char kSoftSpinUs[] = "FERRY_SOFT_SPIN_US";
constexpr char kWaitSpinUs[] = "FERRY_WAIT_SPIN_US";
constexpr char kSoftAttendUs[] = "FERRY_SOFT_ATTEND_US";
constexpr char kWaitLeaseUs[] = "FERRY_WAIT_LEASE_US";
template <const char* Name>
Result<std::string> parseSpinMicroseconds(std::string_view raw) {
  auto us = wholeNumber(raw, 0, 10000);
  if (!us) return refuse(Name, raw, "expected a whole number of microseconds, 0..10000");
  return std::to_string(*us);
}

Result<std::string> parseTransportTimeout(std::string_view raw) {
  auto seconds = wholeNumber(raw, 1, 70000);
  if (!seconds) return refuse("FERRY_TRANSPORT_TIMEOUT", raw, "expected a whole number of seconds, 1..70000");
  return std::to_string(*seconds);
}

Result<std::string> parseGidIndex(std::string_view raw) {
  auto index = wholeNumber(raw, 0, 255);
  if (!index) return refuse("FERRY_IB_GID_INDEX", raw, "expected a GID index, 0..255");
  return std::to_string(*index);
}

Result<std::string> parseAnyText(std::string_view raw) { return std::string(raw); }

Result<std::string> parseSecret(std::string_view raw) {
  return std::string("(set, ") + std::to_string(raw.size()) + " characters)";
}

// CLASS=KIND[,CLASS=KIND...]; the agent turns it into lane overrides (lanes.h).
Result<std::string> parseLanes(std::string_view raw) {
  for (const std::string& item : splitNames(raw)) {
    const size_t eq = item.find('=');
    const std::string cls = item.substr(0, eq);
    const std::string kind = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (cls != "messages" && cls != "rma" && cls != "atomics") {
      return refuse("FERRY_AGENT_LANES", raw,
                    "'" + item + "': expected CLASS=KIND with CLASS messages, rma or atomics");
    }
    if (kind != "same_host" && kind != "rdma" && kind != "tcp") {
      return refuse("FERRY_AGENT_LANES", raw, "'" + item + "': expected KIND same_host, rdma or tcp");
    }
  }
  return std::string(raw);
}

Result<std::string> parseTokenTtl(std::string_view raw) {
  auto seconds = wholeNumber(raw, 1, 604800);
  if (!seconds)
    return refuse("FERRY_OBJECTS_TOKEN_TTL", raw, "expected a whole number of seconds, 1..604800");
  return std::to_string(*seconds);
}

Result<std::string> parseStore(std::string_view raw) {
  for (const char* scheme : {"memory://", "ferry://", "redis://", "etcd://"}) {
    if (raw.substr(0, std::string_view(scheme).size()) == scheme) return std::string(raw);
  }
  return refuse("FERRY_STORE", raw, "expected a URL starting memory://, ferry://, redis:// or etcd://");
}

Result<std::string> parseLogLevel(std::string_view raw) {
  for (const char* level : {"error", "warn", "info", "debug"}) {
    if (raw == level) return std::string(raw);
  }
  return refuse("FERRY_LOG_LEVEL", raw, "expected error, warn, info or debug");
}

// Variables renamed after a release read them. The former name is still read where the current one
// is unset, and a process that sees it says so once (unknownVariables()).
struct FormerName {
  const char* former;
  const char* current;
};
constexpr FormerName kFormerNames[] = {
    {"FERRY_SOFT_TCP_LANE", "FERRY_SOFT_TCP_STRIPE"},
};

const char* setValue(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && *env != '\0' ? env : nullptr;
}

const char* rawValue(const char* name) {
  if (const char* env = setValue(name)) return env;
  for (const FormerName& f : kFormerNames) {
    if (std::string_view(f.current) == name) return setValue(f.former);
  }
  return nullptr;
}

// The effective value of a set variable, or nullopt when it is unset or invalid.
std::optional<std::string> parsed(const char* name) {
  const char* raw = rawValue(name);
  if (raw == nullptr) return std::nullopt;
  for (const Variable& v : variables()) {
    if (std::string_view(v.name) == name) {
      Result<std::string> value = v.parse(raw);
      if (value.isOk()) return *value;
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// The optimal-string-alignment distance (insertions, deletions, substitutions and swaps of two
// neighbours), or `limit + 1` as soon as it must exceed `limit`.
size_t editDistance(std::string_view a, std::string_view b, size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return std::min(d[a.size()][b.size()], limit + 1);
}

// Edits between a misspelt name and the one it suggests: FERRY_DEVICE -> FERRY_DEVICES,
// FERRY_LOGLEVEL -> FERRY_LOG_LEVEL, FERRY_SOFT_SPNI_US -> FERRY_SOFT_SPIN_US.
constexpr size_t kSuggestWithin = 2;

// The known name nearest to `name` (compared in upper case: FERRY_Devices is FERRY_DEVICES), or "".
std::string nearestKnownName(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  std::string best;
  size_t bestDistance = kSuggestWithin + 1;
  auto consider = [&](const char* known) {
    const size_t distance = editDistance(upper, known, kSuggestWithin);
    if (distance < bestDistance) {
      bestDistance = distance;
      best = known;
    }
  };
  for (const Variable& v : variables()) consider(v.name);
  for (const ReservedVariable& r : reservedVariables()) consider(r.name);
  return best;
}

}  // namespace

const std::vector<ReservedVariable>& reservedVariables() {
  // Every FERRY_* name that tests/, bench/, scripts/, .ci/ and the Makefile read from the
  // environment. A new one goes here too, or every ferry process of its run would warn about it.
  static const std::vector<ReservedVariable> table = {
      {"FERRY_TEST_BIN_DIR", "the Python tests: where the helper programs are"},
      {"FERRY_REQUIRE_PROVIDERS", "the conformance tests: provider paths that may not skip"},
      {"FERRY_REQUIRE_STORES", "the store tests: store backends that may not skip"},
      {"FERRY_REQUIRE_RDMA_VM", "make test-rdma: a VM that cannot boot is a failure"},
      {"FERRY_AGENT_TEST_DEVICE", "the agent and connector tests: the device they use"},
      {"FERRY_TEST_SHARED_MEMORY", "the conformance fixture's peers: memory from shared memory"},
      {"FERRY_CAMPAIGN_TRIALS", "the multi-process verbs test: trials of its campaign"},
      {"FERRY_REQUIRE_CUDA", "the GPU tests (label gpu): no usable CUDA driver is a failure, not a skip"},
      {"FERRY_BIN", "bench/tests/sizes_test.py: the ferry program to compare with"},
      {"FERRY_BUILD_DIR", "the bench/ scripts: the build tree holding ferry"},
      {"FERRY_VENV", "scripts/install-deps.sh: the virtual environment"},
  };
  return table;
}

std::string UnknownVariable::warning() const {
  if (renamed)
    return name + " is the former name of " + suggestion + ", read while that is unset; set " + suggestion +
           " instead";
  std::string text = name + " is not a ferry variable";
  if (!suggestion.empty()) text += " (did you mean " + suggestion + "?)";
  return text + "; ferry info --config lists them";
}

std::vector<UnknownVariable> unknownVariables() {
  std::vector<UnknownVariable> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view item(*entry);
    const std::string_view name = item.substr(0, item.find('='));
    if (name.substr(0, 6) != "FERRY_") continue;
    auto named = [&](const auto& row) { return name == row.name; };
    if (std::any_of(variables().begin(), variables().end(), named)) continue;
    if (std::any_of(reservedVariables().begin(), reservedVariables().end(), named)) continue;
    const auto former = std::find_if(std::begin(kFormerNames), std::end(kFormerNames),
                                     [&](const FormerName& f) { return name == f.former; });
    if (former != std::end(kFormerNames)) {
      out.push_back({std::string(name), former->current, /*renamed=*/true});
      continue;
    }
    out.push_back({std::string(name), nearestKnownName(name)});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

// The variables of the devices: which are visible, and how the software provider moves bytes.
std::vector<Variable> deviceVariables() {
  return {
      {"FERRY_DEVICES", "Only the named devices are listed and opened, everywhere devices are.",
       "all devices", "device names separated by commas, e.g. soft_lo,rxe0", parseDevices},
      {"FERRY_SOFT_SAME_HOST",
       "How the soft provider connects processes of one host: shared-memory rings with one-copy WRITE/READ, "
       "rings "
       "only, or TCP.",
       "auto", "auto (or 1), ring, 0 (or off)", parseSameHost},
      {"FERRY_SOFT_RING_BYTES",
       "The size of each shared-memory ring of the same-host path (rounded down to a power of two).", "1M",
       "64K..64M", parseRingBytes},
      {"FERRY_SOFT_SPIN_US", "How long a progress thread polls a ring before it sleeps (0: never polls).",
       "20 on four or more cores, else 0", "0..10000 (microseconds)", parseSpinMicroseconds<kSoftSpinUs>},
      {"FERRY_SOFT_CALLER_PROGRESS",
       "Whether the application's threads progress a soft device themselves when its progress thread is not "
       "running: a post sends its requests, and a poll of a completion queue that finds nothing runs the "
       "device's "
       "loop once (its sockets, rings, timers and posted work), instead of waiting for that thread to wake "
       "up.",
       "1", "1 (or on), 0 (or off)", parseCallerProgress},
      {"FERRY_SOFT_TCP_STRIPE",
       "Whether a soft device's queue pair that reaches its peer over TCP opens a second connection (a "
       "stripe) "
       "that carries the second half of each WRITE and each READ response of 1 MiB or more (or of the size "
       "given): two congestion windows on a link that drops packets, and a thread of its own that copies "
       "alongside the progress thread.",
       "1", "1 (or on), 0 (or off), or the smallest WRITE or READ to share (2..2G, e.g. 64K)",
       parseTcpStripe},
      {"FERRY_SOFT_ATTEND_US",
       "How long a poll of a soft device's completion queue vouches that the application polls: until then "
       "the "
       "peers on this host write into its rings without waking its progress thread, and its polls take the "
       "frames. "
       "Arming a completion queue ends it at once; otherwise a frame, or an acknowledgement its polls owe "
       "a peer, waits at most this long when the application stops polling (0: peers always wake the "
       "thread). Also how long a `getEvent` on a completion channel sleeps on the device's sockets and "
       "rings itself, running the device's loop when they bring something, before it leaves them to the "
       "progress thread (0: never). Needs FERRY_SOFT_CALLER_PROGRESS.",
       "1000", "0..10000 (microseconds)", parseSpinMicroseconds<kSoftAttendUs>},
  };
}

// The variables of the layers above the devices: waits, transports, RDMA ports, logging, the
// agent and the object store.
std::vector<Variable> layerVariables() {
  return {
      {"FERRY_WAIT_SPIN_US",
       "How long a thread waiting for an Endpoint API operation (wait() on its future) polls the endpoint's "
       "completions itself before it sleeps until the endpoint's worker wakes it (0: never polls).",
       "50", "0..10000 (microseconds)", parseSpinMicroseconds<kWaitSpinUs>},
      {"FERRY_WAIT_LEASE_US",
       "How long an Endpoint API waiter that polled its operation to completion vouches that the next one "
       "polls "
       "too: while waiters poll, and until then, the endpoint's worker is not woken for each completion (the "
       "waiters take them). A waiter that sleeps, or a callback waiting for an operation, ends it at once; "
       "otherwise a completion nobody polls for waits at most this long (0: the worker is woken for every "
       "completion). Needs FERRY_WAIT_SPIN_US.",
       "1000", "0..10000 (microseconds)", parseSpinMicroseconds<kWaitLeaseUs>},
      {"FERRY_TRANSPORT_TIMEOUT",
       "How long the queue pairs of endpoints and agents wait for a peer that makes no progress (paused, "
       "unreachable, not connected yet) before their work fails: their timeout and retry_cnt are set to "
       "cover "
       "it. A queue pair whose peer is gone (its process died, its connection dropped) fails at once.",
       "30 (34 s in effect: 8 tries of 4.3 s)", "1..70000 (seconds)", parseTransportTimeout},
      {"FERRY_IB_GID_INDEX", "The GID index every RDMA port uses (as NCCL_IB_GID_INDEX).",
       "chosen by GID type: RoCE v2 IPv4-mapped, then global IPv6, then link-local", "0..255", parseGidIndex},
      {"FERRY_IBVERBS_LIBRARY", "The libibverbs the ibverbs provider loads at run time.", "libibverbs.so.1",
       "a library name or path", parseAnyText},
      {"FERRY_CUDA_LIBRARY",
       "The CUDA driver library ferry loads at run time to tell GPU memory from host memory.", "libcuda.so.1",
       "a library name or path", parseAnyText},
      {"FERRY_LOG_LEVEL", "How much ferry logs (to stderr, or to Python's logging from Python).", "warn",
       "error, warn, info, debug", parseLogLevel},
      {"FERRY_STORE", "The discovery store an agent uses when none is given.",
       "none (peers connect by address)",
       "memory://NAME, ferry://HOST:PORT, redis://HOST:PORT, etcd://HOST:PORT", parseStore},
      {"FERRY_AGENT_SECRET", "A shared secret: every agent wireup message carries an HMAC-SHA256 of it.",
       "none (no challenge)", "any text (it is never printed)", parseSecret},
      {"FERRY_AGENT_ALLOW_REMOTE",
       "Whether an agent without a secret serves peers of other hosts: it then listens on every address and "
       "accepts any peer that reaches it, unauthenticated (docs/security.md). Without it, an agent without a "
       "secret listens on loopback and refuses peers of other hosts.",
       "0 (this host only)", "1 (or on), 0 (or off)", parseAllowRemote},
      {"FERRY_AGENT_LANES", "Overrides the agent's lane choice per operation class.", "chosen per peer",
       "CLASS=KIND,... with CLASS messages, rma, atomics and KIND same_host, rdma, tcp", parseLanes},
      {"FERRY_OBJECTS_TOKEN_TTL",
       "How long an object client's descriptor (a token for one range and direction) may be used before the "
       "client "
       "revokes it.",
       "300", "1..604800 (seconds)", parseTokenTtl},
      {"FERRY_OBJECTS_ACCESS_KEY",
       "The object store's access key: `ferry objects serve` then requires AWS Signature Version 4 on every "
       "request, and ferry's object client signs with it.",
       "none (no authentication)", "any text", parseAnyText},
      {"FERRY_OBJECTS_SECRET_KEY", "The secret key that goes with FERRY_OBJECTS_ACCESS_KEY.", "none",
       "any text (it is never printed)", parseSecret},
  };
}

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = [] {
    std::vector<Variable> all = deviceVariables();
    std::vector<Variable> layers = layerVariables();
    all.insert(all.end(), layers.begin(), layers.end());
    return all;
  }();
  return table;
}

std::vector<Setting> settings() {
  std::vector<Setting> out;
  for (const Variable& v : variables()) {
    Setting s;
    s.variable = &v;
    const char* raw = rawValue(v.name);
    if (raw == nullptr) {
      s.effective = v.defaultText;
    } else {
      s.set = true;
      s.raw = raw;
      Result<std::string> value = v.parse(raw);
      if (value.isOk()) {
        s.effective = *value;
      } else {
        s.error = value.status().message();
        s.effective = v.defaultText;
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

Status check() {
  // Once per process, at the first entry point: a misspelt name is never read, so nothing else
  // would ever mention it.
  static std::once_flag warned;
  std::call_once(warned, [] {
    for (const UnknownVariable& u : unknownVariables()) FERRY_LOG(kWarn, "%s", u.warning().c_str());
  });
  for (const Setting& s : settings()) {
    if (!s.error.empty()) return invalidArgument(s.error);
  }
  return Status::ok();
}

std::optional<std::vector<std::string>> devices() {
  auto value = parsed("FERRY_DEVICES");
  if (!value) return std::nullopt;
  return splitNames(*value);
}

SameHost softSameHost() {
  auto value = parsed("FERRY_SOFT_SAME_HOST");
  if (value == "0") return SameHost::kOff;
  if (value == "ring") return SameHost::kRingOnly;
  return SameHost::kAuto;
}

std::optional<uint64_t> softRingBytes() {
  auto value = parsed("FERRY_SOFT_RING_BYTES");
  if (!value) return std::nullopt;
  return std::stoull(*value);
}

std::optional<int64_t> softSpinUs() {
  auto value = parsed("FERRY_SOFT_SPIN_US");
  if (!value) return std::nullopt;
  return std::stoll(*value);
}

bool softCallerProgress() {
  auto value = parsed("FERRY_SOFT_CALLER_PROGRESS");
  return !value || *value == "1";
}

uint64_t softTcpStripeMinBytes() {
  auto value = parsed("FERRY_SOFT_TCP_STRIPE");
  return value ? std::stoull(*value) : kDefaultStripeMinBytes;
}

int64_t softAttendUs() {
  auto value = parsed("FERRY_SOFT_ATTEND_US");
  return value ? std::stoll(*value) : 1000;
}

int64_t waitLeaseUs() {
  auto value = parsed("FERRY_WAIT_LEASE_US");
  return value ? std::stoll(*value) : 1000;
}

int64_t waitSpinUs() {
  auto value = parsed("FERRY_WAIT_SPIN_US");
  return value ? std::stoll(*value) : 50;
}

std::optional<int> ibGidIndex() {
  auto value = parsed("FERRY_IB_GID_INDEX");
  if (!value) return std::nullopt;
  return std::stoi(*value);
}

int transportTimeoutSeconds() {
  auto value = parsed("FERRY_TRANSPORT_TIMEOUT");
  return value ? std::stoi(*value) : 30;
}

std::string ibverbsLibrary() { return parsed("FERRY_IBVERBS_LIBRARY").value_or("libibverbs.so.1"); }

std::string cudaLibrary() { return parsed("FERRY_CUDA_LIBRARY").value_or("libcuda.so.1"); }

int logLevel() {
  const std::string level = parsed("FERRY_LOG_LEVEL").value_or("warn");
  if (level == "error") return 0;
  if (level == "info") return 2;
  if (level == "debug") return 3;
  return 1;
}

std::string agentSecret() {
  const char* raw = rawValue("FERRY_AGENT_SECRET");
  return raw != nullptr && parsed("FERRY_AGENT_SECRET") ? raw : "";
}
bool agentAllowRemote() { return parsed("FERRY_AGENT_ALLOW_REMOTE").value_or("0") == "1"; }
std::string agentLanes() { return parsed("FERRY_AGENT_LANES").value_or(""); }
std::string store() { return parsed("FERRY_STORE").value_or(""); }

bool isSecret(std::string_view name) {
  return name == "FERRY_AGENT_SECRET" || name == "FERRY_OBJECTS_SECRET_KEY";
}

std::string objectsAccessKey() { return parsed("FERRY_OBJECTS_ACCESS_KEY").value_or(""); }
std::string objectsSecretKey() {
  const char* raw = rawValue("FERRY_OBJECTS_SECRET_KEY");
  return raw != nullptr ? raw : "";
}

int objectsTokenTtlSeconds() {
  auto value = parsed("FERRY_OBJECTS_TOKEN_TTL");
  return value ? std::stoi(*value) : 300;
}

Result<uint64_t> parseByteSize(std::string_view text) {
  auto bad = [&](const char* why) { return invalidArgument("bad size '" + std::string(text) + "': " + why); };
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (value > (UINT64_MAX - 9) / 10) return bad("too large");
    value = value * 10 + static_cast<uint64_t>(text[i] - '0');
    ++i;
  }
  if (i == 0) return bad("expected a number of bytes such as 4096, 4K or 1M");
  uint64_t scale = 1;
  if (i < text.size()) {
    switch (text[i]) {
      case 'k':
      case 'K':
        scale = uint64_t{1} << 10;
        ++i;
        break;
      case 'm':
      case 'M':
        scale = uint64_t{1} << 20;
        ++i;
        break;
      case 'g':
      case 'G':
        scale = uint64_t{1} << 30;
        ++i;
        break;
      default: break;
    }
  }
  const std::string_view rest = text.substr(i);
  if (!(rest.empty() || rest == "B" || (scale > 1 && (rest == "iB" || rest == "b")))) {
    return bad("expected a number with an optional K, M or G suffix");
  }
  if (value == 0) return bad("sizes start at 1 byte");
  if (value > UINT64_MAX / scale) return bad("too large");
  return value * scale;
}

}  // namespace ferry::config
