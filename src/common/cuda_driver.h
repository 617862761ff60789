// CUDA's driver API, loaded at run time: libcuda.so.1 (FERRY_CUDA_LIBRARY) by dlopen, as the
// ibverbs provider loads libibverbs. ferry builds without a CUDA toolkit, and on a machine without
// a GPU nothing changes. What ferry asks of the driver: where a range of memory lives (so that no
// path reads device memory as host memory), and copies between device and host memory (the
// software devices stage device memory through host buffers; docs/gpu.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ferry/common/memory_location.h"
#include "ferry/common/status.h"

namespace ferry::cuda {

// The driver as this process found it (loaded once, at the first call).
struct DriverInfo {
  bool usable = false;
  std::string library;  // what was loaded, or tried
  std::string reason;   // why the driver is not usable ("" when it is)
  int version = 0;      // cuDriverGetVersion: 1000 * major + 10 * minor
  int devices = 0;
};
const DriverInfo& driver();

// "usable: driver 13.0, 1 device" or "not usable: <reason>", for `ferry info`.
std::string describe();

// A dma-buf exporting a range of device memory, so that a NIC reads and writes it in place
// (GPUDirect RDMA: ibv_reg_dmabuf_mr). The caller owns fd and closes it once a registration holds
// the buffer; the range starts `offset` bytes into it.
struct DmaBuf {
  int fd = -1;
  uint64_t offset = 0;
};

// The CUDA IPC handle of the allocation a range of device memory lies in (cuIpcGetMemHandle), for
// another process of this host to open (cuIpcOpenMemHandle): the same-host path's device-to-device
// copies between processes (docs/gpu.md). Whoever holds the 64 bytes may open the allocation as a
// process of the same user: keep them where only such processes read.
struct IpcHandle {
  std::array<uint8_t, 64> bytes{};
  std::array<uint8_t, 16> uuid{};  // the device's UUID: its ordinal may differ in the other process
  uint64_t base = 0;               // the allocation in the exporting process
  uint64_t length = 0;
};

// An IpcHandle opened in this process: the allocation's address here and the device it is on.
struct IpcMapping {
  void* base = nullptr;
  MemoryLocation where;
};

// Device memory as ferry reaches it: the driver's (the default), or one a test installs.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Where the memory at addr lives: kHost for host memory (managed memory too) and for everything
  // when no device memory can exist; kCuda with the device's ordinal for device memory.
  virtual MemoryLocation locate(const void* addr) = 0;
  // Copies n bytes from src (at `from`) to dst (at `to`); at least one of them is on a device.
  // Synchronous: when it returns OK the bytes are in place, visible to the host and to a kernel
  // launched after it. An error (memory freed, a device lost) names the copy; dst may then hold
  // part of the bytes.
  virtual Status copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n) = 0;
  // A dma-buf of [addr, addr + length) on device `where` (cuMemGetHandleForAddressRange), or why
  // there is none: a driver older than CUDA 11.7, a device or kernel module without dma-buf
  // support, memory the driver cannot export.
  virtual Result<DmaBuf> exportDmaBuf(const void* addr, size_t length, MemoryLocation where) {
    return notSupported("export as a dma-buf: " + where.toString() + " cannot be exported");
  }
  // The IPC handle of the allocation addr lies in, on device `where`, or why there is none (memory
  // the driver cannot share between processes: virtual memory management's, or managed memory).
  virtual Result<IpcHandle> exportIpc(const void* addr, MemoryLocation where) {
    return notSupported("CUDA IPC: " + where.toString() + " shares no memory between processes");
  }
  // Opens a handle another process exported, on this process's device with the handle's UUID
  // (peer access enabled as needed); kNotFound when no device here has it. Opening a handle this
  // process exported is an error: the exporter uses its own pointer.
  virtual Result<IpcMapping> openIpc(const IpcHandle& handle) {
    return notSupported("CUDA IPC: no device memory of another process can be opened here");
  }
  // Closes what openIpc opened (the exporter's allocation is unaffected).
  virtual void closeIpc(const IpcMapping& mapping) {}
  // Pins host memory for the device's copies (cuMemHostRegister); false where it cannot.
  virtual bool pinHost(void* addr, size_t length) { return false; }
  virtual void unpinHost(void* addr) {}
};

// Installs the device memory every call below uses (nullptr: the driver's again). For tests that
// check, on a host without a GPU, that every path stages such memory instead of touching it
// (tests/common/host_backed_device.h); not thread-safe against calls in flight.
void installDeviceMemory(DeviceMemory* memory);

// The installed device memory's answers.
MemoryLocation locate(const void* addr);
Status copy(void* dst, MemoryLocation to, const void* src, MemoryLocation from, size_t n);
Result<DmaBuf> exportDmaBuf(const void* addr, size_t length, MemoryLocation where);
Result<IpcHandle> exportIpc(const void* addr, MemoryLocation where);
Result<IpcMapping> openIpc(const IpcHandle& handle);
void closeIpc(const IpcMapping& mapping);

// Host memory pinned for the device's copies while this lives (cuMemHostRegister, portable to every
// context): copies to and from it run at the bus's speed as DMA, not through the driver's own bounce
// buffers. Where the driver is not usable or refuses, the memory stays as it was (pinned() false)
// and copies with it still work. The software devices pin their staging buffers once they carry
// device memory.
class PinnedHost {
 public:
  PinnedHost() = default;
  PinnedHost(void* addr, size_t length);
  ~PinnedHost();
  PinnedHost(PinnedHost&& other) noexcept : addr_(other.addr_) { other.addr_ = nullptr; }
  PinnedHost& operator=(PinnedHost&& other) noexcept;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  bool pinned() const { return addr_ != nullptr; }

 private:
  void* addr_ = nullptr;
};

// The kernel module that lets an RDMA NIC register CUDA device pointers with plain ibv_reg_mr
// (GPUDirect RDMA through peer memory, where the driver exports no dma-bufs): "nvidia_peermem", or
// the older "nv_peer_mem", when sysfs under sysRoot shows it loaded; "" when neither is.
std::string peerMemoryModule(const std::string& sysRoot = "/sys");

// Whether this process registered device memory (noteDeviceMemoryRegistered): until it has, a
// pointer ferry is handed without a registration (inline data) is host memory and needs no
// driver call to say so.
bool deviceMemoryRegistered();
void noteDeviceMemoryRegistered();

}  // namespace ferry::cuda
