// Tree attention (CPU reference): a hand-computed example; agreement with a naive dense
// computation (rows gathered per sequence, a [q_len, kv_len] mask built by walking tree parents,
// float two-pass softmax) on random trees, histories, page tables and GQA shapes; a chain tree
// equals the causal (no-mask) case exactly; queries that see nothing; strict mode; validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "block_manager_test_util.h"
#include "kv_test_util.h"
#include "specd/tree_attention.h"
#include "tree_attention_test_util.h"

namespace specd::testing {
namespace {

// Naive dense attention: gather each sequence's K/V, build the mask from parents, softmax.
std::vector<float> dense_attention(const AttnBatch& b, float scale) {
  const int32_t dim = b.cache.layout.head_dim, kv_heads = b.cache.layout.kv_heads;
  const int32_t group = b.q_heads / kv_heads;
  std::vector<float> out;
  for (std::size_t s = 0; s < b.trees.size(); ++s) {
    const TokenTree& tree = b.trees[s];
    const int32_t q_len = tree.size(), kv_len = b.kv_lens[s], hist = kv_len - q_len;
    for (int32_t i = 0; i < q_len; ++i) {
      const int32_t t = b.query_start[s] + i;
      for (int32_t h = 0; h < b.q_heads; ++h) {
        const int32_t g = h / group;
        std::vector<float> scores(static_cast<std::size_t>(kv_len), -std::numeric_limits<float>::infinity());
        for (int32_t pos = 0; pos < kv_len; ++pos) {
          if (pos >= hist && !is_ancestor_or_self(tree, pos - hist, i)) continue;
          const int64_t krow = dense_row(b.cache, static_cast<int32_t>(s), pos) + int64_t{g} * dim;
          float dot = 0;
          for (int32_t d = 0; d < dim; ++d)
            dot += b.q[static_cast<std::size_t>((int64_t{t} * b.q_heads + h) * dim + d)] *
                   b.cache.k[static_cast<std::size_t>(krow + d)];
          scores[static_cast<std::size_t>(pos)] = dot * scale;
        }
        float max = -std::numeric_limits<float>::infinity();
        for (float x : scores) max = std::max(max, x);
        float sum = 0;
        for (float& x : scores) sum += (x = std::exp(x - max));
        for (int32_t d = 0; d < dim; ++d) {
          float acc = 0;
          for (int32_t pos = 0; pos < kv_len; ++pos)
            acc += scores[static_cast<std::size_t>(pos)] *
                   b.cache.v[static_cast<std::size_t>(dense_row(b.cache, static_cast<int32_t>(s), pos) + int64_t{g} * dim + d)];
          out.push_back(acc / sum);
        }
      }
    }
  }
  return out;
}

TEST(TreeAttentionCpu, HandComputedExample) {
  // One head of dim 1, block size 4, one page. History: 1 key; tree root -> a, root -> b.
  // Query b (node 2) sees the history, the root and itself, not node 1.
  AttnBatch b;
  b.cache.layout = PagedKvLayout{1, 4, 1, 1, 4};
  b.cache.k = {0.f, 1.f, 2.f, std::log(3.f)};  // positions 0 (history), 1..3 = nodes 0..2
  b.cache.v = {1.f, 2.f, 100.f, 4.f};
  b.cache.table = {0};
  b.cache.width = b.cache.stride = 1;
  b.q_heads = 1;
  TokenTree tree(0);
  tree.add_node(0, 1);
  tree.add_node(0, 2);
  b.trees = {tree};
  b.query_start = {0, 3};
  b.kv_lens = {4};
  b.mask = tree.ancestor_mask();
  b.q = {0.f, 0.f, 1.f};
  std::vector<float> out;
  TreeAttentionParams p = attn_params(b, &out);
  p.scale = 1.f;
  SPECD_ASSERT_OK(tree_attention_cpu(p, /*strict=*/true));
  // Query 2 (q = 1): weights exp(0), exp(1), exp(log 3) over values 1, 2, 4.
  const double e = std::exp(1.0);
  EXPECT_NEAR(out[2], (1 * 1 + e * 2 + 3 * 4) / (1 + e + 3), 1e-6);
  // Queries 0 and 1 have q = 0: uniform over what they see (history + root; + node 1).
  EXPECT_NEAR(out[0], (1 + 2) / 2.0, 1e-6);
  EXPECT_NEAR(out[1], (1 + 2 + 100) / 3.0, 1e-5);
}

TEST(TreeAttentionCpu, MatchesDenseAttentionOnRandomTrees) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t max_drafts = trial % 10 == 9 ? 70 : 1 + static_cast<int32_t>(rng() % 12);  // > 64: 2 mask words
    const AttnBatch b = random_attn_batch(rng, 1 + static_cast<int32_t>(rng() % 4), max_drafts,
                                          1 + static_cast<int32_t>(rng() % 3));
    std::vector<float> out;
    const TreeAttentionParams p = attn_params(b, &out);
    SPECD_ASSERT_OK(tree_attention_cpu(p, /*strict=*/true));
    const std::vector<float> want = dense_attention(b, p.scale);
    ASSERT_EQ(out.size(), want.size());
    for (std::size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << "trial " << trial << " element " << i;
  }
}

TEST(TreeAttentionCpu, ChainTreeEqualsCausal) {
  std::mt19937 rng(23);
  for (int trial = 0; trial < 20; ++trial) {
    AttnBatch b = random_attn_batch(rng, 3, 9, 2);
    b.mask.clear();
    for (TokenTree& tree : b.trees) {  // replace each tree by a chain of the same size
      TokenTree chain(0);
      for (int32_t i = 1; i < tree.size(); ++i) chain.add_node(i - 1, i);
      tree = chain;
      const std::vector<uint64_t> m = chain.ancestor_mask();
      b.mask.insert(b.mask.end(), m.begin(), m.end());
    }
    std::vector<float> with_mask, causal;
    SPECD_ASSERT_OK(tree_attention_cpu(attn_params(b, &with_mask, true), true));
    SPECD_ASSERT_OK(tree_attention_cpu(attn_params(b, &causal, false), true));
    EXPECT_EQ(with_mask, causal) << "trial " << trial;
  }
}

// Random keep[s] in [0, tree size] per request.
std::vector<int32_t> random_keep(std::mt19937& rng, const AttnBatch& b) {
  std::vector<int32_t> keep;
  for (std::size_t s = 0; s < b.trees.size(); ++s) {
    const int32_t size = b.query_start[s + 1] - b.query_start[s];
    keep.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(size + 1)));
  }
  return keep;
}

