#include "support/path_memory.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "ferry/common/shared_memory.h"

namespace ferry::test {

namespace {

struct SharedAllocations {
  std::mutex mu;
  std::map<void*, std::shared_ptr<SharedMemory>> live;
};

SharedAllocations& allocations() {
  static auto* a = new SharedAllocations;  // never destroyed: buffers may outlive static teardown
  return *a;
}

}  // namespace

bool sharedMemoryPath() {
  static const bool shared = [] {
    const char* v = std::getenv("FERRY_TEST_SHARED_MEMORY");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return shared;
}

void* allocateShared(size_t bytes) {
  auto memory = SharedMemory::allocate(bytes == 0 ? 1 : bytes);
  if (!memory.isOk()) return nullptr;
  void* p = (*memory)->data();
  std::lock_guard<std::mutex> lock(allocations().mu);
  allocations().live.emplace(p, std::move(*memory));
  return p;
}

void releaseShared(void* p) {
  std::shared_ptr<SharedMemory> freed;  // unmapped outside the lock
  std::lock_guard<std::mutex> lock(allocations().mu);
  auto it = allocations().live.find(p);
  if (it == allocations().live.end()) return;
  freed = std::move(it->second);
  allocations().live.erase(it);
}

}  // namespace ferry::test
