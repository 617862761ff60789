// SameHostChannel: WRITE, READ and atomics carried out within the post on the peer's memory (one
// copy by cross-memory attach, or loads and stores on memory both sides map).
#include "providers/soft/same_host/channel.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "common/device_access.h"
#include "common/log.h"
#include "providers/soft/region_copy.h"
#include "providers/soft/soft.h"

namespace ferry::soft {

using verbs::WrOpcode;

namespace {

// The CUDA ordinal a region's memory is on, -1 for host memory (what copyThroughDriver takes).
int16_t deviceOf(const MrEntry& entry) {
  return entry.location.onDevice() ? static_cast<int16_t>(entry.location.device) : int16_t{-1};
}

// Same-host requests from this size are copied by two threads (copyInTwo).
constexpr uint64_t kStripeBytes = uint64_t{4} << 20;

}  // namespace

Result<std::shared_ptr<SameHostChannel>> SameHostChannel::open(SoftContext& ctx, const void* pdId,
                                                               uint32_t qpn, uint32_t destQpn,
                                                               const wire::FrameHeader& reply) {
  if (!ctx.share()) return notSupported("this device offers no same-host path");
  if (reply.sharePid == 0) return notSupported("the peer offers no same-host path");
  auto peer = ctx.sharePeer(ShareInfo{reply.sharePid, reply.shareFd, reply.shareCookie});
  if (!peer.isOk()) return peer.status();
  auto slot = SharePeer::claim(*peer);
  if (!slot.isOk()) return slot.status();
  return std::shared_ptr<SameHostChannel>(
      new SameHostChannel(ctx, pdId, qpn, destQpn, std::move(*peer), std::move(*slot)));
}

SameHostChannel::SameHostChannel(SoftContext& ctx, const void* pdId, uint32_t qpn, uint32_t destQpn,
                                 std::shared_ptr<SharePeer> peer, std::unique_ptr<SharePeer::Slot> slot)
    : ctx_(ctx), pdId_(pdId), qpn_(qpn), destQpn_(destQpn), peer_(std::move(peer)), slot_(std::move(slot)) {}

bool SameHostChannel::carries(WrOpcode opcode) {
  return opcode == WrOpcode::kRdmaWrite || opcode == WrOpcode::kRdmaWriteWithImm ||
         opcode == WrOpcode::kRdmaRead || opcode == WrOpcode::kAtomicCmpAndSwp ||
         opcode == WrOpcode::kAtomicFetchAndAdd;
}

namespace {

// One stretch of a same-host copy: local bytes against the peer's bytes they move to or from.
struct Stretch {
  uint8_t* local;
  uint64_t remote;
  uint64_t length;
};

// The lowest address with at least half of the stretches' bytes written below it (counting
// overlapping stretches once each), rounded up to a page. `dest` gives where a stretch writes.
template <typename Dest>
uint64_t halfwayByAddress(const std::vector<Stretch>& stretches, uint64_t total, Dest dest) {
  // Bytes below p grow by the number of stretches covering p: sweep their ends in address order.
  std::vector<std::pair<uint64_t, int>> ends;
  ends.reserve(2 * stretches.size());
  for (const Stretch& s : stretches) {
    ends.emplace_back(dest(s), 1);
    ends.emplace_back(dest(s) + s.length, -1);
  }
  std::sort(ends.begin(), ends.end());
  const uint64_t half = total / 2;
  uint64_t below = 0;
  int covering = 0;
  uint64_t at = ends.front().first;
  for (const auto& [where, step] : ends) {
    if (covering > 0 && where > at) {
      const uint64_t more = (where - at) * static_cast<uint64_t>(covering);
      if (below + more >= half) {
        const uint64_t pivot = at + (half - below + covering - 1) / static_cast<uint64_t>(covering);
        return std::min((pivot + 4095) & ~uint64_t{4095}, ends.back().first);
      }
      below += more;
    }
    at = where;
    covering += step;
  }
  return ends.back().first;
}

}  // namespace

bool SameHostChannel::copyInTwo(bool write, std::span<const iovec> local, std::span<const iovec> remote) {
  // The stretches, in post order: each remote piece takes the next bytes of the local pieces.
  std::vector<Stretch> stretches;
  stretches.reserve(local.size() + remote.size());
  uint64_t total = 0;
  size_t li = 0, lo = 0;
  for (const iovec& r : remote) {
    uint64_t at = reinterpret_cast<uintptr_t>(r.iov_base);
    size_t need = r.iov_len;
    while (need > 0) {
      if (li == local.size()) return false;  // the lengths agree (built so by the caller)
      const size_t take = std::min(need, local[li].iov_len - lo);
      stretches.push_back({static_cast<uint8_t*>(local[li].iov_base) + lo, at, take});
      at += take;
      need -= take;
      lo += take;
      total += take;
      if (lo == local[li].iov_len) {
        ++li;
        lo = 0;
      }
    }
  }
  if (stretches.empty()) return true;  // nothing to move
  // Split by where the bytes land (the peer's memory for a WRITE, ours for a READ), not by
  // request: one thread writes what lands below the pivot, the other the rest, each in post
  // order. No byte is written by both, so where requests overlap a later one's bytes still land
  // over an earlier one's (the order of an RC QP's WRITEs), and the two threads never write one
  // cache line (requests to one place, split by request, ran at a third of the speed).
  auto dest = [write](const Stretch& s) {
    return write ? s.remote : static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s.local));
  };
  const uint64_t pivot = halfwayByAddress(stretches, total, dest);
  std::vector<iovec> lows[2], highs[2];  // [0] local pieces, [1] remote pieces
  for (const Stretch& s : stretches) {
    const uint64_t d = dest(s);
    const uint64_t low = d >= pivot ? 0 : std::min<uint64_t>(s.length, pivot - d);
    if (low > 0) {
      lows[0].push_back(iovec{s.local, low});
      lows[1].push_back(iovec{reinterpret_cast<void*>(static_cast<uintptr_t>(s.remote)), low});
    }
    if (low < s.length) {
      highs[0].push_back(iovec{s.local + low, s.length - low});
      highs[1].push_back(
          iovec{reinterpret_cast<void*>(static_cast<uintptr_t>(s.remote + low)), s.length - low});
    }
  }
  const SharePeer::Slot* slot = slot_.get();
  CopyHelper& helper = ctx_.copyHelper();
  // Each half goes to the kernel as one iovec set when the memory is not mapped (IOV_MAX pieces).
  if (lows[0].empty() || highs[0].empty() || lows[0].size() > kMaxPieces || highs[0].size() > kMaxPieces ||
      !helper.tryStart([slot, write, &highs] { return slot->copyv(write, highs[0], highs[1]); })) {
    // Nothing to split, or the helper is busy with another request: all of it here. One request
    // goes through copy(), which carries on after a system call's short count (the kernel moves
    // at most about 2 GiB a call).
    if (remote.size() == 1)
      return slot->copy(write, local, reinterpret_cast<uintptr_t>(remote[0].iov_base), total);
    return slot->copyv(write, local, remote);
  }
  const bool a = slot->copyv(write, lows[0], lows[1]);
  const bool b = helper.wait();
  return a && b;
}

