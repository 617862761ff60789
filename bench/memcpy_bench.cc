// ferry_memcpy_bench: the single-core ceilings bench/compare measures ferry against.
//
//   ferry_memcpy_bench [--sizes 8,4K,64K,1M,16M,64M] [--min-time SEC] [--json]
//       memcpy within this process, one thread: what one copy of the bytes costs.
//   ferry_memcpy_bench --cma [...]
//       process_vm_writev and process_vm_readv into and out of a forked child: the one-copy
//       same-host path (cross-memory attach) without any protocol around it.
//
// Each size is copied again and again between the same two buffers until --min-time has passed
// (after one untimed pass), like a benchmark that reuses its registered buffers. GB/s is 10^9
// bytes per second.
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Keeps the compiler from dropping copies nobody reads.
void escape(void* p) { asm volatile("" : : "g"(p) : "memory"); }

bool parseSize(const std::string& text, uint64_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return false;
  std::string suffix(end);
  uint64_t scale = 1;
  if (suffix == "K" || suffix == "k")
    scale = 1 << 10;
  else if (suffix == "M" || suffix == "m")
    scale = 1 << 20;
  else if (suffix == "G" || suffix == "g")
    scale = 1 << 30;
  else if (!suffix.empty())
    return false;
  if (v == 0) return false;
  *out = v * scale;
  return true;
}

uint8_t* mapBuffer(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("ferry_memcpy_bench: mmap");
    std::exit(1);
  }
  std::memset(p, 1, bytes);  // fault every page in before timing
  return static_cast<uint8_t*>(p);
}

// Runs op() until minTime has passed; returns bytes per second.
template <typename Op>
double timeIt(uint64_t size, double minTime, Op&& op) {
  if (!op()) return -1;
  uint64_t reps = 0;
  auto start = Clock::now();
  double elapsed = 0;
  uint64_t batch = size >= (1u << 20) ? 1 : (1u << 20) / size;
  do {
    for (uint64_t i = 0; i < batch; ++i) {
      if (!op()) return -1;
    }
    reps += batch;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < minTime);
  return static_cast<double>(size) * static_cast<double>(reps) / elapsed;
}

struct Row {
  uint64_t size;
  double first;   // memcpy, or process_vm_writev
  double second;  // unused, or process_vm_readv
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<uint64_t> sizes = {8, 4096, 65536, 1 << 20, 16 << 20, 64 << 20};
  double minTime = 0.3;
  bool json = false, cma = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--cma") {
      cma = true;
    } else if (a == "--min-time" && i + 1 < argc) {
      minTime = std::atof(argv[++i]);
      if (!(minTime > 0 && minTime < 600)) {
        std::fprintf(stderr, "ferry_memcpy_bench: --min-time takes seconds in (0, 600)\n");
        return 2;
      }
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::string list = argv[++i];
      size_t start = 0;
      while (true) {
        size_t comma = list.find(',', start);
        uint64_t s = 0;
        if (!parseSize(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start),
                       &s) ||
            s > (uint64_t{1} << 30)) {
          std::fprintf(stderr, "ferry_memcpy_bench: bad size list '%s'\n", list.c_str());
          return 2;
        }
        sizes.push_back(s);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: ferry_memcpy_bench [--cma] [--sizes 8,4K,1M] [--min-time SEC] [--json]\n");
      return 2;
    }
  }
  uint64_t maxSize = 0;
  for (uint64_t s : sizes) maxSize = s > maxSize ? s : maxSize;

  std::vector<Row> rows;
  std::string error;
  if (!cma) {
    uint8_t* src = mapBuffer(maxSize);
    uint8_t* dst = mapBuffer(maxSize);
    for (uint64_t size : sizes) {
      double bps = timeIt(size, minTime, [&] {
        std::memcpy(dst, src, size);
        escape(dst);
        return true;
      });
      rows.push_back({size, bps, 0});
    }
  } else {
    // The child maps its buffer, tells the parent where it is, and waits until told to go.
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) {
      std::perror("ferry_memcpy_bench: pipe");
      return 1;
    }
    pid_t child = fork();
    if (child < 0) {
      std::perror("ferry_memcpy_bench: fork");
      return 1;
    }
    if (child == 0) {
      uint8_t* buf = mapBuffer(maxSize);
      uintptr_t addr = reinterpret_cast<uintptr_t>(buf);
      if (write(up[1], &addr, sizeof addr) != sizeof addr) _exit(1);
      char c;
      while (read(down[0], &c, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    uintptr_t remote = 0;
    if (read(up[0], &remote, sizeof remote) != sizeof remote) {
      std::fprintf(stderr, "ferry_memcpy_bench: the child did not start\n");
      return 1;
    }
    uint8_t* local = mapBuffer(maxSize);
    for (uint64_t size : sizes) {
      iovec l{local, size}, r{reinterpret_cast<void*>(remote), size};
      int err = 0;
      auto write = [&] {
        ssize_t n = process_vm_writev(child, &l, 1, &r, 1, 0);
        if (n < 0) err = errno;
        return n == static_cast<ssize_t>(size);
      };
      auto read = [&] {
        ssize_t n = process_vm_readv(child, &l, 1, &r, 1, 0);
        if (n < 0) err = errno;
        return n == static_cast<ssize_t>(size);
      };
      double w = timeIt(size, minTime, write);
      double rd = w < 0 ? -1 : timeIt(size, minTime, read);
      if (w < 0 || rd < 0) {
        error =
            std::string("cross-memory attach refused: ") + std::strerror(err) +
            (err == EPERM ? " (ptrace scope or a seccomp profile forbids process_vm_readv/writev here)" : "");
        break;
      }
      rows.push_back({size, w, rd});
    }
    if (write(down[1], "x", 1) != 1) kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }

  if (json) {
    std::printf("{\"ferry_memcpy_bench\":1,\"mode\":\"%s\",\"min_time\":%g,", cma ? "cma" : "memcpy",
                minTime);
    if (!error.empty()) std::printf("\"error\":\"%s\",", error.c_str());
    std::printf("\"results\":[");
    for (size_t i = 0; i < rows.size(); ++i) {
      if (cma) {
        std::printf("%s{\"size\":%llu,\"write_gbps\":%.6f,\"read_gbps\":%.6f}", i ? "," : "",
                    static_cast<unsigned long long>(rows[i].size), rows[i].first / 1e9, rows[i].second / 1e9);
      } else {
        std::printf("%s{\"size\":%llu,\"gbps\":%.6f}", i ? "," : "",
                    static_cast<unsigned long long>(rows[i].size), rows[i].first / 1e9);
      }
    }
    std::printf("]}\n");
  } else {
    if (!error.empty()) std::fprintf(stderr, "ferry_memcpy_bench: %s\n", error.c_str());
    std::printf(cma ? "%12s %18s %18s\n" : "%12s %18s\n", "bytes", cma ? "vm_writev GB/s" : "memcpy GB/s",
                "vm_readv GB/s");
    for (const Row& r : rows) {
      if (cma) {
        std::printf("%12llu %18.3f %18.3f\n", static_cast<unsigned long long>(r.size), r.first / 1e9,
                    r.second / 1e9);
      } else {
        std::printf("%12llu %18.3f\n", static_cast<unsigned long long>(r.size), r.first / 1e9);
      }
    }
  }
  return error.empty() ? 0 : 3;
}
