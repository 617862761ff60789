// InlineVec: elements inside the object up to N, on the heap beyond; every element constructed is
// destroyed once, across growth, copies and moves.
#include "common/inline_vec.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace ferry {
namespace {

// Counts live instances, so that a leak or a double destruction shows.
struct Counted {
  static inline int live = 0;
  std::string text;
  explicit Counted(std::string t = "") : text(std::move(t)) { ++live; }
  Counted(const Counted& o) : text(o.text) { ++live; }
  Counted(Counted&& o) noexcept : text(std::move(o.text)) { ++live; }
  Counted& operator=(const Counted&) = default;
  Counted& operator=(Counted&&) noexcept = default;
  ~Counted() { --live; }
  bool operator==(const Counted& o) const { return text == o.text; }
};

std::vector<std::string> texts(const InlineVec<Counted, 2>& v) {
  std::vector<std::string> out;
  for (const auto& c : v) out.push_back(c.text);
  return out;
}

TEST(InlineVec, KeepsItsFirstElementsInsideAndGrowsOntoTheHeap) {
  {
    InlineVec<Counted, 2> v;
    EXPECT_TRUE(v.empty());
    EXPECT_EQ(v.capacity(), 2u);
    const auto* inside = reinterpret_cast<const unsigned char*>(&v);
    v.emplace_back("a");
    v.push_back(Counted("b"));
    EXPECT_GE(reinterpret_cast<const unsigned char*>(v.data()), inside);
    EXPECT_LT(reinterpret_cast<const unsigned char*>(v.data()), inside + sizeof v) << "two fit inside";
    v.emplace_back("c");
    EXPECT_EQ(v.size(), 3u);
    EXPECT_GE(v.capacity(), 3u);
    const auto* heap = reinterpret_cast<const unsigned char*>(v.data());
    EXPECT_TRUE(heap < inside || heap >= inside + sizeof v) << "the third moved them to the heap";
    EXPECT_EQ(texts(v), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(v.front().text, "a");
    EXPECT_EQ(v.back().text, "c");
    EXPECT_EQ(v[1].text, "b");
    EXPECT_EQ(Counted::live, 3);
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(InlineVec, AnElementOfItsOwnIsCopiedSafelyWhenItGrows) {
  InlineVec<Counted, 2> v{Counted("x"), Counted("y")};
  v.push_back(v[0]);  // grows: the argument must be read before the elements move
  v.push_back(v[2]);
  EXPECT_EQ(texts(v), (std::vector<std::string>{"x", "y", "x", "x"}));
}

TEST(InlineVec, CopiesAndMovesInsideAndOnTheHeap) {
  {
    InlineVec<Counted, 2> small{Counted("a")};
    InlineVec<Counted, 2> big{Counted("a"), Counted("b"), Counted("c")};
    InlineVec<Counted, 2> smallCopy = small;
    InlineVec<Counted, 2> bigCopy = big;
    EXPECT_TRUE(smallCopy == small);
    EXPECT_TRUE(bigCopy == big);
    InlineVec<Counted, 2> smallMoved = std::move(small);
    InlineVec<Counted, 2> bigMoved = std::move(big);
    EXPECT_TRUE(small.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty, by contract
    EXPECT_TRUE(big.empty());    // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(texts(smallMoved), (std::vector<std::string>{"a"}));
    EXPECT_EQ(texts(bigMoved), (std::vector<std::string>{"a", "b", "c"}));
    // Assignment both ways between inline and heap storage.
    smallMoved = bigMoved;
    EXPECT_EQ(texts(smallMoved), (std::vector<std::string>{"a", "b", "c"}));
    bigMoved = InlineVec<Counted, 2>{Counted("z")};
    EXPECT_EQ(texts(bigMoved), (std::vector<std::string>{"z"}));
    smallCopy = std::move(bigCopy);
    EXPECT_EQ(texts(smallCopy), (std::vector<std::string>{"a", "b", "c"}));
    big.push_back(Counted("again"));  // NOLINT(bugprone-use-after-move): a moved-from one is usable
    EXPECT_EQ(texts(big), (std::vector<std::string>{"again"}));
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(InlineVec, ResizeAssignClearAndPopBack) {
  {
    InlineVec<Counted, 2> v;
    v.resize(5);
    EXPECT_EQ(v.size(), 5u);
    EXPECT_EQ(Counted::live, 5);
    v.resize(1);
    EXPECT_EQ(v.size(), 1u);
    EXPECT_EQ(Counted::live, 1);
    std::vector<Counted> from{Counted("p"), Counted("q"), Counted("r")};
    v.assign(from.begin(), from.end());
    EXPECT_EQ(texts(v), (std::vector<std::string>{"p", "q", "r"}));
    v.pop_back();
    EXPECT_EQ(texts(v), (std::vector<std::string>{"p", "q"}));
    v.clear();
    EXPECT_TRUE(v.empty());
    EXPECT_EQ(Counted::live, 3) << "only `from` is left";
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(InlineVec, HoldsMoveOnlyElements) {
  InlineVec<std::unique_ptr<int>, 1> v;
  for (int i = 0; i < 4; ++i) v.push_back(std::make_unique<int>(i));
  InlineVec<std::unique_ptr<int>, 1> w = std::move(v);
  ASSERT_EQ(w.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(*w[i], i);
}

}  // namespace
}  // namespace ferry
