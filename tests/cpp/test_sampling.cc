// Sampling rules: temperature, top-k, top-p, min-p (worked examples, ties, order of the
// filters), argmax ties, inverse-CDF draws, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

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
