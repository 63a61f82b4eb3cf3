// Verification worked examples (greedy and stochastic; chains and trees; all accepted, none
// accepted, ties) and deterministic properties of the stochastic verifier.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "block_manager_test_util.h"
#include "specd/sampling.h"
#include "specd/verify.h"

namespace specd::testing {
namespace {

using V = std::vector<int32_t>;

// Rows of a tiny vocabulary, each given as a list of probabilities.
struct Rows {
  std::vector<float> data;
  int32_t vocab;
  explicit Rows(std::vector<std::vector<float>> rows) : vocab(static_cast<int32_t>(rows[0].size())) {
    for (const auto& r : rows) data.insert(data.end(), r.begin(), r.end());
  }
  ProbRows view() const {
    return ProbRows{data.data(), static_cast<int32_t>(data.size()) / vocab, vocab, vocab};
  }
};

// A one-hot row at `token` over 5 tokens.
std::vector<float> hot(int32_t token) {
  std::vector<float> r(5, 0.0f);
  r[static_cast<std::size_t>(token)] = 1.0f;
  return r;
}

VerifyResult greedy(const TokenTree& t, const Rows& rows) {
  VerifyResult r;
  const Status s = verify_greedy(t, rows.view(), &r);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

TEST(VerifyGreedy, ChainAllAcceptedAppendsBonus) {
  const TokenTree t = TokenTree::chain(0, V{1, 2, 3});
  const VerifyResult r = greedy(t, Rows({hot(1), hot(2), hot(3), hot(4)}));
  EXPECT_EQ(r.num_accepted, 3);
  EXPECT_EQ(r.tokens, (V{1, 2, 3, 4}));  // 3 drafts + bonus 4
  EXPECT_EQ(r.path, (V{0, 1, 2, 3}));
}

TEST(VerifyGreedy, ChainNoneAccepted) {
  const TokenTree t = TokenTree::chain(0, V{1, 2, 3});
  const VerifyResult r = greedy(t, Rows({hot(4), hot(2), hot(3), hot(4)}));
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_EQ(r.tokens, (V{4}));  // the target's own token replaces the first draft
  EXPECT_EQ(r.path, (V{0}));
}

TEST(VerifyGreedy, ChainPartiallyAccepted) {
  const TokenTree t = TokenTree::chain(0, V{1, 2, 3});
  const VerifyResult r = greedy(t, Rows({hot(1), hot(0), hot(3), hot(4)}));
  EXPECT_EQ(r.tokens, (V{1, 0}));
  EXPECT_EQ(r.num_accepted, 1);
}

TEST(VerifyGreedy, TiesGoToTheLowestTokenId) {
  const std::vector<float> tie{0.1f, 0.4f, 0.4f, 0.1f, 0.0f};
  // Draft 2 loses the tie against 1.
  EXPECT_EQ(greedy(TokenTree::chain(0, V{2}), Rows({tie, hot(0)})).tokens, (V{1}));
  // Draft 1 wins it and the bonus comes from the next row.
  EXPECT_EQ(greedy(TokenTree::chain(0, V{1}), Rows({tie, hot(3)})).tokens, (V{1, 3}));
}

TEST(VerifyGreedy, WorksOnLogitsToo) {
  const TokenTree t = TokenTree::chain(0, V{3});
  const VerifyResult r = greedy(t, Rows({{-5.0f, -1.0f, -3.0f, -0.5f, -9.0f}, {2.0f, 1.0f, 0.0f, 0.0f, 7.0f}}));
  EXPECT_EQ(r.tokens, (V{3, 4}));
}

TEST(VerifyGreedy, TreeFollowsTheMatchingSibling) {
  // root -> 1 -> 3
  //      -> 2 -> 4 -> 0
  //           -> 3
  TokenTree t(0);
  const int32_t a = t.add_node(0, 1);
  const int32_t b = t.add_node(0, 2);
  t.add_node(a, 3);
  const int32_t d = t.add_node(b, 4);
  t.add_node(b, 3);
  t.add_node(d, 0);
  // Rows: root -> 2 (second sibling); node b -> 3 (its second child, node 5); node 5 -> 1.
  const Rows rows({hot(2), hot(0), hot(3), hot(0), hot(0), hot(1), hot(0)});
  const VerifyResult r = greedy(t, rows);
  EXPECT_EQ(r.path, (V{0, 2, 5}));
  EXPECT_EQ(r.tokens, (V{2, 3, 1}));
  EXPECT_EQ(r.num_accepted, 2);
  // All accepted to the deepest leaf.
  const Rows deep({hot(2), hot(0), hot(4), hot(0), hot(0), hot(0), hot(4)});
  EXPECT_EQ(greedy(t, deep).tokens, (V{2, 4, 0, 4}));
}

TEST(VerifyGreedy, FromTargetTokensAgreesWithRows) {
  std::mt19937 rng(8);
  for (int trial = 0; trial < 500; ++trial) {
    TokenTree t(0);
    for (int32_t n = 1; n < 10; ++n) {
      const int32_t parent = static_cast<int32_t>(rng() % static_cast<unsigned>(t.size()));
      const int32_t token = static_cast<int32_t>(rng() % 4);
      if (t.find_child(parent, token) < 0) t.add_node(parent, token);
    }
    std::vector<std::vector<float>> rows;
    std::vector<int32_t> argmaxes;
    for (int32_t v = 0; v < t.size(); ++v) {
      std::vector<float> row(5);
      for (float& x : row) x = static_cast<float>(rng() % 3);  // frequent ties
      rows.push_back(row);
      argmaxes.push_back(argmax(row));
    }
    VerifyResult from_tokens;
    SPECD_ASSERT_OK(verify_greedy_tokens(t, argmaxes, &from_tokens));
    const VerifyResult from_rows = greedy(t, Rows(rows));
    EXPECT_EQ(from_tokens.tokens, from_rows.tokens);
    EXPECT_EQ(from_tokens.path, from_rows.path);
  }
  VerifyResult r;
  SPECD_EXPECT_CODE(verify_greedy_tokens(TokenTree::chain(0, V{1}), V{1}, &r), kInvalidArgument);
  SPECD_EXPECT_CODE(verify_greedy_tokens(TokenTree::chain(0, V{1}), V{-1, 0}, &r), kInvalidArgument);
}

TEST(VerifyGreedy, RootOnlyTreeEmitsTheArgmax) {
  EXPECT_EQ(greedy(TokenTree(7), Rows({hot(3)})).tokens, (V{3}));
}

TEST(Verify, InputErrors) {
  VerifyResult r;
  const TokenTree t = TokenTree::chain(0, V{1, 2});
  const Rows two({hot(1), hot(2)});
  SPECD_EXPECT_CODE(verify_greedy(t, two.view(), &r), kInvalidArgument);  // 3 nodes, 2 rows
  const Rows three({hot(1), hot(2), hot(3)});
  SPECD_EXPECT_CODE(verify_greedy(TokenTree::chain(0, V{9}), three.view(), &r), kInvalidArgument);
  const Rows nan({{0.1f, NAN, 0.2f, 0.3f, 0.4f}, hot(0), hot(0)});
  SPECD_EXPECT_CODE(verify_greedy(t, nan.view(), &r), kInvalidArgument);
  const RngKey key{1, 0, 0, 0};
  SPECD_EXPECT_CODE(verify_stochastic(t, nan.view(), nullptr, DraftSampling::kIndependent, key, &r), kInvalidArgument);
  const Rows negative({{0.5f, -0.1f, 0.6f, 0.0f, 0.0f}, hot(0), hot(0)});
  SPECD_EXPECT_CODE(verify_stochastic(t, negative.view(), nullptr, DraftSampling::kIndependent, key, &r), kInvalidArgument);
  const Rows zero({std::vector<float>(5, 0.0f), hot(0), hot(0)});
  SPECD_EXPECT_CODE(verify_stochastic(t, zero.view(), nullptr, DraftSampling::kIndependent, key, &r), kInvalidArgument);
  // A drafted token the draft rows give probability 0.
  const Rows q({hot(2), hot(2), hot(2)});
  const ProbRows qv = q.view();
  SPECD_EXPECT_CODE(verify_stochastic(t, three.view(), &qv, DraftSampling::kIndependent, key, &r), kInvalidArgument);
  // Equal siblings are invalid when drafts were sampled without replacement.
  TokenTree dup(0);
  dup.add_node(0, 1);
  dup.add_node(0, 1);
  const Rows uniform({std::vector<float>(5, 0.2f), std::vector<float>(5, 0.2f), std::vector<float>(5, 0.2f)});
  const ProbRows uv = uniform.view();
  SPECD_EXPECT_CODE(verify_stochastic(dup, uniform.view(), &uv, DraftSampling::kWithoutReplacement, key, &r), kInvalidArgument);
  SPECD_ASSERT_OK(verify_stochastic(dup, uniform.view(), &uv, DraftSampling::kIndependent, key, &r));
}

VerifyResult stochastic(const TokenTree& t, const Rows& target, const Rows* draft, RngKey key,
                        DraftSampling mode = DraftSampling::kWithoutReplacement) {
  VerifyResult r;
  const ProbRows dv = draft ? draft->view() : ProbRows{};
  const Status s = verify_stochastic(t, target.view(), draft ? &dv : nullptr, mode, key, &r);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return r;
}

TEST(VerifyStochastic, OneHotTargetsMakeItGreedy) {
  // With one-hot target rows (temperature 0), stochastic verification accepts exactly the
  // greedy path, for any seed and with or without draft rows.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    TokenTree t(0);
    for (int32_t n = 1; n < 8; ++n) {  // up to 7 drafts (duplicates skipped)
      const int32_t parent = static_cast<int32_t>(rng() % static_cast<unsigned>(t.size()));
      const int32_t token = static_cast<int32_t>(rng() % 5);
      if (t.find_child(parent, token) < 0) t.add_node(parent, token);
    }
    std::vector<std::vector<float>> rows, uniform;
    for (int32_t i = 0; i < t.size(); ++i) {
      rows.push_back(hot(static_cast<int32_t>(rng() % 5)));
      uniform.emplace_back(5, 0.2f);
    }
    const Rows target(rows), draft(uniform);
    const VerifyResult g = greedy(t, target);
    const RngKey key{static_cast<uint64_t>(trial), 1, 2, 3};
    EXPECT_EQ(stochastic(t, target, nullptr, key).tokens, g.tokens);
    EXPECT_EQ(stochastic(t, target, &draft, key).path, g.path);
    EXPECT_EQ(stochastic(t, target, &draft, key, DraftSampling::kIndependent).tokens, g.tokens);
  }
}

TEST(VerifyStochastic, DraftEqualToTargetIsAlwaysAccepted) {
  const std::vector<float> p{0.1f, 0.2f, 0.3f, 0.4f, 0.0f};
  const TokenTree t = TokenTree::chain(0, V{2, 1, 3});
  const Rows rows({p, p, p, p});
  for (uint64_t seed = 0; seed < 200; ++seed)
    EXPECT_EQ(stochastic(t, rows, &rows, RngKey{seed, 0, 0, 0}).num_accepted, 3);
}

TEST(VerifyStochastic, ZeroTargetProbabilityIsNeverEmitted) {
  const std::vector<float> p{0.5f, 0.0f, 0.5f, 0.0f, 0.0f};
  const TokenTree t = TokenTree::chain(0, V{1});  // draft 1 has target probability 0
  const Rows rows({p, p});
  for (uint64_t seed = 0; seed < 500; ++seed) {
    const VerifyResult r = stochastic(t, rows, nullptr, RngKey{seed, 0, 0, 0});
    EXPECT_EQ(r.num_accepted, 0);
    EXPECT_TRUE(r.tokens[0] == 0 || r.tokens[0] == 2) << r.tokens[0];
  }
}

TEST(VerifyStochastic, ReproducibleForAKeyAndVaryingAcrossKeys) {
  const std::vector<float> p{0.3f, 0.2f, 0.2f, 0.2f, 0.1f};
  const std::vector<float> q{0.1f, 0.1f, 0.2f, 0.3f, 0.3f};
  TokenTree t(0);
  t.add_node(0, 3);
  t.add_node(0, 4);
  t.add_node(1, 0);
  const Rows target({p, p, p, p}), draft({q, q, q, q});
  std::set<V> outcomes;
  for (uint32_t step = 0; step < 200; ++step) {
    const RngKey key{11, 5, step, 100};
    const VerifyResult a = stochastic(t, target, &draft, key), b = stochastic(t, target, &draft, key);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.path, b.path);
    outcomes.insert(a.tokens);
  }
  EXPECT_GT(outcomes.size(), 5u);
}

TEST(VerifyStochastic, SampleTokenIsVerificationOfARootOnlyTree) {
  const std::vector<float> p{0.3f, 0.2f, 0.2f, 0.2f, 0.1f};
  const Rows rows({p});
  for (uint32_t pos = 0; pos < 100; ++pos) {
    const RngKey key{9, 1, 2, pos};
    int32_t token = -1;
    SPECD_ASSERT_OK(sample_token(p.data(), 5, key, &token));
    EXPECT_EQ(V{token}, stochastic(TokenTree(4), rows, nullptr, key).tokens);
  }
}

}  // namespace
}  // namespace specd::testing
