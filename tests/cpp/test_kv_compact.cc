// KV compaction (CPU reference): the in-place, increasing-d moves give the same cache as an
// out-of-place model (every accepted node's original row copied to its committed position
// from a snapshot) on random trees, paths, page tables and several layers; rows outside the
// destinations never change; invalid paths and uncovered positions; size validation.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "block_manager_test_util.h"
#include "kv_test_util.h"
#include "specd/kv_compact.h"

namespace specd::testing {
namespace {

// Cache of several layers: layer l's K at k.data() + l * layer_stride (likewise V).
struct Batch {
  RandomPagedCache cache;
  int32_t num_layers = 1;
  int64_t layer_stride = 0;
  std::vector<int32_t> tree_start, path, num_accepted;
  int32_t path_stride = 0;
};

KvCompactParams compact_params(Batch* b) {
  KvCompactParams p;
  p.k_cache = b->cache.k.data();
  p.v_cache = b->cache.v.data();
  p.layout = b->cache.layout;
  p.num_layers = b->num_layers;
  p.layer_stride = b->layer_stride;
  p.block_table = b->cache.table.data();
  p.num_seqs = static_cast<int32_t>(b->tree_start.size());
  p.table_width = b->cache.width;
  p.table_stride = b->cache.stride;
  p.tree_start = b->tree_start.data();
  p.path = b->path.data();
  p.num_accepted = b->num_accepted.data();
  p.path_stride = b->path_stride;
  return p;
}

// Random batch: each sequence has a history, then a tree written at tree_start..; its
// accepted path is a random walk. All layers share one buffer (layer_stride apart).
Batch random_batch(std::mt19937& rng, int32_t seqs, int32_t layers) {
  Batch b;
  const int32_t bs = 1 + static_cast<int32_t>(rng() % 6);
  const int32_t blocks = 2 + static_cast<int32_t>(rng() % 6);
  b.cache = random_paged_cache(rng, seqs, blocks, bs, 1 + static_cast<int32_t>(rng() % 3),
                               1 + static_cast<int32_t>(rng() % 8));
  // Extra layers: repeat the whole (random) buffer, so layer l lives layer_stride further on.
  b.num_layers = layers;
  b.layer_stride = static_cast<int64_t>(b.cache.k.size()) + 7;
  std::normal_distribution<float> normal;
  for (auto* buf : {&b.cache.k, &b.cache.v}) {
    buf->resize(static_cast<std::size_t>(layers * b.layer_stride));
    for (auto& x : *buf) x = normal(rng);
  }
  const int32_t capacity = blocks * bs;
  b.path_stride = capacity + 1;
  b.path.assign(static_cast<std::size_t>(seqs * b.path_stride), -1);
  for (int32_t s = 0; s < seqs; ++s) {
    const int32_t drafts = static_cast<int32_t>(rng() % static_cast<uint32_t>(capacity));
    const TokenTree tree = random_tree(rng, drafts);
    const std::vector<int32_t> path = random_path(rng, tree);
    b.tree_start.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(capacity - drafts)));
    b.num_accepted.push_back(static_cast<int32_t>(path.size()) - 1);
    std::copy(path.begin(), path.end(), b.path.begin() + s * b.path_stride);
  }
  return b;
}

// The out-of-place model: position tree_start + d gets the snapshot's row at tree_start + path[d].
void model_compact(const Batch& b, const std::vector<float>& snap, std::vector<float>* out) {
  const int64_t row = kv_row_elems(b.cache.layout);
  for (std::size_t s = 0; s < b.tree_start.size(); ++s) {
    for (int32_t d = 1; d <= b.num_accepted[s]; ++d) {
      const int32_t node = b.path[s * static_cast<std::size_t>(b.path_stride) + static_cast<std::size_t>(d)];
      const int64_t src = dense_row(b.cache, static_cast<int32_t>(s), b.tree_start[s] + node);
      const int64_t dst = dense_row(b.cache, static_cast<int32_t>(s), b.tree_start[s] + d);
      for (int32_t l = 0; l < b.num_layers; ++l)
        for (int64_t e = 0; e < row; ++e)
          (*out)[static_cast<std::size_t>(l * b.layer_stride + dst + e)] =
              snap[static_cast<std::size_t>(l * b.layer_stride + src + e)];
    }
  }
}

