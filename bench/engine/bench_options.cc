// Command-line options of `ferry bench` and the checks both sides apply to a run's shape.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>

#include "bench.h"
#include "ferry/common/config.h"

namespace ferry::cli::bench {

const char* opName(Op op) {
  switch (op) {
    case Op::kWrite: return "write";
    case Op::kRead: return "read";
    case Op::kSend: return "send";
    case Op::kWriteImm: return "write_imm";
    case Op::kAtomic: return "atomic";
  }
  return "?";
}

const char* modeName(Mode mode) { return mode == Mode::kBandwidth ? "bw" : "lat"; }

const char* apiName(Api api) { return api == Api::kVerbs ? "verbs" : "endpoint"; }

bool parseOp(std::string_view text, Op* out) {
  for (Op op : {Op::kWrite, Op::kRead, Op::kSend, Op::kWriteImm, Op::kAtomic}) {
    if (text == opName(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

bool parseMode(std::string_view text, Mode* out) {
  if (text == "bw") {
    *out = Mode::kBandwidth;
  } else if (text == "lat") {
    *out = Mode::kLatency;
  } else {
    return false;
  }
  return true;
}

bool parseApi(std::string_view text, Api* out) {
  for (Api api : {Api::kVerbs, Api::kEndpoint}) {
    if (text == apiName(api)) {
      *out = api;
      return true;
    }
  }
  return false;
}

bool isPingPong(const RunShape& s) {
  return s.api == Api::kVerbs && s.mode == Mode::kLatency && s.op != Op::kRead && s.op != Op::kAtomic;
}

uint64_t bufferBytes(const RunShape& shape) {
  uint64_t bytes = shape.maxSize;
  if (shape.api == Api::kEndpoint) {
    bytes += shape.maxSize * (shape.op == Op::kSend ? static_cast<uint64_t>(shape.batch) : 1);
  } else if (isPingPong(shape)) {
    bytes *= 2;
  }
  return std::max<uint64_t>(bytes, 4096);
}

namespace {

// The Endpoint API's part of validateShape().
Status validateEndpointShape(const RunShape& s) {
  if (s.op == Op::kAtomic) {
    return invalidArgument(
        "--api endpoint offers write, read, send and write_imm (the Endpoint API has no atomics)");
  }
  if (s.threads != 1) {
    return invalidArgument(
        "--api endpoint drives one endpoint: --threads must be 1 (use --qps for its queue pairs)");
  }
  if (s.qps > kMaxEndpointQps) {
    return invalidArgument("--api endpoint: --qps (the endpoint's num_qp) must be in [1, " +
                           std::to_string(kMaxEndpointQps) + "], not " + std::to_string(s.qps));
  }
  if (s.maxSize > kMaxMessageSize / static_cast<uint64_t>(s.batch)) {
    return invalidArgument("--api endpoint: one call moves --size x --batch bytes, at most 1G; " +
                           std::to_string(s.maxSize) + " x " + std::to_string(s.batch) + " is more");
  }
  return Status::ok();
}

}  // namespace

Status validateShape(const RunShape& s) {
  auto range = [](const char* name, int64_t value, int64_t lo, int64_t hi) -> Status {
    if (value < lo || value > hi) {
      return invalidArgument(std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "], not " + std::to_string(value));
    }
    return Status::ok();
  };
  Status st = range("threads", s.threads, 1, kMaxThreads);
  if (st.isOk()) st = range("qps", s.qps, 1, kMaxQpsPerThread);
  if (st.isOk()) st = range("depth", s.depth, 1, kMaxDepth);
  if (st.isOk()) st = range("poll-yield", s.pollYield, 0, kMaxPollYield);
  // A verbs batch is posted at once, so it fits in the depth; an endpoint batch is one call.
  if (st.isOk()) st = range("batch", s.batch, 1, s.api == Api::kVerbs ? s.depth : kMaxEndpointBatch);
  if (!st.isOk()) return st;
  if (s.threads * s.qps > kMaxTotalQps) {
    return invalidArgument("threads x qps must be at most " + std::to_string(kMaxTotalQps));
  }
  if (s.maxSize < 1 || s.maxSize > kMaxMessageSize) {
    return invalidArgument("message sizes must be in [1, " + std::to_string(kMaxMessageSize) + "] bytes");
  }
  if (s.api == Api::kEndpoint) FERRY_RETURN_IF_ERROR(validateEndpointShape(s));
  if (s.op == Op::kAtomic && s.maxSize != 8) {
    return invalidArgument("atomics move 8 bytes: use --size 8 (or no --size) with --op atomic");
  }
  if (s.events && (s.api != Api::kVerbs || s.mode != Mode::kLatency || (s.op == Op::kWrite))) {
    return invalidArgument(
        "--wait event is for verbs latency runs of send, write_imm, read and atomic (a WRITE ping-pong lands "
        "in "
        "memory with no completion to wait for; the Endpoint API's waits sleep with FERRY_WAIT_SPIN_US=0)");
  }
  if (bufferBytes(s) * static_cast<uint64_t>(s.threads) > kMaxRegisteredBytes) {
    return invalidArgument("threads x buffer bytes exceed " + std::to_string(kMaxRegisteredBytes >> 30) +
                           " GiB of registered memory per side");
  }
  return Status::ok();
}

std::string formatSize(uint64_t bytes) {
  static const char* kUnits[] = {"", "K", "M", "G"};
  int unit = 0;
  while (unit < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + kUnits[unit];
}

Result<uint64_t> parseSize(std::string_view text) {
  FERRY_ASSIGN_OR_RETURN(uint64_t bytes, config::parseByteSize(text));
  if (bytes > kMaxMessageSize) {
    return invalidArgument("bad size '" + std::string(text) +
                           "': larger than 1G, the largest message ferry bench moves");
  }
  return bytes;
}

uint64_t autoIterations(Mode mode, uint64_t size) {
  uint64_t budget = mode == Mode::kBandwidth ? (uint64_t{2} << 30) : (uint64_t{256} << 20);
  uint64_t lo = mode == Mode::kBandwidth ? 32 : 16;
  uint64_t hi = mode == Mode::kBandwidth ? 20000 : 5000;
  return std::clamp<uint64_t>(budget / std::max<uint64_t>(size, 1), lo, hi);
}

void printUsage(FILE* out) {
  std::fprintf(out,
               "usage: ferry bench --local [options]            server and client in two processes here\n"
               "       ferry bench --server [--port P] [--bind ADDR] [--device NAME]\n"
               "       ferry bench HOST[:PORT] [options]         connect to a running server\n"
               "\n"
               "options:\n"
               "  --device NAME         device of this side (default: the one bound to the control\n"
               "                        connection's local address, e.g. soft_lo for 127.0.0.1)\n"
               "  --server-device NAME  --local: device of the server process (default: --device)\n"
               "  --api verbs|endpoint  measure verbs work requests (default) or the Endpoint API's\n"
               "                        calls and futures (RDMAEndpoint; no atomics, one thread)\n"
               "  --op OP               write (default), read, send, write_imm, atomic (fetch-and-add)\n"
               "  --mode bw|lat         bandwidth (default) or latency\n"
               "  --size N[,N...]       message size(s), K/M/G suffixes; repeatable (default: --sweep)\n"
               "  --sweep               the standard sizes 8, 4K, 64K, 1M, 16M, 64M\n"
               "  --iters N             iterations per size (default: chosen per size)\n"
               "  --duration SEC        run each size for SEC seconds instead of --iters\n"
               "  --batch N             work requests per postSend call (bw; default 1); endpoint:\n"
               "                        assignments per call, each of the message size (send: chunks)\n"
               "  --depth N             outstanding work requests per QP (bw; default 64); endpoint:\n"
               "                        operations in flight\n"
               "  --qps N               QPs per thread, used round-robin (default 1); endpoint: num_qp\n"
               "  --threads N           threads, each with its own QPs, CQ and buffer (default 1)\n"
               "  --json                print the results as one JSON document on stdout\n"
               "                        (bench/plot.py draws charts from these documents)\n"
               "  --timeout SEC         give up when the peer is silent or a transfer stalls this long\n"
               "                        (default 30)\n"
               "  --port P              control port (default %u); --server --port 0 picks a free one\n"
               "  --bind ADDR           --server: listen on ADDR (default 0.0.0.0)\n"
               "  --soft-path PATH      the software devices' path between processes of this host:\n"
               "                        same-host (rings, one-copy WRITE/READ), ring (rings only:\n"
               "                        data staged through shared memory) or tcp; sets\n"
               "                        FERRY_SOFT_SAME_HOST for this process (and --local's server)\n"
               "  --memory KIND         heap (default: anonymous memory, registered) or shared\n"
               "                        (ProtectionDomain::allocMr on both sides: a same-host peer\n"
               "                        maps it, and WRITE/READ are loads and stores); with --api\n"
               "                        endpoint the pool's allocMemoryRegion\n"
               "  --wait poll|event     lat: poll the CQ (default) or sleep on its completion\n"
               "                        channel, both sides (the event-driven variant; verbs\n"
               "                        send, write_imm, read and atomic)\n"
               "  --poll-yield N        lat: polling loops yield the core after every Nth empty poll\n"
               "                        (default 16; 1 after each; 0 never), both sides\n"
               "  --call-time           verbs lat: also time each postSend call (t_call), with one\n"
               "                        more clock read per iteration inside the latency\n"
               "\n"
               "Latency: write, send and write_imm are ping-pongs (one-way = round trip / 2); read and\n"
               "atomic are the time from posting to completion; endpoint operations the time from the\n"
               "call to the return of the future's wait(). CPU%% is process CPU time over wall time\n"
               "during the measured part, for each side (100%% = one core).\n",
               static_cast<unsigned>(kDefaultPort));
}

namespace {

Result<int64_t> parseCount(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0' || errno != 0 || value < lo || value > hi) {
    return invalidArgument(flag + " takes a whole number in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], not '" + text + "'");
  }
  return static_cast<int64_t>(value);
}

// "HOST", "HOST:PORT", "[V6ADDR]" or "[V6ADDR]:PORT".
Status parseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  std::string portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) return invalidArgument("bad server address '" + text + "'");
    *host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return invalidArgument("bad server address '" + text + "'");
      portText = text.substr(close + 2);
    }
  } else {
    size_t colon = text.find(':');
    if (colon != std::string::npos && text.find(':', colon + 1) != std::string::npos) {
      *host = text;  // a bare IPv6 address
    } else if (colon != std::string::npos) {
      *host = text.substr(0, colon);
      portText = text.substr(colon + 1);
    } else {
      *host = text;
    }
  }
  if (host->empty()) return invalidArgument("bad server address '" + text + "': no host");
  if (!portText.empty() || text.back() == ':') {
    auto p = parseCount("the server port", portText, 1, 65535);
    if (!p.isOk()) return p.status();
    *port = static_cast<uint16_t>(*p);
  }
  return Status::ok();
}

}  // namespace

Result<Options> parseOptions(const std::vector<std::string>& args) {
  Options o;
  bool server = false, local = false, sweep = false, help = false;
  std::vector<std::string> sizeTexts;
  std::string memory, wait;
  std::string target, softPath, op, api, mode, port, iters, batch, depth, qps, threads, duration, timeout,
      plot;
  std::string pollYield;
  // CLI11 recognises the options and their values; the checks below give each value's own message.
  CLI::App app("perftest-style bandwidth and latency between two processes", "ferry bench");
  app.set_help_flag();  // printUsage() is the help
  app.add_flag("-h,--help", help);
  app.add_flag("--server", server);
  app.add_flag("--local", local);
  app.add_flag("--announce", o.announce);
  app.add_flag("--sweep", sweep);
  app.add_flag("--json", o.json);
  app.add_flag("--call-time", o.shape.callTime);
  app.add_option("--device", o.device);
  app.add_option("--server-device", o.serverDevice);
  app.add_option("--bind", o.bind);
  app.add_option("--plot", plot);
  app.add_option("--soft-path", softPath);
  app.add_option("--memory", memory);
  app.add_option("--wait", wait);
  app.add_option("--op", op);
  app.add_option("--api", api);
  app.add_option("--mode", mode);
  app.add_option("--size", sizeTexts)->expected(1)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  for (auto [name, text] : {std::pair{"--port", &port},
                            {"--iters", &iters},
                            {"--batch", &batch},
                            {"--depth", &depth},
                            {"--qps", &qps},
                            {"--threads", &threads},
                            {"--duration", &duration},
                            {"--timeout", &timeout},
                            {"--poll-yield", &pollYield}}) {
    app.add_option(name, *text);
  }
  app.add_option("target", target, "HOST[:PORT]");
  app.allow_extras();  // reported below, by name
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return invalidArgument(e.what());
  }
  for (const std::string& extra : app.remaining()) {
    if (!extra.empty() && extra[0] == '-') return invalidArgument("unknown option '" + extra + "'");
    return invalidArgument("more than one server address ('" + target + "', '" + extra + "')");
  }
  if (help) return Status(StatusCode::kCancelled, "help");
  if (!plot.empty()) return invalidArgument("--plot is gone: write --json and draw it with bench/plot.py");

