// RingDeque: a queue whose slots are kept; order, growth across the wrap, both ends, and every
// element let go of what it held once popped.
#include "common/ring_deque.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <random>
#include <vector>

namespace ferry {
namespace {

std::vector<int> contents(const RingDeque<int>& q) { return std::vector<int>(q.begin(), q.end()); }

TEST(RingDeque, KeepsOrderAcrossTheWrapAndGrowth) {
  RingDeque<int> q;
  EXPECT_TRUE(q.empty());
  // Move the head forward so that later pushes wrap around the array, then grow it mid-wrap.
  for (int i = 0; i < 3; ++i) q.push_back(int{i});
  q.pop_front();
  q.pop_front();
  for (int i = 3; i < 12; ++i) q.push_back(int{i});
  EXPECT_EQ(contents(q), (std::vector<int>{2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(q.front(), 2);
  EXPECT_EQ(q.back(), 11);
  EXPECT_EQ(q[3], 5);
  q.push_front(int{1});
  q.pop_back();
  EXPECT_EQ(contents(q), (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(std::count_if(q.begin(), q.begin() + 4, [](int v) { return v % 2 == 0; }), 2);
  q.clear();
  EXPECT_TRUE(q.empty());
  q.push_back(int{42});
  EXPECT_EQ(contents(q), (std::vector<int>{42}));
}

TEST(RingDeque, BehavesAsADequeUnderRandomOperations) {
  RingDeque<int> q;
  std::deque<int> model;
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    switch (rng() % 5) {
      case 0:
      case 1:
        q.push_back(int{step});
        model.push_back(step);
        break;
      case 2:
        q.push_front(int{step});
        model.push_front(step);
        break;
      case 3:
        if (!model.empty()) {
          q.pop_front();
          model.pop_front();
        }
        break;
      case 4:
        if (!model.empty()) {
          q.pop_back();
          model.pop_back();
        }
        break;
    }
    ASSERT_EQ(q.size(), model.size());
    if (!model.empty()) {
      ASSERT_EQ(q.front(), model.front());
      ASSERT_EQ(q.back(), model.back());
    }
  }
  EXPECT_EQ(contents(q), std::vector<int>(model.begin(), model.end()));
}

TEST(RingDeque, APoppedElementLetsGoOfWhatItHeld) {
  auto held = std::make_shared<int>(5);
  RingDeque<std::shared_ptr<int>> q;
  q.push_back(std::shared_ptr<int>(held));
  q.push_back(std::shared_ptr<int>(held));
  EXPECT_EQ(held.use_count(), 3);
  q.pop_front();
  EXPECT_EQ(held.use_count(), 2) << "the slot kept its element's reference";
  q.pop_back();
  EXPECT_EQ(held.use_count(), 1);
  RingDeque<std::shared_ptr<int>> other;
  other.push_back(std::shared_ptr<int>(held));
  q.swap(other);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_TRUE(other.empty());
  q.clear();
  EXPECT_EQ(held.use_count(), 1);
}

}  // namespace
}  // namespace ferry
