// `ferry objects`: the object store (include/ferry/objects/store.h) and its client.
//   ferry objects serve [options]          (ferry objects serve --help lists them)
//   ferry objects put FILE URL [--http] [--piece SIZE]
//   ferry objects get URL FILE [--http] [--piece SIZE]
//   ferry objects ls|mb|rb|rm URL
// URL: http://HOST:PORT[/BUCKET[/KEY]]. put without a KEY, or with one ending in '/', adds FILE's
// name (as `aws s3 cp` does); get into a directory writes DIR/(the key's last part). put and get
// draw a progress bar on a terminal and print the bytes and rate when done; --http moves the
// payload in the HTTP body instead of by RDMA.
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "ferry/common/config.h"
#include "ferry/objects/store.h"
#include "progress.h"

namespace ferry::cli {
namespace {

// A bad argument is its message alone and exit code 2, like a bad option; any other error names its
// status code and is exit code 1.
int objectsFailed(const std::string& what, const Status& st) {
  if (st.code() == StatusCode::kInvalidArgument) return usageError("ferry objects " + what, st.message());
  std::fprintf(stderr, "ferry objects %s: %s\n", what.c_str(), st.toString().c_str());
  return 1;
}

// Why nothing takes a TCP connection at `base` (http://HOST:PORT), or "" when something does: the
// HTTP client says only "Connection", and "connection refused" tells a user the server is down.
std::string whyUnreachable(const std::string& base) {
  std::string authority = base.substr(std::strlen("http://"));
  const size_t colon = authority.rfind(':');
  std::string host = authority.substr(0, colon), port = authority.substr(colon + 1);
  if (host.size() > 1 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  }
  int error = ETIMEDOUT;
  for (addrinfo* a = found; a != nullptr && error != 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    error = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      socklen_t len = sizeof error;
      error =
          poll(&p, 1, 3000) == 1 ? (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len), error) : ETIMEDOUT;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (error == 0) return "";
  std::string why = std::strerror(error);
  if (!why.empty()) why.front() = static_cast<char>(std::tolower(static_cast<unsigned char>(why.front())));
  return why;
}

// The client's error in the words a user acts on: that no server answers at the URL, or which of
// the bucket and the object is missing. A 404 names neither (a HEAD answer has no document), so
// the store's own list of buckets tells.
Status explain(const Status& st, const objects::ObjectUrl& u, objects::ObjectClient* client) {
  if (st.code() == StatusCode::kUnavailable) {
    std::string why = whyUnreachable(u.base);
    if (!why.empty())
      return Status(StatusCode::kUnavailable, "no server answers at " + u.base + " (" + why + ")");
    return st;
  }
  if (st.code() != StatusCode::kNotFound || client == nullptr || u.bucket.empty()) return st;
  auto buckets = client->buckets();
  if (!buckets.isOk()) return st;
  if (std::find(buckets->begin(), buckets->end(), u.bucket) == buckets->end())
    return Status(StatusCode::kNotFound, "no bucket '" + u.bucket + "'");
  if (!u.key.empty())
    return Status(StatusCode::kNotFound, "no object '" + u.key + "' in bucket '" + u.bucket + "'");
  return st;
}

// The exit codes of the client's commands.
CommandHelp clientHelp(const std::string& done) {
  return {.usage = {},
          .commands = {},
          .done = done,
          .failed =
              "no server answers at URL, or the store refused the request (the line says why: no bucket, "
              "no object, access denied, ...)"};
}

int serve(const std::vector<std::string>& args) {
  objects::StoreOptions o;
  o.port = 9000;
  int port = 9000, rdmaPort = 0;
  CLI::App app(
      "Serves the object store (S3-style HTTP; payloads by RDMA with ferry's client) in the foreground until "
      "SIGINT or SIGTERM; prints \"ferry objects: serving URL\" when ready.",
      "ferry objects serve");
  app.add_option("--host", o.host, "the HTTP address (and the object server's, unless --rdma-host)")
      ->option_text("ADDRESS")
      ->capture_default_str();
  app.add_option("--port", port, "the HTTP port (0 picks a free one)")
      ->option_text("N")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--rdma-host", o.rdmaHost, "the object server's session address (default: --host)")
      ->option_text("ADDRESS");
  app.add_option("--rdma-port", rdmaPort, "its port (0 picks one)")
      ->option_text("N")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option(
         "--data-dir", o.dataDir,
         "keep objects on disk, as files DIR/BUCKET/KEY (memory is their cache); a restart serves them again")
      ->option_text("DIR");
  app.add_option("--threads", o.threads, "the HTTP workers started at once (more start on demand)")
      ->option_text("N")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  std::string maxBody = "5G", maxReceiving = "16G";
  app.add_option("--max-body", maxBody, "the largest body of one PUT (larger: 400 EntityTooLarge)")
      ->option_text("SIZE")
      ->capture_default_str();
  app.add_option(
         "--max-receiving", maxReceiving,
         "declared bytes of bodies and uploads received at once, over all clients (past it: 503 SlowDown)")
      ->option_text("SIZE")
      ->capture_default_str();
  std::string maxMemory;
  app.add_option(
         "--max-memory", maxMemory,
         "bytes of objects and uploads held in memory (past it: 507 InsufficientStorage; with --data-dir "
         "the memory cache's bound, least recently used objects dropped first; default: half of physical "
         "memory)")
      ->option_text("SIZE");
  app.add_option("--upload-expiry", o.abandonedUploadSeconds,
                 "seconds after which a multipart upload with no call is dropped with its parts")
      ->option_text("SECONDS")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{365} * 24 * 3600));
  app.add_option("--max-connections", o.maxConnections, "connections served at once (past it: 503 SlowDown)")
      ->option_text("N")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--header-timeout", o.headerTimeoutMs, "milliseconds for a request's line and headers")
      ->option_text("MS")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  app.add_option("--idle-timeout", o.idleTimeoutMs,
                 "milliseconds a connection may wait for the next byte of a body or request")
      ->option_text("MS")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  app.add_flag(
      "--insecure-allow-remote", o.allowRemoteWithoutCredentials,
      "without credentials, serve clients of other hosts too (anyone who can reach the port may read, "
      "replace and delete every object)");
  const CommandHelp help{
      .usage = {},
      .commands = {},
      .done = "stopped by SIGINT or SIGTERM",
      .failed = "the store could not start (the port is taken, --data-dir cannot be read, ...)"};
  if (auto code = parseCommand(app, help, args)) return *code;
  auto bodyBytes = config::parseByteSize(maxBody);
  if (!bodyBytes.isOk()) return objectsFailed("serve", bodyBytes.status());
  auto receivingBytes = config::parseByteSize(maxReceiving);
  if (!receivingBytes.isOk()) return objectsFailed("serve", receivingBytes.status());
  o.maxBodyBytes = *bodyBytes;
  o.maxReceivingBytes = *receivingBytes;
  if (!maxMemory.empty()) {
    auto memoryBytes = config::parseByteSize(maxMemory);
    if (!memoryBytes.isOk()) return objectsFailed("serve", memoryBytes.status());
    if (*memoryBytes == 0)
      return objectsFailed("serve", invalidArgument("--max-memory must be at least 1 byte"));
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
  if (!store.isOk()) return objectsFailed("serve", store.status());
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

std::string objectUrl(const objects::ObjectUrl& u) { return u.base + "/" + u.bucket + "/" + u.key; }

// put's FILE and URL, checked before anything moves: FILE a readable file; a URL without a key, or
// with one ending in '/', takes FILE's name after it.
Status resolvePut(const std::string& file, objects::ObjectUrl& u) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return invalidArgument("no file '" + file + "'");
  if (std::filesystem::is_directory(file, ec))
    return invalidArgument("'" + file + "' is a directory, not a file");
  if (access(file.c_str(), R_OK) != 0)
    return invalidArgument("cannot read '" + file + "': " + std::strerror(errno));
  if (u.bucket.empty()) return invalidArgument("the URL names no bucket (http://HOST:PORT/BUCKET[/KEY])");
  if (u.key.empty() || u.key.back() == '/') u.key += std::filesystem::path(file).filename().string();
  return Status::ok();
}

// get's URL and FILE: the URL names an object; FILE an existing directory takes the key's last part
// after it, and a FILE elsewhere needs its directory to exist.
Status resolveGet(const objects::ObjectUrl& u, std::string& file) {
  if (u.bucket.empty() || u.key.empty() || u.key.back() == '/')
    return invalidArgument("the URL names no object (http://HOST:PORT/BUCKET/KEY)");
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    file = (std::filesystem::path(file) / std::filesystem::path(u.key).filename()).string();
    return Status::ok();
  }
  std::filesystem::path dir = std::filesystem::path(file).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    return invalidArgument("no directory '" + dir.string() + "' for '" + file + "'");
  return Status::ok();
}

