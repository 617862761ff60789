#include "ferry/common/metrics.h"

#include <bit>
#include <cmath>
#include <limits>

namespace ferry {

double OpMetrics::bucketUpperUs(int i) {
  return i >= kLatencyBuckets - 1 ? std::numeric_limits<double>::infinity() : std::ldexp(1.0, i);
}

Metrics::Metrics(std::vector<std::string> kinds) : kinds_(std::move(kinds)), perKind_(kinds_.size()) {}

void Metrics::record(int kind, StatusCode status, uint64_t bytes, uint64_t latencyNs) {
  if (kind < 0 || static_cast<size_t>(kind) >= perKind_.size()) return;
  PerKind& k = perKind_[static_cast<size_t>(kind)];
  k.operations.fetch_add(1, std::memory_order_relaxed);
  if (status == StatusCode::kOk) {
    k.bytes.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    k.errors.fetch_add(1, std::memory_order_relaxed);
    const int code = static_cast<int>(status);
    if (code >= 0 && code < kStatusCodes)
      k.byStatus[static_cast<size_t>(code)].fetch_add(1, std::memory_order_relaxed);
  }
  k.latencySumNs.fetch_add(latencyNs, std::memory_order_relaxed);
  // Bucket i holds latencies up to 2^i us: the bit width of ceil(us) - 1, so 1 us -> 0, 2 -> 1, 3..4 -> 2.
  const uint64_t us = (latencyNs + 999) / 1000;
  const int bucket = us <= 1 ? 0 : std::min(kLatencyBuckets - 1, static_cast<int>(std::bit_width(us - 1)));
  k.buckets[static_cast<size_t>(bucket)].fetch_add(1, std::memory_order_relaxed);
}

std::vector<OpMetrics> Metrics::snapshot() const {
  std::vector<OpMetrics> out;
  for (size_t i = 0; i < perKind_.size(); ++i) {
    const PerKind& k = perKind_[i];
    OpMetrics m;
    m.kind = kinds_[i];
    m.operations = k.operations.load(std::memory_order_relaxed);
    m.bytes = k.bytes.load(std::memory_order_relaxed);
    m.errors = k.errors.load(std::memory_order_relaxed);
    for (int code = 0; code < kStatusCodes; ++code) {
      const uint64_t n = k.byStatus[static_cast<size_t>(code)].load(std::memory_order_relaxed);
      if (n != 0) m.errorsByStatus.emplace_back(statusCodeName(static_cast<StatusCode>(code)), n);
    }
    m.latencySumUs = static_cast<double>(k.latencySumNs.load(std::memory_order_relaxed)) / 1000.0;
    for (int b = 0; b < kLatencyBuckets; ++b) {
      m.latencyBuckets[static_cast<size_t>(b)] =
          k.buckets[static_cast<size_t>(b)].load(std::memory_order_relaxed);
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace ferry