TEST(TreeAttentionCpu, TreeLensFeedOnlyTheNewestNodes) {
  // A forward that feeds a tree's newest nodes (tree_lens = the whole tree, the mask rows over
  // all of it) computes for them exactly what a forward feeding the whole tree computes.
  std::mt19937 rng(31);
  for (int trial = 0; trial < 40; ++trial) {
    const int32_t max_drafts = trial % 10 == 9 ? 70 : 1 + static_cast<int32_t>(rng() % 12);
    const AttnBatch full = random_attn_batch(rng, 1 + static_cast<int32_t>(rng() % 4), max_drafts,
                                             1 + static_cast<int32_t>(rng() % 3));
    const std::vector<int32_t> keep = random_keep(rng, full);
    const AttnBatch part = newest_queries(full, keep);
    for (bool with_mask : {true, false}) {
      std::vector<float> want, got;
      SPECD_ASSERT_OK(tree_attention_cpu(attn_params(full, &want, with_mask), /*strict=*/true));
      SPECD_ASSERT_OK(tree_attention_cpu(attn_params(part, &got, with_mask), /*strict=*/true));
      const int64_t row = int64_t{full.q_heads} * full.cache.layout.head_dim;
      std::size_t at = 0;
      for (std::size_t s = 0; s < keep.size(); ++s)
        for (int32_t t = full.query_start[s + 1] - keep[s]; t < full.query_start[s + 1]; ++t)
          for (int64_t e = 0; e < row; ++e, ++at)
            ASSERT_EQ(got[at], want[static_cast<std::size_t>(t * row + e)])
                << "trial " << trial << " mask " << with_mask << " request " << s << " token " << t;
      ASSERT_EQ(at, got.size());
    }
  }
}

