// The client process of cuobj_multiprocess_test: one cuObjClient (include/ferry/cuobj_client.h) in a
// process of its own, driven line by line over stdin/stdout (the test's control path). Its
// arguments, applied before the client is created: lanes=<same_host|tcp> (FERRY_AGENT_LANES="rma=..."),
// ttl=<seconds> (FERRY_OBJECTS_TOKEN_TTL), telemetry=<file> (the client's telemetry, every level).
//
// Commands (one reply line each: "ok ..." or "err <why>"):
//   alloc <id> <size> <fill>            mmap'ed memory filled with a byte, cuMemObjGetDescriptor: "ok <addr>"
//   free <id>                           cuMemObjPutDescriptor, munmap
//   fill <id> <off> <len> <seed> <p>    bytes [off, +len) := the test pattern of seed from pattern offset p
//   expect <id> <off> <len> pat <seed> <p> | expect <id> <off> <len> byte <b>
//                                       checks [off, +len) byte for byte: "ok" or "err" naming the first
//                                       differing byte
//   token <id> <GET|PUT> <off> <size>   cuMemObjGetRDMAToken: "ok <token index> <addr> <size> <descriptor>"
//   untoken <index>                     cuMemObjPutRDMAToken: "ok", or "err" when it is not a live token
//   get|put <id> <size> <objoff> <bufoff> <key>
//                                       cuObjGet / cuObjPut; each callback writes
//                                       "req <GET|PUT> <key> <ptr> <size> <offset> <descriptor>" and returns
//                                       the n of the "res <n>" line it reads back: "ok <returned value>"
//   exit                                destroys the client, replies "ok" and exits 0
// The first line, once the client exists: "ok ready <pid>" (or "err ..." when it is not connected).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/cuobj_client.h"

