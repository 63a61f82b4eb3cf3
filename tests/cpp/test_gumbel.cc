// The Gumbel-max draw (DrawRule::kGumbelMax, detail/gumbel.h, detail/gumbel_row.h): the
// deterministic log, the screen's bounds, the row code against a reference that computes
// every kept token's key without a screen, thread-layout independence, statuses, and the
// distribution it draws from (chi-square against sampling_probs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "block_manager_test_util.h"
#include "chi_square.h"
#include "sampling_batch_test_util.h"
#include "specd/detail/gumbel_row.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/serial_block.h"
#include "specd/sampling.h"
#include "specd/sampling_batch.h"
#include "threaded_block.h"

namespace specd::testing {
namespace {

std::vector<float> bounds_table() {
  std::vector<float> t(detail::kGumbelBuckets);
  detail::fill_gumbel_bounds(t.data());
  return t;
}

TEST(GumbelPieces, DeterministicLogIsWithinAFewUlpsOfLog) {
  std::mt19937_64 g(1);
  std::uniform_real_distribution<double> exponent(-1000.0, 1000.0);
  for (int n = 0; n < 200000; ++n) {
    const double x = std::pow(2.0, exponent(g)) * (1.0 + 1e-3 * static_cast<double>(g() % 1000));
    const double want = std::log(x);
    EXPECT_NEAR(detail::deterministic_log(x), want, 4e-16 * std::fabs(want) + 1e-300) << x;
  }
  // Near 1, where the noise's inner log lives (u = 1 - tiny): relative accuracy.
  for (int k = 1; k < 53; ++k) {
    const double x = 1.0 - std::ldexp(1.0, -k);
    EXPECT_NEAR(detail::deterministic_log(x), std::log1p(-std::ldexp(1.0, -k)), 4e-16 * std::ldexp(1.0, -k)) << k;
  }
  EXPECT_EQ(detail::deterministic_log(1.0), 0.0);
}

TEST(GumbelPieces, NoiseIsFiniteAndMonotoneInItsBits) {
  const uint64_t top = (uint64_t{1} << 52) - 1;
  EXPECT_NEAR(detail::gumbel_from_bits(top), -std::log(-std::log1p(-std::ldexp(0.5, -52))), 1e-12);
  EXPECT_LT(detail::gumbel_from_bits(top), 36.8);
  EXPECT_GT(detail::gumbel_from_bits(0), -4.0);
  std::mt19937_64 g(2);
  for (int n = 0; n < 100000; ++n) {
    const uint64_t a = g() >> 12, b = g() >> 12;
    if (a < b) EXPECT_LE(detail::gumbel_from_bits(a), detail::gumbel_from_bits(b));
  }
}

// Every bucket's entry bounds the noise of every 52-bit value in it, and is close to it
// where keys compete (the screen rules out most tokens there).
TEST(GumbelPieces, BucketBoundsHoldAndAreTight) {
  const std::vector<float> table = bounds_table();
  for (int32_t b = 1; b < detail::kGumbelBuckets; ++b) EXPECT_LT(table[b], table[b - 1]) << b;
  std::vector<int> seen(detail::kGumbelBuckets, 0);
  for (uint32_t hi = 0; hi <= 0xFFFFu; ++hi) {
    const int32_t b = detail::gumbel_bucket(hi);
    ASSERT_GE(b, 0);
    ASSERT_LT(b, detail::kGumbelBuckets);
    ++seen[b];
    ASSERT_LE(0xFFFFu - hi, 0xFFFFu);
    EXPECT_GE(0xFFFFu - hi, detail::gumbel_bucket_floor(b)) << hi;
    // The largest and smallest 52-bit values with this high half.
    const uint64_t low_ones = (uint64_t{1} << detail::kGumbelLowBits) - 1;
    const double g_top = detail::gumbel_from_bits((uint64_t{hi} << detail::kGumbelLowBits) | low_ones);
    const double g_bottom = detail::gumbel_from_bits(uint64_t{hi} << detail::kGumbelLowBits);
    EXPECT_GE(static_cast<double>(table[b]), g_top) << hi;
    // Where the winning noise lives (u >= 1/2, g >= 0.37), the bound is within 0.075 of the
    // bucket's least noise (the top 16 buckets hold one high half each: their own width).
    if (hi >= 0x8000u && hi < 0xFFF0u) EXPECT_LT(static_cast<double>(table[b]) - g_bottom, 0.075) << hi;
  }
  for (int32_t b = 0; b < detail::kGumbelBuckets; ++b) EXPECT_GT(seen[b], 0) << b;
}

// screen_upper bounds the exact key for any noise up to the bound, over logits and
// temperatures from tiny to huge.
TEST(GumbelPieces, ScreenBoundsTheKey) {
  std::mt19937_64 g(3);
  const std::vector<double> temperatures{1e-300, 1e-40, 1e-3, 0.3, 0.9999, 1.0, 1.7, 1e6, 1e300};
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int n = 0; n < 200000; ++n) {
    const double t = temperatures[g() % temperatures.size()];
    const detail::GumbelScale scale = detail::gumbel_scale(t);
    const float scale_l = std::vector<float>{1e-30f, 1e-3f, 1.0f, 30.0f, 3e5f, 3e38f}[g() % 6];
    const float l = unit(g) * scale_l;
    const double noise = detail::gumbel_from_bits(g() >> 12);
    const float bound = detail::float_at_least(noise + (g() % 2 == 0 ? 0.0 : 0.01 * (g() % 100)));
    EXPECT_GE(static_cast<double>(detail::screen_upper(scale, l, bound)), detail::gumbel_key(scale, l, noise))
        << "t " << t << " l " << l << " g " << noise;
  }
}

// The rule without the screen: the token of largest key(i, g_i) among the ids key admits
// (-inf: left out), g_i each token's full noise; the lowest id on ties.
template <class Key>
int32_t unscreened_argmax(int32_t n, const RngKey& k, const Key& key) {
  double best = -INFINITY;
  int32_t id = -1;
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t high = detail::philox_half(detail::gumbel_high_bits(k, i / 8), i % 8);
    const double value = key(i, detail::gumbel_from_bits(detail::gumbel_bits(k, i, high)));
    if (value > best) {
      best = value;
      id = i;
    }
  }
  return id;
}

