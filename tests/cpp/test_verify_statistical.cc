// Statistical losslessness of stochastic verification.
//
// A toy autoregressive "target" and "draft" over a small vocabulary give the next-token
// distribution for every (position, previous token). Each trial runs speculative decoding
// from a fixed root until at least two tokens are emitted: the draft proposes a chain or a
// tree (sampled from its rows with or without replacement, or chosen deterministically as
// top-m candidates, i.e. one-hot proposals), the verifier accepts a prefix and emits a bonus
// or recovered token, and decoding continues from there. Over 100,000 trials per case:
// - the first emitted token must follow the target's distribution at position 1, and
// - the pair (first, second) must follow target(first) x target(second | first),
// each by a chi-square test at significance 0.001, and tokens of target probability 0 must
// never be emitted. Cases cover chains and trees with >= 2 siblings, with and without draft
// rows, and temperature / top-k / top-p / min-p applied to both models. Negative controls
// show that the test rejects two subtly wrong verifiers with the same number of trials.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "block_manager_test_util.h"
#include "chi_square.h"
#include "specd/philox.h"
#include "specd/sampling.h"
#include "specd/verify.h"

namespace specd::testing {
namespace {

constexpr double kAlpha = 0.001;

int64_t num_trials() {
  // The ASan build lowers this (tests/run.sh) to keep its run short; normal builds use 1e5.
  const char* env = std::getenv("SPECD_STAT_TRIALS");
  return env ? std::atoll(env) : 100000;
}

// Next-token distributions by (position, previous token), repeating every `levels` positions.
struct ToyModel {
  int32_t vocab = 0;
  int32_t levels = 0;
  std::vector<float> rows;  // [levels * vocab, vocab]
  const float* dist(int32_t pos, int32_t prev) const {
    return rows.data() + (static_cast<std::size_t>(pos % levels) * vocab + static_cast<std::size_t>(prev)) * vocab;
  }
};

// Target: logits ~ N(0, 1.5) with the last token banned (-inf); draft: the target's logits
// plus N(0, noise), so it bans that token too, or (noise < 0) independent logits, which do
// propose it. Both pass through the same sampling params.
std::pair<ToyModel, ToyModel> make_models(int32_t vocab, uint64_t seed, double noise,
                                          const SamplingParams& params) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  ToyModel target{vocab, 3, {}}, draft{vocab, 3, {}};
  const std::size_t rows = static_cast<std::size_t>(target.levels) * vocab;
  target.rows.resize(rows * vocab);
  draft.rows.resize(rows * vocab);
  std::vector<float> tl(static_cast<std::size_t>(vocab)), dl(static_cast<std::size_t>(vocab));
  for (std::size_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < vocab; ++i) tl[static_cast<std::size_t>(i)] = normal(rng);
    tl.back() = -INFINITY;  // the target never emits the last token
    for (int32_t i = 0; i < vocab; ++i)
      dl[static_cast<std::size_t>(i)] = noise < 0 ? normal(rng) : tl[static_cast<std::size_t>(i)] + static_cast<float>(noise) * normal(rng);
    EXPECT_TRUE(sampling_probs(tl, params, Span<float>(target.rows.data() + r * vocab, static_cast<std::size_t>(vocab))).ok());
    EXPECT_TRUE(sampling_probs(dl, params, Span<float>(draft.rows.data() + r * vocab, static_cast<std::size_t>(vocab))).ok());
  }
  return {target, draft};
}

enum class Proposal { kWithoutReplacement, kIndependent, kTopM /* deterministic: one-hot */ };

struct Case {
  const char* name;
  int32_t vocab;
  std::vector<int32_t> branching;  // children per node at each depth: {1,1,1} = chain of 3
  Proposal proposal;
  SamplingParams params;
  double noise;  // draft = target + noise; < 0: independent draft
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

int32_t draw(const float* q, int32_t vocab, std::vector<char>* banned, std::mt19937_64* rng) {
  std::vector<double> w(static_cast<std::size_t>(vocab));
  double total = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    w[static_cast<std::size_t>(i)] = (*banned)[static_cast<std::size_t>(i)] ? 0.0 : q[i];
    total += w[static_cast<std::size_t>(i)];
  }
  if (total <= 0) return -1;
  return sample_from_weights(w, total, std::uniform_real_distribution<double>(0, 1)(*rng));
}

