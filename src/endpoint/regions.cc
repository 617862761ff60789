// The endpoint's memory regions: local ones are the pool's (memory_pool.h); the peer's are kept
// here by handle and by name, recorded by connect() from its metadata or one by one from an
// mr_info entry, and resolved by operations under remoteMu_.
#include <optional>

#include "common/json.h"
#include "endpoint/endpoint_internal.h"
#include "endpoint/metadata.h"
#include "ferry/endpoint/endpoint.h"

namespace ferry::endpoint {

Result<MrHandle> EndpointImpl::registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                                    RegionOptions options) {
  return pool_->registerMemoryRegion(name, addr, length, std::move(options));
}

Result<MrHandle> EndpointImpl::registerMemoryRegion(uint64_t key, void* addr, uint64_t length,
                                                    RegionOptions options) {
  return pool_->registerMemoryRegion(key, addr, length, std::move(options));
}

Result<MrHandle> EndpointImpl::registerRemoteMemoryRegion(std::string_view name,
                                                          std::string_view mrInfoJson) {
  if (name.empty()) return invalidArgument("register_remote_memory_region: the name is empty");
  auto parsed = json::parse(mrInfoJson);
  if (!parsed.isOk()) return invalidArgument("register_remote_memory_region: " + parsed.status().message());
  FERRY_ASSIGN_OR_RETURN(
      RegionMetadata r,
      decodeRegion(std::string(name), *parsed, "register_remote_memory_region '" + std::string(name) + "'"));
  std::unique_lock<std::shared_mutex> lock(remoteMu_);
  return recordRemoteLocked(
      RemoteRegion{
          .name = r.name, .addr = r.addr, .length = r.length, .rkey = r.rkey, .writable = r.writable},
      r.handle);
}

Status EndpointImpl::unregisterRemoteMemoryRegion(MrHandle handle) {
  std::unique_lock<std::shared_mutex> lock(remoteMu_);
  auto it = remotes_.find(handle);
  if (it == remotes_.end())
    return notFound("unregister_remote_memory_region: no remote region " + std::to_string(handle));
  remoteNames_.erase(it->second.name);
  remotes_.erase(it);
  return Status::ok();
}

MrHandle EndpointImpl::recordRemoteLocked(RemoteRegion region, std::optional<MrHandle> wanted) {
  auto named = remoteNames_.find(region.name);
  MrHandle handle;
  if (named != remoteNames_.end()) {
    handle = named->second;
  } else if (wanted && remotes_.count(*wanted) == 0) {
    handle = *wanted;
  } else {
    while (remotes_.count(nextRemote_) != 0) ++nextRemote_;
    handle = nextRemote_++;
  }
  remoteNames_[region.name] = handle;
  remotes_[handle] = std::move(region);
  return handle;
}

Result<MrHandle> EndpointImpl::localHandle(std::string_view name) const { return pool_->handleOf(name); }

Result<MrHandle> EndpointImpl::remoteHandle(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(remoteMu_);
  auto it = remoteNames_.find(std::string(name));
  if (it == remoteNames_.end()) {
    return notFound("no remote memory region named '" + std::string(name) +
                    "' (register_remote_memory_region() or connect() records them)");
  }
  return it->second;
}

}  // namespace ferry::endpoint