bool SameHostChannel::runBatch(std::span<const verbs::SendWr> wrs) {
  const bool write = wrs.front().opcode != WrOpcode::kRdmaRead;
  if (!peer_->aliveRecently()) return false;
  std::array<iovec, kMaxPieces> local;
  std::array<iovec, kMaxBatch> remote;
  size_t nl = 0;
  bool anyDevice = false;
  uint64_t lo = ~uint64_t{0}, hi = 0;
  std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
  const uint32_t need = write ? 0 : verbs::access::kLocalWrite;
  uint64_t total = 0;
  // The region of the last lkey looked up: the SGEs of a batch mostly name the same one, and the
  // memory lock keeps it registered until the batch ends.
  uint32_t knownKey = 0;
  uint64_t knownBegin = 1, knownEnd = 0;  // empty
  for (size_t i = 0; i < wrs.size(); ++i) {
    const verbs::SendWr& wr = wrs[i];
    const bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
    uint64_t len = 0;
    for (const auto& sge : wr.sgList) {
      if (sge.length == 0) continue;
      const bool known = sge.lkey == knownKey && sge.addr >= knownBegin &&
                         sge.addr + sge.length >= sge.addr && sge.addr + sge.length <= knownEnd;
      if (!inlined && !known) {
        auto entry = ctx_.findMrEntryLocked(sge.lkey, pdId_, sge.addr, sge.length, need);
        if (!entry) return false;
        knownKey = sge.lkey;
        knownBegin = reinterpret_cast<uintptr_t>(entry->addr);
        knownEnd = knownBegin + entry->length;
        anyDevice = anyDevice || onDevice(entry);
      }
      local[nl++] = iovec{reinterpret_cast<void*>(sge.addr), sge.length};
      len += sge.length;
    }
    if (wr.rdma.remoteAddr + len < wr.rdma.remoteAddr) return false;
    remote[i] = iovec{reinterpret_cast<void*>(static_cast<uintptr_t>(wr.rdma.remoteAddr)), len};
    total += len;
    lo = std::min(lo, wr.rdma.remoteAddr);
    hi = std::max(hi, wr.rdma.remoteAddr + len);
  }
  // The owner's records are checked once for the span all of them touch: inside one region, each
  // one is.
  const uint32_t remoteNeed = write ? verbs::access::kRemoteWrite : verbs::access::kRemoteRead;
  if (!slot_->begin(destQpn_, qpn_, wrs.front().rdma.rkey, lo, hi - lo, remoteNeed)) return false;
  const std::span<const iovec> localSpan(local.data(), nl), remoteSpan(remote.data(), wrs.size());
  if (anyDevice || slot_->onDevice()) return copyDeviceAndEnd(write, wrs, localSpan, remoteSpan);
  // Large: the context's helper thread copies half of it while this one copies the rest (under
  // the same accessor mark and memory lock; both end before anything completes).
  const bool copied = total >= kStripeBytes ? copyInTwo(write, localSpan, remoteSpan)
                                            : slot_->copyv(write, localSpan, remoteSpan);
  const bool mapped = slot_->mapped();
  slot_->end();
  if (copied) {
    countSameHostOps(wrs.size(), mapped ? SameHostCopy::kMapped : SameHostCopy::kAttach);
  }
  return copied;
}

