// The memory cache of objects on disk (--data-dir). An object's bytes are in memory while a PUT
// received them or an RDMA GET needed them registered; they stay there, counted in maxMemoryBytes,
// until room is needed, when the least recently used are dropped (a request still reading them
// keeps them until it ends). An HTTP GET of an object that is not cached reads its file.
#include "objects/store_server_impl.h"

namespace ferry::objects {

Result<ObjectPtr> ObjectStore::Impl::bytesOf(const std::string& bucket, const std::string& key,
                                             const ObjectPtr& record) {
  if (!record->onDisk || record->size == 0) return record;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (record->cached) {
      lru.splice(lru.end(), lru, record->lruPos);
      return record->cached;
    }
  }
  FERRY_ASSIGN_OR_RETURN(ObjectPtr bytes, readRecord(bucket, key, record, 0, record->size));
  std::lock_guard<std::mutex> lock(mu);
  if (record->cached) return record->cached;  // another request read it meanwhile
  auto b = buckets.find(bucket);
  if (b == buckets.end()) return bytes;
  auto it = b->second.find(key);
  if (it == b->second.end() || it->second != record) return bytes;  // replaced or deleted: not cached
  record->cached = bytes;
  cacheLocked(record);
  return bytes;
}

Result<ObjectPtr> ObjectStore::Impl::readRecord(const std::string& bucket, const std::string& key,
                                                const ObjectPtr& record, uint64_t offset, uint64_t n) {
  auto held = reserveMemory(n);
  if (!held) {
    return Status(StatusCode::kResourceExhausted,
                  std::to_string(n) + " bytes of the object do not fit in memory (--max-memory " +
                      std::to_string(opts.maxMemoryBytes) + ")");
  }
  FERRY_ASSIGN_OR_RETURN(int fd, openRecord(bucket, key, record));
  std::unique_ptr<int, void (*)(int*)> closer(&fd, [](int* p) { ::close(*p); });
  FERRY_ASSIGN_OR_RETURN(ObjectPtr bytes, newObject(n, /*registered=*/false));
  bytes->memory = std::move(*held);
  for (uint64_t done = 0; done < n;) {
    ssize_t got =
        ::pread(fd, static_cast<char*>(bytes->mem) + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ioError("reading " + fileOf(bucket, key).string());
    if (got == 0) return Status(StatusCode::kBusy, "the object was replaced while it was read");
    done += static_cast<uint64_t>(got);
  }
  FERRY_RETURN_IF_ERROR(registerObject(bytes));
  return bytes;
}

void ObjectStore::Impl::cacheLocked(const ObjectPtr& record) {
  if (!record->onDisk || !record->cached) return;
  record->lruPos = lru.insert(lru.end(), record);
}

void ObjectStore::Impl::forgetLocked(const ObjectPtr& record) {
  if (!record->onDisk || !record->cached) return;
  lru.erase(record->lruPos);
  record->cached.reset();
}

bool ObjectStore::Impl::evictOne() {
  ObjectPtr dropped;  // freed outside mu (a deregistration and an munmap)
  std::lock_guard<std::mutex> lock(mu);
  if (lru.empty()) return false;
  ObjectPtr record = lru.front();
  lru.pop_front();
  dropped = std::move(record->cached);
  record->cached.reset();
  return true;
}

}  // namespace ferry::objects
