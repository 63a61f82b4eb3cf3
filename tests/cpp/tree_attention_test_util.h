// Helpers shared by the tree-attention tests (CPU reference and CUDA kernel): a random batch
// of requests, each a random tree after a random history in a shuffled paged cache, and the
// float32 TreeAttentionParams over it.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kv_test_util.h"
#include "specd/tree_attention.h"

namespace specd::testing {

// A batch of requests, each with a history and a tree (written at the end of its KV extent).
struct AttnBatch {
  RandomPagedCache cache;
  int32_t q_heads = 0;
  std::vector<TokenTree> trees;
  std::vector<int32_t> query_start{0}, kv_lens;
  std::vector<uint64_t> mask;  // [num_tokens, mask_words]
  int32_t mask_words = 1;
  std::vector<float> q;        // [num_tokens, q_heads, head_dim]
  std::vector<int32_t> tree_lens;  // [num_seqs] or empty (each tree is its queries)
};

// The batch `full` (every tree node a query) with only the newest nodes of each tree as queries:
// request s keeps its last keep[s] nodes (their q and mask rows), tree_lens = its tree's size.
// Its outputs must be the matching rows of `full`'s (the keys each query sees are the same).
inline AttnBatch newest_queries(const AttnBatch& full, const std::vector<int32_t>& keep) {
  AttnBatch b = full;
  b.query_start = {0};
  b.mask.clear();
  b.q.clear();
  b.tree_lens.clear();
  const int64_t row = int64_t{full.q_heads} * full.cache.layout.head_dim;
  for (std::size_t s = 0; s < full.trees.size(); ++s) {
    const int32_t size = full.query_start[s + 1] - full.query_start[s];
    for (int32_t t = full.query_start[s + 1] - keep[s]; t < full.query_start[s + 1]; ++t) {
      b.q.insert(b.q.end(), full.q.begin() + t * row, full.q.begin() + (t + 1) * row);
      b.mask.insert(b.mask.end(), full.mask.begin() + int64_t{t} * full.mask_words,
                    full.mask.begin() + int64_t{t + 1} * full.mask_words);
    }
    b.query_start.push_back(b.query_start.back() + keep[s]);
    b.tree_lens.push_back(size);
  }
  return b;
}

// `dim` 0 picks a random head_dim in [1, 20]; histories have up to `max_history` tokens.
inline AttnBatch random_attn_batch(std::mt19937& rng, int32_t seqs, int32_t max_drafts, int32_t group,
                                   int32_t dim = 0, int32_t max_history = 40) {
  AttnBatch b;
  const int32_t bs = 1 + static_cast<int32_t>(rng() % 8);
  const int32_t kv_heads = 1 + static_cast<int32_t>(rng() % 3);
  if (dim == 0) dim = 1 + static_cast<int32_t>(rng() % 20);
  const int32_t capacity = max_drafts + 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_history + 1));
  const int32_t blocks = (capacity + bs - 1) / bs;
  b.cache = random_paged_cache(rng, seqs, blocks, bs, kv_heads, dim);
  b.q_heads = kv_heads * group;
  for (int32_t s = 0; s < seqs; ++s) {
    b.trees.push_back(random_tree(rng, static_cast<int32_t>(rng() % static_cast<uint32_t>(max_drafts + 1))));
    const int32_t q_len = b.trees.back().size();
    b.query_start.push_back(b.query_start.back() + q_len);
    b.kv_lens.push_back(q_len + static_cast<int32_t>(rng() % static_cast<uint32_t>(capacity - q_len + 1)));
  }
  b.mask_words = (max_drafts + 1 + 63) / 64;
  for (const TokenTree& tree : b.trees) {
    const std::vector<uint64_t> m = tree.ancestor_mask();
    for (int32_t i = 0; i < tree.size(); ++i)
      for (int32_t w = 0; w < b.mask_words; ++w)
        b.mask.push_back(w < tree.mask_words() ? m[static_cast<std::size_t>(i * tree.mask_words() + w)] : 0);
  }
  std::normal_distribution<float> normal;
  b.q.resize(static_cast<std::size_t>(b.query_start.back() * b.q_heads * dim));
  for (auto& x : b.q) x = normal(rng);
  return b;
}

inline TreeAttentionParams attn_params(const AttnBatch& b, std::vector<float>* out, bool with_mask = true) {
  const int64_t row = int64_t{b.q_heads} * b.cache.layout.head_dim;
  out->assign(static_cast<std::size_t>(b.query_start.back() * row), std::nanf(""));
  TreeAttentionParams p;
  p.q = b.q.data();
  p.q_token_stride = row;
  p.k_cache = b.cache.k.data();
  p.v_cache = b.cache.v.data();
  p.layout = b.cache.layout;
  p.block_table = b.cache.table.data();
  p.table_width = b.cache.width;
  p.table_stride = b.cache.stride;
  p.query_start = b.query_start.data();
  p.kv_lens = b.kv_lens.data();
  p.tree_mask = with_mask ? b.mask.data() : nullptr;
  p.mask_words = b.mask_words;
  p.tree_lens = b.tree_lens.empty() ? nullptr : b.tree_lens.data();
  p.out = out->data();
  p.out_token_stride = row;
  p.num_seqs = static_cast<int32_t>(b.kv_lens.size());
  p.num_tokens = b.query_start.back();
  p.q_heads = b.q_heads;
  p.scale = 1.0f / std::sqrt(static_cast<float>(b.cache.layout.head_dim));
  return p;
}

}  // namespace specd::testing
