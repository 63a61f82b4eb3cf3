// Split-KV rules (detail/attention_split.h), checked on the CPU: the plan covers every KV
// position exactly once with non-empty splits of whole tiles, and partial softmax states
// computed split by split (the rule of tree_attention.h within each split) and merged as the
// CUDA grouped kernel merges them equal tree_attention_cpu on random trees, histories and GQA
// shapes, for every max_splits from 1 to 64.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "block_manager_test_util.h"  // SPECD_ASSERT_OK
#include "specd/detail/attention_split.h"
#include "specd/tree_attention.h"
#include "tree_attention_test_util.h"

namespace specd::testing {
namespace {

using detail::KeyRange;
using detail::KeySplit;

TEST(AttentionSplit, PlanCoversEveryKeyOnceInWholeTiles) {
  for (int32_t kv_len : {0, 1, 31, 32, 127, 128, 129, 300, 521, 4096, 4097, 100000}) {
    for (int32_t max_splits : {1, 2, 3, 7, 64}) {
      const KeySplit plan = detail::plan_key_split(kv_len, max_splits, 128, 32);
      ASSERT_GE(plan.splits, 1);
      ASSERT_LE(plan.splits, max_splits) << kv_len;
      ASSERT_EQ(plan.span % 32, 0);
      int32_t next = 0;
      for (int32_t s = 0; s < plan.splits; ++s) {
        const KeyRange r = detail::key_split_range(plan, kv_len, s);
        ASSERT_EQ(r.begin, next) << "kv_len " << kv_len << " split " << s;
        if (kv_len > 0) {
          ASSERT_GT(r.end, r.begin) << "empty split " << s << " of kv_len " << kv_len;
        }
        if (s + 1 < plan.splits) {
          ASSERT_GE(r.end - r.begin, 128) << "splits have at least min_keys keys but the last";
        }
        next = r.end;
      }
      ASSERT_EQ(next, kv_len);
    }
  }
  // Short histories stay in one split; a long one takes them all.
  EXPECT_EQ(detail::plan_key_split(200, 64, 128, 32).splits, 2);
  EXPECT_EQ(detail::plan_key_split(128, 64, 128, 32).splits, 1);
  EXPECT_EQ(detail::plan_key_split(64 * 128, 64, 128, 32).splits, 64);
}

// Partial state of query token t, head h over the keys of `keys` (the rule's scores in double,
// stored as the kernel stores them: float).
struct Partial {
  float max = -INFINITY;
  float sum = 0.f;
  std::vector<float> acc;
};

Partial partial_state(const TreeAttentionParams& p, int32_t t, int32_t h, KeyRange keys) {
  const int32_t dim = p.layout.head_dim;
  Partial part;
  part.acc.assign(static_cast<std::size_t>(dim), 0.f);
  const TreeQuery tq = tree_attention_query(p, t);
  const auto* q = static_cast<const float*>(p.q) + t * p.q_token_stride + int64_t{h} * dim;
  const auto* k = static_cast<const float*>(p.k_cache);
  const auto* v = static_cast<const float*>(p.v_cache);
  const int32_t* row = p.block_table + int64_t{tq.seq} * p.table_stride;
  std::vector<double> scores;
  std::vector<int64_t> offs;
  for (int32_t pos = keys.begin; pos < keys.end; ++pos) {
    if (!tree_attention_visible(p, tq, t, pos)) continue;
    const int64_t slot = paged_kv_slot(row, p.table_width, p.layout.block_size, p.layout.num_pages, pos);
    if (slot < 0) continue;
    const int64_t off = kv_row_offset(p.layout, slot) + int64_t{tree_attention_kv_head(p, h)} * dim;
    double dot = 0;
    for (int32_t d = 0; d < dim; ++d) dot += double{q[d]} * double{k[off + d]};
    scores.push_back(dot * p.scale);
    offs.push_back(off);
  }
  if (scores.empty()) return part;
  double max = scores[0];
  for (double s : scores) max = std::max(max, s);
  double sum = 0;
  std::vector<double> acc(static_cast<std::size_t>(dim), 0.0);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const double w = std::exp(scores[i] - max);
    sum += w;
    for (int32_t d = 0; d < dim; ++d) acc[static_cast<std::size_t>(d)] += w * double{v[offs[i] + d]};
  }
  part.max = static_cast<float>(max);
  part.sum = static_cast<float>(sum);
  for (int32_t d = 0; d < dim; ++d) part.acc[static_cast<std::size_t>(d)] = static_cast<float>(acc[static_cast<std::size_t>(d)]);
  return part;
}

TEST(AttentionSplit, MergedPartialStatesEqualTheReference) {
  std::mt19937 rng(71);
  int multi_split_rows = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int32_t max_splits = trial % 4 == 0 ? 1 : trial % 4 == 1 ? 3 : trial % 4 == 2 ? 7 : 64;
    const int32_t history = trial % 3 == 0 ? 40 : 700;
    const AttnBatch b = random_attn_batch(rng, 1 + static_cast<int32_t>(rng() % 3), 1 + static_cast<int32_t>(rng() % 12),
                                          1 + static_cast<int32_t>(rng() % 4), 0, history);
    std::vector<float> want;
    const TreeAttentionParams p = attn_params(b, &want, /*with_mask=*/trial % 5 != 4);
    SPECD_ASSERT_OK(tree_attention_cpu(p, /*strict=*/true));
    const int32_t dim = p.layout.head_dim;
    for (int32_t t = 0; t < p.num_tokens; ++t) {
      const TreeQuery tq = tree_attention_query(p, t);
      const KeySplit plan = detail::plan_key_split(tq.kv_len, max_splits, 128, 32);
      multi_split_rows += plan.splits > 1;
      for (int32_t h = 0; h < p.q_heads; ++h) {
        std::vector<Partial> parts;
        for (int32_t s = 0; s < plan.splits; ++s)
          parts.push_back(partial_state(p, t, h, detail::key_split_range(plan, tq.kv_len, s)));
        float max_all = -INFINITY;
        for (const Partial& part : parts)
          if (part.sum > 0.f) max_all = std::max(max_all, part.max);
        float total = 0.f;
        std::vector<float> o(static_cast<std::size_t>(dim), 0.f);
        for (const Partial& part : parts) {
          const float weight = detail::softmax_part_weight(part.max, part.sum, max_all);
          total += weight * part.sum;
          for (int32_t d = 0; d < dim; ++d) o[static_cast<std::size_t>(d)] += weight * part.acc[static_cast<std::size_t>(d)];
        }
        for (int32_t d = 0; d < dim; ++d) {
          const float got = total > 0.f ? o[static_cast<std::size_t>(d)] / total : 0.f;
          const float ref = want[static_cast<std::size_t>(t * p.out_token_stride + int64_t{h} * dim + d)];
          ASSERT_NEAR(got, ref, 1e-5 * (1 + std::fabs(ref)))
              << "trial " << trial << " token " << t << " head " << h << " dim " << d << " splits " << plan.splits;
        }
      }
    }
  }
  EXPECT_GT(multi_split_rows, 20) << "the trials should exercise several splits";
}

TEST(AttentionSplit, PartsThatSawNoKeyWeighNothing) {
  EXPECT_EQ(detail::softmax_part_weight(-INFINITY, 0.f, 1.f), 0.f);
  EXPECT_EQ(detail::softmax_part_weight(5.f, 0.f, 1.f), 0.f);
  EXPECT_FLOAT_EQ(detail::softmax_part_weight(1.f, 2.f, 1.f), 1.f);
  EXPECT_FLOAT_EQ(detail::softmax_part_weight(0.f, 2.f, 1.f), std::exp(-1.f));
}

}  // namespace
}  // namespace specd::testing
