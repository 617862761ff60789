// The object store's calls (ferry/objects/store.h) in a ferry built without cpp-httplib
// (CMakeLists.txt: FERRY_WITH_HTTP=OFF). The store and its client are an HTTP server and client,
// so each call is refused with kNotSupported naming the switch: `ferry objects` and ferry.objects
// say why instead of failing to link or to load. CMakeLists.txt compiles this file in place of
// store_*.cc and sigv4.cc.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/objects/store.h"

namespace ferry::objects {
namespace {

Status httpNotBuilt(const std::string& call) {
  return notSupported(call +
                      ": this ferry was built without the object store's HTTP server and client "
                      "(cpp-httplib; configured with FERRY_WITH_HTTP=OFF)");
}

}  // namespace

struct ObjectStore::Impl {};
struct ObjectClient::Impl {};

// NOLINTNEXTLINE(performance-unnecessary-value-param): store.h's signature
Result<std::unique_ptr<ObjectStore>> ObjectStore::start(StoreOptions) {
  return httpNotBuilt("ObjectStore::start");
}
ObjectStore::ObjectStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ObjectStore::~ObjectStore() = default;
uint16_t ObjectStore::port() const { return 0; }
std::string ObjectStore::url() const { return ""; }
StoreStats ObjectStore::stats() const { return {}; }
void ObjectStore::stop() {}
void ObjectStore::wait() {}

// NOLINTNEXTLINE(performance-unnecessary-value-param): store.h's signature
Result<std::unique_ptr<ObjectClient>> ObjectClient::connect(std::string url, ClientOptions) {
  return httpNotBuilt("ObjectClient::connect(" + url + ")");
}
ObjectClient::ObjectClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ObjectClient::~ObjectClient() = default;
Status ObjectClient::createBucket(const std::string&) { return httpNotBuilt("ObjectClient::createBucket"); }
Status ObjectClient::deleteBucket(const std::string&) { return httpNotBuilt("ObjectClient::deleteBucket"); }
Result<std::vector<std::string>> ObjectClient::buckets() { return httpNotBuilt("ObjectClient::buckets"); }
Result<std::vector<ObjectInfo>> ObjectClient::list(const std::string&, const std::string&) {
  return httpNotBuilt("ObjectClient::list");
}
Status ObjectClient::put(const std::string&, const std::string&, const void*, uint64_t) {
  return httpNotBuilt("ObjectClient::put");
}
Status ObjectClient::putFile(const std::string&, const std::string&, const std::string&) {
  return httpNotBuilt("ObjectClient::putFile");
}
Result<uint64_t> ObjectClient::get(const std::string&, const std::string&, void*, uint64_t) {
  return httpNotBuilt("ObjectClient::get");
}
Result<std::string> ObjectClient::get(const std::string&, const std::string&) {
  return httpNotBuilt("ObjectClient::get");
}
Status ObjectClient::getFile(const std::string&, const std::string&, const std::string&) {
  return httpNotBuilt("ObjectClient::getFile");
}
Result<ObjectInfo> ObjectClient::head(const std::string&, const std::string&) {
  return httpNotBuilt("ObjectClient::head");
}
Status ObjectClient::remove(const std::string&, const std::string&) {
  return httpNotBuilt("ObjectClient::remove");
}

Result<ObjectUrl> parseObjectUrl(const std::string& url) { return httpNotBuilt("object URL '" + url + "'"); }

}  // namespace ferry::objects