// sample_tokens' rule without the screen: every kept token's key, the largest.
int32_t unscreened_gumbel(const float* row, int32_t vocab, const SamplingParams& p, const RngKey& k) {
  detail::SerialBlock b;
  detail::RowPlan plan;
  const detail::Float32Row load{row};
  if (p.temperature == 0 || detail::has_filters(p)) {
    if (detail::plan_row(b, load, vocab, p, &plan) != SampleStatus::kOk) return -1;
    if (plan.greedy) return plan.argmax;
  }
  const detail::GumbelScale scale = detail::gumbel_scale(p.temperature);
  return unscreened_argmax(vocab, k, [&](int32_t i, double g) -> double {
    if (!(row[i] > -INFINITY)) return -INFINITY;
    if (detail::has_filters(p) && !(detail::row_prob(plan, i, row[i]) > 0)) return -INFINITY;
    return detail::gumbel_key(scale, row[i], g);
  });
}

TEST(GumbelRows, MatchTheUnscreenedRuleOnRandomRows) {
  std::mt19937_64 g(4);
  for (int32_t vocab : {1, 2, 7, 8, 9, 64, 333, 5000}) {
    const SamplingCase c = random_sampling_case(&g, 60, vocab);
    std::vector<int32_t> tokens(static_cast<std::size_t>(c.rows)), st(tokens.size());
    std::vector<int32_t> icdf_tokens(tokens.size()), icdf_st(tokens.size());
    SPECD_ASSERT_OK(sample_tokens_cpu(c.view(), c.params.data(), c.keys.data(), tokens.data(), st.data(),
                                      DrawRule::kGumbelMax));
    SPECD_ASSERT_OK(sample_tokens_cpu(c.view(), c.params.data(), c.keys.data(), icdf_tokens.data(), icdf_st.data()));
    for (int32_t r = 0; r < c.rows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      ASSERT_EQ(st[ur], icdf_st[ur]) << "vocab " << vocab << " row " << r;  // the same validation
      if (st[ur] != 0) {
        EXPECT_EQ(tokens[ur], -1);
        continue;
      }
      const float* row = c.logits.data() + r * c.stride;
      EXPECT_EQ(tokens[ur], unscreened_gumbel(row, vocab, c.params[ur], c.keys[ur])) << "vocab " << vocab << " row " << r;
      if (c.params[ur].temperature == 0) EXPECT_EQ(tokens[ur], icdf_tokens[ur]);
      // A drawn token has probability > 0 under the rules (sampling_probs' float row may
      // round a tiny one to 0; the rows here have none that small).
      std::vector<float> probs(static_cast<std::size_t>(vocab));
      SPECD_ASSERT_OK(sampling_probs(Span<const float>(row, static_cast<std::size_t>(vocab)), c.params[ur],
                                     Span<float>(probs.data(), probs.size())));
      EXPECT_GT(probs[static_cast<std::size_t>(tokens[ur])], 0.0f) << "vocab " << vocab << " row " << r;
    }
  }
}

