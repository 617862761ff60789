#include "common/log.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ferry::log {
namespace {

Level configuredLevel() {
  static const Level level = [] {
    const char* env = std::getenv("FERRY_LOG_LEVEL");
    if (env == nullptr) return Level::kWarn;
    if (std::strcmp(env, "error") == 0) return Level::kError;
    if (std::strcmp(env, "info") == 0) return Level::kInfo;
    if (std::strcmp(env, "debug") == 0) return Level::kDebug;
    return Level::kWarn;
  }();
  return level;
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

}  // namespace

bool enabled(Level level) { return static_cast<int>(level) <= static_cast<int>(configuredLevel()); }

void write(Level level, const char* format, ...) {
  char line[1024];
  int n = std::snprintf(line, sizeof line, "ferry[%d] %s: ", static_cast<int>(getpid()), levelName(level));
  va_list args;
  va_start(args, format);
  std::vsnprintf(line + n, sizeof line - n, format, args);
  va_end(args);
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s\n", line);
}

}  // namespace ferry::log
