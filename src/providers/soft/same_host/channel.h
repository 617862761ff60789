// SameHostChannel: a queue pair's way to a peer on this host through the peer's memory.
//
// When the peer's hello reply offers its share table (share.h) and this process can reach the
// peer's memory, the QP opens a channel. A WRITE or READ posted while nothing else is outstanding
// on the QP is then carried out by the posting thread itself, before ibv_post_send returns:
// checked against the peer's records, one process_vm_writev/readv (or, on memory both sides map
// (ferry/common/shared_memory.h), a memcpy into this process's mapping of it; for device memory at
// either end, CUDA copies through the allocation opened by its IPC handle), and its completion.
// A WRITE_WITH_IMM's data moves the same way and only its immediate goes over the connection (a
// WRITE_IMM frame with kFlagPlaced); atomics are carried out on mapped memory only. Whatever the
// channel refuses (a record that does not allow it, a peer that stopped answering) goes over the
// QP's connection in order behind it.
//
// The QP asks once per post whether the channel carries the work (SoftQp::postSend); the channel
// itself keeps no queue. Any thread; the QP keeps the channel alive while a post runs on it.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>

#include "ferry/common/status.h"
#include "ferry/verbs/types.h"
#include "providers/soft/same_host/share.h"
#include "providers/soft/wire.h"

namespace ferry::soft {

class SoftContext;

class SameHostChannel {
 public:
  // A WRITE (or READ) batch moves at most this many requests, and this many local pieces, in one
  // system call.
  static constexpr size_t kMaxBatch = 256;
  static constexpr size_t kMaxPieces = 1024;

  // The channel to the peer process the hello reply names, for QP qpn whose peer is destQpn (an
  // error when the reply offers none this process can reach). pdId: the QP's protection domain.
  static Result<std::shared_ptr<SameHostChannel>> open(SoftContext& ctx, const void* pdId, uint32_t qpn,
                                                       uint32_t destQpn, const wire::FrameHeader& reply);
  SameHostChannel(const SameHostChannel&) = delete;
  SameHostChannel& operator=(const SameHostChannel&) = delete;

  // Whether requests of this opcode may take the channel at all.
  static bool carries(verbs::WrOpcode opcode);
  // Carries out wr (of `length` bytes); false: nothing was done, it must go over the connection.
  bool run(const verbs::SendWr& wr, uint64_t length);
  // Several WRITEs (or READs) with one remote key in one system call; false: none was done.
  bool runBatch(std::span<const verbs::SendWr> wrs);

 private:
  SameHostChannel(SoftContext& ctx, const void* pdId, uint32_t qpn, uint32_t destQpn,
                  std::shared_ptr<SharePeer> peer, std::unique_ptr<SharePeer::Slot> slot);
  // An atomic on memory both sides map, as loads and stores; false: it must go to the peer.
  bool runAtomic(const verbs::SendWr& wr);
  // Copies local (the pieces of wrs' SGEs) against remote (each remote piece takes the next local
  // bytes) where device memory is at either end, ends the access begin() allowed and counts the
  // requests when every byte moved.
  bool copyDeviceAndEnd(bool write, std::span<const verbs::SendWr> wrs, std::span<const iovec> local,
                        std::span<const iovec> remote);
  // Copies local against remote (each remote piece takes the next local bytes, as copyv) with
  // this thread and the context's helper thread, about half each, split by where bytes land.
  bool copyInTwo(bool write, std::span<const iovec> local, std::span<const iovec> remote);

  SoftContext& ctx_;
  const void* const pdId_;
  const uint32_t qpn_;
  const uint32_t destQpn_;
  const std::shared_ptr<SharePeer> peer_;
  const std::unique_ptr<SharePeer::Slot> slot_;
};

}  // namespace ferry::soft
