// Issuing operations (caller's thread): read, write, write_with_imm and send check their batch
// against the regions and resolve it to addresses and keys before anything is posted, then queue
// it in issue order for posting.cc. recv() and immRecv() are receives.cc's.
#include <optional>

#include "endpoint/endpoint_internal.h"

namespace ferry::endpoint {

std::shared_ptr<OpState> EndpointImpl::newOp(OpKind kind) {
  auto op = std::make_shared<OpState>(kind);
  op->track(metrics_, context_->metrics());
  op->setProgressor(self_);
  return op;
}

Result<std::shared_ptr<OpState>> EndpointImpl::resolveTransfers(OpKind kind,
                                                                std::span<const Assignment> batch) {
  auto op = newOp(kind);
  op->transfers.reserve(batch.size());
  const char* verb = kind == OpKind::kRead ? "read" : kind == OpKind::kWrite ? "write" : "write_with_imm";
  std::optional<RegionView> local;
  const RemoteRegion* remote = nullptr;  // the region of remoteHandleCached
  MrHandle remoteHandleCached = 0;
  std::shared_lock<std::shared_mutex> lock(remoteMu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const Assignment& a = batch[i];
    auto where = [&] { return std::string(verb) + ": assignment " + std::to_string(i) + ": "; };
    if (!local || local->handle != a.local) {
      auto found = pool_->find(a.local);
      if (!found.isOk()) return invalidArgument(where() + found.status().message());
      local = *found;
    }
    if (remote == nullptr || remoteHandleCached != a.remote) {
      auto it = remotes_.find(remoteHandleCached = a.remote);
      if (it == remotes_.end()) {
        return invalidArgument(where() + "no remote memory region with handle " + std::to_string(a.remote) +
                               " (register_remote_memory_region() or connect() records them)");
      }
      remote = &it->second;
    }
    if (a.localOffset > local->length || a.length > local->length - a.localOffset) {
      return invalidArgument(where() + "local offset " + std::to_string(a.localOffset) + " + length " +
                             std::to_string(a.length) + " exceeds the local region (" +
                             std::to_string(local->length) + " bytes)");
    }
    if (a.remoteOffset > remote->length || a.length > remote->length - a.remoteOffset) {
      return invalidArgument(where() + "remote offset " + std::to_string(a.remoteOffset) + " + length " +
                             std::to_string(a.length) + " exceeds remote region '" + remote->name + "' (" +
                             std::to_string(remote->length) + " bytes)");
    }
    if (kind == OpKind::kRead && !local->writable) {
      return invalidArgument(where() + "the local region is read-only: it cannot be a READ's destination");
    }
    if (kind != OpKind::kRead && !remote->writable) {
      return invalidArgument(where() + "remote region '" + remote->name + "' is read-only");
    }
    if (a.length == 0) continue;
    const uint64_t localAddr = local->addr + a.localOffset;
    const uint64_t remoteAddr = remote->addr + a.remoteOffset;
    op->totalBytes += a.length;
    if (!op->transfers.empty()) {
      // A range that continues the previous one on both sides travels with it (fewer work
      // requests for batches of consecutive pages).
      Transfer& prev = op->transfers.back();
      if (prev.lkey == local->lkey && prev.rkey == remote->rkey &&
          prev.localAddr + prev.length == localAddr && prev.remoteAddr + prev.length == remoteAddr) {
        prev.length += a.length;
        continue;
      }
    }
    op->transfers.push_back(Transfer{.localAddr = localAddr,
                                     .remoteAddr = remoteAddr,
                                     .length = a.length,
                                     .lkey = local->lkey,
                                     .rkey = remote->rkey});
  }
  return op;
}

Result<std::shared_ptr<OpState>> EndpointImpl::resolvePieces(OpKind kind, std::span<const Chunk> chunks) {
  auto op = newOp(kind);
  const char* verb = kind == OpKind::kSend ? "send" : "recv";
  std::optional<RegionView> region;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    auto where = [&] { return std::string(verb) + ": chunk " + std::to_string(i) + ": "; };
    if (!region || region->handle != c.mr) {
      auto found = pool_->find(c.mr);
      if (!found.isOk()) return invalidArgument(where() + found.status().message());
      region = *found;
    }
    if (c.offset > region->length || c.length > region->length - c.offset) {
      return invalidArgument(where() + "offset " + std::to_string(c.offset) + " + length " +
                             std::to_string(c.length) + " exceeds the region (" +
                             std::to_string(region->length) + " bytes)");
    }
    if (kind == OpKind::kRecv && !region->writable) {
      return invalidArgument(where() + "the region is read-only: it cannot receive");
    }
    if (c.length == 0) continue;
    op->pieces.push_back(MessagePiece{.mr = c.mr,
                                      .addr = region->addr + c.offset,
                                      .length = c.length,
                                      .lkey = region->lkey,
                                      .location = region->location});
    op->totalBytes += c.length;
  }
  return op;
}

Status EndpointImpl::notUsableLocked() const {
  switch (state_) {
    case State::kShutdown: return closedError("the endpoint was shut down");
    case State::kFailed: return failure_;
    case State::kIdle:
      return Status(StatusCode::kUnavailable,
                    "the endpoint is not connected (call connect(peer_info) first)");
    case State::kConnected: break;
  }
  return Status::ok();
}

Status EndpointImpl::submit(const std::shared_ptr<OpState>& op) {
  std::lock_guard<std::mutex> lock(mu_);
  FERRY_RETURN_IF_ERROR(notUsableLocked());
  if (op->kind() == OpKind::kSend) op->messageSeq = sendSeq_++;
  queue_.push_back(op);
  pumpLocked();
  return Status::ok();
}

Result<ReadWriteFuture> EndpointImpl::read(std::span<const Assignment> batch) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolveTransfers(OpKind::kRead, batch));
  FERRY_RETURN_IF_ERROR(submit(op));
  return ReadWriteFuture(std::move(op));
}

Result<ReadWriteFuture> EndpointImpl::write(std::span<const Assignment> batch) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolveTransfers(OpKind::kWrite, batch));
  FERRY_RETURN_IF_ERROR(submit(op));
  return ReadWriteFuture(std::move(op));
}

Result<ReadWriteFuture> EndpointImpl::writeWithImm(std::span<const Assignment> batch, uint32_t immData) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolveTransfers(OpKind::kWriteWithImm, batch));
  op->imm = immData;
  FERRY_RETURN_IF_ERROR(submit(op));
  return ReadWriteFuture(std::move(op));
}

Result<SendFuture> EndpointImpl::send(std::span<const Chunk> chunks) {
  FERRY_ASSIGN_OR_RETURN(auto op, resolvePieces(OpKind::kSend, chunks));
  FERRY_RETURN_IF_ERROR(submit(op));
  return SendFuture(std::move(op));
}

}  // namespace ferry::endpoint
