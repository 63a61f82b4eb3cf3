// The goodput optimizer against brute force on small cases, and its limiting behaviours.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>

#include "block_manager_test_util.h"
#include "specd/goodput_optimizer.h"

namespace specd::testing {
namespace {

CostModel linear(double intercept, double per_token) {
  CostModel m;
  for (int rep = 0; rep < 3; ++rep)
    for (int64_t n = 1; n <= 512; n += (n < 64 ? 1 : 7)) EXPECT_TRUE(m.observe(n, intercept + per_token * n).ok());
  return m;
}

std::vector<double> chain_gains(const std::vector<double>& alphas) {
  std::vector<double> g;
  double p = 1;
  for (double a : alphas) g.push_back(p *= a);
  return g;
}

// A random step of 1..max_n requests, each with one draft-model option: a chain of
// 1..max_depth gains from alphas in [alpha_lo, 1), a catch-up of 1..max_base tokens and a
// draft width of min_width (plus 0..extra_widths - 1 at random when extra_widths > 1).
struct RandomDraftStep {
  std::vector<std::vector<double>> gains;
  std::vector<SpecOption> options;
  std::vector<SpecRequest> reqs;

  RandomDraftStep(std::mt19937& rng, std::size_t max_n, std::size_t max_depth, double alpha_lo, int32_t max_base,
                  int32_t min_width = 1, int32_t extra_widths = 1) {
    std::uniform_real_distribution<double> u(0, 1);
    const std::size_t n = 1 + rng() % max_n;
    gains.resize(n);
    options.resize(n);
    reqs.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> alphas(1 + rng() % max_depth);
      for (double& a : alphas) a = alpha_lo + (1 - alpha_lo) * u(rng);
      gains[i] = chain_gains(alphas);
      const auto base = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_base));
      const int32_t width = min_width + (extra_widths > 1 ? static_cast<int32_t>(rng() % static_cast<uint32_t>(extra_widths)) : 0);
      options[i] = SpecOption{gains[i], true, base, width};
      reqs[i] = SpecRequest{1, Span<const SpecOption>(&options[i], 1)};
    }
  }
};

// A step of n requests, each with one option: a chain of 1..max_depth gains from alphas in
// [0.3, 1), with the draft model (draft = 1), without (0) or either at random (-1), a catch-up
// of 1..max_draft_base tokens (exactly max_draft_base when draft >= 0) and 1..max_base base
// tokens.
struct RandomChainStep {
  std::vector<std::vector<double>> gains;
  std::vector<SpecOption> options;
  std::vector<SpecRequest> reqs;

  RandomChainStep(std::mt19937& rng, std::size_t n, std::size_t max_depth, int draft, int32_t max_draft_base,
                  int32_t max_base)
      : gains(n), options(n), reqs(n) {
    std::uniform_real_distribution<double> u(0, 1);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> alphas(1 + rng() % max_depth);
      for (double& a : alphas) a = 0.3 + 0.7 * u(rng);
      gains[i] = chain_gains(alphas);
      const bool uses_draft = draft < 0 ? (rng() % 2) == 0 : draft == 1;
      const int32_t draft_base =
          draft < 0 ? 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_draft_base)) : max_draft_base;
      options[i] = SpecOption{gains[i], uses_draft, draft_base};
      reqs[i] = SpecRequest{1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(max_base)),
                            Span<const SpecOption>(&options[i], 1)};
    }
  }
};

double brute_force(Span<const SpecRequest> reqs, const StepCostModel& cost, std::vector<int32_t>* best_k) {
  // Allocations over cost.max_target_tokens (when > 0) are not candidates, except all-zero.
  const std::size_t n = reqs.size();
  std::vector<int32_t> k(n, 0), opt(n, 0), best_opt;
  double best = 0;
  best_k->clear();
  std::function<void(std::size_t)> rec = [&](std::size_t i) {
    if (i == n) {
      int64_t verified = 0, drafted = 0;
      for (std::size_t j = 0; j < n; ++j) {
        verified += reqs[j].base_tokens + k[j];
        drafted += k[j];
      }
      if (cost.max_target_tokens > 0 && drafted > 0 && verified > cost.max_target_tokens) return;
      double t = 0, s = 0;
      EXPECT_TRUE(evaluate_allocation(reqs, cost, k, opt, &t, &s).ok());
      const double value = cost.reference_goodput > 0 ? t - cost.reference_goodput * s : t / s;
      if (best_k->empty() || value > best) {
        best = value;
        *best_k = k;
      }
      return;
    }
    for (std::size_t o = 0; o < std::max<std::size_t>(1, reqs[i].options.size()); ++o) {
      opt[i] = reqs[i].options.empty() ? -1 : static_cast<int32_t>(o);
      const int32_t max_k = reqs[i].options.empty() ? 0 : static_cast<int32_t>(reqs[i].options[o].gains.size());
      for (k[i] = 0; k[i] <= max_k; ++k[i]) rec(i + 1);
      k[i] = 0;
    }
  };
  rec(0);
  return best;
}