int putOrGet(bool put, const std::vector<std::string>& args) {
  const char* name = put ? "put" : "get";
  std::string first, second;
  ClientArgs a;
  CLI::App app(
      put ? "Stores FILE as the object at URL. Without a KEY, or with a KEY ending in '/', the key ends "
            "with FILE's name (as with `aws s3 cp`): put w.bin http://HOST:PORT/models/ stores models/w.bin."
          : "Writes the object at URL to FILE; into DIR/NAME when FILE is a directory (NAME: the key's "
            "last part).",
      std::string("ferry objects ") + name);
  app.add_option(put ? "FILE" : "URL", first, put ? "the file to store" : "http://HOST:PORT/BUCKET/KEY")
      ->required();
  app.add_option(put ? "URL" : "FILE", second,
                 put ? "http://HOST:PORT/BUCKET[/KEY]" : "the file (or directory) to write")
      ->required();
  app.add_flag("--http", a.http, "move the payload in the HTTP body (no RDMA)");
  app.add_option("--piece", a.piece, "bytes per request (64M, 1G, ...)")
      ->option_text("SIZE")
      ->capture_default_str();
  if (auto code = parseCommand(app, clientHelp(put ? "stored" : "fetched"), args)) return *code;
  std::string file = put ? first : second;
  auto u = objects::parseObjectUrl(put ? second : first);
  if (!u.isOk()) return objectsFailed(name, u.status());
  if (Status st = put ? resolvePut(file, *u) : resolveGet(*u, file); !st.isOk())
    return objectsFailed(name, st);
  ProgressBar bar(isatty(STDERR_FILENO) == 1);
  auto c = client(u->base, a, &bar, u->key.size() > 18 ? u->key.substr(u->key.size() - 18) : u->key);
  if (!c.isOk()) return objectsFailed(name, c.status());
  auto start = std::chrono::steady_clock::now();
  Status st = put ? (*c)->putFile(u->bucket, u->key, file) : (*c)->getFile(u->bucket, u->key, file);
  bar.clear();
  if (!st.isOk()) return objectsFailed(name, explain(st, *u, c->get()));
  auto info = (*c)->head(u->bucket, u->key);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  uint64_t bytes = info.isOk() ? info->size : 0;
  std::printf("%s %s %s: %llu bytes in %.3f s (%.1f MB/s, %s)\n", put ? "stored" : "fetched", file.c_str(),
              objectUrl(*u).c_str(), static_cast<unsigned long long>(bytes), secs,
              secs > 0 ? bytes / secs / 1e6 : 0.0, a.http ? "HTTP body" : "RDMA");
  return 0;
}