  auto given = [&](const char* name) { return app.count(name) > 0; };
  if (given("--soft-path")) {
    if (softPath == "same-host") {
      o.softSameHost = "1";
    } else if (softPath == "ring") {
      o.softSameHost = "ring";
    } else if (softPath == "tcp") {
      o.softSameHost = "0";
    } else {
      return invalidArgument("unknown --soft-path '" + softPath + "': use same-host, ring or tcp");
    }
  }
  if (given("--op") && !parseOp(op, &o.shape.op)) {
    return invalidArgument("unknown --op '" + op + "': use write, read, send, write_imm or atomic");
  }
  if (given("--api") && !parseApi(api, &o.shape.api)) {
    return invalidArgument("unknown --api '" + api + "': use verbs or endpoint");
  }
  if (given("--memory")) {
    if (memory != "heap" && memory != "shared")
      return invalidArgument("unknown --memory '" + memory + "': use heap or shared");
    o.shape.sharedMemory = memory == "shared";
  }
  if (given("--wait")) {
    if (wait != "poll" && wait != "event")
      return invalidArgument("unknown --wait '" + wait + "': use poll or event");
    o.shape.events = wait == "event";
  }
  if (given("--mode") && !parseMode(mode, &o.shape.mode)) {
    return invalidArgument("unknown --mode '" + mode + "': use bw or lat");
  }
  if (o.shape.callTime && (o.shape.api != Api::kVerbs || o.shape.mode != Mode::kLatency)) {
    return invalidArgument(
        "--call-time is for verbs latency runs (--mode lat); the Endpoint API's runs always time "
        "their calls");
  }
  std::vector<uint64_t> sizes;
  for (const std::string& v : sizeTexts) {
    size_t start = 0;
    while (true) {
      size_t comma = v.find(',', start);
      FERRY_ASSIGN_OR_RETURN(uint64_t size,
                             parseSize(std::string_view(v).substr(
                                 start, comma == std::string::npos ? std::string::npos : comma - start)));
      sizes.push_back(size);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  const bool portGiven = given("--port");
  if (portGiven) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--port", port, 0, 65535));
    o.port = static_cast<uint16_t>(n);
  }
  if (given("--iters")) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--iters", iters, 1, int64_t{1} << 40));
    o.iters = static_cast<uint64_t>(n);
  }
  if (given("--batch")) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--batch", batch, 1, kMaxEndpointBatch));
    o.shape.batch = static_cast<int>(n);
  }
  if (given("--depth")) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--depth", depth, 1, kMaxDepth));
    o.shape.depth = static_cast<int>(n);
  }
  if (given("--poll-yield")) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--poll-yield", pollYield, 0, kMaxPollYield));
    o.shape.pollYield = static_cast<int>(n);
  }
  if (given("--qps")) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--qps", qps, 1, kMaxQpsPerThread));
    o.shape.qps = static_cast<int>(n);
  }
  if (given("--threads")) {
    FERRY_ASSIGN_OR_RETURN(int64_t n, parseCount("--threads", threads, 1, kMaxThreads));
    o.shape.threads = static_cast<int>(n);
  }
  for (auto [name, text, out] :
       {std::tuple{"--duration", &duration, &o.duration}, {"--timeout", &timeout, &o.timeout}}) {
    if (!given(name)) continue;
    char* end = nullptr;
    double d = std::strtod(text->c_str(), &end);
    if (text->empty() || *end != '\0' || !std::isfinite(d) || d <= 0 || d > 86400) {
      return invalidArgument(std::string(name) + " takes seconds, a number in (0, 86400], not '" + *text +
                             "'");
    }
    *out = d;
  }

  if (server + local + !target.empty() != 1) {
    return invalidArgument("give exactly one of --server, --local or a server address HOST[:PORT]");
  }
  o.role = server ? Options::Role::kServer : local ? Options::Role::kLocal : Options::Role::kClient;
  if (!target.empty()) {
    uint16_t port = o.port;
    Status st = parseHostPort(target, &o.host, &port);
    if (!st.isOk()) return st;
    if (portGiven && port != o.port) return invalidArgument("two different ports: in the address and --port");
    o.port = port;
    if (o.port == 0)
      return invalidArgument("--port 0 picks a free port for --server only: give the server's port");
  }
  if (o.role != Options::Role::kLocal && !o.serverDevice.empty()) {
    return invalidArgument("--server-device is for --local (the server picks its device with --device)");
  }
  if (o.iters != 0 && o.duration != 0) return invalidArgument("give --iters or --duration, not both");
  if (o.role == Options::Role::kServer) {
    // The client decides the run; a server only chooses where it listens and its device.
    return o;
  }

  if (sweep) sizes.insert(sizes.end(), std::begin(kSweepSizes), std::end(kSweepSizes));
  if (sizes.empty()) {
    if (o.shape.op == Op::kAtomic) {
      sizes.push_back(8);
    } else {
      sizes.assign(std::begin(kSweepSizes), std::end(kSweepSizes));
    }
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  o.sizes = sizes;
  o.shape.maxSize = sizes.back();
  if (o.shape.op == Op::kAtomic && (sizes.size() != 1 || sizes[0] != 8)) {
    return invalidArgument("atomics move 8 bytes: use --size 8 (or no --size) with --op atomic");
  }
  if (o.shape.api == Api::kVerbs && o.shape.batch > o.shape.depth) {
    return invalidArgument("--batch (" + std::to_string(o.shape.batch) + ") cannot exceed --depth (" +
                           std::to_string(o.shape.depth) + ")");
  }
  Status st = validateShape(o.shape);
  if (!st.isOk()) return st;
  return o;
}

}  // namespace ferry::cli::bench