TEST(GoodputOptimizer, MatchesBruteForceOnSmallSingleOptionCases) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  int speculated = 0, plain = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const double t0 = 0.002 + 0.03 * u(rng), t1 = 0.0005 + 0.01 * u(rng) * (trial % 3 == 0 ? 10 : 1);
    const CostModel target = linear(t0, t1), draft = linear(0.001 + 0.01 * u(rng), 0.0002 + 0.002 * u(rng));
    const std::size_t n = 1 + rng() % 3;
    std::vector<std::vector<double>> gains(n);
    std::vector<SpecOption> options(n);
    std::vector<SpecRequest> reqs(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> alphas(1 + rng() % 4);
      for (double& a : alphas) a = u(rng);
      gains[i] = chain_gains(alphas);
      options[i] = SpecOption{gains[i], (rng() % 2) == 0, 1 + static_cast<int32_t>(rng() % 3)};
      reqs[i] = SpecRequest{1 + static_cast<int32_t>(rng() % 20), Span<const SpecOption>(&options[i], 1)};
    }
    const StepCostModel cost{&target, &draft, 0.001 * u(rng)};
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &a));
    std::vector<int32_t> best_k;
    const double best = brute_force(reqs, cost, &best_k);
    EXPECT_NEAR(a.goodput, best, 1e-9 * best) << "trial " << trial;
    EXPECT_GE(a.goodput, a.plain_goodput * (1 - 1e-12));
    (a.goodput > a.plain_goodput * (1 + 1e-9) ? speculated : plain)++;
  }
  EXPECT_GT(speculated, 40);  // both regimes are exercised
  EXPECT_GT(plain, 20);
}

// Draft trees of width w feed their frontier: draft forward j >= 2 processes w tokens of the
// request (goodput_optimizer.h). The step time charges that, and the allocation stays within
// 3% of brute force.
TEST(GoodputOptimizer, DraftTreesChargeTheirFrontierForwards) {
  const CostModel target = linear(0.010, 0.001), draft = linear(0.002, 0.0005);
  const std::vector<double> g{0.9, 0.8, 0.7};
  const SpecOption tree{g, true, 3, 2};
  const std::vector<SpecRequest> one{SpecRequest{1, Span<const SpecOption>(&tree, 1)}};
  const StepCostModel cost{&target, &draft, 0.0};
  double tokens = 0, seconds = 0;
  const std::vector<int32_t> k{3}, option{0};
  SPECD_ASSERT_OK(evaluate_allocation(one, cost, k, option, &tokens, &seconds));
  // target: 4 tokens; draft forwards: 3 (catch-up), then 2 and 2 tokens (the frontiers).
  EXPECT_NEAR(seconds, (0.010 + 0.004) + (0.002 + 0.0015) + (0.002 + 0.001) + (0.002 + 0.001), 1e-6);
  EXPECT_NEAR(tokens, 1 + 0.9 + 0.8 + 0.7, 1e-12);
  const SpecOption chain{g, true, 3, 1};
  const std::vector<SpecRequest> as_chain{SpecRequest{1, Span<const SpecOption>(&chain, 1)}};
  double chain_seconds = 0;
  SPECD_ASSERT_OK(evaluate_allocation(as_chain, cost, k, option, &tokens, &chain_seconds));
  EXPECT_NEAR(seconds - chain_seconds, 0.0005 * ((2 - 1) + (2 - 1)), 1e-6);  // forwards 2 and 3: w - 1 more each

  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  double worst = 1;
  for (int trial = 0; trial < 200; ++trial) {
    const CostModel t = linear(0.002 + 0.03 * u(rng), 0.0005 + 0.005 * u(rng));
    const CostModel d = linear(0.001 + 0.01 * u(rng), 0.0002 + 0.004 * u(rng));
    const RandomDraftStep step(rng, 3, 4, 0.5, 3, 2, 3);
    const std::vector<SpecRequest>& reqs = step.reqs;
    const StepCostModel c{&t, &d, 0.001 * u(rng)};
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(reqs, c, &a));
    std::vector<int32_t> best_k;
    const double best = brute_force(reqs, c, &best_k);
    EXPECT_LE(a.goodput, best * (1 + 1e-9));
    worst = std::min(worst, a.goodput / best);
  }
  EXPECT_GE(worst, 0.97);
  std::printf("draft trees: worst goodput / brute force %.4f\n", worst);
}

