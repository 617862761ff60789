// Where a range of memory lives: the host's memory, or the memory of a CUDA device. Every
// registration records it (verbs::MemoryRegion::location()); ferry tells the kinds apart through
// the CUDA driver where there is one (docs/gpu.md), and never reads device memory as host memory.
#pragma once

#include <string>

namespace ferry {

enum class MemoryKind {
  kHost,  // host memory (CUDA managed memory too: the driver migrates its pages on access)
  kCuda,  // memory the CUDA driver allocated on a device
};

struct MemoryLocation {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // the CUDA device's ordinal (kCuda); -1 for host memory

  bool onDevice() const { return kind == MemoryKind::kCuda; }
  // "host" or "cuda:N".
  std::string toString() const { return onDevice() ? "cuda:" + std::to_string(device) : "host"; }
  friend bool operator==(const MemoryLocation&, const MemoryLocation&) = default;
};

}  // namespace ferry
