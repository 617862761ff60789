// The endpoint's metadata and connection (endpoint.h): endpointInfo() describes this side (the
// codec is metadata.cc), connect() checks the peer's, brings every queue pair to RTS against its
// peer and records the peer's regions.
#include <algorithm>

#include "endpoint/endpoint_internal.h"
#include "endpoint/endpoint_qp.h"
#include "endpoint/metadata.h"

namespace ferry::endpoint {
namespace {

namespace v = ferry::verbs;

}  // namespace

std::string EndpointImpl::endpointInfo() const { return json::serialize(endpointInfoValue()); }

json::Value EndpointImpl::endpointInfoValue() const {
  EndpointMetadata m{.device = context_->deviceName(),
                     .ibPort = context_->ibPort(),
                     .linkType = context_->linkType(),
                     .numQp = static_cast<uint32_t>(options_.numQp),
                     .recvBufferSize = options_.recvBufferSize,
                     .recvDepth = options_.recvDepth,
                     .paths = {},
                     .regions = {}};
  for (const auto& qp : qps_) m.paths.push_back(qp->local);
  return metadataValue(m, pool_->mrInfo());
}

json::Value endpointInfoValue(const Endpoint& endpoint) {
  return static_cast<const EndpointImpl&>(endpoint).endpointInfoValue();
}

Status connectFromValue(Endpoint& endpoint, const json::Value& peerInfo) {
  return static_cast<EndpointImpl&>(endpoint).connect(peerInfo);
}

std::string EndpointImpl::mrInfo() const { return pool_->mrInfo(); }

Status EndpointImpl::connect(std::string_view peerInfo) {
  FERRY_ASSIGN_OR_RETURN(EndpointMetadata peer, decodeMetadata(peerInfo, "connect: peer metadata"));
  return connectTo(std::move(peer));
}

Status EndpointImpl::connect(const json::Value& peerInfo) {
  FERRY_ASSIGN_OR_RETURN(EndpointMetadata peer, decodeMetadataValue(peerInfo, "connect: peer metadata"));
  return connectTo(std::move(peer));
}

Status EndpointImpl::establishQp(EndpointQp& qp, v::Path path) {
  path.reverse();  // the peer's path, seen from this side
  path.portNum = qp.local.portNum;
  path.sgidIndex = qp.local.sgidIndex;
  FERRY_RETURN_IF_ERROR(v::fillPath(context_->verbs(), qp.queuePair, path));
  // Our side as published; our own transport policy (never the peer's timeouts for our QP).
  path.sgid = qp.local.sgid;
  path.sqpsn = qp.local.sqpsn;
  path.retries = qp.local.retries;
  path.rnrRetries = qp.local.rnrRetries;
  path.minRnrTimer = qp.local.minRnrTimer;
  path.packetLifeTime = qp.local.packetLifeTime;
  return qp.queuePair.establish(path, kQpAccess);
}

Status EndpointImpl::connectTo(EndpointMetadata peer) {
  // Everything is checked first: malformed metadata changes nothing.
  if (peer.numQp != options_.numQp) {
    return invalidArgument("connect: peer metadata: the peer has num_qp=" + std::to_string(peer.numQp) +
                           ", this endpoint " + std::to_string(options_.numQp) +
                           ": both sides need the same num_qp");
  }
  std::vector<v::Path>& peerPaths = peer.paths;
  std::vector<RegionMetadata>& regions = peer.regions;
  const uint32_t recvBufferSize = peer.recvBufferSize;

  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kShutdown) return closedError("connect: the endpoint was shut down");
    if (state_ == State::kFailed) return failure_;
    if (state_ == State::kConnected) return invalidArgument("connect: the endpoint is already connected");
    for (size_t i = 0; i < qps_.size(); ++i) {
      Status st = establishQp(*qps_[i], peerPaths[i]);
      if (!st.isOk()) {
        Status why(st.code(),
                   "connect: bringing up queue pair " + std::to_string(i) + " failed: " + st.message() +
                       " (this endpoint cannot be used any more)",
                   st.cause());
        failLocked(why);
        return why;
      }
    }
    peerRecvBufferSize_ = static_cast<uint32_t>(recvBufferSize);
    state_ = State::kConnected;
    updateProbeLocked();
  }
  {
    std::unique_lock<std::shared_mutex> lock(remoteMu_);
    // In the peer's handle order, so its handles are kept wherever they are free here.
    std::sort(regions.begin(), regions.end(), [](const RegionMetadata& a, const RegionMetadata& b) {
      return a.handle.value_or(~MrHandle{0}) < b.handle.value_or(~MrHandle{0});
    });
    for (auto& r : regions) {
      recordRemoteLocked(
          RemoteRegion{
              .name = r.name, .addr = r.addr, .length = r.length, .rkey = r.rkey, .writable = r.writable},
          r.handle);
    }
  }
  auto worker = this->worker();
  if (worker) worker->wake();
  return Status::ok();
}

bool EndpointImpl::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kConnected;
}

}  // namespace ferry::endpoint
