// `ferry objects`: the object store (include/ferry/objects/store.h) and its client.
//   ferry objects serve [--host A] [--port N] [--rdma-host A] [--rdma-port N] [--data-dir DIR]
//                       [--max-body SIZE] [--max-receiving SIZE] [--max-connections N]
//                       [--max-memory SIZE] [--upload-expiry SECONDS]
//                       [--header-timeout MS] [--idle-timeout MS] [--insecure-allow-remote]
//   ferry objects mb URL | rb URL | ls URL | rm URL
//   ferry objects put FILE URL [--http] [--piece SIZE]
//   ferry objects get URL FILE [--http] [--piece SIZE]
// URL: http://HOST:PORT/BUCKET[/KEY]. put and get draw a progress bar on a terminal and print the
// bytes and rate when done; --http moves the payload in the HTTP body instead of by RDMA.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "ferry/common/config.h"
#include "ferry/objects/store.h"
#include "progress.h"

namespace ferry::cli {
namespace {

int fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "ferry objects %s: %s\n", what.c_str(), st.toString().c_str());
  return st.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

int serve(const std::vector<std::string>& args) {
  objects::StoreOptions o;
  o.port = 9000;
  int port = 9000, rdmaPort = 0;
  CLI::App app(
      "Serves the object store (S3-style HTTP; payloads by RDMA with ferry's client) until SIGINT or SIGTERM",
      "ferry objects serve");
  app.add_option("--host", o.host, "The HTTP address (and the object server's, unless --rdma-host)")
      ->capture_default_str();
  app.add_option("--port", port, "The HTTP port (0 picks a free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--rdma-host", o.rdmaHost, "The object server's session address (default: --host)");
  app.add_option("--rdma-port", rdmaPort, "Its port (0 picks one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--data-dir", o.dataDir, "Keep objects as files DIR/BUCKET/KEY too, and load them at start");
  app.add_option("--threads", o.threads, "HTTP workers started at once (more start on demand)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  std::string maxBody = "5G", maxReceiving = "16G";
  app.add_option("--max-body", maxBody, "The largest body of one PUT (larger: 400 EntityTooLarge)")
      ->capture_default_str();
  app.add_option("--max-receiving", maxReceiving,
                 "Declared bytes of bodies and uploads received at once, over all clients (past it: 503 SlowDown)")
      ->capture_default_str();
  std::string maxMemory;
  app.add_option(
      "--max-memory", maxMemory,
      "Bytes of objects and uploads held in memory (past it: 507 InsufficientStorage; default: half "
      "of physical memory)");
  app.add_option("--upload-expiry", o.abandonedUploadSeconds,
                 "Seconds after which a multipart upload with no call is dropped with its parts")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{365} * 24 * 3600));
  app.add_option("--max-connections", o.maxConnections, "Connections served at once (past it: 503 SlowDown)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--header-timeout", o.headerTimeoutMs, "Milliseconds for a request's line and headers")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  app.add_option("--idle-timeout", o.idleTimeoutMs,
                 "Milliseconds a connection may wait for the next byte of a body or request")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  app.add_flag("--insecure-allow-remote", o.allowRemoteWithoutCredentials,
               "Without credentials, serve clients of other hosts too (anyone who can reach the port may read, "
               "replace and delete every object)");
  if (auto code = parseCommand(app, "objects serve", args)) return *code;
  auto bodyBytes = config::parseByteSize(maxBody);
  if (!bodyBytes.isOk()) return fail("serve", bodyBytes.status());
  auto receivingBytes = config::parseByteSize(maxReceiving);
  if (!receivingBytes.isOk()) return fail("serve", receivingBytes.status());
  o.maxBodyBytes = *bodyBytes;
  o.maxReceivingBytes = *receivingBytes;
  if (!maxMemory.empty()) {
    auto memoryBytes = config::parseByteSize(maxMemory);
    if (!memoryBytes.isOk()) return fail("serve", memoryBytes.status());
    if (*memoryBytes == 0) return fail("serve", invalidArgument("--max-memory must be at least 1 byte"));
    o.maxMemoryBytes = *memoryBytes;
  }
  o.port = static_cast<uint16_t>(port);
  o.rdmaPort = static_cast<uint16_t>(rdmaPort);
  sigset_t stopSignals;
  sigemptyset(&stopSignals);
  sigaddset(&stopSignals, SIGINT);
  sigaddset(&stopSignals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
  auto store = objects::ObjectStore::start(o);
  if (!store.isOk()) return fail("serve", store.status());
  const bool open = o.accessKey.empty() && config::objectsAccessKey().empty();
  std::printf("ferry objects: serving %s%s\n", (*store)->url().c_str(),
              !open                             ? " (AWS SigV4 required)"
              : o.allowRemoteWithoutCredentials ? " (no credentials, open to every host)"
                                                : " (no credentials: clients of this host only)");
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stopSignals, &signal);
  (*store)->stop();
  return 0;
}

struct ClientArgs {
  bool http = false;
  std::string piece = "64M";
};

Result<std::unique_ptr<objects::ObjectClient>> client(const std::string& base, const ClientArgs& a,
                                                      ProgressBar* bar, const std::string& label) {
  objects::ClientOptions o;
  o.rdma = !a.http;
  FERRY_ASSIGN_OR_RETURN(o.pieceBytes, config::parseByteSize(a.piece));
  if (bar)
    o.progress = [bar, label](uint64_t done, uint64_t total) {
      bar->show(label, total ? double(done) / total : 1);
    };
  return objects::ObjectClient::connect(base, o);
}

