// Logging: one line per event to stderr, filtered by FERRY_LOG_LEVEL (error, warn, info, debug;
// default warn). Log an error once, where it is decided.
#pragma once

#include <cstdarg>

namespace ferry::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

bool enabled(Level level);
// printf-style; adds "ferry[pid] LEVEL: " and a newline.
void write(Level level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace ferry::log

#define FERRY_LOG(level, ...)                                                \
  do {                                                                       \
    if (::ferry::log::enabled(::ferry::log::Level::level)) {                 \
      ::ferry::log::write(::ferry::log::Level::level, __VA_ARGS__);          \
    }                                                                        \
  } while (0)