TEST(GoodputOptimizer, ReferenceGoodputObjectiveMatchesBruteForce) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> u(0, 1);
  int speculated = 0, plain = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const CostModel target = linear(0.002 + 0.03 * u(rng), 0.0005 + 0.01 * u(rng) * (trial % 3 == 0 ? 10 : 1));
    const CostModel draft = linear(0.001 + 0.01 * u(rng), 0.0002 + 0.002 * u(rng));
    const std::size_t n = 1 + rng() % 3;
    std::vector<std::vector<double>> gains(n);
    std::vector<SpecOption> options(n);
    std::vector<SpecRequest> reqs(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> alphas(1 + rng() % 4);
      for (double& a : alphas) a = u(rng);
      gains[i] = chain_gains(alphas);
      options[i] = SpecOption{gains[i], (rng() % 2) == 0, 1 + static_cast<int32_t>(rng() % 3)};
      reqs[i] = SpecRequest{1 + static_cast<int32_t>(rng() % 40), Span<const SpecOption>(&options[i], 1)};
    }
    StepCostModel cost{&target, &draft, 0.001 * u(rng)};
    Allocation plain_step;
    SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &plain_step));
    cost.reference_goodput = plain_step.plain_goodput * (0.5 + 2.0 * u(rng));  // a price around this step's rate
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &a));
    std::vector<int32_t> best_k;
    const double best = brute_force(reqs, cost, &best_k);
    EXPECT_NEAR(a.objective, best, 1e-9 * std::max(1.0, std::abs(best))) << "trial " << trial;
    double t = 0, s = 0;
    SPECD_ASSERT_OK(evaluate_allocation(reqs, cost, a.k, a.option, &t, &s));
    EXPECT_NEAR(a.objective, t - cost.reference_goodput * s, 1e-9 * std::max(1.0, t));
    (std::any_of(a.k.begin(), a.k.end(), [](int32_t k) { return k > 0; }) ? speculated : plain)++;
  }
  EXPECT_GT(speculated, 40);
  EXPECT_GT(plain, 20);
}

// GPU-like costs (a target flat in the tokens, a draft forward with a large fixed cost) and
// chains of up to 8 drafts: the optimizer skips draft depths whose bound cannot beat the
// best so far (goodput_optimizer.h), and must still find deep loops where they pay.
TEST(GoodputOptimizer, DeepDraftLoopsMatchBruteForce) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<double> u(0, 1);
  int deep = 0, shallow = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const CostModel target = linear(0.015 + 0.01 * u(rng), 0.00002 + 0.0002 * u(rng));
    const CostModel draft = linear(0.0005 + 0.006 * u(rng), 0.00001 + 0.0001 * u(rng));
    const RandomDraftStep step(rng, 3, 8, 0.4 + 0.55 * u(rng), 2);
    StepCostModel cost{&target, &draft, 0.002 * u(rng)};
    if (trial % 2 == 1) {
      Allocation own;
      SPECD_ASSERT_OK(optimize_goodput(step.reqs, cost, &own));
      cost.reference_goodput = own.goodput * (0.7 + 0.6 * u(rng));
    }
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(step.reqs, cost, &a));
    std::vector<int32_t> best_k;
    const double best = brute_force(step.reqs, cost, &best_k);
    EXPECT_NEAR(a.objective, best, 1e-9 * std::max(1.0, std::abs(best))) << "trial " << trial;
    (a.draft_depth >= 5 ? deep : shallow)++;
  }
  EXPECT_GT(deep, 20);  // both regimes are exercised
  EXPECT_GT(shallow, 20);
}

// A monotone but non-convex curve through random points, like the ones measured on a
// 2-core CPU (steep for the first tokens, then nearly flat, with noise steps).
CostModel bumpy(std::mt19937& rng, double scale) {
  std::uniform_real_distribution<double> u(0, 1);
  CostModel m;
  double t = scale * (0.2 + u(rng));
  for (int64_t n = 1; n <= 64; n = n < 12 ? n + 1 : n * 2) {
    EXPECT_TRUE(m.observe(n, t).ok());
    t += scale * (u(rng) < 0.5 ? 0.02 * u(rng) : u(rng));  // a plateau or a jump
  }
  return m;
}