bool SameHostChannel::copyDeviceAndEnd(bool write, std::span<const verbs::SendWr> wrs,
                                       std::span<const iovec> local, std::span<const iovec> remote) {
  // Where each local piece lives (the pieces as run() and runBatch() listed them; the memory lock
  // they hold keeps every region registered): looked up again here, off the host path.
  std::array<int16_t, kMaxPieces> where;
  size_t n = 0;
  for (const verbs::SendWr& wr : wrs) {
    const bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
    for (const auto& sge : wr.sgList) {
      if (sge.length == 0) continue;
      const MrEntry* entry =
          inlined ? nullptr : ctx_.findMrEntryLocked(sge.lkey, pdId_, sge.addr, sge.length, 0);
      where[n++] = entry != nullptr ? deviceOf(*entry) : int16_t{-1};
    }
  }
  // CUDA copies, against the owner's device memory opened here or its memory both sides map.
  // Device memory against memory only a system call reaches goes over the connection, staged.
  const bool copied = n == local.size() && (slot_->onDevice() || slot_->mapped()) &&
                      slot_->copyThroughDriver(write, local, where.data(), remote);
  slot_->end();
  if (copied) countSameHostOps(wrs.size(), SameHostCopy::kDevice);
  return copied;
}

bool SameHostChannel::runAtomic(const verbs::SendWr& wr) {
  if (!peer_->aliveRecently()) return false;
  std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
  const verbs::Sge& sge = wr.sgList.front();  // one 8-byte SGE (checked at post)
  const MrEntry* entry = ctx_.findMrEntryLocked(sge.lkey, pdId_, sge.addr, 8, verbs::access::kLocalWrite);
  if (!entry || onDevice(entry)) return false;
  if (!slot_->begin(destQpn_, qpn_, wr.atomic.rkey, wr.atomic.remoteAddr, 8, verbs::access::kRemoteAtomic)) {
    return false;
  }
  // Only memory both sides map: the owner's atomics are instructions on that memory, so ours are
  // too. Any other memory goes to the owner's responder, which applies it there.
  if (!slot_->mapped()) {
    slot_->end();
    return false;
  }
  const uint64_t original = slot_->atomic(wr.opcode == WrOpcode::kAtomicCmpAndSwp, wr.atomic.remoteAddr,
                                          wr.atomic.compareAdd, wr.atomic.swap);
  slot_->end();
  {
    DeviceAccess device;
    std::memcpy(reinterpret_cast<void*>(sge.addr), &original, sizeof original);
  }
  countSameHostOps(1, SameHostCopy::kMapped);
  return true;
}

