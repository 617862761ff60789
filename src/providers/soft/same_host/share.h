// The soft provider's same-host path: one-copy RDMA WRITE and READ between processes of one host.
//
// A context that allows it (FERRY_SOFT_SAME_HOST is not "0") keeps a ShareTable: a shared-memory
// segment (a memfd) in which it publishes, as they change, the records a remote access is checked
// against — each registered region (key, range, access, PD) and each RC QP (state, access flags,
// PD, the peer it is connected to). Its hello replies carry the table's address: the owner's pid,
// the memfd's descriptor number and a random cookie.
//
// A requester on the same host (a SharePeer) maps that table through /proc/<pid>/fd/<n> (which
// takes the same permission as reading the owner's memory), proves with process_vm_readv that the
// cookie it was told sits in the owner's memory, and from then on carries out a WRITE or READ (or
// a WRITE_WITH_IMM's data) itself: it checks the owner's records at the moment of the access and
// copies with one process_vm_writev/readv call. Anything the records refuse, and any copy that fails, goes
// the ordinary way over TCP, where the owner's reactor checks it again and reports the error as usual.
//
// Device memory (docs/gpu.md) is published too, with the CUDA IPC handle of the allocation it lies
// in: an accessor opens the allocation once (cuIpcOpenMemHandle; in the owner's own process it uses
// the owner's pointer) and moves the bytes with device copies, device to device (NVLink where the
// devices have it) or between the device and host memory. The handle is a capability: the table
// is readable only by processes that may read the owner's memory anyway.
//
// Deregistration never races a copy: each accessor QP holds an accessor slot in the table, and
// marks the key it is about to touch in it before it reads the records (a store, then loads);
// the owner retracts the record before it scans the slots (a store, then loads). With sequentially
// consistent ordering on both sides at least one sees the other: either the accessor finds the
// record gone, or the owner finds the key marked and waits until the copy ends — or until the
// accessor process is gone (its pid dead or reused).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "common/cuda_driver.h"
#include "ferry/common/memory_location.h"
#include "ferry/common/status.h"
#include "ferry/verbs/types.h"

namespace ferry::soft {

// What a hello reply says of the owner's table. pid == 0: the owner offers no same-host path.
struct ShareInfo {
  uint32_t pid = 0;
  uint32_t fd = 0;
  uint64_t cookie = 0;
};

// Whether this process may use the same-host path's one-copy WRITE and READ (FERRY_SOFT_SAME_HOST
// neither "0" nor "ring", and the kernel's process_vm_readv works); reason describes the whole
// same-host path as it stands. Probed once per process; the first call logs which path is used.
bool sameHostAllowed(std::string* reason = nullptr);
// Whether same-host connections may move to shared-memory rings (ring.h): FERRY_SOFT_SAME_HOST is
// not "0". Rings work where cross-memory attach is refused: they are the staging fallback then.
bool sameHostRingsAllowed();

// How a same-host request's bytes moved.
enum class SameHostCopy {
  kAttach,  // process_vm_writev/readv
  kMapped,  // loads and stores into memory both sides map (no system call)
  kDevice,  // CUDA copies: device memory at either end
};
// How many work requests this process has carried out on the same-host path.
uint64_t sameHostOpsDone();
// How many of them were loads and stores into memory both sides map.
uint64_t sameHostMappedOpsDone();
// How many of them moved device memory with CUDA copies.
uint64_t sameHostDeviceOpsDone();
// The counts, one per SameHostCopy (one step per batch: the total is their sum).
extern std::atomic<uint64_t> sameHostOpCounts[3];
// Counts n more of them.
inline void countSameHostOps(uint64_t n, SameHostCopy how) {
  sameHostOpCounts[static_cast<int>(how)].fetch_add(n, std::memory_order_relaxed);
}
// How many copies a CopyHelper has shared (a part of a request copied on its thread).
uint64_t sameHostSplitCopies();

// The IPC handle a region of device memory is published with (share.h): nothing for host memory,
// or for device memory the driver cannot share between processes (then only the owner's own
// process reaches it on this path).
std::optional<cuda::IpcHandle> shareableDevice(const void* addr, MemoryLocation where);

namespace share_layout {
struct RegionView;
struct Header;
struct MrRecord;
struct QpRecord;
struct AccessorSlot;
}  // namespace share_layout

// The owner's side.
class ShareTable {
 public:
  static Result<std::unique_ptr<ShareTable>> create();
  ~ShareTable();
  ShareTable(const ShareTable&) = delete;
  ShareTable& operator=(const ShareTable&) = delete;

