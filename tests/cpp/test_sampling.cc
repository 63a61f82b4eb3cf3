// Sampling rules: temperature, top-k, top-p, min-p (worked examples, ties, order of the
// filters), argmax ties, inverse-CDF draws, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "block_manager_test_util.h"
#include "specd/detail/sampling_rules.h"
#include "specd/sampling.h"

namespace specd::testing {
namespace {

std::vector<float> probs_of(const std::vector<float>& logits, SamplingParams params) {
  std::vector<float> out(logits.size());
  const Status s = sampling_probs(logits, params, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out;
}

// logits chosen so that softmax (T = 1) gives 0.4, 0.3, 0.2, 0.1.
std::vector<float> four() {
  return {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.1f)};
}

void expect_probs(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "token " << i;
}

TEST(Sampling, SoftmaxAndTemperature) {
  expect_probs(probs_of(four(), {}), {0.4, 0.3, 0.2, 0.1});
  // T = 0.5 squares the probabilities before renormalizing: 16, 9, 4, 1 over 30.
  SamplingParams cold;
  cold.temperature = 0.5;
  expect_probs(probs_of(four(), cold), {16 / 30.0, 9 / 30.0, 4 / 30.0, 1 / 30.0});
}

TEST(Sampling, TemperatureZeroIsOneHotArgmaxLowestIdOnTies) {
  SamplingParams greedy;
  greedy.temperature = 0;
  expect_probs(probs_of({1.0f, 3.0f, 3.0f, -2.0f}, greedy), {0, 1, 0, 0});
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 3.0f, 3.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{-5.0f}), 0);
}

TEST(Sampling, TopKTopPMinP) {
  SamplingParams k2;
  k2.top_k = 2;
  expect_probs(probs_of(four(), k2), {4 / 7.0, 3 / 7.0, 0, 0});
  SamplingParams p;
  p.top_p = 0.65;  // 0.4 < 0.65 <= 0.7: keep two
  expect_probs(probs_of(four(), p), {4 / 7.0, 3 / 7.0, 0, 0});
  p.top_p = 0.7;  // mass reaches exactly 0.7 (in double, from float logits: just below or at)
  const auto at = probs_of(four(), p);
  EXPECT_EQ(at[3], 0.0f);
  p.top_p = 0.05;  // always keeps at least the top token
  expect_probs(probs_of(four(), p), {1, 0, 0, 0});
  SamplingParams m;
  m.min_p = 0.45;  // keep p >= 0.18
  expect_probs(probs_of(four(), m), {4 / 9.0, 3 / 9.0, 2 / 9.0, 0});
}

TEST(Sampling, FiltersApplyInOrderOnRenormalizedProbabilities) {
  // top_k 3 -> {.4,.3,.2}/.9; then top_p 0.7 on that: .444, .777 -> keep two;
  SamplingParams s;
  s.top_k = 3;
  s.top_p = 0.7;
  expect_probs(probs_of(four(), s), {4 / 7.0, 3 / 7.0, 0, 0});
  // min_p is relative to the max, so renormalizing first does not change it.
  s.min_p = 0.8;  // keep >= 0.8 * 4/7
  expect_probs(probs_of(four(), s), {1, 0, 0, 0});
}

TEST(Sampling, TiesAtTheTopKBoundaryKeepLowerIds) {
  SamplingParams s;
  s.top_k = 2;
  expect_probs(probs_of({0.0f, 1.0f, 1.0f, 1.0f}, s), {0, 0.5, 0.5, 0});
}

TEST(Sampling, NegativeInfinityLogitsGetZeroProbability) {
  const float ninf = -INFINITY;
  expect_probs(probs_of({0.0f, ninf, 0.0f}, {}), {0.5, 0, 0.5});
}