// Measured curves are not convex: the greedy keeps the best prefix of its order, looking a
// draft per request plus a chain past it, and small steps are polished by local search.
// Within 3% of brute force on such curves (worst 0.979, mean 0.9999 here; not exact), and
// exact on the case that showed the problem (a real-pair CPU load run: k = 0 was chosen
// where 2 drafts per request pay).
TEST(GoodputOptimizer, NearBruteForceOnNonConvexCurves) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> u(0, 1);
  double worst = 1.0, sum = 0;
  int trials = 0, speculated = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const CostModel target = bumpy(rng, 0.3), draft = bumpy(rng, 0.1);
    const RandomDraftStep step(rng, 4, 3, 0.3, 2);
    const std::vector<SpecRequest>& reqs = step.reqs;
    const StepCostModel cost{&target, &draft, 0.001};
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &a));
    std::vector<int32_t> best_k;
    const double best = brute_force(reqs, cost, &best_k);
    worst = std::min(worst, a.goodput / best);
    sum += a.goodput / best;
    ++trials;
    speculated += a.goodput > a.plain_goodput * (1 + 1e-9) ? 1 : 0;
    EXPECT_GE(a.goodput, a.plain_goodput * (1 - 1e-12));
  }
  EXPECT_GE(worst, 0.97);
  EXPECT_GE(sum / trials, 0.995);
  EXPECT_GT(speculated, 60);

  // The real case: costs as learned (seconds), four requests in sync.
  CostModel target, draft;
  for (const auto& [n, t] : std::vector<std::pair<int64_t, double>>{{1, 0.38}, {2, 0.758}, {3, 1.167}, {46, 1.684}})
    SPECD_ASSERT_OK(target.observe(n, t));
  for (const auto& [n, t] : std::vector<std::pair<int64_t, double>>{{1, 0.149}, {2, 0.259}, {3, 0.444}, {179, 1.176}})
    SPECD_ASSERT_OK(draft.observe(n, t));
  std::vector<std::vector<double>> gains{chain_gains({0.756, 0.816}), chain_gains({0.626, 0.758}),
                                         chain_gains({0.626, 0.758}), chain_gains({0.679, 0.758})};
  std::vector<SpecOption> options;
  for (const auto& g : gains) options.push_back(SpecOption{g, true, 1});
  std::vector<SpecRequest> reqs;
  for (const auto& o : options) reqs.push_back(SpecRequest{1, Span<const SpecOption>(&o, 1)});
  const StepCostModel cost{&target, &draft, 0.0015};
  Allocation a;
  SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &a));
  std::vector<int32_t> best_k;
  EXPECT_NEAR(a.goodput, brute_force(reqs, cost, &best_k), 1e-9);
  EXPECT_GT(a.goodput, 1.15 * a.plain_goodput);
}

// The allocation for `cost`; with a price factor f, for the objective E - G T at G = f times
// the step's own optimal goodput (set in cost->reference_goodput).
Allocation optimized(Span<const SpecRequest> reqs, StepCostModel* cost, std::optional<double> price_factor) {
  if (price_factor) {
    Allocation own;
    EXPECT_TRUE(optimize_goodput(reqs, *cost, &own).ok());
    cost->reference_goodput = own.goodput * *price_factor;
  }
  Allocation a;
  EXPECT_TRUE(optimize_goodput(reqs, *cost, &a).ok());
  return a;
}

