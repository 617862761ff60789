// Endpoint, the public handle: every call is EndpointImpl's call of the same name
// (endpoint_internal.h), so endpoint.h shows the API and none of the state.
#include "endpoint/endpoint_internal.h"
#include "ferry/endpoint/endpoint.h"

namespace ferry::endpoint {

EndpointImpl& Endpoint::impl() { return static_cast<EndpointImpl&>(*this); }
const EndpointImpl& Endpoint::impl() const { return static_cast<const EndpointImpl&>(*this); }

Endpoint::~Endpoint() = default;  // EndpointImpl's destructor shuts the endpoint down

Result<MrHandle> Endpoint::registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                                RegionOptions options) {
  return impl().registerMemoryRegion(name, addr, length, options);
}
Result<MrHandle> Endpoint::registerMemoryRegion(uint64_t key, void* addr, uint64_t length,
                                                RegionOptions options) {
  return impl().registerMemoryRegion(key, addr, length, options);
}
Result<MrHandle> Endpoint::registerRemoteMemoryRegion(std::string_view name, std::string_view mrInfoJson) {
  return impl().registerRemoteMemoryRegion(name, mrInfoJson);
}
Status Endpoint::unregisterRemoteMemoryRegion(MrHandle handle) {
  return impl().unregisterRemoteMemoryRegion(handle);
}
Result<MrHandle> Endpoint::localHandle(std::string_view name) const { return impl().localHandle(name); }
Result<MrHandle> Endpoint::remoteHandle(std::string_view name) const { return impl().remoteHandle(name); }

std::string Endpoint::endpointInfo() const { return impl().endpointInfo(); }
std::string Endpoint::mrInfo() const { return impl().mrInfo(); }
Status Endpoint::connect(std::string_view peerInfo) { return impl().connect(peerInfo); }
bool Endpoint::connected() const { return impl().connected(); }

Result<ReadWriteFuture> Endpoint::read(std::span<const Assignment> batch) { return impl().read(batch); }
Result<ReadWriteFuture> Endpoint::write(std::span<const Assignment> batch) { return impl().write(batch); }
Result<ReadWriteFuture> Endpoint::writeWithImm(std::span<const Assignment> batch, uint32_t immData) {
  return impl().writeWithImm(batch, immData);
}
Result<SendFuture> Endpoint::send(std::span<const Chunk> chunks) { return impl().send(chunks); }
Result<RecvFuture> Endpoint::recv(std::span<const Chunk> chunks) { return impl().recv(chunks); }
Result<ImmRecvFuture> Endpoint::immRecv() { return impl().immRecv(); }

void Endpoint::shutdown() { impl().shutdown(); }
void Endpoint::shutdown(const Status& why) { impl().shutdown(why); }
bool Endpoint::isShutdown() const { return impl().isShutdown(); }

size_t Endpoint::numQp() const { return impl().options_.numQp; }
const EndpointOptions& Endpoint::options() const { return impl().options_; }
const std::shared_ptr<MemoryPool>& Endpoint::pool() const { return impl().pool_; }
const std::shared_ptr<RdmaContext>& Endpoint::context() const { return impl().context_; }
std::shared_ptr<Worker> Endpoint::worker() const { return impl().worker(); }
Status Endpoint::failure() const { return impl().failure(); }
EndpointStats Endpoint::stats() const { return impl().stats(); }

}  // namespace ferry::endpoint