  ShareInfo info() const;
  // Whether a region with this key can be published (its record slot is free).
  bool keyFits(uint32_t key) const;
  // Publishes a region (a no-op when its slot is taken: that region then goes over TCP only).
  // Device memory names its device, and the IPC handle that opens it in another process (none:
  // only this process's own QPs reach it on the same-host path).
  void publishMr(uint32_t key, const void* addr, uint64_t length, uint32_t access, const void* pd,
                 MemoryLocation where = {}, const cuda::IpcHandle* ipc = nullptr);
  // Withdraws a region's record (no new access starts with the key)...
  void withdrawMr(uint32_t key);
  // ... and waits until no accessor is in the middle of a copy with it.
  void waitForAccessors(uint32_t key);
  // Publishes the state of an RC QP (a QP in RESET or ERR is published as unusable).
  void publishQp(uint32_t qpn, verbs::QpState state, uint32_t access, const void* pd, uint32_t destQpn);
  void retractQp(uint32_t qpn);

 private:
  ShareTable() = default;

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint64_t cookie_ = 0;  // the copy accessors read with process_vm_readv to prove they reach us
  std::mutex writeMu_;   // one writer of the records at a time
};

// A second copying thread for large same-host requests: the posting thread copies one part while
// this thread copies another, so one QP's large WRITE or READ uses two cores. One job at a time;
// a caller that finds it busy copies everything itself. Started on first use.
class CopyHelper {
 public:
  CopyHelper() = default;
  ~CopyHelper();
  CopyHelper(const CopyHelper&) = delete;
  CopyHelper& operator=(const CopyHelper&) = delete;
  // Starts job on the helper thread; false when the helper is busy (or cannot start).
  bool tryStart(std::function<bool()> job);
  // Waits for the job tryStart() started and returns its result.
  bool wait();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  std::function<bool()> job_;
  bool busy_ = false;  // a job was started and not waited for
  bool done_ = false;
  bool result_ = false;
  bool stopping_ = false;
};

// The accessor's side: one owner's table, mapped; shared by the QPs of a context that reach it.
class SharePeer {
 public:
  // Maps the table info names and proves it belongs to a live process whose memory we can reach.
  static Result<std::shared_ptr<SharePeer>> open(const ShareInfo& info);
  ~SharePeer();
  SharePeer(const SharePeer&) = delete;
  SharePeer& operator=(const SharePeer&) = delete;

  const ShareInfo& info() const { return info_; }
  // Whether the owner process still runs (its pidfd has not signalled exit).
  bool alive() const;
  // alive(), asked of the kernel at most every few milliseconds: a pid is not reused that fast (the
  // kernel hands out every other free pid first), and the lost TCP connection ends the path too.
  // When it asks the kernel, it also sweeps the mappings (sweepMappings()).
  bool aliveRecently();

  // The owner's memfd (memory both sides map), mapped here; unmapped when the last user drops it.
  struct Mapping {
    ~Mapping();
    uint8_t* base = nullptr;
    uint64_t length = 0;
  };
  // Maps the owner's memfd with descriptor number fd and this inode, or returns the mapping made
  // before; nullptr when it cannot be mapped (gone, another file, not size-sealed, refused).
  std::shared_ptr<Mapping> mapping(uint32_t fd, uint64_t inode);
  // Drops the mappings no slot uses whose memfd the owner no longer holds (it freed the memory,
  // which our mapping would otherwise keep alive), and the device allocations no slot uses that no
  // record names any more. At most once a second unless now is set; never waits for the lock.
  // aliveRecently() calls it.
  void sweepMappings(bool now = false);

  // An allocation of the owner's device memory, opened here (closed when the last user drops it).
  struct DeviceMapping {
    ~DeviceMapping();
    cuda::IpcMapping opened;
    std::array<uint8_t, 64> handle{};  // the handle it was opened with
  };
  // Opens the allocation the handle names, or returns the one opened before; nullptr when it
  // cannot be opened here (no such device visible, the driver refused).
  std::shared_ptr<DeviceMapping> deviceMapping(const cuda::IpcHandle& handle);
  // How many device allocations are open now.
  size_t deviceMappings();

