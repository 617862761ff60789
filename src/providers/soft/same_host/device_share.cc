// The same-host path's device memory: an owner's CUDA allocations opened in the accessor's process
// by their IPC handles, and the copies between them and local memory (share.h).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/device_access.h"
#include "common/log.h"
#include "providers/soft/same_host/share.h"
#include "providers/soft/same_host/share_layout.h"

namespace ferry::soft {

std::optional<cuda::IpcHandle> shareableDevice(const void* addr, MemoryLocation where) {
  if (!where.onDevice()) return std::nullopt;
  Result<cuda::IpcHandle> ipc = cuda::exportIpc(addr, where);
  if (!ipc.isOk()) {
    FERRY_LOG(kDebug, "soft: same-host: %s memory is reached by this process only: %s",
              where.toString().c_str(), ipc.status().toString().c_str());
    return std::nullopt;
  }
  return *ipc;
}

SharePeer::DeviceMapping::~DeviceMapping() { cuda::closeIpc(opened); }

std::shared_ptr<SharePeer::DeviceMapping> SharePeer::deviceMapping(const cuda::IpcHandle& handle) {
  std::lock_guard<std::mutex> lock(mapMu_);
  if (auto it = deviceMappings_.find(handle.bytes); it != deviceMappings_.end()) return it->second;
  // Bounded as the memfd mappings are: the unused ones go first.
  constexpr size_t kMaxDeviceMappings = 256;
  if (deviceMappings_.size() >= kMaxDeviceMappings) {
    std::erase_if(deviceMappings_, [](const auto& entry) { return entry.second.use_count() <= 1; });
    if (deviceMappings_.size() >= kMaxDeviceMappings) return nullptr;
  }
  std::shared_ptr<DeviceMapping> made;
  Result<cuda::IpcMapping> opened = cuda::openIpc(handle);
  if (opened.isOk()) {
    made = std::make_shared<DeviceMapping>();
    made->opened = *opened;
    made->handle = handle.bytes;
  } else {
    FERRY_LOG(kDebug, "soft: same-host: device memory of process %u stays on the connection: %s", info_.pid,
              opened.status().toString().c_str());
  }
  deviceMappings_[handle.bytes] = made;
  return made;
}

size_t SharePeer::deviceMappings() {
  std::lock_guard<std::mutex> lock(mapMu_);
  return static_cast<size_t>(std::count_if(deviceMappings_.begin(), deviceMappings_.end(),
                                           [](const auto& e) { return e.second != nullptr; }));
}

void SharePeer::sweepDeviceMappingsLocked() {
  if (deviceMappings_.empty()) return;
  // The handles the owner's records name now: an allocation none names was deregistered (and
  // perhaps freed), and our mapping would keep its memory from the device's other users.
  std::set<std::array<uint8_t, 64>> named;
  share_layout::MrRecord* records = share_layout::mrs(base_);
  share_layout::DeviceRecord* parts = share_layout::devices(base_);
  for (uint32_t i = 0; i < share_layout::kMrSlots; ++i) {
    if (records[i].key.load(std::memory_order_relaxed) == 0) continue;
    share_layout::DeviceView view;
    if (share_layout::readStable(
            records[i], [&](const share_layout::MrRecord&) { view = share_layout::readDevice(parts[i]); }) &&
        view.hasIpc)
      named.insert(view.ipc.bytes);
  }
  std::erase_if(deviceMappings_, [&](const auto& entry) {
    return (!entry.second || entry.second.use_count() <= 1) && !named.contains(entry.first);
  });
}

bool SharePeer::Slot::beginDevice(const share_layout::RegionView& region, uint32_t recordSlot) {
  // In the owner's own process its pointers are ours.
  if (peer_->info_.pid == static_cast<uint32_t>(::getpid())) {
    device_.reset();
    deviceBias_ = 0;
    remoteWhere_ = MemoryLocation{MemoryKind::kCuda, static_cast<int>(region.device - 1)};
    viaDevice_ = true;
    return true;
  }
  // The handle, read under the record's seqlock: still the record begin() checked.
  uint32_t key = 0;
  share_layout::DeviceView device;
  const share_layout::DeviceRecord& part = share_layout::devices(peer_->base_)[recordSlot];
  if (!share_layout::readStable(share_layout::mrs(peer_->base_)[recordSlot],
                                [&](const share_layout::MrRecord& r) {
                                  key = r.key.load(std::memory_order_relaxed);
                                  device = share_layout::readDevice(part);
                                })) {
    return false;
  }
  const cuda::IpcHandle& ipc = device.ipc;
  // The region must lie in the allocation the handle opens (a record that says otherwise only
  // fails here).
  if (key != region.key || !device.hasIpc || region.addr < ipc.base || region.length > ipc.length ||
      region.addr - ipc.base > ipc.length - region.length) {
    return false;
  }
  if (!device_ || device_->handle != ipc.bytes) device_ = peer_->deviceMapping(ipc);
  if (!device_) return false;
  deviceBias_ = reinterpret_cast<uintptr_t>(device_->opened.base) - ipc.base;
  remoteWhere_ = device_->opened.where;
  viaDevice_ = true;
  return true;
}

bool SharePeer::Slot::copyThroughDriver(bool toRemote, std::span<const iovec> local,
                                        const int16_t* localDevice, std::span<const iovec> remote) const {
  if (!viaDevice_ && !viaMap_) return false;
  const MemoryLocation remoteWhere = viaDevice_ ? remoteWhere_ : MemoryLocation{};
  const uint64_t bias = viaDevice_ ? deviceBias_ : bias_;
  DeviceAccess access;
  size_t li = 0, lo = 0;
  for (const iovec& r : remote) {
    auto* at = reinterpret_cast<uint8_t*>(reinterpret_cast<uintptr_t>(r.iov_base) + bias);
    size_t done = 0;
    while (done < r.iov_len) {
      if (li == local.size()) return false;  // the lengths agree (built so by the caller)
      const size_t take = std::min(r.iov_len - done, local[li].iov_len - lo);
      uint8_t* mine = static_cast<uint8_t*>(local[li].iov_base) + lo;
      const MemoryLocation here = localDevice == nullptr || localDevice[li] < 0
                                      ? MemoryLocation{}
                                      : MemoryLocation{MemoryKind::kCuda, localDevice[li]};
      if (!here.onDevice() && !remoteWhere.onDevice()) {
        std::memcpy(toRemote ? at + done : mine, toRemote ? mine : at + done, take);
      } else if (!(toRemote ? cuda::copy(at + done, remoteWhere, mine, here, take)
                            : cuda::copy(mine, here, at + done, remoteWhere, take))
                      .isOk()) {
        return false;  // memory freed, a device lost: the request goes the ordinary way
      }
      done += take;
      lo += take;
      if (lo == local[li].iov_len) {
        ++li;
        lo = 0;
      }
    }
  }
  return true;
}

}  // namespace ferry::soft