// Several threads per row (each screening with its own best key) give the one-thread token:
// the result is an argmax, whatever the layout.
TEST(GumbelRows, SeveralThreadsPerRowMatchOneThread) {
  std::mt19937_64 g(5);
  const std::vector<float> table = bounds_table();
  for (int32_t threads : {2, 3, 8}) {
    for (int32_t vocab : {1, 9, 64, 700}) {
      const SamplingCase c = random_sampling_case(&g, 20, vocab);
      std::vector<int32_t> want(static_cast<std::size_t>(c.rows)), want_status(want.size());
      SPECD_ASSERT_OK(sample_tokens_cpu(c.view(), c.params.data(), c.keys.data(), want.data(), want_status.data(),
                                        DrawRule::kGumbelMax));
      for (int32_t r = 0; r < c.rows; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        const auto row = detail::Float32Row::at(c.logits.data(), r * c.stride);
        int32_t token = -9, status = -9;
        run_threaded(threads, [&](ThreadedBlock& b) {
          detail::RowPlan plan;
          int32_t t = -1;
          const SampleStatus s = detail::gumbel_token_row(b, row, vocab, c.params[ur], c.keys[ur], table.data(), &t, plan);
          if (b.rank() == 0) {
            token = t;
            status = static_cast<int32_t>(s);
          }
        });
        EXPECT_EQ(status, want_status[ur]) << threads << " threads, vocab " << vocab << ", row " << r;
        EXPECT_EQ(token, want[ur]) << threads << " threads, vocab " << vocab << ", row " << r;
      }
    }
  }
}