TEST(KvCompactCpu, WorkedExampleWithOverlappingMoves) {
  // One sequence, block size 2, pages {1, 0}: positions 0,1 -> page 1; 2,3 -> page 0.
  // Tree written at positions 0..3 (nodes 0..3); accepted path 0 -> 2 -> 3: node 2 moves to
  // position 1 and node 3 to position 2 (which was node 2's source: read before overwritten).
  Batch b;
  b.cache.layout = PagedKvLayout{2, 2, 1, 1, 2};
  b.cache.k = {12, 13, 10, 11};  // node i's K is 10 + i: page 1 holds nodes 0, 1
  b.cache.v = {22, 23, 20, 21};
  b.cache.table = {1, 0};
  b.cache.width = b.cache.stride = 2;
  b.tree_start = {0};
  b.path = {0, 2, 3, -1};
  b.num_accepted = {2};
  b.path_stride = 4;
  SPECD_ASSERT_OK(kv_compact_cpu(compact_params(&b), /*strict=*/true));
  EXPECT_EQ(b.cache.k, (std::vector<float>{13, 13, 10, 12}));  // positions 0..2 = nodes 0, 2, 3
  EXPECT_EQ(b.cache.v, (std::vector<float>{23, 23, 20, 22}));
}

TEST(KvCompactCpu, MatchesOutOfPlaceModelOnRandomTrees) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    Batch b = random_batch(rng, 1 + static_cast<int32_t>(rng() % 5), 1 + static_cast<int32_t>(rng() % 3));
    std::vector<float> want_k = b.cache.k, want_v = b.cache.v;
    model_compact(b, b.cache.k, &want_k);
    model_compact(b, b.cache.v, &want_v);
    SPECD_ASSERT_OK(kv_compact_cpu(compact_params(&b), /*strict=*/true));
    ASSERT_EQ(b.cache.k, want_k) << "trial " << trial;  // includes: nothing else changed
    ASSERT_EQ(b.cache.v, want_v) << "trial " << trial;
  }
}

TEST(KvCompactCpu, InvalidPathsMoveNothing) {
  std::mt19937 rng(9);
  Batch b = random_batch(rng, 1, 1);
  b.tree_start = {0};
  b.path_stride = 4;
  const std::vector<std::vector<int32_t>> bad_paths{
      {1, 2, 3, -1},   // does not start at the root
      {0, 2, 2, -1},   // not strictly increasing
      {0, 3, 1, -1},
  };
  const std::vector<float> k = b.cache.k;
  for (const auto& path : bad_paths) {
    b.path = path;
    b.num_accepted = {2};
    SPECD_EXPECT_CODE(kv_compact_cpu(compact_params(&b), true), kInvalidArgument);
    SPECD_ASSERT_OK(kv_compact_cpu(compact_params(&b), false));
    EXPECT_EQ(b.cache.k, k);
  }
  b.path = {0, 1, 2, 3};
  for (int32_t n : {-1, 4}) {  // num_accepted outside [0, path_stride)
    b.num_accepted = {n};
    SPECD_EXPECT_CODE(kv_compact_cpu(compact_params(&b), true), kInvalidArgument);
    SPECD_ASSERT_OK(kv_compact_cpu(compact_params(&b), false));
    EXPECT_EQ(b.cache.k, k);
  }
}

TEST(KvCompactCpu, UncoveredPositionsAreReportedWhenStrictAndSkippedOtherwise) {
  // Block size 1, table {0, 1, -1}: position 2 has no page. Path 0 -> 2 (position 2 -> 1) can
  // not be read; nothing moves.
  Batch b;
  b.cache.layout = PagedKvLayout{3, 1, 1, 1, 1};
  b.cache.k = {10, 11, 12};
  b.cache.v = {20, 21, 22};
  b.cache.table = {0, 1, -1};
  b.cache.width = b.cache.stride = 3;
  b.tree_start = {0};
  b.path = {0, 2};
  b.num_accepted = {1};
  b.path_stride = 2;
  SPECD_EXPECT_CODE(kv_compact_cpu(compact_params(&b), true), kOutOfRange);
  SPECD_ASSERT_OK(kv_compact_cpu(compact_params(&b), false));
  EXPECT_EQ(b.cache.k, (std::vector<float>{10, 11, 12}));
}

TEST(KvCompactCpu, ValidatesSizes) {
  Batch b;
  b.cache.layout = PagedKvLayout{1, 1, 1, 1, 1};
  b.cache.k = b.cache.v = {0};
  b.cache.table = {0};
  b.cache.width = b.cache.stride = 1;
  b.tree_start = {0};
  b.path = {0};
  b.num_accepted = {0};
  b.path_stride = 1;
  SPECD_ASSERT_OK(kv_compact_cpu(compact_params(&b), true));  // nothing accepted
  KvCompactParams p = compact_params(&b);
  p.num_layers = 0;
  SPECD_EXPECT_CODE(validate_kv_compact(p), kInvalidArgument);
  p = compact_params(&b);
  p.path_stride = 0;
  SPECD_EXPECT_CODE(validate_kv_compact(p), kInvalidArgument);
  p = compact_params(&b);
  p.table_stride = 0;
  SPECD_EXPECT_CODE(validate_kv_compact(p), kInvalidArgument);
  p = compact_params(&b);
  p.path = nullptr;
  SPECD_EXPECT_CODE(validate_kv_compact(p), kInvalidArgument);
}

}  // namespace
}  // namespace specd::testing
