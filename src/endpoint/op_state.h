// OpState: the state of one operation of an endpoint, shared by the endpoint and the operation's
// futures. Internal to the endpoint layer: users see it only through a Future (future.h).
//
// Every operation has its own OpState (never a slot reused by a counter), so a late completion can
// only ever reach the operation it belongs to. It is a Completion (completion.h): it completes
// exactly once, with success, an error, a cancellation or a failure of the connection.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/common/completion.h"
#include "ferry/common/memory_location.h"
#include "ferry/common/metrics.h"
#include "ferry/common/status.h"
#include "ferry/endpoint/assignment.h"

namespace ferry::endpoint {

// A resolved range of a one-sided transfer: addresses and keys, checked against both regions.
struct Transfer {
  uint64_t localAddr = 0;
  uint64_t remoteAddr = 0;
  uint64_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

// A resolved piece of a message (a send's gather list or a recv's scatter list).
struct MessagePiece {
  MrHandle mr = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t lkey = 0;
  MemoryLocation location;  // the region's: device memory is copied through the driver
};

class OpState : public Completion {
 public:
  explicit OpState(OpKind kind) : kind_(kind) {}

  OpKind kind() const { return kind_; }

  // Records the operation in these metrics when it completes (kind, status, bytes, the time from
  // this call to completion). Set once, by the endpoint that creates the operation.
  void track(std::shared_ptr<Metrics> endpoint, std::shared_ptr<Metrics> context);

  // ---- Progress state: owned by the endpoint, touched only under its lock. ----
  std::vector<Transfer> transfers;  // READ / WRITE / WRITE_WITH_IMM
  size_t nextTransfer = 0;
  uint64_t transferOffset = 0;       // bytes of transfers[nextTransfer] already posted
  std::vector<MessagePiece> pieces;  // send: gather list; recv: scatter list
  size_t nextPiece = 0;
  uint64_t pieceOffset = 0;
  uint64_t totalBytes = 0;   // send: message length; recv: room of the scatter list
  uint64_t movedBytes = 0;   // send: bytes posted; recv: bytes received so far
  uint32_t imm = 0;          // WRITE_WITH_IMM: the immediate to deliver
  size_t markersPosted = 0;  // WRITE_WITH_IMM: queue pairs that carry the immediate already
  uint64_t messageSeq = 0;   // send / recv: the message's number
  uint64_t wrsInFlight = 0;  // work requests posted and not completed yet
  bool allPosted = false;
  bool overflow = false;  // recv: the message was longer than the scatter list
  Status firstError;

 private:
  void completed(const Status& status, uint64_t bytes) override;

  const OpKind kind_;
  std::shared_ptr<Metrics> metrics_[2];
  Clock::time_point started_{};
};

}  // namespace ferry::endpoint
