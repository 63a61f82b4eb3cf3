// Losslessness harness of batched stochastic verification: one verify step per trial, all
// trials in one batch; the first emitted token must follow the target distribution. Shared
// by the CPU test (batched CPU version) and the CUDA test (the kernel).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "chi_square.h"
#include "specd/sampling.h"
#include "specd/verify_batch.h"
#include "verify_batch_test_util.h"

namespace specd::testing {

struct LosslessBatch {
  BatchRun run;
  std::vector<double> root_target;  // the distribution the first emitted token must follow
};

// The root proposes 3 children (drawn from the draft row with or without replacement, or
// for kOneHot the draft's argmax or a random token, without draft rows), each child one
// grandchild. Rows depend on (depth, token); the target bans the last token, the draft
// does not. c.logits holds the logits of the target rows (default SamplingParams).
inline LosslessBatch make_lossless_batch(Proposal how, int64_t trials) {
  constexpr int32_t V = 12;
  std::mt19937_64 g(77);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> p_rows(3 * V * V), q_rows(p_rows.size()), l_rows(p_rows.size());  // [depth][token][V]
  for (std::size_t r = 0; r < 3 * V; ++r) {
    std::vector<float> l(V), d(V);
    for (std::size_t i = 0; i < V; ++i) {
      l[i] = normal(g);
      d[i] = l[i] + normal(g);
    }
    l[V - 1] = -INFINITY;
    std::copy(l.begin(), l.end(), l_rows.begin() + static_cast<std::ptrdiff_t>(r * V));
    EXPECT_TRUE(sampling_probs(l, {}, Span<float>(p_rows.data() + r * V, V)).ok());
    EXPECT_TRUE(sampling_probs(d, {}, Span<float>(q_rows.data() + r * V, V)).ok());
  }
  const auto row = [&](const std::vector<float>& rows, int32_t depth, int32_t token) {
    return rows.data() + (static_cast<std::size_t>(depth) * V + static_cast<std::size_t>(token)) * V;
  };
  LosslessBatch batch;
  batch.root_target.assign(row(p_rows, 0, 0), row(p_rows, 0, 0) + V);
  VerifyCase& c = batch.run.c;
  c.vocab = V;
  c.stride = V;
  c.sampling = how == Proposal::kDraftIndependent ? DraftSampling::kIndependent : DraftSampling::kWithoutReplacement;
  const auto add_node = [&](int32_t parent, int32_t token, int32_t depth) {
    c.parents.push_back(parent);
    c.tokens.push_back(token);
    c.target.insert(c.target.end(), row(p_rows, depth, token), row(p_rows, depth, token) + V);
    c.draft.insert(c.draft.end(), row(q_rows, depth, token), row(q_rows, depth, token) + V);
    c.logits.insert(c.logits.end(), row(l_rows, depth, token), row(l_rows, depth, token) + V);  // p's logits
    c.target_tokens.push_back(0);
  };
  for (int64_t t = 0; t < trials; ++t) {
    const auto begin = static_cast<int32_t>(c.parents.size());
    add_node(-1, 0, 0);
    for (int32_t x : propose_children(g, row(q_rows, 0, 0), row(q_rows, 0, 0), V, 3, how)) {
      add_node(0, x, 1);
      const int32_t child = static_cast<int32_t>(c.parents.size()) - 1 - begin;
      for (int32_t y : propose_children(g, row(q_rows, 1, x), row(q_rows, 1, x), V, 1, how)) add_node(child, y, 2);
    }
    c.offsets.push_back(static_cast<int32_t>(c.parents.size()));
    c.keys.push_back(RngKey{99, static_cast<uint32_t>(t), 0, 1});
  }
  return batch;
}

// Chi-square of the first emitted tokens against the root's target row (significance
// 0.001); tokens of target probability 0 never appear; drafts get accepted.
inline void expect_first_token_follows_target(const LosslessBatch& batch, const BatchOutputs& got, const char* who) {
  const VerifyCase& c = batch.run.c;
  std::vector<int64_t> counts(batch.root_target.size(), 0);
  int64_t accepted = 0;
  for (int32_t r = 0; r < c.batch(); ++r) {
    const auto ur = static_cast<std::size_t>(r);
    ASSERT_EQ(got.status[ur], 0) << who << " trial " << r;
    ++counts[static_cast<std::size_t>(got.tokens[static_cast<std::size_t>(c.offsets[ur])])];
    accepted += got.num_accepted[ur];
  }
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (batch.root_target[i] == 0) EXPECT_EQ(counts[i], 0) << who << ": token " << i << " has target probability 0";
  const ChiSquare test = chi_square_test(counts, batch.root_target);
  EXPECT_GT(test.p_value, 0.001) << who << ": chi2 " << test.statistic << " df " << test.df;
  EXPECT_GT(accepted, c.batch() / 5) << who << ": too few accepted drafts to test acceptance";
  std::printf("[ lossless ] %s first token: chi2 %.1f df %d p %.3f, accepted/step %.2f\n", who, test.statistic, test.df,
              test.p_value, static_cast<double>(accepted) / static_cast<double>(c.batch()));
}

}  // namespace specd::testing