TEST(Sampling, Validation) {
  std::vector<float> out(3);
  const std::vector<float> ok{0.0f, 1.0f, 2.0f};
  SamplingParams s;
  s.temperature = -1;
  SPECD_EXPECT_CODE(sampling_probs(ok, s, out), kInvalidArgument);
  s = {};
  s.top_p = 0;
  SPECD_EXPECT_CODE(sampling_probs(ok, s, out), kInvalidArgument);
  s = {};
  s.top_k = -1;
  SPECD_EXPECT_CODE(sampling_probs(ok, s, out), kInvalidArgument);
  s = {};
  s.min_p = 1.5;
  SPECD_EXPECT_CODE(sampling_probs(ok, s, out), kInvalidArgument);
  SPECD_EXPECT_CODE(sampling_probs(std::vector<float>{0.0f, NAN, 1.0f}, {}, out), kInvalidArgument);
  SPECD_EXPECT_CODE(sampling_probs(std::vector<float>{0.0f, INFINITY, 1.0f}, {}, out), kInvalidArgument);
  SPECD_EXPECT_CODE(sampling_probs(std::vector<float>(3, -INFINITY), {}, out), kInvalidArgument);
  SPECD_EXPECT_CODE(sampling_probs(std::vector<float>{0.0f}, {}, out), kInvalidArgument);  // size mismatch
}

TEST(Sampling, RowsVersionMatchesOneRowAtATime) {
  const std::vector<float> logits{0, 1, 2, 3, 99, 3, 2, 1, 0, 99};  // 2 rows of 4, stride 5
  std::vector<float> out(8);
  SamplingParams s;
  s.top_k = 2;
  SPECD_ASSERT_OK(sampling_probs_rows(logits.data(), 2, 4, 5, s, out.data()));
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), probs_of({0, 1, 2, 3}, s));
  EXPECT_EQ(std::vector<float>(out.begin() + 4, out.end()), probs_of({3, 2, 1, 0}, s));
}

TEST(Sampling, InverseCdfDraw) {
  const std::vector<double> w{0.0, 0.25, 0.0, 0.5, 0.25};
  EXPECT_EQ(sample_from_weights(w, 1.0, 0.0), 1);
  EXPECT_EQ(sample_from_weights(w, 1.0, 0.2499), 1);
  EXPECT_EQ(sample_from_weights(w, 1.0, 0.25), 3);
  EXPECT_EQ(sample_from_weights(w, 1.0, 0.7499), 3);
  EXPECT_EQ(sample_from_weights(w, 1.0, 0.75), 4);
  EXPECT_EQ(sample_from_weights(w, 1.0, 0.9999999), 4);
  EXPECT_EQ(sample_from_weights(w, 2.0, 0.9999999), 4);  // total too large: last positive
  EXPECT_EQ(sample_from_weights(std::vector<double>{0, 0, 3}, 3.0, 0.5), 2);
}

}  // namespace
}  // namespace specd::testing

