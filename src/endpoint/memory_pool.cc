#include "ferry/endpoint/memory_pool.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include "common/json.h"

namespace ferry::endpoint {

struct MemoryPool::Region {
  std::string name;
  MrHandle handle = 0;
  verbs::MemoryRegion mr;
  uint64_t addr = 0;
  uint64_t length = 0;
  bool writable = true;
  bool published = true;
  RegionOptions::Remote remote = RegionOptions::Remote::kDefault;
  std::shared_ptr<void> owner;
};

Result<std::shared_ptr<MemoryPool>> MemoryPool::create(std::shared_ptr<RdmaContext> context) {
  if (!context) return invalidArgument("MemoryPool: no context");
  std::shared_ptr<MemoryPool> pool(new MemoryPool(context));
  FERRY_ASSIGN_OR_RETURN(pool->pd_, context->verbs().allocPd());
  return pool;
}

MemoryPool::~MemoryPool() {
  // Regions first (deregistration stops device access), then the owners they keep alive.
  std::unordered_map<MrHandle, std::shared_ptr<Region>> regions;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    regions.swap(byHandle_);
    byName_.clear();
  }
  for (auto& [handle, region] : regions) region->mr.close();
  regions.clear();
  pd_.close();
}

Result<MrHandle> MemoryPool::registerMemoryRegion(std::string_view name, void* addr, uint64_t length,
                                                  RegionOptions options) {
  if (name.empty()) return invalidArgument("register_memory_region: the name is empty");
  if (name.size() > 1024)
    return invalidArgument("register_memory_region: the name is longer than 1024 bytes");
  return add(std::string(name), 0, /*named=*/true, addr, length, std::move(options));
}

Result<std::shared_ptr<SharedMemory>> MemoryPool::allocMemoryRegion(std::string_view name, uint64_t length,
                                                                    RegionOptions options) {
  if (length == 0) return invalidArgument("alloc_memory_region: zero length");
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<SharedMemory> memory, SharedMemory::allocate(length));
  options.owner = memory;
  FERRY_RETURN_IF_ERROR(registerMemoryRegion(name, memory->data(), length, std::move(options)).status());
  return memory;
}

Result<MrHandle> MemoryPool::registerMemoryRegion(uint64_t key, void* addr, uint64_t length,
                                                  RegionOptions options) {
  if (key >= kNamedHandleBase) {
    return invalidArgument("register_memory_region: integer key " + std::to_string(key) +
                           " is not below 2^31");
  }
  return add(std::to_string(key), key, /*named=*/false, addr, length, std::move(options));
}

Result<MrHandle> MemoryPool::add(std::string name, MrHandle handle, bool named, void* addr, uint64_t length,
                                 RegionOptions options) {
  if (addr == nullptr) return invalidArgument("register_memory_region '" + name + "': null address");
  if (length == 0) return invalidArgument("register_memory_region '" + name + "': zero length");
  if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr)) {
    return invalidArgument("register_memory_region '" + name + "': address + length overflows");
  }
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    auto it = byName_.find(name);
    if (it != byName_.end()) {
      const Region& r = *byHandle_.at(it->second);
      if (r.addr == reinterpret_cast<uintptr_t>(addr) && r.length == length &&
          r.writable == options.writable && r.remote == options.remote && r.published == options.published) {
        return r.handle;
      }
      return invalidArgument("register_memory_region: '" + name +
                             "' is already registered for another range; unregister it first");
    }
  }
  using Remote = RegionOptions::Remote;
  uint32_t access = 0;
  if (options.writable) access |= verbs::access::kLocalWrite;
  if (options.remote == Remote::kDefault) access |= verbs::access::kRemoteRead;
  if (options.writable && options.remote != Remote::kNone) access |= verbs::access::kRemoteWrite;
  // Registration pins and maps the memory: do it outside the lock.
  FERRY_ASSIGN_OR_RETURN(verbs::MemoryRegion mr, pd_.registerMemory(addr, length, access));
  auto region = std::make_shared<Region>();
  region->name = name;
  region->mr = std::move(mr);
  region->addr = reinterpret_cast<uintptr_t>(addr);
  region->length = length;
  region->writable = options.writable;
  region->published = options.published;
  region->remote = options.remote;
  region->owner = std::move(options.owner);

  std::unique_lock<std::shared_mutex> lock(mu_);
  if (byName_.count(name) != 0) {
    // Another thread registered the same name meanwhile: keep theirs.
    return invalidArgument("register_memory_region: '" + name + "' was registered concurrently");
  }
  if (named) {
    while (byHandle_.count(nextNamed_) != 0) ++nextNamed_;
    handle = nextNamed_++;
  }
  region->handle = handle;
  byHandle_[handle] = region;
  byName_[name] = handle;
  return handle;
}

