// BlockManager prefix caching: matching adopts whole registered blocks (refcounts, limits,
// per model), freed registered pages stay evictable and count as free, eviction takes a
// prefix's last blocks first, writing into a registered page copies or unregisters it,
// caching off matches nothing, reset forgets everything, and bad calls fail cleanly.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "block_manager_test_util.h"

namespace specd::testing {
namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence with `tokens.size()` committed target tokens, its full blocks registered.
void add_cached(BlockManager& bm, SeqId id, const std::vector<int32_t>& tokens, ModelIndex m = 0) {
  SPECD_ASSERT_OK(bm.add_sequence(id));
  SPECD_ASSERT_OK(grow(bm, id, static_cast<int32_t>(tokens.size()), m));
  SPECD_ASSERT_OK(bm.cache_blocks(id, m, tokens));
}

TEST(BlockManagerPrefix, MatchAdoptsWholeRegisteredBlocks) {
  auto bm = make_manager(16, 4, {6}, 1, true);
  const auto tokens = iota_tokens(10);
  add_cached(*bm, 1, tokens);
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 2);  // the partial third block is not registered
  const auto owner = pages_of(*bm, 1);
  // cached_prefix says what a match would adopt, and adopts nothing.
  EXPECT_EQ(bm->cached_prefix(0, tokens, 9), 8);
  EXPECT_EQ(bm->cached_prefix(0, tokens, 7), 4);
  EXPECT_EQ(bm->cached_prefix(0, iota_tokens(10, 50), 10), 0);
  EXPECT_EQ(bm->cached_prefix(3, tokens, 9), 0);  // not a model
  EXPECT_EQ(bm->page_refcount(owner[0]), 1);
  EXPECT_EQ(bm->prefix_cache_stats().hit_pages, 0);
  SPECD_ASSERT_OK(bm->add_sequence(2));
  int64_t matched = -1;
  SPECD_ASSERT_OK(bm->match_prefix(2, 0, tokens, 9, &matched));
  EXPECT_EQ(matched, 8);
  EXPECT_EQ(pages_of(*bm, 2), (std::vector<int32_t>{owner[0], owner[1]}));
  EXPECT_EQ(bm->page_refcount(owner[0]), 2);
  EXPECT_EQ(info_of(*bm, 2).committed, 8);
  SPECD_ASSERT_OK(bm->add_sequence(3));
  SPECD_ASSERT_OK(bm->match_prefix(3, 0, tokens, 7, &matched));  // whole blocks within the limit
  EXPECT_EQ(matched, 4);
  auto other = tokens;
  other[5] = 99;  // differs in the second block
  SPECD_ASSERT_OK(bm->add_sequence(4));
  SPECD_ASSERT_OK(bm->match_prefix(4, 0, other, 10, &matched));
  EXPECT_EQ(matched, 4);
  EXPECT_EQ(bm->prefix_cache_stats().hit_pages, 4);
  // A matched sequence goes on from its cached prefix and registers its own blocks.
  SPECD_ASSERT_OK(grow(*bm, 4, 4));
  SPECD_ASSERT_OK(bm->cache_blocks(4, 0, other));
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 3);
  SPECD_ASSERT_OK(bm->add_sequence(5));
  SPECD_ASSERT_OK(bm->match_prefix(5, 0, other, 9, &matched));
  EXPECT_EQ(matched, 8);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerPrefix, FreedPagesStayEvictableAndLoseTheirLastBlocksFirst) {
  auto bm = make_manager(6, 4, {6}, 1, true);
  const auto tokens = iota_tokens(12);
  add_cached(*bm, 1, tokens);
  SPECD_ASSERT_OK(bm->free_sequence(1));
  EXPECT_EQ(bm->num_free_pages(), 6);  // caching costs no capacity
  EXPECT_EQ(bm->prefix_cache_stats().evictable_pages, 3);
  SPECD_ASSERT_OK(bm->add_sequence(2));
  SPECD_ASSERT_OK(grow(*bm, 2, 16));  // 3 free pages and one evicted
  EXPECT_EQ(bm->prefix_cache_stats().evictions, 1);
  SPECD_ASSERT_OK(bm->add_sequence(3));
  int64_t matched = -1;
  SPECD_ASSERT_OK(bm->match_prefix(3, 0, tokens, 12, &matched));
  EXPECT_EQ(matched, 8);  // the last block went; the first two are still there
  SPECD_ASSERT_OK(bm->free_sequence(2));
  SPECD_ASSERT_OK(bm->check_invariants());
  Reservation r;
  EXPECT_EQ(bm->reserve(3, 0, 17, &r).code(), StatusCode::kOutOfPages);  // 5 pages, 4 free
  SPECD_ASSERT_OK(bm->reserve(3, 0, 16, &r));
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerPrefix, WritingIntoARegisteredPageUnregistersOrCopiesIt) {
  auto bm = make_manager(16, 4, {6}, 1, true);
  const auto tokens = iota_tokens(8);
  add_cached(*bm, 1, tokens);
  SPECD_ASSERT_OK(bm->rollback(1, 0, 6));  // into the second registered block
  Reservation r;
  SPECD_ASSERT_OK(bm->reserve(1, 0, 2, &r));
  EXPECT_TRUE(r.copies.empty());  // its own page: written in place, so no longer registered
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 1);
  SPECD_ASSERT_OK(bm->check_invariants());
  SPECD_ASSERT_OK(bm->commit(1, 0, 2));
  SPECD_ASSERT_OK(bm->cache_blocks(1, 0, tokens));  // registered again
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 2);
  // Shared with a matching sequence: the writer copies it and the original stays registered.
  SPECD_ASSERT_OK(bm->add_sequence(2));
  int64_t matched = -1;
  SPECD_ASSERT_OK(bm->match_prefix(2, 0, tokens, 8, &matched));
  ASSERT_EQ(matched, 8);
  SPECD_ASSERT_OK(bm->rollback(2, 0, 6));
  SPECD_ASSERT_OK(bm->reserve(2, 0, 2, &r));
  ASSERT_EQ(r.copies.size(), 1u);
  EXPECT_EQ(r.copies[0].src_page, pages_of(*bm, 1)[1]);
  EXPECT_EQ(r.copies[0].num_tokens, 2);
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 2);
  SPECD_ASSERT_OK(bm->add_sequence(3));
  SPECD_ASSERT_OK(bm->match_prefix(3, 0, tokens, 8, &matched));
  EXPECT_EQ(matched, 8);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerPrefix, ModelsHaveTheirOwnBlocks) {
  auto bm = make_manager(32, 4, {6, 3}, 1, true);  // target blocks of 4 tokens, draft blocks of 8
  const auto tokens = iota_tokens(17);
  add_cached(*bm, 1, tokens, 0);
  SPECD_ASSERT_OK(bm->add_sequence(2));
  int64_t matched = -1;
  SPECD_ASSERT_OK(bm->match_prefix(2, 1, tokens, 16, &matched));
  EXPECT_EQ(matched, 0);  // no draft KV was registered
  SPECD_ASSERT_OK(grow(*bm, 1, 17, 1));
  SPECD_ASSERT_OK(bm->cache_blocks(1, 1, tokens));
  SPECD_ASSERT_OK(bm->free_sequence(2));
  SPECD_ASSERT_OK(bm->add_sequence(2));
  SPECD_ASSERT_OK(bm->match_prefix(2, 1, tokens, 16, &matched));
  EXPECT_EQ(matched, 16);
  SPECD_ASSERT_OK(bm->match_prefix(2, 0, tokens, 16, &matched));
  EXPECT_EQ(matched, 16);
  EXPECT_EQ(info_of(*bm, 2, 1).num_pages, 2);
  EXPECT_EQ(info_of(*bm, 2, 0).num_pages, 4);
  SPECD_ASSERT_OK(bm->check_invariants());
}