int simple(const std::string& what, const std::vector<std::string>& args) {
  std::string url;
  CLI::App app(what == "ls"
                   ? "Lists the buckets (a URL without a bucket) or a bucket's objects (a key: only those "
                     "under that prefix)."
               : what == "mb" ? "Makes the bucket of URL."
               : what == "rb" ? "Removes the bucket of URL; it must be empty."
                              : "Removes the object at URL.",
               "ferry objects " + what);
  app.add_option("URL", url,
                 what == "ls"   ? "http://HOST:PORT[/BUCKET[/PREFIX]]"
                 : what == "rm" ? "http://HOST:PORT/BUCKET/KEY"
                                : "http://HOST:PORT/BUCKET")
      ->required();
  const char* done = what == "ls" ? "listed" : what == "mb" ? "made" : "removed";
  if (auto code = parseCommand(app, clientHelp(done), args)) return *code;
  auto u = objects::parseObjectUrl(url);
  if (!u.isOk()) return objectsFailed(what, u.status());
  if (what != "ls" && u->bucket.empty())
    return objectsFailed(what, invalidArgument("the URL names no bucket"));
  if (what == "rm" && u->key.empty()) return objectsFailed(what, invalidArgument("the URL names no key"));
  ClientArgs a;
  a.http = true;  // no payloads: no RDMA session needed
  auto c = client(u->base, a, nullptr, "");
  if (!c.isOk()) return objectsFailed(what, c.status());
  if (what == "ls") {
    if (u->bucket.empty()) {
      auto b = (*c)->buckets();
      if (!b.isOk()) return objectsFailed(what, explain(b.status(), *u, nullptr));
      for (const auto& name : *b) std::printf("%s/\n", name.c_str());
      return 0;
    }
    auto objects = (*c)->list(u->bucket, u->key);
    if (!objects.isOk()) return objectsFailed(what, explain(objects.status(), *u, c->get()));
    for (const auto& o : *objects)
      std::printf("%12llu  %s\n", static_cast<unsigned long long>(o.size), o.key.c_str());
    return 0;
  }
  Status st = what == "mb"   ? (*c)->createBucket(u->bucket)
              : what == "rb" ? (*c)->deleteBucket(u->bucket)
                             : (*c)->remove(u->bucket, u->key);
  return st.isOk() ? 0 : objectsFailed(what, explain(st, *u, c->get()));
}

