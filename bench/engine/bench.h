// `ferry bench`: a perftest / ucx_perftest style benchmark of ferry between two processes, at the
// verbs layer (`--api verbs`, the default) or through the Endpoint API (`--api endpoint`). One side
// serves (`--server`), the other connects (`HOST[:PORT]`) or starts the server as a child process
// (`--local`). A TCP control connection carries only parameters, paths or endpoint metadata, memory
// keys and results as versioned JSON lines (see docs/benchmarks.md); data moves by RDMA alone.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/control_channel.h"
#include "ferry/common/status.h"

namespace ferry::cli {

// `ferry bench ...`; self is the absolute path of this binary (the --local server runs it).
int runBench(const std::vector<std::string>& args, const std::string& self);

namespace bench {

inline constexpr uint16_t kDefaultPort = 18520;
// The protocol version this ferry speaks on the control connection ({"ferry_bench": 1, ...}).
inline constexpr int kProtocolVersion = 1;
// The control connection's protocol (ferry::ControlChannel): tag "ferry_bench", lines up to 4 MiB
// (a hello of 1024 QPs' paths fits with room to spare).
inline ControlProtocol controlProtocol() { return {"ferry_bench", kProtocolVersion, size_t{4} << 20}; }
// Largest message one run may use; the buffers of both sides are sized from it.
inline constexpr uint64_t kMaxMessageSize = uint64_t{1} << 30;
// The standard sizes of --sweep.
inline constexpr uint64_t kSweepSizes[] = {8, 4096, 65536, 1u << 20, 16u << 20, 64u << 20};

// --poll-yield's default and limit.
inline constexpr int kDefaultPollYield = 16;
inline constexpr int kMaxPollYield = 1 << 20;

enum class Op : uint8_t { kWrite, kRead, kSend, kWriteImm, kAtomic };
enum class Mode : uint8_t { kBandwidth, kLatency };
// What a run drives: verbs work requests, or the Endpoint API's operations and futures.
enum class Api : uint8_t { kVerbs, kEndpoint };

const char* opName(Op op);        // "write", "read", "send", "write_imm", "atomic"
const char* modeName(Mode mode);  // "bw", "lat"
const char* apiName(Api api);     // "verbs", "endpoint"
bool parseOp(std::string_view text, Op* out);
bool parseMode(std::string_view text, Mode* out);
bool parseApi(std::string_view text, Api* out);

// The shape of a run both sides must agree on; the client sends it in its hello and the server
// checks it with validateShape() before allocating anything.
//
// With Api::kEndpoint the run drives one RDMAEndpoint per side: `qps` is its num_qp, `depth` the
// operations (futures) in flight in bandwidth mode, and `batch` the assignments per call (for send,
// the chunks gathered into one message), each of the message size, in both modes.
struct RunShape {
  Op op = Op::kWrite;
  Mode mode = Mode::kBandwidth;
  Api api = Api::kVerbs;
  int threads = 1;       // each thread has its own CQ, QPs and buffer on both sides
  int qps = 1;           // QPs per thread, used round-robin
  int depth = 64;        // outstanding work requests per QP (bandwidth mode)
  int batch = 1;         // work requests per postSend call (bandwidth mode)
  uint64_t maxSize = 0;  // largest message of the run
  // --memory shared: the verbs buffers come from ProtectionDomain::allocMr (memory a same-host
  // peer of the software provider maps), not from an anonymous mapping.
  bool sharedMemory = false;
  // --wait event: latency loops (and the server's responder) sleep on the CQ's completion channel
  // (arm, poll once more, wait) instead of polling: the event-driven (blocking) variant. Verbs
  // runs of send, write_imm, read and atomic latency; a WRITE ping-pong has no completion to wait
  // for at the side the WRITE lands on.
  bool events = false;
  // --poll-yield N: a latency loop gives the core away (sched_yield) after every Nth poll in a row
  // that did not find what it waits for (the reply, the completion), both sides; 0 never. Between
  // those, no system call, as ib_send_lat and ucx_perftest poll; the yields let a device whose
  // progress runs on threads of its own have the core on a machine with few cores.
  int pollYield = kDefaultPollYield;
  // --call-time: a verbs latency loop also times each postSend call (t_call; call_us in the JSON
  // document), the cost the Endpoint API's own call is compared with. One more clock read per
  // iteration, inside the measured latency, so it is off unless asked for. Client side only; the
  // Endpoint API's runs always time their calls.
  bool callTime = false;
};

inline constexpr int kMaxThreads = 64;
inline constexpr int kMaxQpsPerThread = 256;
inline constexpr int kMaxTotalQps = 1024;
inline constexpr int kMaxDepth = 4096;
// The Endpoint API's limits: queue pairs per endpoint, assignments per call.
inline constexpr int kMaxEndpointQps = 64;
inline constexpr int kMaxEndpointBatch = 1 << 20;
// Memory one side may register for a run: threads x buffer bytes.
inline constexpr uint64_t kMaxRegisteredBytes = uint64_t{8} << 30;

// Bytes of one thread's buffer for a shape: latency WRITE ping-pong keeps a send half and a landing
// half, so twice the largest message; the Endpoint API always has both halves, and for send a
// landing half of `batch` messages; at least one page.
uint64_t bufferBytes(const RunShape& shape);
// Whether latency is a ping-pong (one way = round trip / 2) rather than post-to-completion: verbs
// WRITE, SEND and WRITE_WITH_IMM. Endpoint runs time each operation from its call to its wait().
bool isPingPong(const RunShape& shape);
// The bytes a run's source buffers hold (byte i of the buffer), so that each side can check what
// the other one moved: a period of 251 bytes, which no power-of-two misplacement matches.
inline uint8_t patternByte(uint64_t i) { return static_cast<uint8_t>((i % 251) * 7 + 3); }
// kInvalidArgument naming the first field out of range (and atomics with a size other than 8).
Status validateShape(const RunShape& shape);

struct Options {
  enum class Role : uint8_t { kClient, kServer, kLocal };
  Role role = Role::kClient;
  std::string host;  // client: the server's host name or address
  uint16_t port = kDefaultPort;
  std::string bind = "0.0.0.0";  // server: the address to listen on
  std::string device;            // empty: the device bound to the control connection's address
  std::string serverDevice;      // --local: the server's device (default: same as --device)
  RunShape shape;
  std::vector<uint64_t> sizes;
  uint64_t iters = 0;   // 0: chosen per size (see autoIterations)
  double duration = 0;  // seconds per size; 0: run by iterations
  bool json = false;
  double timeout = 30;    // seconds: control messages and stalled transfers
  bool announce = false;  // server: print {"type":"listening"} on stdout (used by --local)
  // --soft-path: the software provider's path between processes of this host, as
  // FERRY_SOFT_SAME_HOST ("0" tcp, "ring" rings only, "1" rings and one-copy); empty: as set.
  std::string softSameHost;
};

// Parses the arguments after "bench". On a usage error returns kInvalidArgument with the message
// to print; `--help` yields kCancelled (print the usage, exit 0).
Result<Options> parseOptions(const std::vector<std::string>& args);
void printUsage(FILE* out);

// "8", "4K", "64K", "1M", "1536" (exact: a K/M/G suffix only where it divides evenly).
std::string formatSize(uint64_t bytes);
// One size: a positive integer with an optional K, M or G suffix (binary: K = 1024), optionally
// followed by "B" or "iB" ("4K", "4KiB", "64k", "1M"). Refuses 0, garbage and sizes above
// kMaxMessageSize.
Result<uint64_t> parseSize(std::string_view text);

// Iterations when neither --iters nor --duration is given: enough to move a few hundred MiB (at
// least a handful, at most tens of thousands) so every size takes about the same time.
uint64_t autoIterations(Mode mode, uint64_t size);

}  // namespace bench
}  // namespace ferry::cli
