// Command-line options of `ferry bench` and the checks both sides apply to a run's shape.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

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
    return invalidArgument("--api endpoint offers write, read, send and write_imm (the Endpoint API has no atomics)");
  }
  if (s.threads != 1) {
    return invalidArgument("--api endpoint drives one endpoint: --threads must be 1 (use --qps for its queue pairs)");
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
      return invalidArgument(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                             "], not " + std::to_string(value));
    }
    return Status::ok();
  };
  Status st = range("threads", s.threads, 1, kMaxThreads);
  if (st.isOk()) st = range("qps", s.qps, 1, kMaxQpsPerThread);
  if (st.isOk()) st = range("depth", s.depth, 1, kMaxDepth);
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
    return invalidArgument("bad size '" + std::string(text) + "': larger than 1G, the largest message ferry bench moves");
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
    return invalidArgument(flag + " takes a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                           "], not '" + text + "'");
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
  bool server = false, local = false, sweep = false, portGiven = false;
  std::vector<uint64_t> sizes;
  std::string target;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) -> Status {
      if (i + 1 >= args.size()) return invalidArgument(a + " needs a value");
      *out = args[++i];
      return Status::ok();
    };
    std::string v;
    Status st;
    if (a == "-h" || a == "--help") {
      return Status(StatusCode::kCancelled, "help");
    } else if (a == "--server") {
      server = true;
    } else if (a == "--local") {
      local = true;
    } else if (a == "--announce") {
      o.announce = true;
    } else if (a == "--sweep") {
      sweep = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--device") {
      st = value(&o.device);
    } else if (a == "--server-device") {
      st = value(&o.serverDevice);
    } else if (a == "--bind") {
      st = value(&o.bind);
    } else if (a == "--plot") {
      st = invalidArgument("--plot is gone: write --json and draw it with bench/plot.py");
    } else if (a == "--soft-path") {
      if ((st = value(&v)).isOk()) {
        if (v == "same-host") {
          o.softSameHost = "1";
        } else if (v == "ring") {
          o.softSameHost = "ring";
        } else if (v == "tcp") {
          o.softSameHost = "0";
        } else {
          st = invalidArgument("unknown --soft-path '" + v + "': use same-host, ring or tcp");
        }
      }
    } else if (a == "--op") {
      if ((st = value(&v)).isOk() && !parseOp(v, &o.shape.op)) {
        st = invalidArgument("unknown --op '" + v + "': use write, read, send, write_imm or atomic");
      }
    } else if (a == "--api") {
      if ((st = value(&v)).isOk() && !parseApi(v, &o.shape.api)) {
        st = invalidArgument("unknown --api '" + v + "': use verbs or endpoint");
      }
    } else if (a == "--mode") {
      if ((st = value(&v)).isOk() && !parseMode(v, &o.shape.mode)) {
        st = invalidArgument("unknown --mode '" + v + "': use bw or lat");
      }
    } else if (a == "--size") {
      if ((st = value(&v)).isOk()) {
        size_t start = 0;
        while (st.isOk()) {
          size_t comma = v.find(',', start);
          auto size = parseSize(std::string_view(v).substr(start, comma == std::string::npos ? std::string::npos
                                                                                            : comma - start));
          if (!size.isOk()) {
            st = size.status();
          } else {
            sizes.push_back(*size);
          }
          if (comma == std::string::npos) break;
          start = comma + 1;
        }
      }
    } else if (a == "--port" || a == "--iters" || a == "--batch" || a == "--depth" || a == "--qps" ||
               a == "--threads") {
      if ((st = value(&v)).isOk()) {
        int64_t lo = a == "--port" ? 0 : 1;
        int64_t hi = a == "--port" ? 65535 : a == "--iters" ? int64_t{1} << 40 : a == "--threads" ? kMaxThreads
                     : a == "--qps" ? kMaxQpsPerThread : a == "--batch" ? kMaxEndpointBatch : kMaxDepth;
        auto n = parseCount(a, v, lo, hi);
        if (!n.isOk()) {
          st = n.status();
        } else if (a == "--port") {
          o.port = static_cast<uint16_t>(*n);
          portGiven = true;
        } else if (a == "--iters") {
          o.iters = static_cast<uint64_t>(*n);
        } else if (a == "--batch") {
          o.shape.batch = static_cast<int>(*n);
        } else if (a == "--depth") {
          o.shape.depth = static_cast<int>(*n);
        } else if (a == "--qps") {
          o.shape.qps = static_cast<int>(*n);
        } else {
          o.shape.threads = static_cast<int>(*n);
        }
      }
    } else if (a == "--duration" || a == "--timeout") {
      if ((st = value(&v)).isOk()) {
        char* end = nullptr;
        double d = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !std::isfinite(d) || d <= 0 || d > 86400) {
          st = invalidArgument(a + " takes seconds, a number in (0, 86400], not '" + v + "'");
        } else if (a == "--duration") {
          o.duration = d;
        } else {
          o.timeout = d;
        }
      }
    } else if (!a.empty() && a[0] == '-') {
      st = invalidArgument("unknown option '" + a + "'");
    } else if (target.empty()) {
      target = a;
    } else {
      st = invalidArgument("more than one server address ('" + target + "', '" + a + "')");
    }
    if (!st.isOk()) return st;
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
    if (o.port == 0) return invalidArgument("--port 0 picks a free port for --server only: give the server's port");
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
