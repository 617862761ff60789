// Memory of the provider path a suite runs on (tests/CMakeLists.txt runs the endpoint, agent,
// connector and object suites once per path). On soft_mapped (FERRY_TEST_SHARED_MEMORY=1) byte
// buffers come from ferry's shared-memory allocator, so that the same-host path finds them mapped
// by both sides, as the verbs suite's TestBuffer does; elsewhere from the heap.
//
//   test::Bytes buf(1 << 20);   // a std::vector<uint8_t> whose storage follows the path
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace ferry::test {

// Whether this process runs on a path whose buffers are shared memory (read once).
bool sharedMemoryPath();
// `bytes` of shared memory (kept alive until releaseShared), or nullptr when the kernel refuses.
void* allocateShared(size_t bytes);
void releaseShared(void* p);

template <typename T>
struct PathAllocator {
  using value_type = T;
  PathAllocator() = default;
  template <typename U>
  PathAllocator(const PathAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(size_t n) {
    if (!sharedMemoryPath()) return std::allocator<T>().allocate(n);
    void* p = allocateShared(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (sharedMemoryPath()) {
      releaseShared(p);
    } else {
      std::allocator<T>().deallocate(p, n);
    }
  }
  template <typename U>
  bool operator==(const PathAllocator<U>&) const noexcept {
    return true;
  }
};

using Bytes = std::vector<uint8_t, PathAllocator<uint8_t>>;

}  // namespace ferry::test
