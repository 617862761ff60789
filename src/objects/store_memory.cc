// The object store's memory: page-aligned objects registered with the object server, and the
// shares of maxReceivingBytes and maxMemoryBytes they hold.
#include "objects/store_server_impl.h"

namespace ferry::objects {

// A share of maxReceivingBytes for `bytes` about to be received, or nullopt when the bound would
// be passed.
std::optional<BoundShare> ObjectStore::Impl::reserveReceiving(uint64_t bytes) {
  return reserve(receiving, opts.maxReceivingBytes, bytes);
}

// A share of maxMemoryBytes for an object or part of `bytes`, or nullopt when the bound would be
// passed. With --data-dir, cached objects are evicted (least recently used first) to make room.
// Never called under mu.
std::optional<BoundShare> ObjectStore::Impl::reserveMemory(uint64_t bytes) {
  for (;;) {
    if (auto share = reserve(memory, opts.maxMemoryBytes, bytes)) return share;
    if (bytes > opts.maxMemoryBytes || !evictOne()) return std::nullopt;
  }
}

std::optional<BoundShare> ObjectStore::Impl::reserve(std::atomic<uint64_t>& pool, uint64_t limit,
                                                     uint64_t bytes) {
  uint64_t held = pool.load();
  do {
    if (bytes > limit || held > limit - bytes) return std::nullopt;
  } while (!pool.compare_exchange_weak(held, held + bytes));
  return BoundShare(&pool, bytes);
}

// `registered`: registered with the object server now (an RDMA upload's target must be); else
// the caller fills the memory first and registers it with registerObject(). The mapping reserves
// address space only: memory is committed page by page as it is written.
Result<ObjectPtr> ObjectStore::Impl::newObject(uint64_t size, bool registered) {
  if (size > opts.maxObjectBytes) {
    return Status(StatusCode::kResourceExhausted, "the object is larger than the store's limit of " +
                                                      std::to_string(opts.maxObjectBytes) + " bytes");
  }
  auto o = std::make_shared<StoredObject>();
  o->server = rdma.get();
  o->size = size;
  o->modifiedNs = nowNs();
  if (size > 0) {
    // Anonymous memory in 2 MiB pages where the kernel has them: a fresh object is written once,
    // and 4 KiB page faults would cost more than the copy itself.
    o->mapped = (size + (2u << 20) - 1) & ~size_t{(2u << 20) - 1};
    void* m =
        mmap(nullptr, o->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      o->mapped = 0;
      return Status(StatusCode::kResourceExhausted, "no memory for the object");
    }
    o->mem = m;
    (void)madvise(m, o->mapped, MADV_HUGEPAGE);
    if (registered) FERRY_RETURN_IF_ERROR(registerObject(o));
  }
  return o;
}

Status ObjectStore::Impl::registerObject(const ObjectPtr& o) {
  if (o->size == 0 || o->buf != nullptr || o->mem == nullptr) return Status::ok();  // nothing in memory
  o->buf = rdma->registerBuffer(o->mem, o->size);
  if (o->buf == nullptr)
    return Status(StatusCode::kResourceExhausted, "the object's memory did not register");
  return Status::ok();
}

void ObjectStore::Impl::insufficientStorage(const httplib::Request& req, httplib::Response& res,
                                            uint64_t bytes) {
  const std::string why = "the store holds as many bytes in memory as it may (--max-memory " +
                          std::to_string(opts.maxMemoryBytes) + "); " + std::to_string(bytes) +
                          " more do not fit" + (onDisk() ? " beside the requests in progress" : "");
  logRefusal(req, 507, "InsufficientStorage", why);
  error(res, 507, "InsufficientStorage", why, req.path);
}

}  // namespace ferry::objects