// Host time that speculation adds (overhead_model.h): per drafting request, per draft token,
// per draft forward. A request's first draft then costs more than its next ones, which makes
// the optimal set no longer a prefix of the greedy's order; the look-ahead and the polish
// must still find it. Both objectives, GPU-like and CPU-like costs, model-free and draft-model
// options mixed, against brute force with the same costs.
TEST(GoodputOptimizer, HostCostsOfSpeculationMatchBruteForce) {
  std::mt19937 rng(41);
  std::uniform_real_distribution<double> u(0, 1);
  double worst = 1.0, sum = 0;
  int trials = 0, exact = 0, speculated = 0, host_decided = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool gpu = trial % 2 == 0;
    const CostModel target = gpu ? linear(0.002 + 0.002 * u(rng), 0.000005 + 0.00005 * u(rng))
                                 : linear(0.002 + 0.03 * u(rng), 0.0005 + 0.01 * u(rng));
    const CostModel draft = gpu ? linear(0.0005 + 0.0015 * u(rng), 0.000002 + 0.00002 * u(rng))
                                : linear(0.001 + 0.01 * u(rng), 0.0002 + 0.002 * u(rng));
    const RandomChainStep step(rng, 1 + rng() % 4, 5, /*draft=*/-1, 3, 4);
    const std::size_t n = step.reqs.size();
    const std::vector<std::vector<double>>& gains = step.gains;
    const std::vector<SpecRequest>& reqs = step.reqs;
    const double scale = target.predict(1);  // host costs up to a share of a target forward
    StepCostModel cost{&target, &draft, 0.1 * scale * u(rng)};
    cost.host = HostCosts{0.4 * scale * u(rng), 0.05 * scale * u(rng), 0.2 * scale * u(rng)};
    const Allocation a = optimized(reqs, &cost, trial % 4 >= 2 ? std::optional<double>(0.7 + 0.6 * u(rng)) : std::nullopt);
    double t = 0, s = 0;
    SPECD_ASSERT_OK(evaluate_allocation(reqs, cost, a.k, a.option, &t, &s));
    EXPECT_NEAR(a.expected_seconds, s, 1e-12);
    std::vector<int32_t> best_k;
    const double best = brute_force(reqs, cost, &best_k);
    // Ratio for the goodput objective; for E - G T, the share of the best gain over plain.
    double plain_t = 0, plain_s = 0;
    const std::vector<int32_t> zeros(n, 0), first(n, 0);
    SPECD_ASSERT_OK(evaluate_allocation(reqs, cost, zeros, first, &plain_t, &plain_s));
    const double plain = cost.reference_goodput > 0 ? plain_t - cost.reference_goodput * plain_s : plain_t / plain_s;
    const double score = cost.reference_goodput > 0
                             ? (best - plain > 1e-12 ? (a.objective - plain) / (best - plain) : 1.0)
                             : a.objective / best;
    worst = std::min(worst, score);
    sum += score;
    ++trials;
    exact += score > 1 - 1e-9 ? 1 : 0;
    EXPECT_GE(a.objective, plain - 1e-12 * std::abs(plain)) << "trial " << trial;
    const bool drafts = std::any_of(a.k.begin(), a.k.end(), [](int32_t k) { return k > 0; });
    speculated += drafts ? 1 : 0;
    // Without the host costs the same step would draft where they make it decline.
    StepCostModel free_cost = cost;
    free_cost.host = HostCosts{};
    Allocation free_plan;
    SPECD_ASSERT_OK(optimize_goodput(reqs, free_cost, &free_plan));
    host_decided += !drafts && std::any_of(free_plan.k.begin(), free_plan.k.end(), [](int32_t k) { return k > 0; });
  }
  std::printf("host costs: exact %d of %d, worst %.4f, mean %.5f of brute force's gain\n", exact, trials, worst,
              sum / trials);
  EXPECT_GE(worst, 0.97);
  EXPECT_GE(sum / trials, 0.998);
  EXPECT_GT(speculated, 100);   // both regimes are exercised
  EXPECT_GT(host_decided, 20);  // and the host costs changed decisions
}