// Children of `node` proposed by the draft row q.
std::vector<int32_t> propose(const float* q, int32_t vocab, int32_t m, Proposal how, std::mt19937_64* rng) {
  std::vector<int32_t> out;
  std::vector<char> banned(static_cast<std::size_t>(vocab), 0);
  for (int32_t j = 0; j < m; ++j) {
    int32_t x = -1;
    if (how == Proposal::kTopM) {
      for (int32_t i = 0; i < vocab; ++i)
        if (!banned[static_cast<std::size_t>(i)] && (x < 0 || q[i] > q[x])) x = i;
    } else {
      x = draw(q, vocab, &banned, rng);
    }
    if (x < 0) break;
    out.push_back(x);
    if (how != Proposal::kIndependent) banned[static_cast<std::size_t>(x)] = 1;
  }
  return out;
}

struct Step {
  TokenTree tree;
  std::vector<float> target_rows, draft_rows;
};

Step build_step(const Case& c, const ToyModel& target, const ToyModel& draft, int32_t root, int32_t pos,
                std::mt19937_64* rng) {
  Step s{TokenTree(root), {}, {}};
  std::vector<int32_t> level{0};
  for (std::size_t d = 0; d < c.branching.size(); ++d) {
    std::vector<int32_t> next;
    for (int32_t node : level) {
      const float* q = draft.dist(pos + static_cast<int32_t>(d), s.tree.token(node));
      for (int32_t x : propose(q, c.vocab, c.branching[d], c.proposal, rng)) next.push_back(s.tree.add_node(node, x));
    }
    level = next;
  }
  for (int32_t v = 0; v < s.tree.size(); ++v) {
    const float* p = target.dist(pos + s.tree.depth(v), s.tree.token(v));
    const float* q = draft.dist(pos + s.tree.depth(v), s.tree.token(v));
    s.target_rows.insert(s.target_rows.end(), p, p + c.vocab);
    s.draft_rows.insert(s.draft_rows.end(), q, q + c.vocab);
  }
  return s;
}

struct Counts {
  std::vector<int64_t> first, pair;  // [V], [V * V]
  int64_t steps = 0, accepted = 0;
  int64_t later_sibling = 0;  // steps whose first accepted draft was not the root's first child
  int64_t multi_sibling = 0;  // steps whose root had >= 2 children
};

Counts run_case(const Case& c, int64_t trials) {
  const auto [target, draft] = make_models(c.vocab, 1234, c.noise, c.params);
  std::mt19937_64 rng(99);
  Counts counts{std::vector<int64_t>(static_cast<std::size_t>(c.vocab), 0),
                std::vector<int64_t>(static_cast<std::size_t>(c.vocab) * c.vocab, 0), 0, 0};
  const DraftSampling mode = c.proposal == Proposal::kIndependent ? DraftSampling::kIndependent
                                                                 : DraftSampling::kWithoutReplacement;
  VerifyResult r;
  for (int64_t trial = 0; trial < trials; ++trial) {
    std::vector<int32_t> emitted;
    int32_t root = 0, pos = 0;
    for (uint32_t step = 0; emitted.size() < 2; ++step) {
      const Step s = build_step(c, target, draft, root, pos, &rng);
      const ProbRows p{s.target_rows.data(), s.tree.size(), c.vocab, c.vocab};
      const ProbRows q{s.draft_rows.data(), s.tree.size(), c.vocab, c.vocab};
      const RngKey key{7, static_cast<uint32_t>(trial), step, static_cast<uint32_t>(pos + 1)};
      const Status st = verify_stochastic(s.tree, p, c.proposal == Proposal::kTopM ? nullptr : &q, mode, key, &r);
      if (!st.ok()) {
        ADD_FAILURE() << st.to_string();
        return counts;
      }
      emitted.insert(emitted.end(), r.tokens.begin(), r.tokens.end());
      pos += static_cast<int32_t>(r.tokens.size());
      root = emitted.back();
      ++counts.steps;
      counts.accepted += r.num_accepted;
      const int32_t first_child = s.tree.first_child(0);
      if (first_child >= 0 && s.tree.next_sibling(first_child) >= 0) ++counts.multi_sibling;
      if (r.num_accepted > 0 && r.path[1] != first_child) ++counts.later_sibling;
    }
    ++counts.first[static_cast<std::size_t>(emitted[0])];
    ++counts.pair[static_cast<std::size_t>(emitted[0]) * c.vocab + static_cast<std::size_t>(emitted[1])];
  }
  return counts;
}