TEST(BlockManagerPrefix, OffResetAndBadCalls) {
  auto off = make_manager(8);
  const auto tokens = iota_tokens(8);
  add_cached(*off, 1, tokens);
  SPECD_ASSERT_OK(off->add_sequence(2));
  int64_t matched = -1;
  SPECD_ASSERT_OK(off->match_prefix(2, 0, tokens, 8, &matched));
  EXPECT_EQ(matched, 0);
  EXPECT_EQ(off->prefix_cache_stats().cached_pages, 0);

  auto bm = make_manager(8, 4, {6}, 1, true);
  add_cached(*bm, 1, tokens);
  SPECD_ASSERT_OK(bm->free_sequence(1));
  add_cached(*bm, 2, iota_tokens(4, 50));
  EXPECT_GT(bm->prefix_cache_stats().hit_pages + bm->prefix_cache_stats().cached_pages, 0);
  bm->reset_prefix_cache();
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 0);
  EXPECT_EQ(bm->prefix_cache_stats().hit_pages, 0);
  EXPECT_EQ(bm->prefix_cache_stats().evictable_pages, 0);
  EXPECT_EQ(bm->num_free_pages(), 7);
  SPECD_ASSERT_OK(bm->check_invariants());
  SPECD_ASSERT_OK(bm->cache_blocks(2, 0, iota_tokens(4, 50)));  // registers its block again
  EXPECT_EQ(bm->prefix_cache_stats().cached_pages, 1);
  SPECD_ASSERT_OK(bm->add_sequence(3));
  SPECD_ASSERT_OK(bm->match_prefix(3, 0, tokens, 8, &matched));
  EXPECT_EQ(matched, 0);

  SPECD_EXPECT_CODE(bm->match_prefix(2, 0, tokens, 8, &matched), kFailedPrecondition);  // it has KV
  SPECD_EXPECT_CODE(bm->match_prefix(77, 0, tokens, 8, &matched), kNotFound);
  SPECD_EXPECT_CODE(bm->match_prefix(3, 4, tokens, 8, &matched), kInvalidArgument);
  SPECD_EXPECT_CODE(bm->cache_blocks(77, 0, tokens), kNotFound);
  SPECD_ASSERT_OK(bm->cache_blocks(2, 0, std::vector<int32_t>{}));  // fewer tokens than KV: nothing more
  SPECD_ASSERT_OK(bm->check_invariants());
}

}  // namespace
}  // namespace specd::testing