// Batches above the polish limit (16) rely on the greedy alone. Brute force is out of reach
// there, so the test checks what can be checked: no single request's k changed to any other
// value improves the objective (the allocation is optimal one request at a time), and the
// host costs are honoured (speculation declined where they eat the gain).
TEST(GoodputOptimizer, LargeBatchesWithHostCostsCannotBeImprovedOneRequestAtATime) {
  std::mt19937 rng(43);
  std::uniform_real_distribution<double> u(0, 1);
  int improvable = 0, trials = 0, speculated = 0;
  double worst_gap = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const CostModel target = linear(0.002 + 0.002 * u(rng), 0.000005 + 0.00005 * u(rng));
    const CostModel draft = linear(0.0005 + 0.0015 * u(rng), 0.000002 + 0.00002 * u(rng));
    const RandomChainStep step(rng, 20 + rng() % 29, 6, /*draft=*/trial % 2 == 0 ? 1 : 0, 2, 1);
    const std::size_t n = step.reqs.size();
    const std::vector<std::vector<double>>& gains = step.gains;
    const std::vector<SpecRequest>& reqs = step.reqs;
    const double scale = target.predict(static_cast<int64_t>(n)) / static_cast<double>(n);
    StepCostModel cost{&target, &draft, 0.0005 * u(rng)};
    cost.host = HostCosts{2 * scale * u(rng), 0.2 * scale * u(rng), 0.0002 * u(rng)};
    const Allocation a = optimized(reqs, &cost, trial % 4 >= 2 ? std::optional<double>(0.8 + 0.4 * u(rng)) : std::nullopt);
    speculated += std::any_of(a.k.begin(), a.k.end(), [](int32_t k) { return k > 0; }) ? 1 : 0;
    std::vector<int32_t> k = a.k;
    const std::vector<int32_t> only(n, 0);  // each request's one option
    double gap = 0;
    for (std::size_t i = 0; i < n; ++i) {
      for (int32_t v = 0; v <= static_cast<int32_t>(gains[i].size()); ++v) {
        if (v == a.k[i]) continue;
        k[i] = v;
        double t = 0, s = 0;
        SPECD_ASSERT_OK(evaluate_allocation(reqs, cost, k, only, &t, &s));
        const double value = cost.reference_goodput > 0 ? t - cost.reference_goodput * s : t / s;
        gap = std::max(gap, (value - a.objective) / std::max(1e-9, std::abs(a.objective)));
      }
      k[i] = a.k[i];
    }
    improvable += gap > 1e-9 ? 1 : 0;
    worst_gap = std::max(worst_gap, gap);
    ++trials;
  }
  std::printf("large batches with host costs: %d of %d improvable by one request, worst by %.2e\n", improvable, trials,
              worst_gap);
  EXPECT_LE(improvable, trials / 20);
  EXPECT_LT(worst_gap, 0.01);
  EXPECT_GT(speculated, 30);
}

// A request's first draft carries the host time of a drafting request: with a large one, a
// single request's chain pays only when it is long enough to spread it, and a step of many
// requests each with one good draft declines them all.
TEST(GoodputOptimizer, HostTimeOfADraftingRequestIsPaidOnce) {
  const CostModel target = linear(0.004, 0.00001), draft = linear(0.001, 0.00001);
  const std::vector<double> sure = chain_gains({0.95, 0.95, 0.95, 0.95, 0.95, 0.95});
  const SpecOption deep{Span<const double>(sure), true, 1};
  const std::vector<SpecRequest> one{SpecRequest{1, Span<const SpecOption>(&deep, 1)}};
  StepCostModel cost{&target, &draft, 0.0};
  cost.host.per_drafting_request = 0.004;  // as much as a target forward
  Allocation a;
  SPECD_ASSERT_OK(optimize_goodput(one, cost, &a));
  EXPECT_GE(a.k[0], 4);  // a chain long enough to carry it
  std::vector<int32_t> best_k;
  EXPECT_NEAR(a.goodput, brute_force(one, cost, &best_k), 1e-9);
  const std::vector<double> short_chain = chain_gains({0.9});
  const SpecOption one_draft{Span<const double>(short_chain), false, 1};
  const std::vector<SpecRequest> many(8, SpecRequest{1, Span<const SpecOption>(&one_draft, 1)});
  cost.host.per_drafting_request = 0.0006;  // 8 x 0.6 ms against 8 x 0.9 tokens on a 4.1 ms step
  SPECD_ASSERT_OK(optimize_goodput(many, cost, &a));
  EXPECT_EQ(std::count(a.k.begin(), a.k.end(), 0), 8);
  cost.host.per_drafting_request = 0.0;
  SPECD_ASSERT_OK(optimize_goodput(many, cost, &a));
  EXPECT_EQ(std::count(a.k.begin(), a.k.end(), 1), 8);
  cost.host.per_draft_token = -1.0;
  SPECD_EXPECT_CODE(optimize_goodput(many, cost, &a), kInvalidArgument);
}

