// Helpers shared by the BlockManager tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "specd/block_manager.h"

namespace specd::testing {

#define SPECD_ASSERT_OK(expr)                                   \
  do {                                                          \
    const ::specd::Status s_ = (expr);                          \
    ASSERT_TRUE(s_.ok()) << #expr << " -> " << s_.to_string();  \
  } while (0)

#define SPECD_EXPECT_CODE(expr, code_)                                        \
  do {                                                                        \
    const ::specd::Status s_ = (expr);                                        \
    EXPECT_EQ(s_.code(), ::specd::StatusCode::code_) << #expr << " -> " << s_.to_string(); \
    EXPECT_FALSE(s_.message().empty()) << #expr;                              \
  } while (0)

// A manager whose page holds `bytes_per_token.size()` models' blocks; page_bytes chosen so the
// first model (target) gets exactly `target_block` tokens per page.
inline std::unique_ptr<BlockManager> make_manager(int32_t num_pages, int32_t target_block = 4,
                                                  std::vector<int64_t> bytes_per_token = {6},
                                                  int32_t block_align = 1, bool prefix_caching = false) {
  BlockManagerConfig config;
  config.prefix_caching = prefix_caching;
  config.page_bytes = int64_t{target_block} * bytes_per_token[0];
  config.num_pages = num_pages;
  config.block_align = block_align;
  const char* names[] = {"target", "draft", "m2", "m3"};
  for (std::size_t i = 0; i < bytes_per_token.size(); ++i)
    config.models.push_back(ModelKvSpec{names[i], bytes_per_token[i]});
  std::unique_ptr<BlockManager> bm;
  const Status s = BlockManager::create(config, &bm);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return bm;
}

inline SeqKvInfo info_of(const BlockManager& bm, SeqId seq, ModelIndex m = 0) {
  SeqKvInfo info;
  const Status s = bm.info(seq, m, &info);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return info;
}

inline std::vector<int32_t> pages_of(const BlockManager& bm, SeqId seq, ModelIndex m = 0) {
  const std::vector<int32_t>* pages = nullptr;
  const Status s = bm.pages(seq, m, &pages);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return pages ? *pages : std::vector<int32_t>{};
}

// Reserve + commit all: the sequence grows by n committed tokens (as after a prefill).
inline Status grow(BlockManager& bm, SeqId seq, int32_t n, ModelIndex m = 0) {
  Reservation r;
  SPECD_RETURN_IF_ERROR(bm.reserve(seq, m, n, &r));
  return bm.commit(seq, m, n);
}

}  // namespace specd::testing
