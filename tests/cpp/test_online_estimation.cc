// Online estimation on synthetic streams: the cost model learns flat-then-linear step times
// and follows a change; the acceptance estimator converges per request and follows drift.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "block_manager_test_util.h"
#include "specd/acceptance_estimator.h"
#include "specd/cost_model.h"

namespace specd::testing {
namespace {

double gpu_like(int64_t n) { return 0.010 + (n > 64 ? 0.0002 * static_cast<double>(n - 64) : 0.0); }

TEST(CostModel, LearnsAFlatThenLinearProfileFromNoisySamples) {
  std::mt19937 rng(1);
  std::lognormal_distribution<double> noise(0.0, 0.05);
  std::uniform_int_distribution<int64_t> tokens(1, 300);
  CostModel m;
  EXPECT_FALSE(m.has_data());
  EXPECT_EQ(m.predict(10), 0.0);
  for (int i = 0; i < 3000; ++i) {
    const int64_t n = tokens(rng);
    SPECD_ASSERT_OK(m.observe(n, gpu_like(n) * noise(rng)));
  }
  for (int64_t n : {1, 8, 32, 64, 100, 200, 300})
    EXPECT_NEAR(m.predict(n), gpu_like(n), 0.08 * gpu_like(n)) << "tokens " << n;
  EXPECT_GT(m.predict(600), m.predict(300));  // extrapolated with the learned slope
}

TEST(CostModel, FollowsAChangeOfSpeed) {
  CostModel m;
  for (int i = 0; i < 200; ++i) SPECD_ASSERT_OK(m.observe(1 + i % 8, 0.01));
  for (int i = 0; i < 60; ++i) SPECD_ASSERT_OK(m.observe(1 + i % 8, 0.02));  // the machine got slower
  EXPECT_NEAR(m.predict(4), 0.02, 0.002);
}

TEST(CostModel, ExtrapolationAndValidation) {
  CostModel m;
  SPECD_ASSERT_OK(m.observe(16, 0.5));
  EXPECT_EQ(m.predict(1), 0.5);   // one size only: no slope yet, so flat both ways
  EXPECT_EQ(m.predict(64), 0.5);  // (optimistic, so that larger steps get tried and measured)
  // Only large forwards seen (a compute-bound machine): a small step is predicted cheap, by
  // the learned slope, not as expensive as the smallest forward seen.
  CostModel big;
  for (int i = 0; i < 5; ++i) {
    SPECD_ASSERT_OK(big.observe(56, 1.12));
    SPECD_ASSERT_OK(big.observe(200, 4.0));
  }
  EXPECT_NEAR(big.predict(8), 0.16, 1e-6);
  EXPECT_NEAR(big.predict(400), 8.0, 1e-6);
  EXPECT_EQ(big.predict(1) >= 0.0, true);
  SPECD_EXPECT_CODE(m.observe(0, 0.1), kInvalidArgument);
  SPECD_EXPECT_CODE(m.observe(4, -1.0), kInvalidArgument);
  SPECD_EXPECT_CODE(m.observe(4, NAN), kInvalidArgument);
}

// predict memoizes small counts: every observe must still show in the next predictions, in
// the memoized range and past it, and a copy predicts what its original does.
TEST(CostModel, PredictionsFollowEveryObservation) {
  CostModel m;
  SPECD_ASSERT_OK(m.observe(4, 1.0));
  EXPECT_EQ(m.predict(8), 1.0);
  SPECD_ASSERT_OK(m.observe(12, 3.0));
  EXPECT_DOUBLE_EQ(m.predict(8), 2.0);  // halfway between the two buckets' means
  EXPECT_DOUBLE_EQ(m.predict(4), 1.0);
  const CostModel copy = m;
  SPECD_ASSERT_OK(m.observe(12, 5.0));  // that bucket's mean moves (decay 0.8): 3.4 s
  EXPECT_DOUBLE_EQ(m.predict(12), 0.8 * 3.0 + 0.2 * 5.0);
  EXPECT_DOUBLE_EQ(m.predict(8), (1.0 + 3.4) / 2);
  EXPECT_DOUBLE_EQ(copy.predict(8), 2.0);
  SPECD_ASSERT_OK(m.observe(3000, 100.0));  // past the memoized counts as well
  EXPECT_GT(m.predict(2000), m.predict(12));
  EXPECT_LT(m.predict(2000), 100.0);
  for (int64_t n = 1; n <= 4000; n += 37) EXPECT_LE(m.predict(n), m.predict(n + 37)) << n;
}

// Bucket averages that decrease with the token count (noise) are pooled: predictions never
// decrease, and a consistent curve is left as it is.
TEST(CostModel, PredictionsNeverDecreaseWithTokens) {
  CostModel m;
  const std::pair<int64_t, double> cpu_run[] = {{1, 0.37}, {2, 0.74}, {3, 1.05}, {4, 0.94}, {8, 1.22}, {104, 2.4}};
  for (const auto& [n, s] : cpu_run) SPECD_ASSERT_OK(m.observe(n, s));
  for (int64_t n = 1; n < 200; ++n) EXPECT_LE(m.predict(n), m.predict(n + 1)) << "tokens " << n;
  EXPECT_NEAR(m.predict(3), (1.05 + 0.94) / 2, 1e-9);  // the violating pair, pooled (equal weights)
  EXPECT_NEAR(m.predict(4), (1.05 + 0.94) / 2, 1e-9);
  EXPECT_NEAR(m.predict(2), 0.74, 1e-9);  // the rest as measured
  EXPECT_NEAR(m.predict(8), 1.22, 1e-9);
  // Weighted: three samples at 3 tokens outweigh one at 4.
  CostModel w;
  for (int i = 0; i < 3; ++i) SPECD_ASSERT_OK(w.observe(3, 1.0));
  SPECD_ASSERT_OK(w.observe(4, 0.6));
  const double keep = CostModelConfig{}.decay;
  const double w3 = 1 + keep + keep * keep;
  EXPECT_NEAR(w.predict(4), (w3 * 1.0 + 0.6) / (w3 + 1), 1e-9);
  EXPECT_NEAR(w.predict(3), w.predict(4), 1e-12);
  // Consistent data are untouched.
  CostModel ok;
  const int64_t sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 32, 64, 80, 128, 256};  // one per bucket
  for (int64_t n : sizes) SPECD_ASSERT_OK(ok.observe(n, gpu_like(n)));
  for (int64_t n : sizes) EXPECT_NEAR(ok.predict(n), gpu_like(n), 1e-12) << "tokens " << n;
}

// The exploration limit: at most twice what was measured (bridging measured sizes at most a
// factor 2 apart); never an interpolation across a wide gap (the CPU trap: T(1) and a
// prefill's T(104) measured, T(2) really twice T(1)).
TEST(CostModel, ExploredLimitIsTwiceWhatWasMeasured) {
  CostModel m;
  EXPECT_EQ(m.explored_limit(1), 2);  // nothing measured: the step itself, doubled
  EXPECT_EQ(m.explored_limit(5), 10);
  SPECD_ASSERT_OK(m.observe(1, 0.37));
  SPECD_ASSERT_OK(m.observe(104, 2.44));
  EXPECT_EQ(m.explored_limit(1), 2);  // not 3..104: the interpolation is a guess
  SPECD_ASSERT_OK(m.observe(2, 0.73));
  EXPECT_EQ(m.explored_limit(1), 4);
  EXPECT_EQ(m.explored_limit(2), 4);
  for (int64_t n = 3; n <= 7; ++n) SPECD_ASSERT_OK(m.observe(n, 0.8));
  EXPECT_EQ(m.explored_limit(1), 14);
  SPECD_ASSERT_OK(m.observe(14, 0.9));
  SPECD_ASSERT_OK(m.observe(28, 1.0));
  SPECD_ASSERT_OK(m.observe(56, 1.5));
  EXPECT_EQ(m.explored_limit(1), 208);   // ... 56, 104 (within 2x of 56): twice 104
  EXPECT_EQ(m.explored_limit(300), 600);  // from an unmeasured size: itself, doubled
  CostModel wide;
  for (int64_t n : {1, 2, 16}) SPECD_ASSERT_OK(wide.observe(n, 0.01));
  EXPECT_EQ(wide.explored_limit(1), 4);  // 2 and 16 are 8x apart
  EXPECT_EQ(wide.explored_limit(9), 32);  // 16 is within 2x of 9
}

// A draft measured once, on a 150-token catch-up, is planned with the target's shape through
// that measurement instead of flat at the catch-up's time.
TEST(CostModel, ShapedLikeTheTargetUntilTwoSizesAreMeasured) {
  CostModel target, draft;
  for (int64_t n : {1, 2, 4, 8, 16, 64, 150}) SPECD_ASSERT_OK(target.observe(n, 0.020 + 0.0002 * n));
  SPECD_ASSERT_OK(draft.observe(150, 0.010));
  EXPECT_EQ(draft.predict(1), 0.010);  // flat below its one size
  const CostModel view = draft.shaped_like(target);
  const double ratio = 0.010 / (0.020 + 0.0002 * 150);
  EXPECT_NEAR(view.predict(1), ratio * 0.0202, 1e-9);
  EXPECT_NEAR(view.predict(150), 0.010, 1e-9);
  EXPECT_NEAR(view.predict(16), ratio * 0.0232, 1e-9);
  SPECD_ASSERT_OK(draft.observe(1, 0.004));  // a second size: the draft's own curve
  EXPECT_EQ(draft.shaped_like(target).predict(1), 0.004);
  EXPECT_EQ(CostModel().shaped_like(target).has_data(), false);
  EXPECT_EQ(draft.shaped_like(CostModel()).predict(1), 0.004);
}

// Chains of depth k where each draft is accepted with probability alpha (given its parent).
int32_t accepted_of(std::mt19937& rng, double alpha, int32_t k) {
  std::bernoulli_distribution accept(alpha);
  int32_t a = 0;
  while (a < k && accept(rng)) ++a;
  return a;
}

TEST(AcceptanceEstimator, ConvergesPerRequestAndSharesAPrior) {
  std::mt19937 rng(2);
  AcceptanceEstimator est(AcceptanceEstimatorConfig{}, 2);
  std::vector<double> a(4);
  SPECD_ASSERT_OK(est.alphas(1, 0, a));
  EXPECT_EQ(a[0], 1.0);           // depth 1 is explored before the data decide
  EXPECT_NEAR(a[1], 0.6, 1e-12);  // deeper depths start at the prior
  for (int step = 0; step < 400; ++step) {
    SPECD_ASSERT_OK(est.observe(1, 0, 4, accepted_of(rng, 0.9, 4)));  // a repetitive request
    SPECD_ASSERT_OK(est.observe(2, 0, 4, accepted_of(rng, 0.2, 4)));  // a novel one
    SPECD_ASSERT_OK(est.observe(3, 1, 4, accepted_of(rng, 0.5, 4)));  // another proposer
  }
  SPECD_ASSERT_OK(est.alphas(1, 0, a));
  EXPECT_NEAR(a[0], 0.9, 0.1);
  EXPECT_NEAR(a[2], 0.9, 0.12);
  SPECD_ASSERT_OK(est.alphas(2, 0, a));
  EXPECT_NEAR(a[0], 0.2, 0.15);
  // A new request starts from its proposer's global estimate (between the two above).
  SPECD_ASSERT_OK(est.alphas(99, 0, a));
  EXPECT_GT(a[0], 0.3);
  EXPECT_LT(a[0], 0.85);
  SPECD_ASSERT_OK(est.alphas(99, 1, a));
  EXPECT_NEAR(a[0], 0.5, 0.1);
}

TEST(AcceptanceEstimator, FollowsDriftWithinAFewSteps) {
  std::mt19937 rng(3);
  AcceptanceEstimator est(AcceptanceEstimatorConfig{}, 1);
  for (int step = 0; step < 100; ++step) SPECD_ASSERT_OK(est.observe(7, 0, 4, accepted_of(rng, 0.95, 4)));
  for (int step = 0; step < 15; ++step) SPECD_ASSERT_OK(est.observe(7, 0, 4, 0));  // the text stopped repeating
  std::vector<double> a(1);
  SPECD_ASSERT_OK(est.alphas(7, 0, a));
  EXPECT_LT(a[0], 0.45);
}

TEST(AcceptanceEstimator, CensoredDepthsAndErrors) {
  AcceptanceEstimator est(AcceptanceEstimatorConfig{}, 1);
  for (int i = 0; i < 50; ++i) SPECD_ASSERT_OK(est.observe(1, 0, 2, 2));  // depth 3+ never tried
  std::vector<double> a(3);
  SPECD_ASSERT_OK(est.alphas(1, 0, a));
  EXPECT_GT(a[0], 0.9);
  EXPECT_NEAR(a[2], est.global_alpha(0, 2), 1e-9);  // untested below an explored depth: at its global estimate
  SPECD_ASSERT_OK(est.alphas(1, 0, a, /*explore=*/false));
  EXPECT_NEAR(a[2], 0.6, 1e-9);  // the data alone: still the prior
  SPECD_EXPECT_CODE(est.observe(1, 0, 2, 3), kInvalidArgument);
  SPECD_EXPECT_CODE(est.observe(1, 5, 2, 1), kInvalidArgument);
  SPECD_EXPECT_CODE(est.alphas(1, -1, a), kInvalidArgument);
  est.remove(1);
  EXPECT_EQ(est.num_requests(), 0);
}

TEST(AcceptanceEstimator, IdleStepsFadeARequestTowardsTheGlobalRate) {
  AcceptanceEstimator e(AcceptanceEstimatorConfig{}, 1);
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(e.observe(1, 0, 2, 2).ok());  // the proposer works (globally)
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(e.observe(2, 0, 2, 0).ok());  // but never for request 2
  std::vector<double> a(1);
  ASSERT_TRUE(e.alphas(2, 0, Span<double>(a)).ok());
  const double before = a[0], global = e.global_alpha(0, 1);
  EXPECT_LT(before, 0.5 * global);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(e.idle(2, 0).ok());
  ASSERT_TRUE(e.alphas(2, 0, Span<double>(a)).ok());
  EXPECT_GT(a[0], before);
  EXPECT_GT(a[0], 0.75 * global);
  EXPECT_NEAR(e.global_alpha(0, 1), global, 1e-12);  // global counts untouched
  EXPECT_EQ(e.idle(2, 3).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(e.idle(99, 0).ok());  // unknown request: nothing to fade
}

TEST(AcceptanceEstimator, ExploresDepthOneUntilItHasTenTrials) {
  AcceptanceEstimatorConfig config;
  AcceptanceEstimator e(config, 2);
  std::vector<double> a(2);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(e.global_alpha(0, 1), 1.0) << i;  // still exploring: failures do not stop it
    EXPECT_FALSE(e.explored(0));
    ASSERT_TRUE(e.observe(i, 0, 2, 0).ok());
    ASSERT_TRUE(e.idle_global(0).ok());  // fading does not undo the count
  }
  EXPECT_TRUE(e.explored(0));  // ten verifications
  EXPECT_LT(e.global_alpha(0, 1), 0.2);  // the data decide
  ASSERT_TRUE(e.alphas(99, 0, a).ok());
  EXPECT_LT(a[0], 0.2);                   // for new requests too
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(e.idle_global(0).ok());
  EXPECT_TRUE(e.explored(0));             // for good: fading goes back to the prior, not to 1
  EXPECT_LE(e.global_alpha(0, 1, /*explore=*/false), config.initial_alpha);
  EXPECT_EQ(e.global_alpha(1, 1), 1.0);   // another proposer explores on its own
  EXPECT_FALSE(e.explored(1));
  config.exploration_trials = 0.0;
  EXPECT_TRUE(AcceptanceEstimator(config, 1).explored(0));  // exploration off
}

TEST(AcceptanceEstimator, ExploresOneDepthDeeperAtATime) {
  AcceptanceEstimatorConfig config;
  AcceptanceEstimator e(config, 1);
  // Depth 1 explored and good (9 of 10 accepted); depth 2 never reached yet.
  for (int i = 0; i < 10; ++i) SPECD_ASSERT_OK(e.observe(i, 0, 1, i == 0 ? 0 : 1));
  ASSERT_TRUE(e.explored(0));
  const double depth1 = e.global_alpha(0, 1);
  EXPECT_GT(depth1, 0.75);
  EXPECT_DOUBLE_EQ(e.global_alpha(0, 2), depth1);                       // explored at depth 1's estimate
  EXPECT_DOUBLE_EQ(e.global_alpha(0, 2, /*explore=*/false), config.initial_alpha);  // the data: the prior
  EXPECT_DOUBLE_EQ(e.global_alpha(0, 3), config.initial_alpha);        // one depth at a time
  // Depth 2 fails every time it is tested: optimistic for its ten trials, then the data decide.
  for (int i = 0; i < 9; ++i) SPECD_ASSERT_OK(e.observe(100 + i, 0, 2, 1));
  EXPECT_GE(e.global_alpha(0, 2), e.global_alpha(0, 1));
  SPECD_ASSERT_OK(e.observe(200, 0, 2, 1));  // the tenth trial of depth 2
  EXPECT_LT(e.global_alpha(0, 2), 0.3);
  EXPECT_DOUBLE_EQ(e.global_alpha(0, 3), config.initial_alpha);        // depth 2 is no better than the prior
  // A step with A = D accepted tests depths 1..D only; a rejected step A < D tests A + 1.
  AcceptanceEstimator f(config, 1);
  for (int i = 0; i < 10; ++i) SPECD_ASSERT_OK(f.observe(i, 0, 3, 3));
  EXPECT_DOUBLE_EQ(f.global_alpha(0, 4), f.global_alpha(0, 3, false));  // depth 4 untested: explored
  for (int i = 0; i < 10; ++i) SPECD_ASSERT_OK(f.observe(i, 0, 5, 3));   // depth 4 tested (and failed)
  EXPECT_LT(f.global_alpha(0, 4), config.initial_alpha);
  EXPECT_DOUBLE_EQ(f.global_alpha(0, 5), f.global_alpha(0, 5, false));  // depth 5 never tested, depth 4 bad
}

TEST(AcceptanceEstimator, RetriesAnIdleProposerWithDoublingWaits) {
  AcceptanceEstimatorConfig config;
  AcceptanceEstimator e(config, 2);
  for (int i = 0; i < 10; ++i) SPECD_ASSERT_OK(e.observe(i, 0, 1, 0));  // explored: it fails
  const double low = e.global_alpha(0, 1);
  EXPECT_LT(low, 0.3);
  std::vector<int64_t> retries;  // idle steps (since the last observation) at which a retry began
  int64_t idle = 0;
  for (int round = 0; round < 4; ++round) {
    while (!e.retrying(0)) {
      SPECD_ASSERT_OK(e.idle_global(0));
      ++idle;
      ASSERT_LT(idle, 1000);
    }
    retries.push_back(idle);
    EXPECT_EQ(e.global_alpha(0, 1), 1.0);                        // retried where exploration applies
    EXPECT_LE(e.global_alpha(0, 1, /*explore=*/false), config.initial_alpha);  // not in the data
    SPECD_ASSERT_OK(e.idle_global(0));                           // still retrying until observed
    EXPECT_TRUE(e.retrying(0));
    SPECD_ASSERT_OK(e.observe(100 + round, 0, 1, 0));            // the retry fails
    EXPECT_FALSE(e.retrying(0));
    EXPECT_LT(e.global_alpha(0, 1), config.initial_alpha);
    idle = 0;
  }
  EXPECT_EQ(retries, (std::vector<int64_t>{16, 32, 64, 128}));
  for (int i = 0; i < 1000; ++i) SPECD_ASSERT_OK(e.idle_global(0, /*speculating=*/true));
  EXPECT_FALSE(e.retrying(0));  // steps in which another proposer serves requests do not count
  EXPECT_FALSE(e.retrying(1));  // a proposer still exploring is not "retried"
  for (int i = 0; i < 100; ++i) SPECD_ASSERT_OK(e.idle_global(1));
  EXPECT_FALSE(e.retrying(1));
  EXPECT_EQ(e.global_alpha(1, 1), 1.0);
}

TEST(AcceptanceEstimator, AProposerNobodyUsesFadesBackToThePrior) {
  // Early failures pull the global estimate (which new requests start from) down; when no
  // request uses the proposer any more, idle steps bring it back towards initial_alpha.
  AcceptanceEstimatorConfig config;
  AcceptanceEstimator e(config, 1);
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(e.observe(i, 0, 3, 0).ok());  // past exploration
  ASSERT_TRUE(e.explored(0));
  const double low = e.global_alpha(0, 1);
  EXPECT_LT(low, 0.5 * config.initial_alpha);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(e.idle_global(0).ok());
  EXPECT_GT(e.global_alpha(0, 1, /*explore=*/false), 0.9 * config.initial_alpha);
  EXPECT_LE(e.global_alpha(0, 1, /*explore=*/false), config.initial_alpha);
  EXPECT_EQ(e.idle_global(4).code(), StatusCode::kInvalidArgument);
}

TEST(AcceptanceEstimator, AGoodProposerNobodyUsesKeepsItsEstimate) {
  // Idle because the batch is compute-bound, not because it fails: the global estimate above
  // the prior is kept, so requests retry it at its real rate once drafting pays again.
  AcceptanceEstimatorConfig config;
  AcceptanceEstimator e(config, 1);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(e.observe(i, 0, 2, i % 10 == 9 ? 1 : 2).ok());
  const double depth1 = e.global_alpha(0, 1), depth2 = e.global_alpha(0, 2);
  EXPECT_GT(depth1, 0.8);
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(e.idle_global(0).ok());
  EXPECT_EQ(e.global_alpha(0, 1, /*explore=*/false), depth1);
  EXPECT_EQ(e.global_alpha(0, 2, /*explore=*/false), depth2);
}

}  // namespace
}  // namespace specd::testing