  // An accessor slot held by one QP; released when the Slot is destroyed.
  class Slot {
   public:
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    // Marks rkey busy and checks the owner's records for a `need` access (kRemoteWrite or
    // kRemoteRead) of [addr, addr+len) through the owner's QP qpn, connected to our QP srcQpn.
    // On true the access may proceed and end() must follow; on false nothing is marked.
    bool begin(uint32_t qpn, uint32_t srcQpn, uint32_t rkey, uint64_t addr, uint64_t len, uint32_t need);
    void end();
    // Copies between local and [remote, remote+len) in the owner; true when every byte moved.
    bool copy(bool toRemote, std::span<const iovec> local, uint64_t remote, size_t len) const;
    // One system call for many pieces: local and remote list the same number of bytes (at most
    // IOV_MAX iovecs each); true when every byte moved.
    bool copyv(bool toRemote, std::span<const iovec> local, std::span<const iovec> remote) const;
    // Whether the access begin() allowed is made through a mapping of the owner's memory.
    bool mapped() const { return viaMap_; }
    // Whether the access begin() allowed is to the owner's device memory (copied by the driver).
    bool onDevice() const { return viaDevice_; }
    // Only when onDevice() or mapped(): copies between local pieces and the owner's memory with
    // CUDA copies (and memcpy between host pieces), each remote piece taking the next local bytes;
    // true when every byte moved. localDevice[i]: the CUDA ordinal local[i] is on, -1 for host
    // memory (nullptr: every piece is host memory).
    bool copyThroughDriver(bool toRemote, std::span<const iovec> local, const int16_t* localDevice,
                           std::span<const iovec> remote) const;
    // Only when mapped(): a compare-and-swap (cmpSwap) or fetch-and-add on the 8 bytes at remote,
    // with the hardware's atomic instructions (as the owner's responder applies the atomics it
    // receives, on the same memory); the value before it.
    uint64_t atomic(bool cmpSwap, uint64_t remote, uint64_t compareAdd, uint64_t swap) const;

   private:
    friend class SharePeer;
    Slot(std::shared_ptr<SharePeer> peer, uint32_t index) : peer_(std::move(peer)), index_(index) {}
    bool copyMapped(bool toRemote, std::span<const iovec> local, uint64_t remote, size_t len) const;
    std::shared_ptr<SharePeer> peer_;
    uint32_t index_;
    // The mapping of the last region begin() allowed (kept for the next access to it).
    std::shared_ptr<Mapping> mapped_;
    uint32_t mappedFd_ = 0;
    uint64_t mappedInode_ = 0;
    bool viaMap_ = false;     // this access goes through mapped_: owner address + bias_ is ours
    bool viaDevice_ = false;  // this access is to the owner's device memory (beginDevice)
    uint64_t bias_ = 0;
    // Maps the owner's memfd (descriptor number plus one, inode) for the accesses to come, or
    // drops the mapping held (memFd 0).
    void remap(uint32_t memFd, uint64_t memInode);
    // The owner's device memory: owner address + deviceBias_ is ours, on remoteWhere_. Kept after
    // what every host access reads, off its cache line.
    bool beginDevice(const share_layout::RegionView& region, uint32_t recordSlot);
    uint64_t deviceBias_ = 0;
    MemoryLocation remoteWhere_;
    std::shared_ptr<DeviceMapping> device_;
  };
  // Claims a free accessor slot (reclaiming slots of dead processes); kResourceExhausted if none.
  static Result<std::unique_ptr<Slot>> claim(const std::shared_ptr<SharePeer>& peer);

 private:
  SharePeer() = default;
  share_layout::Header* header() const;

  ShareInfo info_;
  int pidfd_ = -1;
  std::mutex mapMu_;
  std::atomic<int64_t> sweptAt_{0};  // CLOCK_MONOTONIC_COARSE ns of the last sweep
  // By (descriptor number, inode); a nullptr entry remembers a memfd that could not be mapped.
  std::map<std::pair<uint32_t, uint64_t>, std::shared_ptr<Mapping>> mappings_;
  // By the handle's bytes; a nullptr entry remembers a handle that could not be opened.
  std::map<std::array<uint8_t, 64>, std::shared_ptr<DeviceMapping>> deviceMappings_;
  void sweepDeviceMappingsLocked();
  std::atomic<int64_t> aliveAt_{0};  // CLOCK_MONOTONIC_COARSE ns of the last live check
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ferry::soft