// gumbel_uncut_row (the lean one-pass kernel's row code: validation in the pass, no plan)
// gives the planned path's token and status (gumbel_cut_row: plan_row validates, then the
// pass with the plan's keep test) on every row takes_one_pass sends it, and the unscreened
// rule's token: no cut, temperatures below and above 1, NaN, +inf, some -inf and all -inf
// rows, invalid parameters; with one thread and with 2, 3 and 8 per row.
TEST(GumbelRows, UncutRowOwnPassMatchesTheGeneralRow) {
  std::mt19937_64 g(8);
  const std::vector<float> table = bounds_table();
  for (int32_t vocab : {1, 7, 8, 9, 64, 1001}) {
    SamplingCase c = random_sampling_case(&g, 40, vocab);
    mark_edge_rows(&c, &g, [](float* row, int32_t at) { row[at] = -INFINITY; });
    for (int32_t r = 0; r < c.rows; ++r) {
      SamplingParams& p = c.params[static_cast<std::size_t>(r)];
      p = SamplingParams{r % 2 == 0 ? 0.05 + 0.04 * r : 1.0 + 0.3 * r, 0, 1.0, 0.0};
      if (r % 11 == 5) p.temperature = -0.5;  // invalid: kBadParams
      if (r % 13 == 6) p.temperature = NAN;
      ASSERT_TRUE(detail::takes_one_pass(p, DrawRule::kGumbelMax));
      ASSERT_EQ(detail::takes_one_pass(p, DrawRule::kInverseCdf), p.temperature == 0);
    }
    for (int32_t r = 0; r < c.rows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto row = detail::Float32Row::at(c.logits.data(), r * c.stride);
      detail::SerialBlock serial;
      detail::RowPlan plan;
      int32_t want = -9, got = -9;
      const SampleStatus want_status =
          detail::gumbel_cut_row(serial, row, vocab, c.params[ur], c.keys[ur], table.data(), &want, plan);
      EXPECT_EQ(detail::gumbel_uncut_row(serial, row, vocab, c.params[ur], c.keys[ur], table.data(), &got),
                want_status) << vocab << ", " << r;
      EXPECT_EQ(got, want) << "vocab " << vocab << ", row " << r;
      if (want_status == SampleStatus::kOk)
        EXPECT_EQ(got, unscreened_gumbel(c.logits.data() + r * c.stride, vocab, c.params[ur], c.keys[ur]))
            << "vocab " << vocab << ", row " << r;
      int32_t dispatched = -9;  // gumbel_token_row sends the row to the uncut pass
      EXPECT_EQ(detail::gumbel_token_row(serial, row, vocab, c.params[ur], c.keys[ur], table.data(), &dispatched, plan),
                want_status);
      EXPECT_EQ(dispatched, want);
      for (int32_t threads : {2, 3, 8}) {
        int32_t token = -9, status = -9;
        run_threaded(threads, [&](ThreadedBlock& b) {
          int32_t t = -1;
          const SampleStatus st = detail::gumbel_uncut_row(b, row, vocab, c.params[ur], c.keys[ur], table.data(), &t);
          if (b.rank() == 0) {
            token = t;
            status = static_cast<int32_t>(st);
          }
        });
        EXPECT_EQ(status, static_cast<int32_t>(want_status)) << threads << " threads, vocab " << vocab << ", row " << r;
        EXPECT_EQ(token, want) << threads << " threads, vocab " << vocab << ", row " << r;
      }
    }
  }
  // Rows with a cut, or greedy, are not the uncut pass's.
  EXPECT_FALSE(detail::takes_one_pass(SamplingParams{0.7, 40, 1.0, 0.0}, DrawRule::kGumbelMax));
  EXPECT_FALSE(detail::takes_one_pass(SamplingParams{0.7, 0, 0.9, 0.0}, DrawRule::kGumbelMax));
  EXPECT_FALSE(detail::takes_one_pass(SamplingParams{0.7, 0, 1.0, 0.05}, DrawRule::kGumbelMax));
  EXPECT_TRUE(detail::takes_one_pass(SamplingParams{0.0, 40, 0.9, 0.05}, DrawRule::kInverseCdf));
}

TEST(GumbelRows, HalfAndBFloat16RowsDrawAsTheirFloatValues) {
  std::mt19937_64 g(6);
  const int32_t rows = 40, vocab = 300;
  std::vector<uint16_t> bf(static_cast<std::size_t>(rows * vocab));
  std::vector<float> decoded(bf.size());
  for (std::size_t i = 0; i < bf.size(); ++i) {
    bf[i] = static_cast<uint16_t>(0x3F00 + g() % 0x0200);  // bfloat16 values around 0.5-2
    decoded[i] = detail::bfloat16_to_float(bf[i]);
  }
  std::vector<SamplingParams> params(rows);
  std::vector<RngKey> keys(rows);
  for (int32_t r = 0; r < rows; ++r) {
    params[static_cast<std::size_t>(r)].temperature = 0.05 + 0.1 * r;
    keys[static_cast<std::size_t>(r)] = RngKey{g(), static_cast<uint32_t>(r), 3, 100};
  }
  std::vector<int32_t> a(rows), b(rows), sa(rows), sb(rows);
  SPECD_ASSERT_OK(sample_tokens_cpu(LogitRows{bf.data(), LogitsDtype::kBFloat16, rows, vocab, vocab}, params.data(),
                                    keys.data(), a.data(), sa.data(), DrawRule::kGumbelMax));
  SPECD_ASSERT_OK(sample_tokens_cpu(LogitRows{decoded.data(), LogitsDtype::kFloat32, rows, vocab, vocab}, params.data(),
                                    keys.data(), b.data(), sb.data(), DrawRule::kGumbelMax));
  EXPECT_EQ(a, b);
  EXPECT_EQ(sa, std::vector<int32_t>(rows, 0));
}

