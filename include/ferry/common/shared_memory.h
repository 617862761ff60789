// Memory that another process of the host can map: ferry's allocator for registered memory.
//
// SharedMemory::allocate(length) returns page-aligned, zero-filled memory backed by a memfd whose
// size is sealed (it can neither shrink nor grow, so a process that maps it can never fault on a
// truncated file). Registering such memory with the software provider publishes the memfd along
// with the region's record, and a same-host peer then maps it once and carries out WRITE and READ
// on it as plain loads and stores — still checked against the owner's records at each access and
// still safe against deregistration (docs/soft-provider.md, "Memory both sides map"). On a NIC it is
// ordinary memory. Other memory keeps the cross-memory-attach path.
//
// ProtectionDomain::allocMr (verbs.h), `pd.alloc_mr` and `ferry.alloc_shared` in Python, and the
// Endpoint API's memory pool allocate from here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "ferry/common/status.h"

namespace ferry {

class SharedMemory {
 public:
  // length bytes (rounded up to whole pages), zero-filled, mapped read-write in this process.
  // kInvalidArgument for 0 or more than 2^46 bytes; kResourceExhausted when the kernel refuses
  // (memfd_create, ftruncate or mmap fails: the cause is in the status).
  static Result<std::shared_ptr<SharedMemory>> allocate(size_t length);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  void* data() const { return data_; }
  // The length asked for (the mapping itself is whole pages).
  size_t length() const { return length_; }
  // The memfd (owned; closed with the memory).
  int fd() const { return fd_; }

 private:
  SharedMemory() = default;
  void* data_ = nullptr;
  size_t length_ = 0;
  size_t mapped_ = 0;
  int fd_ = -1;
};

// Where a range of SharedMemory lives: the memfd's descriptor number in this process, its inode
// (so a reused descriptor number is never mistaken for it) and the range's offset in it.
struct SharedBacking {
  int fd = -1;
  uint64_t inode = 0;
  uint64_t offset = 0;
};

// The live SharedMemory allocation that holds [addr, addr+length) whole, if any.
std::optional<SharedBacking> findSharedBacking(const void* addr, size_t length);

}  // namespace ferry
