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

TEST(PagePool, CachedPagesStayEvictableAndAreEvictedOldestReleaseFirst) {
  PagePool pool(4);
  int32_t p[4];
  for (int32_t& x : p) ASSERT_TRUE(pool.allocate(&x));
  pool.set_cached(p[0], true);
  pool.set_cached(p[1], true);
  pool.set_cached(p[2], true);
  EXPECT_TRUE(pool.release(p[1]));  // released first: evicted first
  EXPECT_TRUE(pool.release(p[0]));
  EXPECT_TRUE(pool.release(p[2]));
  EXPECT_TRUE(pool.release(p[3]));  // not cached: truly free
  EXPECT_EQ(pool.num_free(), 4);    // evictable pages count as free capacity
  EXPECT_EQ(pool.num_evictable(), 3);
  EXPECT_TRUE(pool.check_invariants().ok());
  pool.retain(p[0]);  // a cache hit revives an evictable page, still cached
  EXPECT_EQ(pool.refcount(p[0]), 1);
  EXPECT_TRUE(pool.cached(p[0]));
  EXPECT_EQ(pool.num_evictable(), 2);
  int32_t page = -1, evicted = -1;
  ASSERT_TRUE(pool.allocate(&page, &evicted));
  EXPECT_EQ(page, p[3]);  // the free page goes before any cached one
  EXPECT_EQ(evicted, -1);
  ASSERT_TRUE(pool.allocate(&page, &evicted));
  EXPECT_EQ(page, p[1]);  // then the oldest release
  EXPECT_EQ(evicted, p[1]);
  EXPECT_FALSE(pool.cached(p[1]));
  ASSERT_TRUE(pool.allocate(&page, &evicted));
  EXPECT_EQ(evicted, p[2]);
  EXPECT_FALSE(pool.allocate(&page, &evicted));  // p[0] is in use
  EXPECT_TRUE(pool.check_invariants().ok());
  pool.release(p[0]);
  pool.set_cached(p[0], false);  // unmarking an evictable page frees it
  EXPECT_EQ(pool.num_evictable(), 0);
  ASSERT_TRUE(pool.allocate(&page, &evicted));
  EXPECT_EQ(page, p[0]);
  EXPECT_EQ(evicted, -1);
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