TEST(GumbelRows, ReportsBadRowsAndRules) {
  // rows: NaN, +inf, all -inf, bad parameters (3 wide each)
  const std::vector<float> rows{1.0f, NAN, 0.0f, 2.0f, INFINITY, 1.0f, -INFINITY, -INFINITY, -INFINITY, 0.5f, 0.0f, 1.0f};
  std::vector<SamplingParams> params(4);
  params[3].temperature = -1;
  std::vector<RngKey> keys(4);
  std::vector<int32_t> t(4, 7), st(4, 7);
  SPECD_ASSERT_OK(sample_tokens_cpu(LogitRows{rows.data(), LogitsDtype::kFloat32, 4, 3, 3}, params.data(), keys.data(),
                                    t.data(), st.data(), DrawRule::kGumbelMax));
  EXPECT_EQ(st, (std::vector<int32_t>{2, 2, 3, 1}));
  EXPECT_EQ(t, (std::vector<int32_t>{-1, -1, -1, -1}));
  SPECD_EXPECT_CODE(sample_tokens_cpu(LogitRows{rows.data(), LogitsDtype::kFloat32, 4, 3, 3}, params.data(), keys.data(),
                                      t.data(), st.data(), static_cast<DrawRule>(5)),
                    kInvalidArgument);
}

// n copies of one row with the same parameters and n keys of one seed (requests and
// positions vary): the inputs of a statistical test.
struct RepeatedRows {
  int32_t n = 0, vocab = 0;
  std::vector<float> rows;
  std::vector<SamplingParams> params;
  std::vector<RngKey> keys;
  LogitRows view() const { return LogitRows{rows.data(), LogitsDtype::kFloat32, n, vocab, vocab}; }
};
RepeatedRows repeated_rows(const std::vector<float>& logits, const SamplingParams& p, int32_t n, uint64_t seed) {
  RepeatedRows c;
  c.n = n;
  c.vocab = static_cast<int32_t>(logits.size());
  for (int32_t r = 0; r < n; ++r) {
    c.rows.insert(c.rows.end(), logits.begin(), logits.end());
    c.keys.push_back(RngKey{seed, static_cast<uint32_t>(r % 97), static_cast<uint32_t>(r % 3), static_cast<uint32_t>(r)});
  }
  c.params.assign(static_cast<std::size_t>(n), p);
  return c;
}

// Counts of `tokens` over the vocabulary; every token has probs[token] > 0.
std::vector<int64_t> token_counts(const std::vector<int32_t>& tokens, const std::vector<float>& probs) {
  std::vector<int64_t> counts(probs.size(), 0);
  for (int32_t t : tokens) {
    EXPECT_GT(probs[static_cast<std::size_t>(t)], 0.0f) << "drew token " << t << " of probability 0";
    ++counts[static_cast<std::size_t>(t)];
  }
  return counts;
}