namespace specd::testing {
namespace {

// exp_nonpositive before its integer-only rounding and exponent (2026-11-27): rint, a
// float-to-integer conversion and a double product. The kernels' weights must not change.
double exp_nonpositive_with_rint(double x) {
  if (!(x >= detail::kExpCutoff)) return 0.0;
  const double n = std::rint(detail::exact_mul(x, detail::kLog2E));
  const float r = static_cast<float>(detail::exact_sub(x, detail::exact_mul(n, detail::kLn2Hi)));
  float p = 1.0f / 5040.0f;
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = detail::exact_addf(detail::exact_mulf(p, r), c);
  const uint64_t two_to_n = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
  return detail::exact_mul(static_cast<double>(p), detail::double_from_bits(two_to_n));
}

TEST(Sampling, SoftmaxExponentialKeepsItsBits) {
  const auto same = [](double x) {
    const double got = detail::exp_nonpositive(x), want = exp_nonpositive_with_rint(x);
    ASSERT_EQ(detail::double_bits(got), detail::double_bits(want)) << "x = " << x << ": " << got << " vs " << want;
  };
  for (int64_t i = 0; i <= 3000000; ++i) same(-700.0 * static_cast<double>(i) / 3000000.0);
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> anywhere(-700.0, 0.0), small(-1.0, 0.0);
  for (int i = 0; i < 2000000; ++i) same(anywhere(gen));
  for (int i = 0; i < 500000; ++i) same(small(gen) * std::pow(10.0, -static_cast<double>(i % 300)));
  // Where x log2 e is a half-integer, rounding ties to even decides n.
  for (int64_t k = -1010; k <= 0; ++k) {
    const double tie = (static_cast<double>(k) - 0.5) / detail::kLog2E;
    for (double x = tie, step = 0; step < 8; ++step) {
      same(x);
      x = std::nextafter(x, step < 4 ? 0.0 : -1000.0);
    }
  }
  for (const double x : {0.0, -0.0, -700.0, -699.9999999999999, std::nextafter(0.0, -1.0)}) same(x);
}

// The exponent bounds the sampling passes skip exponentials by (sampling_rules.h): every
// token's exponent lies within the bounds of its own probability, over rows of many scales
// and temperatures, weights near the cutoff included (probabilities down to subnormals).
TEST(Sampling, ExponentBoundsHoldEveryProbability) {
  std::mt19937_64 gen(11);
  int64_t checked = 0;
  for (const double temperature : {0.05, 0.7, 1.0, 3.0}) {
    for (const float scale : {0.1f, 2.0f, 30.0f, 400.0f}) {
      std::normal_distribution<float> normal(0.0f, scale);
      std::vector<float> logits(4000);
      for (float& l : logits) l = normal(gen);
      const float max_logit = *std::max_element(logits.begin(), logits.end());
      const double inv_t = detail::inverse_temperature(temperature);
      double total = 0;
      for (float l : logits) total += detail::softmax_weight(l, max_logit, inv_t);
      const double inv_total = 1.0 / total, log_total = std::log(total);
      for (float l : logits) {
        const double x = detail::softmax_exponent(l, max_logit, inv_t);
        const double p = detail::exact_mul(detail::exp_nonpositive(x), inv_total);
        if (!(p > 0)) continue;  // below the cutoff: not in any ranked set
        ASSERT_GE(x, detail::exponent_floor(p, log_total)) << "p " << p << ", T " << temperature << ", scale " << scale;
        ASSERT_LE(x, detail::exponent_ceiling(p, log_total)) << "p " << p << ", T " << temperature << ", scale " << scale;
        // And not loose: within the margin plus the exponential's error of ln(p) + ln(total).
        ASSERT_NEAR(x, std::log(p) + log_total, 3e-7) << "p " << p;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 20000);
  EXPECT_EQ(detail::exponent_floor(0.0, 1.0), -INFINITY);
  EXPECT_EQ(detail::exponent_ceiling(1.0, 1.0), INFINITY);
}

// The softmax weight's exponential (detail/sampling_rules.h): close to exp over its whole
// range, 1 at 0, 0 below the cutoff and for -inf, never above 1, and monotone.
TEST(Sampling, SoftmaxExponentialIsCloseToExp) {
  double worst = 0, previous = 1.0;
  for (int64_t i = 0; i <= 2000000; ++i) {
    const double x = -700.0 * static_cast<double>(i) / 2000000.0;
    const double got = detail::exp_nonpositive(x);
    const double want = std::exp(x);
    worst = std::max(worst, std::fabs(got - want) / want);
    ASSERT_LE(got, previous) << "not monotone at x = " << x;
    previous = got;
  }
  EXPECT_LT(worst, 2e-7);
  EXPECT_EQ(detail::exp_nonpositive(0.0), 1.0);
  EXPECT_EQ(detail::exp_nonpositive(-700.5), 0.0);
  EXPECT_EQ(detail::exp_nonpositive(-INFINITY), 0.0);
  EXPECT_EQ(detail::exp_nonpositive(std::nan("")), 0.0);
  // Near 0 (where the probable tokens are) the polynomial alone decides: a few float ulps.
  for (double x = -1e-3; x < 0; x += 1e-6) ASSERT_NEAR(detail::exp_nonpositive(x), std::exp(x), 3e-7);
  // The weights of a row: the largest logit weighs exactly 1, -inf exactly 0.
  EXPECT_EQ(detail::softmax_weight(3.5f, 3.5, detail::inverse_temperature(0.7)), 1.0);
  EXPECT_EQ(detail::softmax_weight(-INFINITY, 3.5, detail::inverse_temperature(0.7)), 0.0);
  // A subnormal temperature (valid: finite and > 0) overflows 1 / temperature: still the argmax.
  SamplingParams tiny;
  tiny.temperature = 1e-310;
  expect_probs(probs_of(four(), tiny), {1, 0, 0, 0});
}

}  // namespace
}  // namespace specd::testing

namespace specd::testing {
namespace {

// The filters of sampling.h written the plain way, with a full sort of the vocabulary, and
// the arithmetic of detail/sampling_rules.h: what sampling_probs's lazily ranked filters must
// give, bit for bit.
std::vector<float> full_sort_probs(const std::vector<float>& logits, const SamplingParams& s) {
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  const double inv_t = detail::inverse_temperature(s.temperature);
  std::vector<double> p(logits.size());
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = detail::softmax_weight(logits[i], max_logit, inv_t);
  const auto renormalize = [&p] {
    double total = 0;
    for (double v : p) total += v;
    const double inv = 1.0 / total;
    for (double& v : p) v = detail::exact_mul(v, inv);
  };
  renormalize();
  std::vector<int32_t> ids;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&p](int32_t a, int32_t b) {
    const double pa = p[static_cast<std::size_t>(a)], pb = p[static_cast<std::size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  const auto keep = [&](std::size_t m) {
    for (std::size_t r = m; r < ids.size(); ++r) p[static_cast<std::size_t>(ids[r])] = 0;
    ids.resize(std::min(m, ids.size()));
    renormalize();
  };
  if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < ids.size()) keep(static_cast<std::size_t>(s.top_k));
  if (s.top_p < 1) {
    uint64_t mass = 0;
    std::size_t m = 0;
    while (m < ids.size() && (m == 0 || mass < detail::fixed_threshold(s.top_p)))
      mass += detail::fixed_mass(p[static_cast<std::size_t>(ids[m++])]);
    keep(m);
  }
  if (s.min_p > 0) {
    const double floor = s.min_p * p[static_cast<std::size_t>(ids[0])];
    for (int32_t id : ids)
      if (p[static_cast<std::size_t>(id)] < floor) p[static_cast<std::size_t>(id)] = 0;
    renormalize();
  }
  return std::vector<float>(p.begin(), p.end());
}

// sampling_probs ranks only the prefix its filters read (a selection, then a sort of the
// selected, doubling for top-p). On large rows, with many exact ties (logits on a coarse
// grid) and nuclei from one token to most of the vocabulary, it must equal the full sort.
TEST(Sampling, FiltersOnLargeRowsEqualAFullSort) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  int64_t largest_nucleus = 0;
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<float> logits(6000 + 2503 * trial);
    for (float& l : logits) l = std::round(normal(gen) * 8.0f) / 8.0f;  // ties
    if (trial % 5 == 0) logits[static_cast<std::size_t>(trial)] = -INFINITY;
    for (const double t : {0.25, 1.0, 6.0})
      for (const int32_t k : {0, 1, 40, 3000})
        for (const double top_p : {1.0, 0.5, 0.95, 0.999999})
          for (const double min_p : {0.0, 0.02}) {
            if (k == 0 && top_p == 1.0 && min_p == 0.0) continue;
            SamplingParams s;
            s.temperature = t;
            s.top_k = k;
            s.top_p = top_p;
            s.min_p = min_p;
            const std::vector<float> got = probs_of(logits, s), want = full_sort_probs(logits, s);
            ASSERT_EQ(got, want) << "trial " << trial << " T " << t << " top_k " << k << " top_p " << top_p
                                 << " min_p " << min_p;
            largest_nucleus = std::max<int64_t>(largest_nucleus, std::count_if(got.begin(), got.end(), [](float v) { return v > 0; }));
          }
  }
  EXPECT_GT(largest_nucleus, 4096);  // the doubling went far beyond its first 64
}

}  // namespace
}  // namespace specd::testing