Status MemoryPool::unregisterMemoryRegion(MrHandle handle) {
  std::shared_ptr<Region> region;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    auto it = byHandle_.find(handle);
    if (it == byHandle_.end())
      return notFound("unregister_memory_region: no region with handle " + std::to_string(handle));
    region = it->second;
    byName_.erase(region->name);
    byHandle_.erase(it);
  }
  region->mr.close();
  region.reset();
  return Status::ok();
}

Status MemoryPool::unregisterMemoryRegion(std::string_view name) {
  FERRY_ASSIGN_OR_RETURN(MrHandle handle, handleOf(name));
  return unregisterMemoryRegion(handle);
}

Result<MrHandle> MemoryPool::handleOf(std::string_view name) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = byName_.find(std::string(name));
  if (it == byName_.end()) return notFound("no local memory region named '" + std::string(name) + "'");
  return it->second;
}

Result<RegionView> MemoryPool::find(MrHandle handle) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = byHandle_.find(handle);
  if (it == byHandle_.end()) return notFound("no local memory region with handle " + std::to_string(handle));
  const Region& r = *it->second;
  return RegionView{.handle = r.handle,
                    .addr = r.addr,
                    .length = r.length,
                    .lkey = r.mr.lkey(),
                    .rkey = r.mr.rkey(),
                    .writable = r.writable,
                    .location = r.mr.location()};
}

std::shared_lock<std::shared_mutex> MemoryPool::pinRegion(MrHandle handle, uint32_t lkey) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = byHandle_.find(handle);
  if (it == byHandle_.end() || it->second->mr.lkey() != lkey) return {};
  return lock;
}

size_t MemoryPool::size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return byHandle_.size();
}

namespace {
// A region's mr_info entry.
template <typename R>
json::Value infoOf(const R& r) {
  json::Value entry = json::Value::emptyObject();
  entry.set("handle", static_cast<int64_t>(r.handle));
  entry.set("addr", static_cast<int64_t>(r.addr));
  entry.set("length", static_cast<int64_t>(r.length));
  entry.set("rkey", static_cast<int64_t>(r.mr.rkey()));
  entry.set("writable", r.writable);
  return entry;
}
}  // namespace

std::string MemoryPool::mrInfo() const {
  json::Value out = json::Value::emptyObject();
  std::shared_lock<std::shared_mutex> lock(mu_);
  // In handle order, so the text is the same for the same regions.
  std::vector<const Region*> regions;
  for (const auto& [handle, region] : byHandle_) {
    if (region->published) regions.push_back(region.get());
  }
  std::sort(regions.begin(), regions.end(),
            [](const Region* a, const Region* b) { return a->handle < b->handle; });
  for (const Region* r : regions) out.set(r->name, infoOf(*r));
  return json::serialize(out);
}

Result<std::string> MemoryPool::regionInfo(MrHandle handle) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = byHandle_.find(handle);
  if (it == byHandle_.end()) return notFound("no region with handle " + std::to_string(handle));
  return json::serialize(infoOf(*it->second));
}

}  // namespace ferry::endpoint