// Draws over many keys follow the rule's distribution (sampling_probs), with and without cuts,
// at low and high temperature; and the keys' positions and requests give independent draws.
TEST(GumbelRows, DrawsFollowTheSamplingDistribution) {
  const std::vector<float> logits{1.0f, 0.2f, -0.5f, 2.0f, -INFINITY, 0.9f, -3.0f, 1.1f, 0.0f, -1.0f, 0.5f};
  const auto vocab = static_cast<int32_t>(logits.size());
  std::vector<SamplingParams> cases(5);
  cases[0].temperature = 1.0;
  cases[1].temperature = 0.45;
  cases[2].temperature = 2.5;
  cases[3].temperature = 0.8;
  cases[3].top_k = 5;
  cases[3].top_p = 0.9;
  cases[4].temperature = 1.3;
  cases[4].min_p = 0.2;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    std::vector<float> probs(static_cast<std::size_t>(vocab));
    SPECD_ASSERT_OK(sampling_probs(Span<const float>(logits.data(), logits.size()), cases[c],
                                   Span<float>(probs.data(), probs.size())));
    const RepeatedRows in = repeated_rows(logits, cases[c], 60000, 0x5eed0000u + c);
    std::vector<int32_t> tokens(static_cast<std::size_t>(in.n)), st(tokens.size());
    SPECD_ASSERT_OK(sample_tokens_cpu(in.view(), in.params.data(), in.keys.data(), tokens.data(), st.data(),
                                      DrawRule::kGumbelMax));
    ASSERT_EQ(st, std::vector<int32_t>(st.size(), 0));
    const ChiSquare test = chi_square_test(token_counts(tokens, probs), std::vector<double>(probs.begin(), probs.end()));
    EXPECT_GT(test.p_value, 1e-4) << "case " << c << ": chi-square " << test.statistic << " on " << test.df << " df";
  }
}

// Over a wide, nearly flat row (where the screen rules out least and the noise's upper tail
// decides), tokens are drawn about uniformly: the bucket bounds do not cut the tail.
TEST(GumbelRows, FlatWideRowsDrawUniformly) {
  const int32_t vocab = 2048, n = 12000;
  std::vector<float> row(static_cast<std::size_t>(vocab), 0.25f);
  std::vector<int64_t> counts(16, 0);  // by token id / 128
  const std::vector<float> table = bounds_table();
  detail::SerialBlock b;
  for (int32_t r = 0; r < n; ++r) {
    detail::RowPlan plan;
    int32_t t = -1;
    SamplingParams p;
    ASSERT_EQ(detail::gumbel_token_row(b, detail::Float32Row{row.data()}, vocab, p, RngKey{77, 1, 0, static_cast<uint32_t>(r)},
                                       table.data(), &t, plan),
              SampleStatus::kOk);
    ++counts[static_cast<std::size_t>(t / 128)];
  }
  const ChiSquare test = chi_square_test(counts, std::vector<double>(16, 1.0 / 16));
  EXPECT_GT(test.p_value, 1e-4) << "chi-square " << test.statistic;
}

// The probability rows' Gumbel-max draw: the same rows as the inverse-CDF call, bit for bit,
// and the token of largest deterministic_log(q) + g among the written q > 0, computed here
// without a screen.
int32_t unscreened_probs_gumbel(const std::vector<float>& q, const RngKey& k) {
  return unscreened_argmax(static_cast<int32_t>(q.size()), k, [&](int32_t i, double g) -> double {
    const float qi = q[static_cast<std::size_t>(i)];
    return qi > 0 ? detail::deterministic_log(static_cast<double>(qi)) + g : -INFINITY;
  });
}

TEST(GumbelProbsRows, SameRowsAndTheUnscreenedToken) {
  std::mt19937_64 g(7);
  for (int32_t vocab : {1, 7, 8, 9, 64, 333, 5000}) {
    const SamplingCase c = random_sampling_case(&g, 60, vocab);
    const auto n = static_cast<std::size_t>(c.rows);
    std::vector<int32_t> tokens(n), st(n), icdf_tokens(n), icdf_st(n);
    std::vector<float> probs(n * static_cast<std::size_t>(vocab), -1.0f), icdf_probs(probs.size(), -2.0f);
    SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(c.view(), c.params.data(), c.keys.data(), tokens.data(), probs.data(),
                                                st.data(), DrawRule::kGumbelMax));
    SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(c.view(), c.params.data(), c.keys.data(), icdf_tokens.data(),
                                                icdf_probs.data(), icdf_st.data()));
    EXPECT_EQ(st, icdf_st) << "vocab " << vocab;
    EXPECT_TRUE(probs == icdf_probs) << "vocab " << vocab << ": the rows differ";
    for (int32_t r = 0; r < c.rows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (st[ur] != 0) {
        EXPECT_EQ(tokens[ur], -1);
        continue;
      }
      const std::vector<float> row(probs.begin() + static_cast<std::ptrdiff_t>(ur * vocab),
                                   probs.begin() + static_cast<std::ptrdiff_t>((ur + 1) * vocab));
      if (c.params[ur].temperature == 0) {
        EXPECT_EQ(tokens[ur], icdf_tokens[ur]);
        continue;
      }
      EXPECT_EQ(tokens[ur], unscreened_probs_gumbel(row, c.keys[ur])) << "vocab " << vocab << " row " << r;
    }
  }
  SPECD_EXPECT_CODE(sample_tokens_and_probs_cpu(LogitRows{nullptr, LogitsDtype::kFloat32, 0, 4, 4}, nullptr, nullptr,
                                                nullptr, nullptr, nullptr, static_cast<DrawRule>(-1)),
                    kInvalidArgument);
}