// The controller's exploration limit on verified tokens: never exceeded, and the greedy
// allocation under it stays close to the best allocation under it (exact without it).
TEST(GoodputOptimizer, HonoursTheTargetTokenLimit) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0, 1);
  const CostModel target = linear(0.02, 0.0002), draft = linear(0.004, 0.0001);
  double worst = 1.0;
  int binding = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = 1 + rng() % 3;
    std::vector<std::vector<double>> gains(n);
    std::vector<SpecOption> options(n);
    std::vector<SpecRequest> reqs(n);
    int64_t base = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> alphas(1 + rng() % 5);
      for (double& a : alphas) a = 0.3 + 0.7 * u(rng);
      gains[i] = chain_gains(alphas);
      options[i] = SpecOption{gains[i], (rng() % 2) == 0, 1};
      reqs[i] = SpecRequest{1 + static_cast<int32_t>(rng() % 3), Span<const SpecOption>(&options[i], 1)};
      base += reqs[i].base_tokens;
    }
    const int64_t limit = std::max<int64_t>(1, base - 1 + static_cast<int64_t>(rng() % 6));  // sometimes <= the bases
    const StepCostModel cost{&target, &draft, 0.0005, 0.0, limit};
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &a));
    int64_t verified = 0, drafted = 0;
    for (std::size_t i = 0; i < n; ++i) {
      verified += reqs[i].base_tokens + a.k[i];
      drafted += a.k[i];
    }
    if (drafted > 0) EXPECT_LE(verified, limit) << "trial " << trial;
    if (base >= limit) EXPECT_EQ(drafted, 0) << "trial " << trial;
    std::vector<int32_t> best_k;
    const double best = brute_force(reqs, cost, &best_k);
    const StepCostModel free_cost{&target, &draft, 0.0005};
    std::vector<int32_t> free_k;
    binding += brute_force(reqs, free_cost, &free_k) > best * (1 + 1e-9) ? 1 : 0;
    worst = std::min(worst, a.goodput / best);
    EXPECT_GE(a.goodput, a.plain_goodput * (1 - 1e-12));
  }
  EXPECT_GT(binding, 50);      // the limit mattered in many cases
  EXPECT_GE(worst, 0.97);      // greedy under a binding limit: near the constrained optimum
  const StepCostModel bad{&target, &draft, 0.0, 0.0, -1};
  std::vector<SpecRequest> none;
  Allocation a;
  SPECD_EXPECT_CODE(optimize_goodput(none, bad, &a), kInvalidArgument);
}

TEST(GoodputOptimizer, ReferenceGoodputStopsOverDraftingInPrefillSteps) {
  // A decode batch of 8 with a 300-token prompt prefilled in the same step: the step is slow
  // anyway, so its own goodput makes deep drafts look cheap. Priced at the decode-only
  // step's goodput, it drafts as the decode-only step does.
  const CostModel target = linear(0.020, 0.00025), draft = linear(0.004, 0.00005);
  const std::vector<double> gains = chain_gains({0.8, 0.8, 0.85, 0.85, 0.9, 0.8, 0.6, 0.5});
  const SpecOption opt{gains, true, 1};
  std::vector<SpecRequest> decode(8, SpecRequest{1, Span<const SpecOption>(&opt, 1)});
  std::vector<SpecRequest> with_prefill = decode;
  with_prefill.push_back(SpecRequest{300, {}});
  Allocation steady, own, priced;
  SPECD_ASSERT_OK(optimize_goodput(decode, StepCostModel{&target, &draft, 0.0005}, &steady));
  SPECD_ASSERT_OK(optimize_goodput(with_prefill, StepCostModel{&target, &draft, 0.0005}, &own));
  SPECD_ASSERT_OK(optimize_goodput(with_prefill, StepCostModel{&target, &draft, 0.0005, steady.goodput}, &priced));
  EXPECT_GT(own.draft_depth, steady.draft_depth);      // the step's own ratio over-drafts
  EXPECT_EQ(priced.draft_depth, steady.draft_depth);   // priced at the decode rate it does not
  EXPECT_EQ(std::vector<int32_t>(priced.k.begin(), priced.k.begin() + 8), steady.k);
}

TEST(GoodputOptimizer, PicksAGoodProposerPerRequest) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> u(0, 1);
  const CostModel target = linear(0.02, 0.002), draft = linear(0.004, 0.0005);
  double worst = 1;
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + rng() % 3;
    std::vector<std::vector<double>> gains(2 * n);
    std::vector<SpecOption> options(2 * n);
    std::vector<SpecRequest> reqs(n);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t o = 0; o < 2; ++o) {
        std::vector<double> alphas(1 + rng() % 4);
        for (double& a : alphas) a = u(rng);
        gains[2 * i + o] = chain_gains(alphas);
        options[2 * i + o] = SpecOption{gains[2 * i + o], o == 1, 1};
      }
      reqs[i] = SpecRequest{1 + static_cast<int32_t>(rng() % 4), Span<const SpecOption>(&options[2 * i], 2)};
    }
    const StepCostModel cost{&target, &draft, 0.0};
    Allocation a;
    SPECD_ASSERT_OK(optimize_goodput(reqs, cost, &a));
    std::vector<int32_t> best_k;
    worst = std::min(worst, a.goodput / brute_force(reqs, cost, &best_k));
  }
  EXPECT_GT(worst, 0.97);  // a heuristic choice of option, then an exact allocation
}

