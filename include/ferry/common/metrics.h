// Operation metrics: per kind of operation, how many completed, their bytes, the failures by
// status code, and a latency histogram (from the call to completion). Every endpoint and every
// context keeps one (EndpointStats / RdmaContext::metrics(), `stats()` in Python, which can expose
// them to Prometheus); recording is a few relaxed atomic additions, no lock.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/common/status.h"

namespace ferry {

// Histogram buckets: the upper bound of bucket i is 2^i microseconds (1 us .. 2^24 us, about 17 s);
// the last bucket counts everything slower.
inline constexpr int kLatencyBuckets = 26;
inline constexpr int kStatusCodes = 16;  // StatusCode values 0..15

struct OpMetrics {
  std::string kind;                                              // "read", "write", ...
  uint64_t operations = 0;                                       // completed, successfully or not
  uint64_t bytes = 0;                                            // bytes moved by the successful ones
  uint64_t errors = 0;                                           // completed with an error status
  std::vector<std::pair<std::string, uint64_t>> errorsByStatus;  // e.g. {"PeerGone", 3}; non-zero only
  double latencySumUs = 0;
  std::array<uint64_t, kLatencyBuckets> latencyBuckets{};  // not cumulative
  // The upper bound of bucket i in microseconds (infinity for the last).
  static double bucketUpperUs(int i);
};

class Metrics {
 public:
  // `kinds` names the kinds recorded (index = kind number).
  explicit Metrics(std::vector<std::string> kinds);
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void record(int kind, StatusCode status, uint64_t bytes, uint64_t latencyNs);
  // Kinds with no operation yet are included (all zero), in kind order.
  std::vector<OpMetrics> snapshot() const;

 private:
  struct PerKind {
    std::atomic<uint64_t> operations{0}, bytes{0}, errors{0}, latencySumNs{0};
    std::array<std::atomic<uint64_t>, kStatusCodes> byStatus{};
    std::array<std::atomic<uint64_t>, kLatencyBuckets> buckets{};
  };
  std::vector<std::string> kinds_;
  std::vector<PerKind> perKind_;
};

}  // namespace ferry