// Expected distributions: first ~ target(pos 0, root 0); pair ~ first x target(pos 1, first).
void check_lossless(const Case& c, const Counts& counts) {
  const auto [target, draft] = make_models(c.vocab, 1234, c.noise, c.params);
  const float* p1 = target.dist(0, 0);
  std::vector<double> first(p1, p1 + c.vocab), pair(static_cast<std::size_t>(c.vocab) * c.vocab);
  for (int32_t a = 0; a < c.vocab; ++a)
    for (int32_t b = 0; b < c.vocab; ++b)
      pair[static_cast<std::size_t>(a) * c.vocab + static_cast<std::size_t>(b)] = double{p1[a]} * target.dist(1, a)[b];
  for (std::size_t i = 0; i < first.size(); ++i)
    if (first[i] == 0) EXPECT_EQ(counts.first[i], 0) << "token " << i << " has target probability 0";
  for (std::size_t i = 0; i < pair.size(); ++i)
    if (pair[i] == 0) EXPECT_EQ(counts.pair[i], 0) << "pair " << i / c.vocab << "," << i % c.vocab << " has probability 0";
  const ChiSquare t1 = chi_square_test(counts.first, first), t2 = chi_square_test(counts.pair, pair);
  EXPECT_GT(t1.p_value, kAlpha) << "first token: chi2 " << t1.statistic << " df " << t1.df;
  EXPECT_GT(t2.p_value, kAlpha) << "token pair: chi2 " << t2.statistic << " df " << t2.df;
  std::printf("[ lossless ] %-28s first: chi2 %7.1f df %3d p %.3f | pair: chi2 %7.1f df %3d p %.3f | "
              "accepted/step %.2f, later sibling accepted in %.1f%% of steps\n", c.name, t1.statistic,
              t1.df, t1.p_value, t2.statistic, t2.df, t2.p_value,
              static_cast<double>(counts.accepted) / static_cast<double>(counts.steps),
              100.0 * static_cast<double>(counts.later_sibling) / static_cast<double>(counts.steps));
}

class VerifyLossless : public ::testing::TestWithParam<Case> {};

TEST_P(VerifyLossless, EmittedTokensFollowTheTarget) {
  const Case& c = GetParam();
  const Counts counts = run_case(c, num_trials());
  ASSERT_FALSE(HasFailure());
  check_lossless(c, counts);
  // The case must exercise what it is named after: acceptance, not only recovered tokens,
  // and, for trees, siblings other than the first being accepted.
  EXPECT_GT(counts.accepted, counts.steps / 20) << "too few accepted drafts to test acceptance";
  if (c.branching[0] > 1) {
    EXPECT_GT(counts.multi_sibling, counts.steps / 2) << "the root rarely had several children";
    EXPECT_GT(counts.later_sibling, counts.steps / 100) << "later siblings were (almost) never accepted";
  }
}

