// ferry_objects_bench: the object server (cuobj_server.h) and the object store (objects/store.h)
// against their baselines, measured in one run so the ratios mean something. Nothing here asserts a
// time; docs/performance.md ("Objects") has figures.
//
//   ferry_objects_bench --mode server [--sizes 4K,64K,1M,16M,64M,256M,1G] [--channels 1,2,4,8]
//       GET (handleGetObject: RDMA WRITE into the client) and PUT (handlePutObject: READ from it),
//       sync and async (8 in flight on a channel), against the Endpoint API's raw WRITE/READ of the
//       same bytes between the same two agents (the server's connection to the client); then GET
//       with 1..8 channels, one thread each. Reports GB/s, us per request and the ratio to raw.
//   ferry_objects_bench --mode store [--sizes 1M,16M,64M,256M]
//       an object store in this process, its client in a child process: PUT and GET of the same
//       objects with the payload by RDMA (descriptors) and in the HTTP body. Reports GB/s and the
//       RDMA/HTTP ratio.
//   Common: [--seconds 1] (time per measured point, at least 3 requests) [--json FILE]
//
// Exit codes: 0 done; 1 a failure (printed); 2 bad options.
#include <getopt.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "ferry/agent/agent.h"
#include "ferry/common/config.h"
#include "ferry/cuobj_client.h"
#include "ferry/cuobj_server.h"
#include "ferry/objects/store.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace json = ferry::json;

struct Options {
  std::string mode;
  std::vector<uint64_t> sizes;
  std::vector<int> channels = {1, 2, 4, 8};
  double seconds = 1.0;
  std::string jsonPath;
};

int usage(const std::string& why) {
  std::fprintf(stderr,
               "ferry_objects_bench: %s\nusage: ferry_objects_bench --mode server|store [--sizes LIST] "
               "[--channels LIST] [--seconds S] [--json FILE]\n",
               why.c_str());
  return 2;
}

