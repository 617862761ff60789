// InlineVec<T, N>: a vector that keeps its first N elements inside itself and moves to the heap
// only beyond them. The data path's per-request lists (a request's scatter/gather entries, its
// resolved segments, a frame's payload pieces) hold one or two items almost always; as
// std::vectors they cost a heap allocation and a free each, several per message. Written here
// rather than taken from a library: Boost's small_vector would bring a large dependency for this
// one header, and only the operations below are needed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

namespace ferry {

template <typename T, size_t N>
class InlineVec {
  static_assert(N > 0, "an InlineVec keeps at least one element inside itself");

 public:
  using value_type = T;
  using size_type = size_t;
  using iterator = T*;
  using const_iterator = const T*;
  using reference = T&;
  using const_reference = const T&;

  InlineVec() = default;
  template <typename It>
  InlineVec(It first, It last) {
    assign(first, last);
  }
  InlineVec(std::initializer_list<T> items) { assign(items.begin(), items.end()); }
  InlineVec(const InlineVec& other) { assign(other.begin(), other.end()); }
  InlineVec(InlineVec&& other) noexcept { takeFrom(other); }
  ~InlineVec() {
    clear();
    release();
  }

  InlineVec& operator=(const InlineVec& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  InlineVec& operator=(InlineVec&& other) noexcept {
    if (this != &other) {
      clear();
      release();
      takeFrom(other);
    }
    return *this;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return capacity_; }
  T* data() { return ptr(); }
  const T* data() const { return ptr(); }
  T* begin() { return ptr(); }
  T* end() { return ptr() + size_; }
  const T* begin() const { return ptr(); }
  const T* end() const { return ptr() + size_; }
  T& operator[](size_t i) { return ptr()[i]; }
  const T& operator[](size_t i) const { return ptr()[i]; }
  T& front() { return ptr()[0]; }
  const T& front() const { return ptr()[0]; }
  T& back() { return ptr()[size_ - 1]; }
  const T& back() const { return ptr()[size_ - 1]; }
  operator std::span<T>() { return {ptr(), size_}; }
  operator std::span<const T>() const { return {ptr(), size_}; }

  void clear() {
    std::destroy_n(ptr(), size_);
    size_ = 0;
  }
  void reserve(size_t n) {
    if (n > capacity_) grow(n);
  }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == capacity_) {
      T item(std::forward<Args>(args)...);  // args may name one of our elements, which grow moves
      grow(capacity_ * 2);
      return *::new (static_cast<void*>(ptr() + size_++)) T(std::move(item));
    }
    return *::new (static_cast<void*>(ptr() + size_++)) T(std::forward<Args>(args)...);
  }
  void push_back(const T& v) { emplace_back(v); }
  void push_back(T&& v) { emplace_back(std::move(v)); }
  void pop_back() {
    --size_;
    std::destroy_at(ptr() + size_);
  }
  void resize(size_t n) {
    if (n < size_) {
      std::destroy(ptr() + n, ptr() + size_);
      size_ = n;
      return;
    }
    reserve(n);
    while (size_ < n) emplace_back();
  }
  template <typename It>
  void assign(It first, It last) {
    clear();
    if constexpr (std::is_base_of_v<std::forward_iterator_tag,
                                    typename std::iterator_traits<It>::iterator_category>) {
      reserve(static_cast<size_t>(std::distance(first, last)));
    }
    for (; first != last; ++first) emplace_back(*first);
  }

  friend bool operator==(const InlineVec& a, const InlineVec& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  T* ptr() { return heap_ ? heap_ : reinterpret_cast<T*>(inline_); }
  const T* ptr() const { return heap_ ? heap_ : reinterpret_cast<const T*>(inline_); }

  void grow(size_t want) {
    const size_t cap = std::max(want, capacity_ * 2);
    T* fresh = static_cast<T*>(::operator new(cap * sizeof(T), std::align_val_t(alignof(T))));
    std::uninitialized_move_n(ptr(), size_, fresh);
    std::destroy_n(ptr(), size_);
    release();
    heap_ = fresh;
    capacity_ = cap;
  }
  // Frees the heap block (the elements are already gone) and goes back to the inline space.
  void release() {
    if (heap_) ::operator delete(heap_, std::align_val_t(alignof(T)));
    heap_ = nullptr;
    capacity_ = N;
  }
  // Takes other's elements (its heap block, or moves its inline ones); other is left empty.
  void takeFrom(InlineVec& other) {
    if (other.heap_) {
      heap_ = std::exchange(other.heap_, nullptr);
      capacity_ = std::exchange(other.capacity_, N);
      size_ = std::exchange(other.size_, 0);
      return;
    }
    std::uninitialized_move_n(other.ptr(), other.size_, ptr());
    size_ = other.size_;
    other.clear();
  }

  alignas(T) unsigned char inline_[N * sizeof(T)];
  T* heap_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = N;
};

}  // namespace ferry