std::string objectsHelp() {
  CommandHelp h{
      .usage = {"ferry objects COMMAND ARGUMENTS [options]", "ferry objects COMMAND --help"},
      .commands = {{"serve", "serve the object store (S3-style HTTP; payloads by RDMA with ferry's client)"},
                   {"put FILE URL",
                    "store FILE as the object at URL (no KEY, or one ending in '/': FILE's name)"},
                   {"get URL FILE", "write the object at URL to FILE (or into the directory FILE)"},
                   {"ls URL", "list the buckets, or a bucket's objects (under a prefix)"},
                   {"mb URL", "make the bucket of URL"},
                   {"rb URL", "remove the (empty) bucket of URL"},
                   {"rm URL", "remove the object at URL"}},
      .done = "done",
      .failed =
          "the store could not start (serve), no server answers at URL, or the store refused the request"};
  return renderHelp(
      "ferry objects",
      "The object store and its client. URL is http://HOST:PORT[/BUCKET[/KEY]]; FERRY_OBJECTS_ACCESS_KEY "
      "and FERRY_OBJECTS_SECRET_KEY set the credentials of both (docs/objects.md).",
      h);
}

}  // namespace

int runObjects(const std::vector<std::string>& args) {
  if (args.empty()) {
    return usageError("ferry objects",
                      "which command? serve, put, get, ls, mb, rb or rm (ferry objects --help)");
  }
  if (args[0] == "help" && args.size() > 1) return runObjects({args[1], "--help"});
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(objectsHelp().c_str(), stdout);
    return 0;
  }
  if (Status st = config::check(); !st.isOk()) return objectsFailed(args[0], st);
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "serve") return serve(rest);
  if (args[0] == "put") return putOrGet(true, rest);
  if (args[0] == "get") return putOrGet(false, rest);
  if (args[0] == "ls" || args[0] == "mb" || args[0] == "rb" || args[0] == "rm") return simple(args[0], rest);
  return usageError("ferry objects", "unknown command '" + args[0] + "' (ferry objects --help lists them)");
}

}  // namespace ferry::cli
