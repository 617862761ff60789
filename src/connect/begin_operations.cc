// begin_read and begin_write, reader and writer side: the metadata checked and the buffers
// exposed for this one operation, BEGIN sent once the connection to the owner is ready, and the
// owner's STARTED and DONE.

#include <algorithm>
#include <string>
#include <string_view>

#include "agent/crypto.h"
#include "common/json.h"
#include "connect/connector_impl.h"

namespace ferry::connect {

namespace {

// "cpu", or "cuda:N" with N a device ordinal: what metadata names a descriptor's device by.
bool knownDevice(const std::string& device) {
  if (device == "cpu") return true;
  constexpr std::string_view kCuda = "cuda:";
  if (device.size() <= kCuda.size() || device.size() > kCuda.size() + 4 || device.rfind(kCuda, 0) != 0)
    return false;
  return std::all_of(device.begin() + static_cast<std::ptrdiff_t>(kCuda.size()), device.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

// What a reader or writer checks before it exposes anything: the metadata's kind, its own buffers
// against the remote descriptors, the expiry, and an owner that is not this connector.
Status Connector::Impl::checkBeginMetadata(const char* what, OperationKind kind, const Metadata& md,
                                           const std::vector<Buffer>& bufs) const {
  if (md.kind != kind) {
    return invalidArgument(std::string(what) + ": the metadata is of a " +
                           (md.kind == OperationKind::kRead ? "readable" : "writable") + " operation (use " +
                           (md.kind == OperationKind::kRead ? "begin_read" : "begin_write") + ")");
  }
  FERRY_RETURN_IF_ERROR(checkBuffers(bufs, kind == OperationKind::kRead, what));
  if (bufs.size() != md.descriptors.size()) {
    return invalidArgument(std::string(what) + ": " + std::to_string(bufs.size()) +
                           " local descriptors for " + std::to_string(md.descriptors.size()) +
                           " remote ones");
  }
  for (size_t i = 0; i < bufs.size(); ++i) {
    // Where the owner's memory lives is the owner's to serve (its engine moves CUDA memory as it
    // moves host memory); a device this ferry does not know is a malformed descriptor.
    if (!knownDevice(md.descriptors[i].device)) {
      return invalidArgument(std::string(what) + ": remote descriptor " + std::to_string(i) +
                             " is on an unknown device '" + md.descriptors[i].device +
                             "' (expected 'cpu' or 'cuda:N')");
    }
    if (bufs[i].length != md.descriptors[i].size) {
      return invalidArgument(std::string(what) + ": descriptor " + std::to_string(i) + " has " +
                             std::to_string(bufs[i].length) + " bytes, the remote one " +
                             std::to_string(md.descriptors[i].size));
    }
  }
  if (nowMs() > md.expires) {
    return invalidArgument(std::string(what) + ": the metadata expired " +
                           std::to_string(nowMs() - md.expires) + " ms ago");
  }
  auto owner = agent::WorkerAddress::decode(md.address);
  if (!owner.isOk())
    return invalidArgument(std::string(what) + ": the metadata's address: " + owner.status().message());
  if (owner->uuid == agent->workerAddress().uuid) {
    return invalidArgument(std::string(what) +
                           ": the metadata is of this connector's own operation (a connector "
                           "moves bytes between workers; use a second Connector)");
  }
  return Status::ok();
}

// BEGIN leaves once the connection to the owner is ready (or its wireup failed: sendBegin ends the
// operation).
void Connector::Impl::sendBeginWhenReady(const OpPtr& op,
                                         const std::shared_ptr<agent::PeerConnection>& conn) {
  if (conn->isConnected()) {
    sendBegin(op, Status::ok());  // the usual case: BEGIN leaves at once
    return;
  }
  std::weak_ptr<Impl> weak = weak_from_this();
  conn->ready().state()->onDone([weak, op](const Completion& d) {
    Status st = d.status();
    if (auto self = weak.lock())
      self->agent->post([weak, op, st] {
        if (auto s = weak.lock()) s->sendBegin(op, st);
      });
  });
}

Result<std::shared_ptr<Operation>> Connector::Impl::begin(OperationKind kind, std::string_view text,
                                                          std::vector<Buffer> bufs) {
  const char* what = kind == OperationKind::kRead ? "begin_read" : "begin_write";
  auto decoded = decodeMetadata(text);
  if (!decoded.isOk()) return invalidArgument(std::string(what) + ": " + decoded.status().message());
  Metadata& md = *decoded;
  FERRY_RETURN_IF_ERROR(checkBeginMetadata(what, kind, md, bufs));
  auto op = std::make_shared<Operation::State>();
  op->connector = weak_from_this();
  op->kind = kind;
  op->passive = false;
  op->buffers = std::move(bufs);
  for (const auto& b : op->buffers) op->total += b.length;
  op->metadata = std::move(md);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (shut) return Status(StatusCode::kClosed, std::string(what) + ": the connector was shut down");
    op->id = newIdLocked();
  }
  // Exposed to the owner for this operation only: a read's buffers to be written, a write's to
  // be read.
  ep::RegionOptions o;
  o.writable = kind == OperationKind::kRead;
  o.remote = kind == OperationKind::kRead ? ep::RegionOptions::Remote::kWriteOnly
                                          : ep::RegionOptions::Remote::kDefault;
  FERRY_RETURN_IF_ERROR(registerBuffers(op, o));
  // A connection whose endpoint failed (a refused access ends an RC connection both ways) is
  // retired by the agent's lookup, and this operation wires up anew.
  auto conn = agent->connectAddress(op->metadata.address);
  if (!conn.isOk()) {
    for (const auto& n : op->regions) (void)agent->unregisterMemoryRegion(n);
    return invalidArgument(std::string(what) + ": " + conn.status().message());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    op->peer = *conn;
    op->status = OperationStatus::kInProgress;
    active[op->id] = op;
    ++stats.begun;
  }
  // The owner accepts a BEGIN up to the expiry by its own clock, and its STARTED takes one more
  // trip: a reader or writer waits cancelGrace longer for it (as it waits for the answer to a
  // CANCEL).
  expireAt(op, op->metadata.expires, opts.cancelGrace);
  sendBeginWhenReady(op, *conn);
  return std::make_shared<Operation>(op);
}

void Connector::Impl::sendBegin(const OpPtr& op, const Status& ready) {
  std::unique_lock<std::mutex> lock(mu);
  if (op->ended) return;
  if (!ready.isOk()) {
    lock.unlock();
    finish(op, OperationStatus::kErrored,
           Status(ready.code(), "could not reach worker '" + op->metadata.worker + "': " + ready.message()));
    return;
  }
  auto endpoint = op->peer->endpoint(agent::OpClass::kRma);
  Message begin = messageOf(MessageType::kBegin, op->id);
  begin.metadata = op->metadata;
  Status bad = endpoint ? Status::ok() : Status(StatusCode::kUnavailable, "no endpoint to the owner");
  for (size_t i = 0; i < op->regions.size() && bad.isOk(); ++i) {
    auto h = endpoint->localHandle(op->regions[i]);
    auto info = h.isOk() ? endpoint->pool()->regionInfo(*h) : Result<std::string>(h.status());
    auto parsed = info.isOk() ? json::parse(*info) : Result<json::Value>(info.status());
    if (!parsed.isOk()) {
      bad = parsed.status();
      break;
    }
    auto num = [&](const char* k) -> uint64_t {
      const json::Value* v = parsed->find(k);
      auto i = v ? v->getInt() : Result<int64_t>(invalidArgument(""));
      return i.isOk() ? static_cast<uint64_t>(*i) : 0;
    };
    begin.buffers.push_back(
        {.addr = num("addr"), .length = num("length"), .rkey = static_cast<uint32_t>(num("rkey"))});
  }
  if (bad.isOk()) {
    op->peerUuid = op->peer->peerUuid();
    bad = op->peer->sendMessage(kChannel, encodeMessage(begin));
  }
  if (!bad.isOk()) {
    lock.unlock();
    finish(op, OperationStatus::kErrored, Status(bad.code(), "could not begin: " + bad.message()));
    return;
  }
  op->beginSent = true;
  watchLocked(op->peer, op->peerUuid);
}

void Connector::Impl::onStarted(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = active.find(m.id);
  if (it == active.end() || it->second->peerUuid != from->peerUuid()) return;
  it->second->started = true;
}

void Connector::Impl::onDone(const std::shared_ptr<agent::PeerConnection>& from, const Message& m) {
  OpPtr op;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = active.find(m.id);
    if (it == active.end()) return;
    op = it->second;
    if (op->peerUuid != from->peerUuid()) return;  // not from the owner it was sent to
    op->started = true;
    if (op->cancelling && m.code != StatusCode::kOk) {
      op->ownerStopped = true;  // cancel() finishes it
      cv.notify_all();
      return;
    }
    op->ownerStopped = true;
  }
  if (m.code == StatusCode::kOk) {
    op->bytes = op->total;
    finish(op, OperationStatus::kComplete, Status::ok());
  } else {
    finish(op, OperationStatus::kErrored,
           Status(m.code, "worker '" + op->metadata.worker + "': " + m.reason));
  }
}

}  // namespace ferry::connect