TEST(GoodputOptimizer, LimitingCases) {
  const std::vector<double> sure{1.0, 1.0, 1.0, 1.0}, never{0.0, 0.0, 0.0};
  const SpecOption good{sure, false, 1}, bad{never, false, 1};
  // Verification nearly free (memory-bound): take every sure draft.
  const CostModel flat = linear(0.02, 1e-7);
  Allocation a;
  const std::vector<SpecRequest> one{{1, Span<const SpecOption>(&good, 1)}};
  SPECD_ASSERT_OK(optimize_goodput(one, StepCostModel{&flat, nullptr, 0}, &a));
  EXPECT_EQ(a.k, (std::vector<int32_t>{4}));
  EXPECT_NEAR(a.goodput / a.plain_goodput, 5.0, 1e-3);
  // Drafts that are never accepted: k = 0 whatever the cost.
  const std::vector<SpecRequest> hopeless{{1, Span<const SpecOption>(&bad, 1)}};
  SPECD_ASSERT_OK(optimize_goodput(hopeless, StepCostModel{&flat, nullptr, 0}, &a));
  EXPECT_EQ(a.k, (std::vector<int32_t>{0}));
  // Compute-bound (each token costs as much as the step): sure drafts do not pay either.
  const CostModel steep = linear(0.0, 0.01);
  std::vector<SpecRequest> batch(64, SpecRequest{1, Span<const SpecOption>(&good, 1)});
  const std::vector<double> likely{0.7, 0.49, 0.34};
  const SpecOption maybe{likely, false, 1};
  for (auto& r : batch) r.options = Span<const SpecOption>(&maybe, 1);
  SPECD_ASSERT_OK(optimize_goodput(batch, StepCostModel{&steep, nullptr, 0}, &a));
  EXPECT_EQ(std::count(a.k.begin(), a.k.end(), 0), 64);
  // No cost data yet: plain decoding (to measure it).
  const CostModel empty;
  SPECD_ASSERT_OK(optimize_goodput(one, StepCostModel{&empty, nullptr, 0}, &a));
  EXPECT_EQ(a.k, (std::vector<int32_t>{0}));
}

TEST(GoodputOptimizer, ValidatesInput) {
  const CostModel target = linear(0.01, 0.001);
  Allocation a;
  const std::vector<double> rising{0.2, 0.5};
  const SpecOption bad{rising, false, 1};
  const std::vector<SpecRequest> r1{{1, Span<const SpecOption>(&bad, 1)}};
  SPECD_EXPECT_CODE(optimize_goodput(r1, StepCostModel{&target, nullptr, 0}, &a), kInvalidArgument);
  const std::vector<double> falling{0.5, 0.2};
  const SpecOption fine{falling, false, 1};
  const std::vector<SpecRequest> good{{1, Span<const SpecOption>(&fine, 1)}};
  SPECD_ASSERT_OK(optimize_goodput(good, StepCostModel{&target, nullptr, 0, 10.0}, &a));
  SPECD_EXPECT_CODE(optimize_goodput(good, StepCostModel{&target, nullptr, 0, -1.0}, &a), kInvalidArgument);
  SPECD_EXPECT_CODE(optimize_goodput(good, StepCostModel{&target, nullptr, 0, std::nan("")}, &a), kInvalidArgument);
  const std::vector<double> ok{0.5};
  const SpecOption draft_opt{ok, true, 1};
  const std::vector<SpecRequest> r2{{1, Span<const SpecOption>(&draft_opt, 1)}};
  SPECD_EXPECT_CODE(optimize_goodput(r2, StepCostModel{&target, nullptr, 0}, &a), kInvalidArgument);  // no draft costs
  const std::vector<SpecRequest> r3{{0, {}}};
  SPECD_EXPECT_CODE(optimize_goodput(r3, StepCostModel{&target, nullptr, 0}, &a), kInvalidArgument);
  SPECD_EXPECT_CODE(optimize_goodput(r3, StepCostModel{nullptr, nullptr, 0}, &a), kInvalidArgument);
}

}  // namespace
}  // namespace specd::testing
