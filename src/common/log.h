// Logging: one line per event, filtered by a threshold (error, warn, info, debug) that
// FERRY_LOG_LEVEL sets at start (default warn) and setLevel() changes at any time (the Python
// package makes it follow the `ferry` logger's level). A line goes to stderr with a UTC timestamp,
// the process id and the level:
//   2026-11-24T20:31:02.123456Z ferry[4242] WARN: ...
// or, once setForwardFd() named a descriptor, to that descriptor as "LEVEL message\n" (the Python
// package forwards those lines to the `logging` module). Log an error once, where it is decided.
#pragma once

#include <cstdarg>
#include <cstdint>

namespace ferry::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Whether a line at `level` passes the threshold: one relaxed atomic load, from any thread.
bool enabled(Level level);
// Sets the threshold from any thread; lines checked after it returns use it. The first threshold is
// FERRY_LOG_LEVEL's (read when a line is first checked, unless setLevel came before).
void setLevel(Level level);
Level level();
// printf-style; adds the prefix above and a newline.
void write(Level level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Sends every line to `fd` (a pipe's write end; made non-blocking) instead of stderr; -1 returns
// to stderr. A line the descriptor cannot take at once is dropped and counted, never waited for.
void setForwardFd(int fd);
uint64_t droppedLines();

}  // namespace ferry::log

#define FERRY_LOG(level, ...)                                       \
  do {                                                              \
    if (::ferry::log::enabled(::ferry::log::Level::level)) {        \
      ::ferry::log::write(::ferry::log::Level::level, __VA_ARGS__); \
    }                                                               \
  } while (0)
