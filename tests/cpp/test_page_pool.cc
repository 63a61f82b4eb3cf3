// PagePool: allocation order, reference counting, exhaustion, invariant check.
#include <gtest/gtest.h>

#include "specd/page_pool.h"

namespace specd {
namespace {

TEST(PagePool, AllocatesLowestIdsFirstAndCountsReferences) {
  PagePool pool(3);
  EXPECT_EQ(pool.num_free(), 3);
  int32_t a = -1, b = -1, c = -1, d = -1;
  ASSERT_TRUE(pool.allocate(&a));
  ASSERT_TRUE(pool.allocate(&b));
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  pool.retain(a);
  EXPECT_EQ(pool.refcount(a), 2);
  EXPECT_FALSE(pool.release(a));  // still referenced
  EXPECT_TRUE(pool.release(a));   // now free
  EXPECT_EQ(pool.num_used(), 1);
  ASSERT_TRUE(pool.allocate(&c));
  EXPECT_EQ(c, 0);  // the freed page is reused
  ASSERT_TRUE(pool.allocate(&d));
  EXPECT_FALSE(pool.allocate(&d));  // exhausted: reports, does not abort
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(PagePool, EmptyPool) {
  PagePool pool(0);
  int32_t p = -1;
  EXPECT_FALSE(pool.allocate(&p));
  EXPECT_EQ(pool.num_pages(), 0);
  EXPECT_TRUE(pool.check_invariants().ok());
}

}  // namespace
}  // namespace specd