namespace {

uint8_t patternByte(uint64_t seed, uint64_t i) { return static_cast<uint8_t>(seed + i * 7 + (i >> 11)); }

int gOut = -1;  // the protocol's stdout (fd 1 itself goes to stderr: the library's logs stay off it)
std::string gIn;

void reply(const std::string& line) {
  std::string l = line + "\n";
  size_t sent = 0;
  while (sent < l.size()) {
    ssize_t n = write(gOut, l.data() + sent, l.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) _exit(3);  // the test is gone
    sent += static_cast<size_t>(n);
  }
}

// One line of stdin; false at its end.
bool readLine(std::string* line) {
  for (;;) {
    size_t nl = gIn.find('\n');
    if (nl != std::string::npos) {
      *line = gIn.substr(0, nl);
      gIn.erase(0, nl + 1);
      return true;
    }
    char chunk[65536];
    ssize_t n = read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    gIn.append(chunk, static_cast<size_t>(n));
  }
}

struct Buffer {
  uint8_t* ptr = nullptr;
  size_t size = 0;
};

// The control path of one cuObjGet / cuObjPut callback.
ssize_t forward(const char* op, const void* handle, const char* ptr, size_t size, loff_t offset,
                const cufileRDMAInfo_t* info) {
  const auto* key = static_cast<const std::string*>(cuObjClient::getCtx(handle));
  if (key == nullptr || info == nullptr || info->version != 1 ||
      info->desc_len != static_cast<int>(std::strlen(info->desc_str)) + 1) {
    return -EINVAL;
  }
  std::ostringstream req;
  req << "req " << op << " " << *key << " " << reinterpret_cast<uint64_t>(ptr) << " " << size << " " << offset
      << " " << info->desc_str;
  reply(req.str());
  std::string line;
  if (!readLine(&line) || line.rfind("res ", 0) != 0) return -EPIPE;
  return static_cast<ssize_t>(std::strtoll(line.c_str() + 4, nullptr, 10));
}

ssize_t controlGet(const void* handle, char* ptr, size_t size, loff_t offset, const cufileRDMAInfo_t* info) {
  return forward("GET", handle, ptr, size, offset, info);
}

ssize_t controlPut(const void* handle, const char* ptr, size_t size, loff_t offset,
                   const cufileRDMAInfo_t* info) {
  return forward("PUT", handle, ptr, size, offset, info);
}

CUObjOps_t gOps{.get = controlGet, .put = controlPut};

class Peer {
 public:
  explicit Peer(cuObjClient* client) : client_(client) {}
  // The texts of tokens never put back (or revoked another way) are the peer's to free.
  ~Peer() {
    for (auto& [index, text] : tokens_) free(text);
  }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // Runs one command; false after "exit".
  bool run(const std::string& line) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "exit") return false;
    std::string out = dispatch(cmd, in);
    reply(out);
    return true;
  }

 private:
  Buffer* find(int id) {
    auto it = buffers_.find(id);
    return it == buffers_.end() ? nullptr : &it->second;
  }

  static bool inside(const Buffer& b, uint64_t off, uint64_t len) {
    return off <= b.size && len <= b.size - off;
  }

  std::string dispatch(const std::string& cmd, std::istringstream& in) {
    int id = -1;
    if (cmd == "alloc") {
      size_t size = 0;
      unsigned fill = 0;
      if (!(in >> id >> size >> fill) || size == 0 || find(id)) return "err bad alloc";
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return "err mmap: " + std::string(std::strerror(errno));
      std::memset(p, static_cast<int>(fill), size);
      if (client_->cuMemObjGetDescriptor(p, size) != CU_OBJ_SUCCESS) {
        munmap(p, size);
        return "err cuMemObjGetDescriptor failed";
      }
      buffers_[id] = Buffer{static_cast<uint8_t*>(p), size};
      return "ok " + std::to_string(reinterpret_cast<uint64_t>(p));
    }
    if (cmd == "free") {
      Buffer* b = (in >> id) ? find(id) : nullptr;
      if (b == nullptr) return "err no buffer";
      cuObjErr_t rc = client_->cuMemObjPutDescriptor(b->ptr);
      munmap(b->ptr, b->size);
      buffers_.erase(id);
      return rc == CU_OBJ_SUCCESS ? "ok" : "err cuMemObjPutDescriptor failed";
    }
    if (cmd == "fill") {
      uint64_t off = 0, len = 0, seed = 0, p = 0;
      Buffer* b = (in >> id >> off >> len >> seed >> p) ? find(id) : nullptr;
      if (b == nullptr || !inside(*b, off, len)) return "err bad fill";
      for (uint64_t i = 0; i < len; ++i) b->ptr[off + i] = patternByte(seed, p + i);
      return "ok";
    }
    if (cmd == "expect") {
      uint64_t off = 0, len = 0, seed = 0, p = 0;
      std::string kind;
      Buffer* b = (in >> id >> off >> len >> kind >> seed) ? find(id) : nullptr;
      if (kind == "pat" && !(in >> p)) b = nullptr;
      if (b == nullptr || !inside(*b, off, len) || (kind != "pat" && kind != "byte")) return "err bad expect";
      for (uint64_t i = 0; i < len; ++i) {
        uint8_t want = kind == "pat" ? patternByte(seed, p + i) : static_cast<uint8_t>(seed);
        if (b->ptr[off + i] != want) {
          return "err byte " + std::to_string(off + i) + " is " + std::to_string(b->ptr[off + i]) + ", not " +
                 std::to_string(want);
        }
      }
      return "ok";
    }
    if (cmd == "token") {
      std::string op;
      uint64_t off = 0, size = 0;
      Buffer* b = (in >> id >> op >> off >> size) ? find(id) : nullptr;
      if (b == nullptr || (op != "GET" && op != "PUT")) return "err bad token";
      char* text = nullptr;
      if (client_->cuMemObjGetRDMAToken(b->ptr, size, off, op == "GET" ? CUOBJ_GET : CUOBJ_PUT, &text) !=
          CU_OBJ_SUCCESS) {
        return "err cuMemObjGetRDMAToken failed";
      }
      int index = nextToken_++;
      tokens_[index] = text;
      return "ok " + std::to_string(index) + " " + std::to_string(reinterpret_cast<uint64_t>(b->ptr) + off) +
             " " + std::to_string(size) + " " + text;
    }
    if (cmd == "untoken") {
      int index = -1;
      if (!(in >> index) || !tokens_.count(index)) return "err no such token";
      char* text = tokens_[index];
      if (client_->cuMemObjPutRDMAToken(text) != CU_OBJ_SUCCESS) return "err not a live token";
      tokens_.erase(index);
      return "ok";
    }
    if (cmd == "get" || cmd == "put") {
      uint64_t size = 0;
      int64_t objoff = 0, bufoff = 0;
      std::string key;
      Buffer* b = (in >> id >> size >> objoff >> bufoff >> key) ? find(id) : nullptr;
      if (b == nullptr) return "err bad " + cmd;
      ssize_t r = cmd == "get" ? client_->cuObjGet(&key, b->ptr, size, objoff, bufoff)
                               : client_->cuObjPut(&key, b->ptr, size, objoff, bufoff);
      return "ok " + std::to_string(r);
    }
    return "err unknown command '" + cmd + "'";
  }

  cuObjClient* client_;
  std::map<int, Buffer> buffers_;
  std::map<int, char*> tokens_;
  int nextToken_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  gOut = dup(STDOUT_FILENO);
  dup2(STDERR_FILENO, STDOUT_FILENO);
  std::string telemetryPath;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("lanes=", 0) == 0) {
      setenv("FERRY_AGENT_LANES", ("rma=" + a.substr(6)).c_str(), 1);
    } else if (a.rfind("ttl=", 0) == 0) {
      setenv("FERRY_OBJECTS_TOKEN_TTL", a.substr(4).c_str(), 1);
    } else if (a.rfind("telemetry=", 0) == 0) {
      telemetryPath = a.substr(10);
    } else {
      reply("err unknown argument '" + a + "'");
      return 2;
    }
  }
  std::ofstream telemetry;
  if (!telemetryPath.empty()) {
    telemetry.open(telemetryPath);
    cuObjClient::setupTelemetry(false, &telemetry);
    cuObjClient::setTelemFlags(CUOBJ_LOG_PATH_ERROR | CUOBJ_LOG_PATH_INFO | CUOBJ_LOG_PATH_DEBUG);
  }
  {
    auto client = std::make_unique<cuObjClient>(gOps);
    if (!client->isConnected()) {
      reply("err the client is not connected");
      return 1;
    }
    reply("ok ready " + std::to_string(getpid()));
    Peer peer(client.get());
    std::string line;
    while (readLine(&line) && peer.run(line)) {
    }
    client.reset();
  }
  if (!telemetryPath.empty()) {
    cuObjClient::shutdownTelemetry();
    telemetry.close();
  }
  reply("ok");
  return 0;
}