bool SameHostChannel::run(const verbs::SendWr& wr, uint64_t length) {
  if (wr.opcode == WrOpcode::kAtomicCmpAndSwp || wr.opcode == WrOpcode::kAtomicFetchAndAdd) {
    return runAtomic(wr);
  }
  const bool write = wr.opcode != WrOpcode::kRdmaRead;
  if (!peer_->aliveRecently()) return false;
  std::array<iovec, 64> iov;
  size_t n = 0;
  bool anyDevice = false;
  // Our own memory stays registered while the lock is held (deregistration takes it exclusively).
  // Inline data needs no key: it is read from the caller's buffer before the post returns.
  std::shared_lock<std::shared_mutex> memLock(ctx_.memMu());
  const bool inlined = (wr.sendFlags & verbs::send_flags::kInline) != 0;
  const uint32_t need = write ? 0 : verbs::access::kLocalWrite;
  for (const auto& sge : wr.sgList) {
    if (sge.length == 0) continue;
    if (n == iov.size()) return false;
    if (!inlined) {
      const MrEntry* entry = ctx_.findMrEntryLocked(sge.lkey, pdId_, sge.addr, sge.length, need);
      if (!entry) return false;
      anyDevice = anyDevice || onDevice(entry);
    }
    iov[n++] = iovec{reinterpret_cast<void*>(sge.addr), sge.length};
  }
  const uint32_t remoteNeed = write ? verbs::access::kRemoteWrite : verbs::access::kRemoteRead;
  if (!slot_->begin(destQpn_, qpn_, wr.rdma.rkey, wr.rdma.remoteAddr, length, remoteNeed)) return false;
  const std::span<const iovec> localSpan(iov.data(), n);
  const iovec whole{reinterpret_cast<void*>(static_cast<uintptr_t>(wr.rdma.remoteAddr)), length};
  if (anyDevice || slot_->onDevice()) return copyDeviceAndEnd(write, {&wr, 1}, localSpan, {&whole, 1});
  const bool copied = length >= kStripeBytes ? copyInTwo(write, localSpan, std::span<const iovec>(&whole, 1))
                                             : slot_->copy(write, localSpan, wr.rdma.remoteAddr, length);
  const bool mapped = slot_->mapped();
  slot_->end();
  if (copied) {
    countSameHostOps(1, mapped ? SameHostCopy::kMapped : SameHostCopy::kAttach);
  }
  return copied;
}

}  // namespace ferry::soft
