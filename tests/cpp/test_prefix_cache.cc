// PrefixCache: keys name whole prefixes (parent, model, tokens); duplicates and pages already
// holding a key register nothing; erase_page forgets exactly one page's key.
#include <gtest/gtest.h>

#include <vector>

#include "specd/prefix_cache.h"

namespace specd {
namespace {

TEST(PrefixCache, KeysNameWholePrefixesPerModel) {
  PrefixCache cache(8);
  const std::vector<int32_t> a{1, 2, 3, 4}, b{5, 6, 7, 8};
  bool inserted = false;
  const uint64_t ka = cache.insert(0, 0, a, 3, &inserted);
  EXPECT_TRUE(inserted);
  EXPECT_GT(ka, 0u);
  const uint64_t kb = cache.insert(ka, 0, b, 5, &inserted);
  EXPECT_TRUE(inserted);
  EXPECT_NE(ka, kb);
  int32_t page = -1;
  EXPECT_EQ(cache.find(0, 0, a, &page), ka);
  EXPECT_EQ(page, 3);
  EXPECT_EQ(cache.find(ka, 0, b, &page), kb);
  EXPECT_EQ(page, 5);
  EXPECT_EQ(cache.find(0, 0, b, &page), 0u);  // b only after a
  EXPECT_EQ(page, -1);
  EXPECT_EQ(cache.find(0, 1, a, &page), 0u);  // another model's KV
  EXPECT_EQ(cache.find(0, 0, std::vector<int32_t>{1, 2, 3}, &page), 0u);
  EXPECT_EQ(cache.size(), 2);
  EXPECT_EQ(cache.key_of_page(5), kb);
}

TEST(PrefixCache, DuplicatesAndBusyPagesRegisterNothing) {
  PrefixCache cache(8);
  const std::vector<int32_t> a{1, 2}, b{3, 4};
  bool inserted = false;
  const uint64_t ka = cache.insert(0, 0, a, 0, &inserted);
  EXPECT_EQ(cache.insert(0, 0, a, 1, &inserted), ka);  // an equal block on another page
  EXPECT_FALSE(inserted);
  EXPECT_FALSE(cache.has_page(1));
  EXPECT_EQ(cache.insert(0, 0, b, 0, &inserted), 0u);  // page 0 already holds a
  EXPECT_FALSE(inserted);
  int32_t page = -1;
  EXPECT_EQ(cache.find(0, 0, b, &page), 0u);
  EXPECT_EQ(cache.size(), 1);
}

TEST(PrefixCache, ErasedKeysAreNeverReused) {
  PrefixCache cache(4);
  const std::vector<int32_t> a{9, 9};
  bool inserted = false;
  const uint64_t k1 = cache.insert(0, 0, a, 2, &inserted);
  cache.insert(k1, 0, a, 3, &inserted);
  cache.erase_page(2);
  EXPECT_FALSE(cache.has_page(2));
  int32_t page = -1;
  EXPECT_EQ(cache.find(0, 0, a, &page), 0u);
  const uint64_t k2 = cache.insert(0, 0, a, 1, &inserted);  // the same block again: a new key
  EXPECT_NE(k2, k1);
  EXPECT_EQ(cache.find(k2, 0, a, &page), 0u);  // the child of the erased key is unreachable
  EXPECT_EQ(cache.find(k1, 0, a, &page), cache.key_of_page(3));
  cache.erase_page(0);  // no key there: nothing happens
  EXPECT_EQ(cache.size(), 2);
}

}  // namespace
}  // namespace specd
