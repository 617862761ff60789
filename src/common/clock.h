// The one monotonic clock ferry's timing reads: leases, due times, timeouts measured in numbers.
#pragma once

#include <chrono>
#include <cstdint>

namespace ferry {

// std::chrono::steady_clock in nanoseconds. On Linux libstdc++ and libc++ read CLOCK_MONOTONIC,
// which is the same in every process of a host: a time written into memory another process reads
// (a ring's lease) means the same there. A Reactor's time points are this clock's too.
inline int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The same clock in microseconds.
inline int64_t steadyUs() { return steadyNs() / 1000; }

}  // namespace ferry
