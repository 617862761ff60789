// RingDeque<T>: a double-ended queue in one circular array that keeps its slots. std::deque frees
// a block whenever its front leaves one and allocates one whenever its back enters one; with
// elements of a few hundred bytes (a frame and its header buffer, a send request) that is a heap
// allocation and a free every one or two elements, at the rate messages go. Here a slot once made
// is reused: a popped element is made anew (so it lets go of what it held) and the array only
// grows, doubling, when it is full. Only what the data path needs: push and pop at both ends,
// front and back, indexing, and forward iteration from the front (an iterator may skip ahead).
#pragma once

#include <cstddef>
#include <iterator>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace ferry {

template <typename T>
class RingDeque {
 public:
  template <typename Q, typename V>
  class Iter {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = V*;
    using reference = V&;
    Iter() = default;
    Iter(Q* q, size_t i) : q_(q), i_(i) {}
    V& operator*() const { return (*q_)[i_]; }
    V* operator->() const { return &(*q_)[i_]; }
    Iter& operator++() {
      ++i_;
      return *this;
    }
    Iter operator++(int) {
      Iter old = *this;
      ++i_;
      return old;
    }
    Iter operator+(std::ptrdiff_t n) const { return Iter(q_, i_ + static_cast<size_t>(n)); }
    bool operator==(const Iter& o) const { return i_ == o.i_; }

   private:
    Q* q_ = nullptr;
    size_t i_ = 0;
  };
  using iterator = Iter<RingDeque, T>;
  using const_iterator = Iter<const RingDeque, const T>;

  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  T& operator[](size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) & (slots_.size() - 1)]; }
  T& front() { return (*this)[0]; }
  const T& front() const { return (*this)[0]; }
  T& back() { return (*this)[count_ - 1]; }
  const T& back() const { return (*this)[count_ - 1]; }
  iterator begin() { return iterator(this, 0); }
  iterator end() { return iterator(this, count_); }
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, count_); }

  void push_back(T&& v) {
    if (count_ == slots_.size()) grow();
    (*this)[count_] = std::move(v);
    ++count_;
  }
  void push_front(T&& v) {
    if (count_ == slots_.size()) grow();
    head_ = (head_ + slots_.size() - 1) & (slots_.size() - 1);
    slots_[head_] = std::move(v);
    ++count_;
  }
  void pop_front() {
    reset(slots_[head_]);
    head_ = (head_ + 1) & (slots_.size() - 1);
    --count_;
  }
  void pop_back() {
    reset(back());
    --count_;
  }
  void clear() {
    while (count_ > 0) pop_back();
    head_ = 0;
  }
  void swap(RingDeque& other) noexcept {
    slots_.swap(other.slots_);
    std::swap(head_, other.head_);
    std::swap(count_, other.count_);
  }

 private:
  // Doubles the array (a power of two, for the index mask), the elements in order from slot 0.
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 4 : slots_.size() * 2);
    for (size_t i = 0; i < count_; ++i) bigger[i] = std::move((*this)[i]);
    slots_.swap(bigger);
    head_ = 0;
  }

  // A slot given back: what its element held is let go, and it is default-initialised again
  // (not value-initialised: a large buffer member is not zeroed each time).
  static void reset(T& slot) {
    std::destroy_at(&slot);
    ::new (static_cast<void*>(&slot)) T;
  }

  std::vector<T> slots_;
  size_t head_ = 0;
  size_t count_ = 0;
};

}  // namespace ferry