// Filters that remove several tokens but leave both models a support of several tokens, so
// trees still get several distinct children.
SamplingParams temp_top_p() {
  SamplingParams s;
  s.temperature = 1.3;
  s.top_p = 0.9;
  return s;
}
SamplingParams top_k_min_p() {
  SamplingParams s;
  s.temperature = 0.9;
  s.top_k = 6;
  s.min_p = 0.05;
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, VerifyLossless,
    ::testing::Values(
        Case{"chain1_draft_rows", 12, {1}, Proposal::kWithoutReplacement, {}, 1.0},
        Case{"chain4_draft_rows", 12, {1, 1, 1, 1}, Proposal::kWithoutReplacement, {}, 0.7},
        Case{"chain3_one_hot_top1", 12, {1, 1, 1}, Proposal::kTopM, {}, 1.0},
        Case{"chain3_one_hot_far_draft", 10, {1, 1, 1}, Proposal::kTopM, {}, -1},
        Case{"tree3x1_without_replacement", 12, {3, 1}, Proposal::kWithoutReplacement, {}, 1.0},
        Case{"tree3x1_independent", 12, {3, 1}, Proposal::kIndependent, {}, 1.0},
        Case{"tree2x2_one_hot_top2", 12, {2, 2}, Proposal::kTopM, {}, 1.0},
        Case{"tree4_independent_far", 8, {4}, Proposal::kIndependent, {}, -1},
        Case{"chain4_temp_top_p", 16, {1, 1, 1, 1}, Proposal::kWithoutReplacement, temp_top_p(), 0.7},
        Case{"tree3x2_temp_top_p", 16, {3, 2}, Proposal::kWithoutReplacement, temp_top_p(), 1.0},
        Case{"tree2x1_top_k_min_p_indep", 16, {2, 1}, Proposal::kIndependent, top_k_min_p(), 1.0},
        Case{"tree2x1_top_p_one_hot", 16, {2, 1}, Proposal::kTopM, temp_top_p(), 1.0}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// ---- negative controls: the same test must reject subtly wrong verifiers ----

// Chain of one draft x ~ q. Wrong: a rejected draft is replaced by a sample from p itself
// instead of from the residual max(0, p - q).
int32_t wrong_residual(const float* p, const float* q, int32_t vocab, int32_t x, uint32_t trial) {
  const double u = philox_uniform(1, trial, 0, 1, 0);
  if (u * q[x] < p[x]) return x;
  std::vector<double> w(p, p + vocab);
  return sample_from_weights(w, 1.0, philox_uniform(1, trial, 0, 1, kFinalDraw));
}

// Two deterministic siblings a, b. Wrong: after rejecting a, b is tested against the
// unchanged p and the final draw may return a again.
int32_t wrong_sibling_update(const float* p, int32_t vocab, int32_t a, int32_t b, uint32_t trial) {
  if (philox_uniform(1, trial, 0, 1, 0) < p[a]) return a;
  if (philox_uniform(1, trial, 0, 1, 1) < p[b]) return b;
  std::vector<double> w(p, p + vocab);
  return sample_from_weights(w, 1.0, philox_uniform(1, trial, 0, 1, kFinalDraw));
}

TEST(VerifyLosslessControls, TheTestRejectsWrongVerifiers) {
  const int32_t vocab = 12;
  const auto [target, draft] = make_models(vocab, 1234, 1.0, {});
  const float* p = target.dist(0, 0);
  const float* q = draft.dist(0, 0);
  std::vector<double> expected(p, p + vocab);
  std::vector<int64_t> residual_counts(static_cast<std::size_t>(vocab), 0), sibling_counts(static_cast<std::size_t>(vocab), 0);
  std::mt19937_64 rng(5);
  const std::vector<int32_t> top2 = propose(p, vocab, 2, Proposal::kTopM, &rng);
  for (int64_t t = 0; t < 100000; ++t) {
    std::vector<char> none(static_cast<std::size_t>(vocab), 0);
    const int32_t x = draw(q, vocab, &none, &rng);
    ++residual_counts[static_cast<std::size_t>(wrong_residual(p, q, vocab, x, static_cast<uint32_t>(t)))];
    ++sibling_counts[static_cast<std::size_t>(wrong_sibling_update(p, vocab, top2[0], top2[1], static_cast<uint32_t>(t)))];
  }
  const ChiSquare r1 = chi_square_test(residual_counts, expected), r2 = chi_square_test(sibling_counts, expected);
  EXPECT_LT(r1.p_value, kAlpha) << "a verifier without the residual went undetected (chi2 " << r1.statistic << ")";
  EXPECT_LT(r2.p_value, kAlpha) << "a verifier without the sibling update went undetected (chi2 " << r2.statistic << ")";
  std::printf("[ control  ] wrong residual: chi2 %.1f p %.2g; wrong sibling update: chi2 %.1f p %.2g\n",
              r1.statistic, r1.p_value, r2.statistic, r2.p_value);
}

TEST(ChiSquare, KnownQuantiles) {
  EXPECT_NEAR(chi_square_sf(3.841458820694124, 1), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_sf(10.827566170662733, 1), 0.001, 1e-9);
  EXPECT_NEAR(chi_square_sf(18.307038053275146, 10), 0.05, 1e-9);
  EXPECT_NEAR(chi_square_sf(124.3421134, 100), 0.05, 1e-6);
  EXPECT_NEAR(chi_square_sf(2.0, 2), std::exp(-1.0), 1e-12);  // df 2: sf = exp(-x/2)
  EXPECT_EQ(chi_square_sf(0.0, 5), 1.0);
}

}  // namespace
}  // namespace specd::testing