TEST(GumbelProbsRows, SeveralThreadsPerRowMatchOneThread) {
  std::mt19937_64 g(8);
  const std::vector<float> table = bounds_table();
  for (int32_t threads : {2, 3, 8}) {
    const int32_t vocab = 700;
    const SamplingCase c = random_sampling_case(&g, 20, vocab);
    const auto n = static_cast<std::size_t>(c.rows);
    std::vector<int32_t> want(n), want_status(n);
    std::vector<float> want_probs(n * vocab);
    SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(c.view(), c.params.data(), c.keys.data(), want.data(),
                                                want_probs.data(), want_status.data(), DrawRule::kGumbelMax));
    for (int32_t r = 0; r < c.rows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto row = detail::Float32Row::at(c.logits.data(), r * c.stride);
      std::vector<float> probs(static_cast<std::size_t>(vocab), -1.0f);
      int32_t token = -9, status = -9;
      run_threaded(threads, [&](ThreadedBlock& b) {
        detail::RowPlan plan;
        int32_t t = -1;
        const SampleStatus s =
            detail::gumbel_probs_row(b, row, vocab, c.params[ur], probs.data(), c.keys[ur], table.data(), &t, plan);
        if (b.rank() == 0) {
          token = t;
          status = static_cast<int32_t>(s);
        }
      });
      EXPECT_EQ(status, want_status[ur]) << threads << " threads, row " << r;
      EXPECT_EQ(token, want[ur]) << threads << " threads, row " << r;
      EXPECT_TRUE(std::equal(probs.begin(), probs.end(), want_probs.begin() + static_cast<std::ptrdiff_t>(ur * vocab)))
          << threads << " threads, row " << r;
    }
  }
}

// Tokens drawn over many keys follow the written rows (chi-square), cuts included.
TEST(GumbelProbsRows, DrawsFollowTheWrittenRow) {
  const std::vector<float> logits{1.0f, 0.2f, -0.5f, 2.0f, -INFINITY, 0.9f, -3.0f, 1.1f, 0.0f};
  const auto vocab = static_cast<int32_t>(logits.size());
  std::vector<SamplingParams> cases(3);
  cases[0].temperature = 0.8;
  cases[1].temperature = 1.5;
  cases[1].top_k = 4;
  cases[2].temperature = 1.0;
  cases[2].top_p = 0.85;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const RepeatedRows in = repeated_rows(logits, cases[c], 50000, 0xd1a7u + c);
    std::vector<int32_t> tokens(static_cast<std::size_t>(in.n)), st(tokens.size());
    std::vector<float> probs(in.rows.size());
    SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(in.view(), in.params.data(), in.keys.data(), tokens.data(),
                                                probs.data(), st.data(), DrawRule::kGumbelMax));
    ASSERT_EQ(st, std::vector<int32_t>(st.size(), 0));
    const std::vector<float> row(probs.begin(), probs.begin() + vocab);  // every row is the same
    const ChiSquare test = chi_square_test(token_counts(tokens, row), std::vector<double>(row.begin(), row.end()));
    EXPECT_GT(test.p_value, 1e-4) << "case " << c << ": chi-square " << test.statistic << " on " << test.df << " df";
  }
}

}  // namespace
}  // namespace specd::testing