std::string human(uint64_t n) {
  if (n >= (1ull << 30) && n % (1ull << 30) == 0) return std::to_string(n >> 30) + "G";
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= (1ull << 10) && n % (1ull << 10) == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

// Runs fn (one request of `bytes`) for about `seconds` (at least 3 times): GB/s and us per request.
template <class Fn>
std::pair<double, double> measure(double seconds, uint64_t bytes, Fn fn) {
  fn();  // warm: connections, page faults
  int n = 0;
  auto start = Clock::now();
  double elapsed = 0;
  while (n < 3 || elapsed < seconds) {
    if (!fn()) return {-1, -1};
    ++n;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return {double(bytes) * n / elapsed / 1e9, elapsed / n * 1e6};
}

json::Value row(const std::string& what, uint64_t size, double gbps, double us, double ratio) {
  json::Value r = json::Value::emptyObject();
  r.set("what", what);
  r.set("size", static_cast<int64_t>(size));
  r.set("gbps", gbps);
  r.set("us", us);
  r.set("ratio", ratio);
  return r;
}

CUObjOps_t noOps{.get = nullptr, .put = nullptr};

int serverMode(const Options& o, std::vector<json::Value>& rows) {
  const uint64_t maxSize = *std::max_element(o.sizes.begin(), o.sizes.end());
  cuObjServer server("127.0.0.1", 0, CUOBJ_PROTO_RDMA_DC_V1);
  cuObjClient client(noOps);
  if (!server.isConnected() || !client.isConnected()) return std::fprintf(stderr, "no session\n"), 1;
  void* sbuf = server.allocHostBuffer(maxSize);
  void* cbuf = server.allocHostBuffer(maxSize);
  std::memset(sbuf, 1, maxSize);
  std::memset(cbuf, 2, maxSize);
  rdma_buffer* rb = server.registerBuffer(sbuf, maxSize);
  if (!rb || client.cuMemObjGetDescriptor(cbuf, maxSize) != CU_OBJ_SUCCESS)
    return std::fprintf(stderr, "register\n"), 1;
  // A descriptor serves one request (the server claims it from the client): each measured
  // request mints its token and puts it back afterwards, as a client does.
  auto mint = [&](cuObjOpType_t op) {
    char* token = nullptr;
    return client.cuMemObjGetRDMAToken(cbuf, maxSize, 0, op, &token) == CU_OBJ_SUCCESS ? token : nullptr;
  };
  auto once = [&](cuObjOpType_t op, const std::function<bool(char*)>& use) {
    char* token = mint(op);
    if (token == nullptr) return false;
    bool ok = use(token);
    client.cuMemObjPutRDMAToken(token);
    return ok;
  };
  const uint64_t caddr = reinterpret_cast<uint64_t>(cbuf);

  // The raw baseline: two agents of their own, the same lane, the same sizes, the Endpoint API.
  auto a = ferry::agent::Agent::start({});
  auto b = ferry::agent::Agent::start({});
  if (!a.isOk() || !b.isOk()) return std::fprintf(stderr, "agents\n"), 1;
  if (!(*a)->registerMemoryRegion("src", sbuf, maxSize).isOk() ||
      !(*b)->registerMemoryRegion("dst", cbuf, maxSize).isOk()) {
    return std::fprintf(stderr, "agent regions\n"), 1;
  }
  auto conn = (*a)->connectAddress((*b)->address());
  if (!conn.isOk() || !(*conn)->waitReady(std::chrono::seconds(30)).isOk())
    return std::fprintf(stderr, "wireup\n"), 1;
  auto rawOp = [&](bool write, uint64_t size) {
    ferry::agent::NamedAssignment x{.local = std::string("src"),
                                    .remote = std::string("dst"),
                                    .localOffset = 0,
                                    .remoteOffset = 0,
                                    .length = size};
    auto f = write ? (*conn)->write(std::span(&x, 1)) : (*conn)->read(std::span(&x, 1));
    return f.isOk() && f->wait(std::chrono::seconds(60)).isOk();
  };

  uint16_t ch = server.allocateChannelId();
  std::printf("%-8s %-22s %10s %12s %8s\n", "size", "what", "GB/s", "us/request", "vs raw");
  for (uint64_t size : o.sizes) {
    auto rawW = measure(o.seconds, size, [&] { return rawOp(true, size); });
    auto rawR = measure(o.seconds, size, [&] { return rawOp(false, size); });
    auto g = measure(o.seconds, size, [&] {
      return once(CUOBJ_GET, [&](char* t) {
        return server.handleGetObject("b", rb, caddr, size, t, ch) == ssize_t(size);
      });
    });
    auto p = measure(o.seconds, size, [&] {
      return once(CUOBJ_PUT, [&](char* t) {
        return server.handlePutObject("b", rb, caddr, size, t, ch) == ssize_t(size);
      });
    });
    // Async: 8 in flight on the channel, each with its own token.
    auto ga = measure(o.seconds, size * 8, [&] {
      std::vector<char*> tokens;
      bool ok = true;
      for (int i = 0; i < 8 && ok; ++i) {
        char* t = mint(CUOBJ_GET);
        if (t == nullptr) break;
        tokens.push_back(t);
        ok = server.handleGetObject("a", rb, caddr, size, t, ch, 0, nullptr,
                                    reinterpret_cast<void*>(i + 1)) == 0;
      }
      int done = 0;
      cuObjAsyncEvent_t ev[16];
      while (ok && done < static_cast<int>(tokens.size())) {
        int n = server.poll(ev, 16, ch);
        if (n < 0)
          ok = false;
        else
          done += n;
      }
      for (char* t : tokens) client.cuMemObjPutRDMAToken(t);
      return ok && tokens.size() == 8;
    });
    struct Line {
      const char* what;
      std::pair<double, double> m;
      double base;
    } lines[] = {{"raw WRITE (Endpoint)", rawW, rawW.first},
                 {"GET sync", g, rawW.first},
                 {"GET async x8", ga, rawW.first},
                 {"raw READ (Endpoint)", rawR, rawR.first},
                 {"PUT sync", p, rawR.first}};
    for (const auto& l : lines) {
      double ratio = l.base > 0 ? l.m.first / l.base : 0;
      std::printf("%-8s %-22s %10.2f %12.1f %7.2fx\n", human(size).c_str(), l.what, l.m.first, l.m.second,
                  ratio);
      rows.push_back(row(l.what, size, l.m.first, l.m.second, ratio));
    }
  }
  server.freeChannelId(ch);
  // Channels: one thread per channel, sync GETs of the largest size up to 64 MiB.
  const uint64_t size = std::min<uint64_t>(maxSize, 64ull << 20);
  for (int channels : o.channels) {
    std::atomic<uint64_t> bytes{0};
    std::atomic<bool> stop{false}, failed{false};
    std::vector<std::thread> threads;
    auto start = Clock::now();
    for (int t = 0; t < channels; ++t) {
      threads.emplace_back([&] {
        uint16_t c = server.allocateChannelId();
        while (!stop) {
          bool ok = once(CUOBJ_GET, [&](char* t) {
            return server.handleGetObject("c", rb, caddr, size, t, c) == ssize_t(size);
          });
          if (!ok) failed = true;
          bytes += size;
        }
        server.freeChannelId(c);
      });
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
    stop = true;
    for (auto& t : threads) t.join();
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    double gbps = failed ? -1 : bytes / secs / 1e9;
    std::printf("%-8s %-22s %10.2f %12s %8s\n", human(size).c_str(),
                ("GET, " + std::to_string(channels) + " channels").c_str(), gbps, "", "");
    rows.push_back(row("GET channels " + std::to_string(channels), size, gbps, 0, 0));
  }
  server.deRegisterBuffer(rb);
  (void)client.cuMemObjPutDescriptor(cbuf);
  (*a)->shutdown();
  (*b)->shutdown();
  std::free(sbuf);
  std::free(cbuf);
  return 0;
}

// The store's client process: for each line "SIZE RDMA(0/1) OP(put/get)" on stdin, one measured
// point; answers "GBPS US" on stdout.
int clientMode(const Options& o, const std::string& url) {
  FILE* in = stdin;
  FILE* out = stdout;
  unsigned long long size = 0;
  int rdma = 0;
  char op[8];
  std::unique_ptr<ferry::objects::ObjectClient> clients[2];
  for (int r = 0; r < 2; ++r) {
    ferry::objects::ClientOptions co;
    co.rdma = r == 1;
    co.pieceBytes = 1ull << 30;
    auto c = ferry::objects::ObjectClient::connect(url, co);
    if (!c.isOk()) _exit(1);
    clients[r] = std::move(*c);
  }
  if (!clients[0]->createBucket("bench").isOk()) _exit(1);
  std::vector<char> buf;
  while (std::fscanf(in, "%llu %d %7s", &size, &rdma, op) == 3) {
    buf.assign(size, 'x');
    auto& c = clients[rdma];
    std::string key = "o" + std::to_string(size);
    if (!c->put("bench", key, buf.data(), size).isOk()) _exit(1);
    auto m = measure(o.seconds, size, [&] {
      return std::string(op) == "put" ? c->put("bench", key, buf.data(), size).isOk()
                                      : c->get("bench", key, buf.data(), size).isOk();
    });
    std::fprintf(out, "%f %f\n", m.first, m.second);
    std::fflush(out);
  }
  return 0;
}

int storeMode(const Options& o, std::vector<json::Value>& rows) {
  auto store = ferry::objects::ObjectStore::start({});
  if (!store.isOk()) return std::fprintf(stderr, "%s\n", store.status().toString().c_str()), 1;
  const std::string url = (*store)->url();
  int toChild[2], fromChild[2];
  if (pipe(toChild) != 0 || pipe(fromChild) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    // The client runs this program anew (a forked copy of a process with threads cannot start
    // devices of its own): --client URL, commands on stdin, answers on stdout.
    dup2(toChild[0], STDIN_FILENO);
    dup2(fromChild[1], STDOUT_FILENO);
    close(toChild[1]);
    close(fromChild[0]);
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) _exit(1);
    self[n] = '\0';
    std::string seconds = std::to_string(o.seconds);
    execl(self, self, "--client", url.c_str(), "--seconds", seconds.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(toChild[0]);
  close(fromChild[1]);
  FILE* to = fdopen(toChild[1], "w");
  FILE* from = fdopen(fromChild[0], "r");
  std::printf("%-8s %-5s %14s %14s %10s\n", "size", "op", "RDMA GB/s", "HTTP GB/s", "RDMA/HTTP");
  int rc = 0;
  for (uint64_t size : o.sizes) {
    for (const char* op : {"put", "get"}) {
      double g[2] = {0, 0}, us[2] = {0, 0};
      for (int r = 0; r < 2; ++r) {
        std::fprintf(to, "%llu %d %s\n", static_cast<unsigned long long>(size), r, op);
        std::fflush(to);
        if (std::fscanf(from, "%lf %lf", &g[r], &us[r]) != 2) {
          std::fprintf(stderr, "the client process failed\n");
          rc = 1;
          break;
        }
      }
      if (rc) break;
      double ratio = g[0] > 0 ? g[1] / g[0] : 0;
      std::printf("%-8s %-5s %14.2f %14.2f %9.2fx\n", human(size).c_str(), op, g[1], g[0], ratio);
      rows.push_back(row(std::string("store ") + op + " rdma", size, g[1], us[1], ratio));
      rows.push_back(row(std::string("store ") + op + " http", size, g[0], us[0], 1.0));
    }
    if (rc) break;
  }
  std::fclose(to);
  int status = 0;
  waitpid(pid, &status, 0);
  (*store)->stop();
  return rc ? rc : (WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string sizes, channels, client;
  static option longOpts[] = {
      {"mode", required_argument, nullptr, 'm'},     {"sizes", required_argument, nullptr, 's'},
      {"channels", required_argument, nullptr, 'c'}, {"seconds", required_argument, nullptr, 't'},
      {"json", required_argument, nullptr, 'j'},     {"client", required_argument, nullptr, 'C'},
      {"help", no_argument, nullptr, 'h'},           {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "", longOpts, nullptr)) != -1) {
    switch (opt) {
      case 'm': o.mode = optarg; break;
      case 's': sizes = optarg; break;
      case 'c': channels = optarg; break;
      case 't': o.seconds = std::atof(optarg); break;
      case 'j': o.jsonPath = optarg; break;
      case 'C': o.mode = "client", client = optarg; break;
      case 'h': std::printf("see the top of bench/objects_bench.cc\n"); return 0;
      default: return usage("unknown option");
    }
  }
  if (optind != argc) return usage(std::string("unexpected argument '") + argv[optind] + "'");
  if (o.mode == "client") return clientMode(o, client);
  if (o.mode != "server" && o.mode != "store") return usage("--mode must be server or store");
  if (!(o.seconds > 0 && o.seconds <= 600)) return usage("--seconds must be in (0, 600]");
  if (sizes.empty()) sizes = o.mode == "server" ? "4K,64K,1M,16M,64M,256M,1G" : "1M,16M,64M,256M";
  size_t start = 0;
  while (start <= sizes.size()) {
    size_t comma = sizes.find(',', start);
    std::string item = sizes.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto v = ferry::config::parseByteSize(item);
    if (!v.isOk() || *v == 0 || *v > (1ull << 30))
      return usage("--sizes: '" + item + "' is not a size in 1..1G");
    o.sizes.push_back(*v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (!channels.empty()) {
    o.channels.clear();
    for (size_t s = 0; s <= channels.size();) {
      size_t comma = channels.find(',', s);
      int c =
          std::atoi(channels.substr(s, comma == std::string::npos ? std::string::npos : comma - s).c_str());
      if (c < 1 || c > 64) return usage("--channels: each count must be 1..64");
      o.channels.push_back(c);
      if (comma == std::string::npos) break;
      s = comma + 1;
    }
  }
  std::vector<json::Value> rows;
  int rc = o.mode == "server" ? serverMode(o, rows) : storeMode(o, rows);
  if (rc == 0 && !o.jsonPath.empty()) {
    json::Value doc = json::Value::emptyObject();
    doc.set("bench", "objects");
    doc.set("mode", o.mode);
    doc.set("rows", json::Value(std::move(rows)));
    std::ofstream(o.jsonPath) << json::serialize(doc) << "\n";
  }
  return rc;
}