TEST(TreeAttentionCpu, StrictChecksTreeLens) {
  std::mt19937 rng(37);
  const AttnBatch full = random_attn_batch(rng, 2, 6, 1);
  const std::vector<int32_t> keep = {full.query_start[1] - full.query_start[0],
                                     full.query_start[2] - full.query_start[1]};  // every node: >= 1
  const AttnBatch part = newest_queries(full, keep);
  std::vector<float> out;
  SPECD_ASSERT_OK(tree_attention_cpu(attn_params(part, &out), true));  // tree_lens = q_len
  AttnBatch bad = part;
  bad.tree_lens[0] = keep[0] - 1;  // fewer tree nodes than queries
  Status st = tree_attention_cpu(attn_params(bad, &out), true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tree_len"), std::string::npos) << st.message();
  bad = part;
  bad.tree_lens[1] = bad.kv_lens[1] + 1;  // a tree longer than the KV extent
  st = tree_attention_cpu(attn_params(bad, &out), true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tree nodes"), std::string::npos) << st.message();
  bad = part;
  bad.tree_lens[0] = 65;  // mask rows of one word cover 64 nodes
  bad.kv_lens[0] = std::max(bad.kv_lens[0], 65);
  st = tree_attention_cpu(attn_params(bad, &out), true);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("mask rows"), std::string::npos) << st.message();
}

TEST(TreeAttentionCpu, QueriesThatSeeNothingGetZeros) {
  // No history and an all-zero mask row for query 1; token 2 belongs to no request.
  AttnBatch b;
  b.cache.layout = PagedKvLayout{1, 2, 1, 2, 4};
  b.cache.k = {1, 2, 3, 4};
  b.cache.v = {5, 6, 7, 8};
  b.cache.table = {0};
  b.cache.width = b.cache.stride = 1;
  b.q_heads = 1;
  b.query_start = {0, 2};
  b.kv_lens = {2};
  b.mask = {1, 0, 0};
  b.q = {1, 1, 1, 1, 1, 1};
  std::vector<float> out;
  TreeAttentionParams p = attn_params(b, &out);
  p.num_tokens = 3;
  out.assign(6, std::nanf(""));
  p.out = out.data();
  SPECD_ASSERT_OK(tree_attention_cpu(p, /*strict=*/false));
  EXPECT_EQ(out, (std::vector<float>{5, 6, 0, 0, 0, 0}));
}

TEST(TreeAttentionCpu, StrictChecksContents) {
  std::mt19937 rng(29);
  AttnBatch b = random_attn_batch(rng, 2, 5, 1);
  std::vector<float> out;
  SPECD_ASSERT_OK(tree_attention_cpu(attn_params(b, &out), true));
  {
    AttnBatch bad = b;
    bad.kv_lens[1] = bad.query_start[2] - bad.query_start[1] - 1;  // fewer keys than queries
    SPECD_EXPECT_CODE(tree_attention_cpu(attn_params(bad, &out), true), kInvalidArgument);
  }
  {
    AttnBatch bad = b;
    bad.kv_lens[0] = bad.cache.width * bad.cache.layout.block_size + 1;  // past the table
    SPECD_EXPECT_CODE(tree_attention_cpu(attn_params(bad, &out), true), kOutOfRange);
    SPECD_ASSERT_OK(tree_attention_cpu(attn_params(bad, &out), false));  // skipped by the kernel rule
  }
  {
    AttnBatch bad = b;
    std::vector<float> o2;
    TreeAttentionParams p = attn_params(bad, &o2);
    p.num_tokens += 1;  // query_start no longer ends at num_tokens
    o2.resize(o2.size() + static_cast<std::size_t>(p.out_token_stride));
    p.out = o2.data();
    SPECD_EXPECT_CODE(tree_attention_cpu(p, true), kInvalidArgument);
  }
}

TEST(TreeAttentionCpu, ValidatesSizes) {
  std::mt19937 rng(31);
  const AttnBatch b = random_attn_batch(rng, 1, 3, 2);
  std::vector<float> out;
  TreeAttentionParams p = attn_params(b, &out);
  SPECD_ASSERT_OK(validate_tree_attention(p));
  p.q_heads += 1;
  if (p.q_heads % p.layout.kv_heads != 0) SPECD_EXPECT_CODE(validate_tree_attention(p), kInvalidArgument);
  p = attn_params(b, &out);
  p.q_token_stride -= 1;
  SPECD_EXPECT_CODE(validate_tree_attention(p), kInvalidArgument);
  p = attn_params(b, &out);
  p.scale = std::numeric_limits<float>::infinity();
  SPECD_EXPECT_CODE(validate_tree_attention(p), kInvalidArgument);
  p = attn_params(b, &out);
  p.mask_words = 0;
  SPECD_EXPECT_CODE(validate_tree_attention(p), kInvalidArgument);
  p = attn_params(b, &out);
  p.dtype = KvDtype::kFloat16;  // valid for the kernel, not for the float32 CPU reference
  SPECD_ASSERT_OK(validate_tree_attention(p));
  SPECD_EXPECT_CODE(tree_attention_cpu(p), kInvalidArgument);
}

TEST(CsrRowOf, FindsOwnersAndSkipsEmptyRows) {
  const std::vector<int32_t> offsets{0, 2, 2, 5, 5};
  const std::vector<int32_t> want{0, 0, 2, 2, 2, -1, -1};
  for (int32_t i = 0; i < 7; ++i) EXPECT_EQ(detail::csr_row_of(offsets.data(), 4, i), want[static_cast<std::size_t>(i)]) << i;
  EXPECT_EQ(detail::csr_row_of(offsets.data(), 4, -1), -1);
  EXPECT_EQ(detail::csr_row_of(offsets.data(), 0, 0), -1);
}

}  // namespace
}  // namespace specd::testing
