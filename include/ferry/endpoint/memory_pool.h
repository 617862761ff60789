// MemoryPool: the local memory regions registered on one RdmaContext, shared by its endpoints.
//
// A region is registered once (ProtectionDomain::registerMemory) and found by its name or its
// handle (see assignment.h for how handles are chosen). Every endpoint built on a pool can use
// every region of it, and publishes all of them in its endpoint_info()["mr_info"].
//
// Buffer ownership: the memory must stay valid until unregisterMemoryRegion() (or the pool's
// end) returns; from then on no device access touches it, also not one already in flight (that
// one fails with a work-completion error). An optional owner is held as long as the region is
// registered (bindings keep the object that owns the memory alive with it).
//
// Thread safety: every method may be called from any thread; lookups do not block each other.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ferry/common/shared_memory.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/assignment.h"
#include "ferry/endpoint/context.h"
#include "ferry/verbs/verbs.h"

namespace ferry::endpoint {

struct RegionOptions {
  // Writable regions can be written by the peer and be the destination of READ and recv();
  // read-only memory (e.g. Python bytes) is registered with remote read access only.
  bool writable = true;
  // Kept alive while the region is registered.
  std::shared_ptr<void> owner;
  // What a peer holding the region's keys may do: kDefault reads it, and writes it when writable;
  // kNone keeps it local (its keys grant no remote access); kWriteOnly lets a peer write (not read)
  // a writable region.
  enum class Remote : uint8_t { kDefault, kNone, kWriteOnly };
  Remote remote = Remote::kDefault;
  // Listed by mrInfo() (and so in an endpoint's metadata). A region left out is reachable only by
  // a peer its keys are handed to (regionInfo()).
  bool published = true;
};

// What a lookup returns: enough to build work requests, copied out of the pool.
struct RegionView {
  MrHandle handle = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  bool writable = true;
  MemoryLocation location;  // host memory, or a CUDA device's (verbs::MemoryRegion::location())
};

class MemoryPool {
 public:
  // A pool with its own protection domain on context.
  static Result<std::shared_ptr<MemoryPool>> create(std::shared_ptr<RdmaContext> context);

  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;
  ~MemoryPool();

  // Registers [addr, addr+length) under a name and returns its handle. Registering a name again
  // with the same range returns the same handle; with another range it is refused
  // (kInvalidArgument: unregister it first). kInvalidArgument for an empty name, a null address
  // or a zero length; the verbs status when the device refuses the registration.
  Result<MrHandle> registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                        RegionOptions options = {});
  // The same under an integer key (below kNamedHandleBase): the handle is the key, the name in
  // mr_info is its decimal text.
  Result<MrHandle> registerMemoryRegion(uint64_t key, void* addr, uint64_t length,
                                        RegionOptions options = {});

  // Allocates length zero-filled bytes (ferry/common/shared_memory.h: memory a same-host peer of
  // the software provider maps, so its READs and WRITEs of it are loads and stores), registers
  // them under name and returns them; the region holds the memory until it is unregistered
  // (options.owner is replaced). kInvalidArgument as registerMemoryRegion, and for length 0.
  Result<std::shared_ptr<SharedMemory>> allocMemoryRegion(std::string_view name, uint64_t length,
                                                          RegionOptions options = {});

  // Deregisters a region: when this returns the device no longer touches its memory and its owner
  // is released. kNotFound for an unknown handle or name.
  Status unregisterMemoryRegion(MrHandle handle);
  Status unregisterMemoryRegion(std::string_view name);

  // The handle of a name (kNotFound when none).
  Result<MrHandle> handleOf(std::string_view name) const;
  // The region of a handle (kNotFound when none).
  Result<RegionView> find(MrHandle handle) const;
  size_t size() const;
  // Holds off the deregistration of region `handle`, as registered with local key `lkey`, while
  // the returned lock lives (for copies into registered memory that bypass the device). The lock
  // owns nothing when the region is gone or was registered anew.
  std::shared_lock<std::shared_mutex> pinRegion(MrHandle handle, uint32_t lkey) const;

  // {"<name>": {"handle": H, "addr": A, "length": L, "rkey": K}, ...} as JSON text: what a peer
  // needs to READ and WRITE these regions (whoever holds it can, so hand it only to the peer).
  std::string mrInfo() const;
  // One region's entry of mr_info ({"handle","addr","length","rkey","writable"}), published or not
  // (kNotFound when none).
  Result<std::string> regionInfo(MrHandle handle) const;

  const std::shared_ptr<RdmaContext>& context() const { return context_; }
  verbs::ProtectionDomain& pd() { return pd_; }

 private:
  struct Region;
  explicit MemoryPool(std::shared_ptr<RdmaContext> context) : context_(std::move(context)) {}
  Result<MrHandle> add(std::string name, MrHandle handle, bool named, void* addr, uint64_t length,
                       RegionOptions options);

  std::shared_ptr<RdmaContext> context_;
  verbs::ProtectionDomain pd_;
  mutable std::shared_mutex mu_;
  std::unordered_map<MrHandle, std::shared_ptr<Region>> byHandle_;
  std::unordered_map<std::string, MrHandle> byName_;
  MrHandle nextNamed_ = kNamedHandleBase;
};

}  // namespace ferry::endpoint