int transfer(bool put, const std::vector<std::string>& args) {
  const char* name = put ? "put" : "get";
  std::string first, second;
  ClientArgs a;
  CLI::App app(put ? "Stores FILE as the object at URL (http://HOST:PORT/BUCKET/KEY)"
                   : "Writes the object at URL (http://HOST:PORT/BUCKET/KEY) to FILE",
               std::string("ferry objects ") + name);
  app.add_option(put ? "FILE" : "URL", first, put ? "The file to store" : "The object")->required();
  app.add_option(put ? "URL" : "FILE", second, put ? "Where to store it" : "The file to write")->required();
  app.add_flag("--http", a.http, "Move the payload in the HTTP body (no RDMA)");
  app.add_option("--piece", a.piece, "Bytes per request (64M, 1G, ...)")->capture_default_str();
  if (auto code = parseCommand(app, std::string("objects ") + name, args)) return *code;
  const std::string& url = put ? second : first;
  const std::string& file = put ? first : second;
  auto u = objects::parseObjectUrl(url);
  if (!u.isOk()) return fail(name, u.status());
  if (u->bucket.empty() || u->key.empty())
    return fail(name, invalidArgument("the URL names no bucket and key"));
  ProgressBar bar(isatty(STDERR_FILENO) == 1);
  auto c = client(u->base, a, &bar, u->key.size() > 18 ? u->key.substr(u->key.size() - 18) : u->key);
  if (!c.isOk()) return fail(name, c.status());
  auto start = std::chrono::steady_clock::now();
  Status st = put ? (*c)->putFile(u->bucket, u->key, file) : (*c)->getFile(u->bucket, u->key, file);
  bar.clear();
  if (!st.isOk()) return fail(name, st);
  auto info = (*c)->head(u->bucket, u->key);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = info.isOk() ? info->size : 0;
  std::printf("%s %s %s: %llu bytes in %.3f s (%.1f MB/s, %s)\n", put ? "stored" : "fetched", file.c_str(),
              url.c_str(), static_cast<unsigned long long>(bytes), secs, secs > 0 ? bytes / secs / 1e6 : 0.0,
              a.http ? "HTTP body" : "RDMA");
  return 0;
}

int simple(const std::string& what, const std::vector<std::string>& args) {
  std::string url;
  CLI::App app(what == "ls"
                   ? "Lists the buckets (URL without a bucket) or a bucket's objects (a key is a prefix)"
               : what == "mb" ? "Creates the bucket of URL"
               : what == "rb" ? "Removes the (empty) bucket of URL"
                              : "Removes the object at URL",
               "ferry objects " + what);
  app.add_option("URL", url, "http://HOST:PORT[/BUCKET[/KEY]]")->required();
  if (auto code = parseCommand(app, "objects " + what, args)) return *code;
  auto u = objects::parseObjectUrl(url);
  if (!u.isOk()) return fail(what, u.status());
  ClientArgs a;
  a.http = true;  // no payloads: no RDMA session needed
  auto c = client(u->base, a, nullptr, "");
  if (!c.isOk()) return fail(what, c.status());
  if (what == "ls") {
    if (u->bucket.empty()) {
      auto b = (*c)->buckets();
      if (!b.isOk()) return fail(what, b.status());
      for (const auto& name : *b) std::printf("%s/\n", name.c_str());
      return 0;
    }
    auto objects = (*c)->list(u->bucket, u->key);
    if (!objects.isOk()) return fail(what, objects.status());
    for (const auto& o : *objects)
      std::printf("%12llu  %s\n", static_cast<unsigned long long>(o.size), o.key.c_str());
    return 0;
  }
  if (u->bucket.empty()) return fail(what, invalidArgument("the URL names no bucket"));
  Status st;
  if (what == "mb")
    st = (*c)->createBucket(u->bucket);
  else if (what == "rb")
    st = (*c)->deleteBucket(u->bucket);
  else if (u->key.empty())
    st = invalidArgument("the URL names no key");
  else
    st = (*c)->remove(u->bucket, u->key);
  return st.isOk() ? 0 : fail(what, st);
}

}  // namespace

int runObjects(const std::vector<std::string>& args) {
  const char* usage =
      "usage: ferry objects serve [--host A] [--port N] [--rdma-host A] [--rdma-port N] [--data-dir DIR]\n"
      "                           [--max-body SIZE] [--max-receiving SIZE] [--max-connections N]\n"
      "                           [--header-timeout MS] [--idle-timeout MS] [--insecure-allow-remote]\n"
      "       ferry objects put FILE URL [--http] [--piece SIZE]\n"
      "       ferry objects get URL FILE [--http] [--piece SIZE]\n"
      "       ferry objects ls|mb|rb|rm URL          (URL: http://HOST:PORT[/BUCKET[/KEY]])\n";
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(usage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (Status st = config::check(); !st.isOk()) return fail(args[0], st);
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "serve") return serve(rest);
  if (args[0] == "put") return transfer(true, rest);
  if (args[0] == "get") return transfer(false, rest);
  if (args[0] == "ls" || args[0] == "mb" || args[0] == "rb" || args[0] == "rm") return simple(args[0], rest);
  std::fprintf(stderr, "ferry objects: unknown command '%s'\n%s", args[0].c_str(), usage);
  return 2;
}

}  // namespace ferry::cli
