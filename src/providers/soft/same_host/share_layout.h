// The layout of the same-host table (share.h): a header, then region records, QP records,
// accessor slots and the regions' device parts, each an array of atomics both processes map.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/cuda_driver.h"
#include "ferry/common/memory_location.h"

namespace ferry::soft {
namespace share_layout {

inline constexpr uint64_t kMagic = 0x4c42544879727266ull;  // "ferryHTBL"-ish, little-endian
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kMrSlots = 8192;
inline constexpr uint32_t kQpSlots = 16384;
inline constexpr uint32_t kAccessorSlots = 512;
inline constexpr uint32_t kQpValid = 0x80000000u;

// Every field is an atomic: the owner writes while accessors read, in two processes.
struct Header {
  std::atomic<uint64_t> magic;
  std::atomic<uint32_t> version;
  std::atomic<uint32_t> ownerPid;
  std::atomic<uint64_t> cookie;
  std::atomic<uint64_t> cookieAddr;  // where the owner keeps its private copy of the cookie
  std::atomic<uint32_t> mrSlots;
  std::atomic<uint32_t> qpSlots;
  std::atomic<uint32_t> accessorSlots;
  std::atomic<uint32_t> accessorsUsed;  // slots [0, accessorsUsed) have ever been claimed
};

// A region; a seqlock (seq odd while the owner rewrites it). key == 0: empty.
struct alignas(64) MrRecord {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> key;
  std::atomic<uint32_t> access;
  std::atomic<uint32_t> device;  // the owner's CUDA ordinal plus one (DeviceRecord: its handle); 0: host
  std::atomic<uint64_t> pd;
  std::atomic<uint64_t> addr;
  std::atomic<uint64_t> length;
  // Memory both sides map (ferry/common/shared_memory.h): the memfd's descriptor number in the
  // owner plus one (0: the region is not in one), its inode, and where addr sits in it.
  std::atomic<uint32_t> memFd;
  std::atomic<uint64_t> memInode;
  std::atomic<uint64_t> memOffset;
};
static_assert(sizeof(MrRecord) == 64);

// An RC QP; same seqlock. qpn carries kQpValid while the record describes a QP.
struct alignas(32) QpRecord {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> qpn;
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> access;
  std::atomic<uint32_t> destQpn;
  std::atomic<uint64_t> pd;
};

// The device part of a region's record (MrRecord's slot, under its seqlock): the CUDA IPC handle
// that opens device memory in another process. Apart from the record, so that host memory's
// accesses read one cache line.
struct alignas(128) DeviceRecord {
  std::atomic<uint32_t> hasIpc;  // 1: the handle below opens the allocation the region lies in
  std::atomic<uint64_t> uuid[2];
  std::atomic<uint64_t> handle[8];
  std::atomic<uint64_t> allocBase;  // the allocation, as the owner addresses it
  std::atomic<uint64_t> allocLength;
};
static_assert(sizeof(DeviceRecord) == 128);

// A DeviceRecord as one read of it saw it (under the region's seqlock).
struct DeviceView {
  bool hasIpc = false;
  cuda::IpcHandle ipc;
};

// Fills a region's record's device part (the owner, inside the region's seqlock write).
inline void writeDevice(MrRecord& r, DeviceRecord& w, MemoryLocation where, const cuda::IpcHandle* ipc) {
  constexpr auto relaxed = std::memory_order_relaxed;
  r.device.store(where.onDevice() ? static_cast<uint32_t>(where.device) + 1 : 0, relaxed);
  w.hasIpc.store(ipc != nullptr ? 1 : 0, relaxed);
  if (ipc == nullptr) return;
  uint64_t words[10];
  std::memcpy(words, ipc->uuid.data(), 16);
  std::memcpy(words + 2, ipc->bytes.data(), 64);
  for (int i = 0; i < 2; ++i) w.uuid[i].store(words[i], relaxed);
  for (int i = 0; i < 8; ++i) w.handle[i].store(words[2 + i], relaxed);
  w.allocBase.store(ipc->base, relaxed);
  w.allocLength.store(ipc->length, relaxed);
}

// Copies a record out (an accessor, inside its seqlock read).
inline DeviceView readDevice(const DeviceRecord& r) {
  constexpr auto relaxed = std::memory_order_relaxed;
  DeviceView v;
  v.hasIpc = r.hasIpc.load(relaxed) != 0;
  if (!v.hasIpc) return v;
  uint64_t words[10];
  for (int i = 0; i < 2; ++i) words[i] = r.uuid[i].load(relaxed);
  for (int i = 0; i < 8; ++i) words[2 + i] = r.handle[i].load(relaxed);
  std::memcpy(v.ipc.uuid.data(), words, 16);
  std::memcpy(v.ipc.bytes.data(), words + 2, 64);
  v.ipc.base = r.allocBase.load(relaxed);
  v.ipc.length = r.allocLength.load(relaxed);
  return v;
}

// One accessor QP: its process (pid and start time, so a reused pid is not mistaken for it) and
// the key it is copying with now (0: none).
struct alignas(64) AccessorSlot {
  std::atomic<uint32_t> pid;
  std::atomic<uint32_t> busyKey;
  std::atomic<uint64_t> startTime;
};

inline constexpr size_t kHeaderSize = 256;
inline constexpr size_t kMrOffset = kHeaderSize;
inline constexpr size_t kQpOffset = kMrOffset + sizeof(MrRecord) * kMrSlots;
inline constexpr size_t kAccessorOffset = kQpOffset + sizeof(QpRecord) * kQpSlots;
inline constexpr size_t kDeviceOffset = kAccessorOffset + sizeof(AccessorSlot) * kAccessorSlots;
inline constexpr size_t kTableSize = kDeviceOffset + sizeof(DeviceRecord) * kMrSlots;
static_assert(sizeof(Header) <= kHeaderSize);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the shared table needs address-free atomics");

inline MrRecord* mrs(uint8_t* base) { return reinterpret_cast<MrRecord*>(base + kMrOffset); }
inline QpRecord* qps(uint8_t* base) { return reinterpret_cast<QpRecord*>(base + kQpOffset); }
inline AccessorSlot* accessors(uint8_t* base) {
  return reinterpret_cast<AccessorSlot*>(base + kAccessorOffset);
}
inline DeviceRecord* devices(uint8_t* base) { return reinterpret_cast<DeviceRecord*>(base + kDeviceOffset); }
inline uint32_t mrSlotOf(uint32_t key) { return (key >> 8) % kMrSlots; }
inline uint32_t qpSlotOf(uint32_t qpn) { return qpn % kQpSlots; }

// A region's record as one read of it saw it (its device part, the handle, is read where one is
// opened, under the same seqlock).
struct RegionView {
  uint32_t key = 0, access = 0, memFd = 0;
  uint32_t device = 0;  // ordinal plus one; 0: host memory
  uint64_t pd = 0, addr = 0, length = 0, memInode = 0, memOffset = 0;
};

// Seqlock writes (the owner, under its write lock).
template <typename Record, typename Fill>
void rewrite(Record& r, Fill fill) {
  uint32_t s = r.seq.load(std::memory_order_relaxed);
  r.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  fill(r);
  r.seq.store(s + 2, std::memory_order_release);
}

// Seqlock read: copies the record's fields through read() until it sees a stable version.
// Inlined always: it is on the path of every same-host request (an out-of-line call with its
// lambda measured a few percent of a small WRITE).
template <typename Record, typename Read>
[[gnu::always_inline]] inline bool readStable(const Record& r, Read read) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint32_t s1 = r.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    read(r);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.seq.load(std::memory_order_relaxed) == s1) return true;
  }
  return false;
}

// Reads a region's record (an accessor); false when it never held still. Inlined always, as
// readStable is.
[[gnu::always_inline]] inline bool readRegion(const MrRecord& m, RegionView* out) {
  return readStable(m, [&](const MrRecord& r) {
    constexpr auto relaxed = std::memory_order_relaxed;
    out->device = r.device.load(relaxed);
    out->key = r.key.load(relaxed);
    out->access = r.access.load(relaxed);
    out->pd = r.pd.load(relaxed);
    out->addr = r.addr.load(relaxed);
    out->length = r.length.load(relaxed);
    out->memFd = r.memFd.load(relaxed);
    out->memInode = r.memInode.load(relaxed);
    out->memOffset = r.memOffset.load(relaxed);
  });
}

}  // namespace share_layout

}  // namespace ferry::soft
