// Bytes into and out of registered memory wherever it lives (MrEntry::location). Host memory is
// read and written in place; memory of a CUDA device never is: each piece is copied through the
// driver (cuda::copy) between it and a host buffer of the provider's own (the frame being sent, the
// connection's input staging, an atomic's eight bytes). That is the soft devices' staged path for
// GPU memory (docs/gpu.md): a message is copied a piece at a time as it goes out or lands, so the
// PCIe copy of one piece overlaps the network carrying the ones before it.
//
// Callers hold the context's memory lock (shared) and checked that the entry is not revoked. A
// false return is a copy the driver refused (memory freed under the region, a device lost): the
// caller treats it as a region that went away (its frame fails, nothing else is touched).
#pragma once

#include <cstring>

#include "common/cuda_driver.h"
#include "common/device_access.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

inline bool onDevice(const MrEntry* entry) { return entry != nullptr && entry->location.onDevice(); }
inline bool onDevice(const Segment& seg) { return onDevice(seg.entry.get()); }

// n bytes at src (inside entry's region) into the host buffer dst.
inline bool readRegion(const MrEntry& entry, void* dst, const void* src, size_t n) {
  if (!entry.location.onDevice()) {
    DeviceAccess device;
    std::memcpy(dst, src, n);
    return true;
  }
  return cuda::copy(dst, MemoryLocation{}, src, entry.location, n).isOk();
}

// n bytes of the host buffer src to dst (inside entry's region).
inline bool writeRegion(const MrEntry& entry, void* dst, const void* src, size_t n) {
  if (!entry.location.onDevice()) {
    DeviceAccess device;
    std::memcpy(dst, src, n);
    return true;
  }
  return cuda::copy(dst, entry.location, src, MemoryLocation{}, n).isOk();
}

}  // namespace ferry::soft
