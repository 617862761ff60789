#include "common/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "ferry/common/config.h"

namespace ferry::log {
namespace {

// The threshold; kUnread until the first check reads FERRY_LOG_LEVEL (not at static initialisation:
// the environment may still change before then) or setLevel() sets it.
constexpr int kUnread = -1;
std::atomic<int> threshold{kUnread};

int currentThreshold() {
  int value = threshold.load(std::memory_order_relaxed);
  if (value != kUnread) return value;
  // A setLevel() racing with this first read wins: it is the later word.
  threshold.compare_exchange_strong(value, config::logLevel(), std::memory_order_relaxed);
  return threshold.load(std::memory_order_relaxed);
}

const char* levelName(Level level) {
  switch (level) {
    case Level::kError: return "ERROR";
    case Level::kWarn: return "WARN";
    case Level::kInfo: return "INFO";
    case Level::kDebug: return "DEBUG";
  }
  return "?";
}

std::atomic<int> forwardFd{-1};
std::atomic<uint64_t> dropped{0};

}  // namespace

bool enabled(Level level) { return static_cast<int>(level) <= currentThreshold(); }

void setLevel(Level level) { threshold.store(static_cast<int>(level), std::memory_order_relaxed); }

Level level() { return static_cast<Level>(currentThreshold()); }

void write(Level level, const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof message, format, args);
  va_end(args);

  char line[1200];
  const int fd = forwardFd.load(std::memory_order_acquire);
  int n;
  if (fd >= 0) {
    n = std::snprintf(line, sizeof line, "%s %s\n", levelName(level), message);
  } else {
    timespec now{};
    clock_gettime(CLOCK_REALTIME, &now);
    tm utc{};
    gmtime_r(&now.tv_sec, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
    n = std::snprintf(line, sizeof line, "%s.%06ldZ ferry[%d] %s: %s\n", stamp, now.tv_nsec / 1000,
                      static_cast<int>(getpid()), levelName(level), message);
  }
  const size_t length = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof line - 1);
  if (fd >= 0) {
    // One write of under PIPE_BUF bytes: lines from many threads never interleave.
    if (::write(fd, line, length) != static_cast<ssize_t>(length))
      dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fwrite(line, 1, length, stderr);
}

void setForwardFd(int fd) {
  if (fd >= 0) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  }
  forwardFd.store(fd, std::memory_order_release);
}

uint64_t droppedLines() { return dropped.load(std::memory_order_relaxed); }

}  // namespace ferry::log
