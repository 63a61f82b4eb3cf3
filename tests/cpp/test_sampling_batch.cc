// Batched sampling on the CPU (the CUDA kernels' row algorithm run by one thread) against
// the references sampling_probs + sample_token: equal probabilities and tokens on random
// rows with ties, -inf logits and every filter combination; per-row statuses; fp16/bf16
// decoding; and the shared helpers (radix selection, draw) on their own.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "block_manager_test_util.h"
#include "sampling_batch_test_util.h"
#include "specd/detail/block_algorithms.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sample_row.h"
#include "specd/detail/serial_block.h"
#include "specd/sampling_batch.h"
#include "threaded_block.h"

namespace specd::testing {
namespace {

TEST(SamplingBatchHelpers, HalfAndBFloat16DecodeExactly) {
  EXPECT_EQ(detail::half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(detail::half_to_float(0xC000), -2.0f);
  EXPECT_EQ(detail::half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(detail::half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(detail::half_to_float(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(detail::half_to_float(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(detail::half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(detail::half_to_float(0x7C00), INFINITY);
  EXPECT_EQ(detail::half_to_float(0xFC00), -INFINITY);
  EXPECT_TRUE(std::isnan(detail::half_to_float(0x7E00)));
  EXPECT_TRUE(std::signbit(detail::half_to_float(0x8000)));
  EXPECT_EQ(detail::bfloat16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(detail::bfloat16_to_float(0xC0A0), -5.0f);
  EXPECT_EQ(detail::bfloat16_to_float(0xFF80), -INFINITY);
}

TEST(SamplingBatchHelpers, DoubleBitsOrderNonNegativeValues) {
  const std::vector<double> v{0.0, 4.9e-324, 1e-300, 1e-5, 0.25, 0.5, 0.5000000000000001, 1.0};
  for (std::size_t i = 1; i < v.size(); ++i) EXPECT_LT(detail::double_bits(v[i - 1]), detail::double_bits(v[i]));
  EXPECT_EQ(detail::double_from_bits(detail::double_bits(0.3)), 0.3);
}

TEST(SamplingBatchHelpers, FixedPointMass) {
  EXPECT_EQ(detail::fixed_mass(1.0), uint64_t{1} << 62);
  EXPECT_EQ(detail::fixed_mass(0.25), uint64_t{1} << 60);
  EXPECT_EQ(detail::fixed_threshold(0.5), uint64_t{1} << 61);
  EXPECT_EQ(detail::fixed_mass(1.0 / 3) * 2, detail::fixed_threshold(2.0 / 3));
}

// radix_select against a sort, over random keys with many ties and some zero masses.
TEST(SamplingBatchHelpers, RadixSelectFindsTheSortedCut) {
  std::mt19937_64 g(3);
  detail::SerialBlock block;
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t n = 1 + static_cast<int32_t>(g() % 60);
    std::vector<uint64_t> key(static_cast<std::size_t>(n)), mass(key.size());
    std::vector<bool> in(key.size());
    for (std::size_t i = 0; i < key.size(); ++i) {
      key[i] = trial % 2 ? g() % 4 : g();  // odd trials: heavy ties
      if (g() % 3 == 0) key[i] <<= 40;
      mass[i] = key[i] % 7 == 0 ? 0 : 1 + key[i] % 997;  // equal keys have equal masses (as in sampling)
      in[i] = g() % 5 != 0;
    }
    std::vector<int32_t> order;
    for (int32_t i = 0; i < n; ++i)
      if (in[static_cast<std::size_t>(i)]) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return key[a] != key[b] ? key[a] > key[b] : a < b;
    });
    const bool by_mass = g() % 2;
    const uint64_t target = 1 + g() % (by_mass ? 20000 : static_cast<uint64_t>(n) + 2);
    // Expected: first rank r whose running stat reaches target.
    int64_t want = -1;
    uint64_t run = 0;
    for (std::size_t r = 0; r < order.size(); ++r) {
      run += by_mass ? mass[order[r]] : 1;
      if (run >= target) {
        want = static_cast<int64_t>(r);
        break;
      }
    }
    const detail::SelectCut cut = detail::radix_select(block, n, [&](int32_t i) {
      return detail::SelectItem{in[i], key[i], mass[i]};
    }, detail::SelectCriterion{by_mass, target});
    EXPECT_EQ(cut.set_count, order.size());
    ASSERT_EQ(cut.found, want >= 0) << "trial " << trial;
    if (want < 0) continue;
    for (int32_t i = 0; i < n; ++i) {
      const auto pos = std::find(order.begin(), order.end(), i) - order.begin();
      const bool kept = in[i] && pos <= want;
      EXPECT_EQ(detail::ranks_at_or_above(key[i], i, cut.key, cut.id) && in[i], kept) << "trial " << trial << " id " << i;
    }
  }
}

TEST(SamplingBatchHelpers, DrawIsTheInverseCdf) {
  detail::SerialBlock block;
  const std::vector<double> w{0.0, 0.25, 0.0, 0.5, 0.25};
  for (double u : {0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999999}) {
    const int32_t got =
        detail::draw_inverse_cdf<detail::kDrawRun>(block, 5, [&](int32_t i) { return w[static_cast<std::size_t>(i)]; }, u);
    EXPECT_EQ(got, sample_from_weights(w, 1.0, u)) << u;
  }
  EXPECT_EQ(detail::draw_inverse_cdf<detail::kDrawRun>(block, 5, [&](int32_t i) { return w[static_cast<std::size_t>(i)]; }, 2.0),
            4);
  EXPECT_EQ(detail::draw_inverse_cdf<detail::kTileRun>(block, 3, [](int32_t) { return 0.0; }, 0.5), -1);
}

// The tiled walks (draw_inverse_cdf with both runs, nth_flagged_id) over many tiles with 1
// to 8 threads:
// weights are multiples of 2^-10 with small sums, so every summation order is exact and the
// results must be those of the sequential rules (first crossing, else last positive; nth id).
TEST(SamplingBatchHelpers, TiledWalksMatchTheSequentialRules) {
  std::mt19937_64 g(41);
  for (int trial = 0; trial < 120; ++trial) {
    const int32_t n = 1 + static_cast<int32_t>(g() % 900);
    std::vector<double> w(static_cast<std::size_t>(n));
    for (double& x : w) x = g() % 3 == 0 ? 0.0 : static_cast<double>(g() % 64) / 1024;
    double total = 0;
    for (double x : w) total += x;
    const double target = trial % 7 == 0 ? total + 1 : total * static_cast<double>(g() % 1000) / 1000;
    int32_t want_draw = -1;
    double run = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (!(w[static_cast<std::size_t>(i)] > 0)) continue;
      run += w[static_cast<std::size_t>(i)];
      want_draw = i;
      if (target < run) break;
    }
    const uint64_t nth = 1 + g() % (static_cast<uint64_t>(n) + 2);
    int32_t want_nth = INT32_MAX;
    uint64_t seen = 0;
    for (int32_t i = 0; i < n && want_nth == INT32_MAX; ++i)
      if (w[static_cast<std::size_t>(i)] > 0 && ++seen == nth) want_nth = i;
    const auto weight = [&](int32_t i) { return w[static_cast<std::size_t>(i)]; };
    const auto flag = [&](int32_t i) { return w[static_cast<std::size_t>(i)] > 0; };
    detail::SerialBlock serial;
    EXPECT_EQ(detail::draw_inverse_cdf<detail::kDrawRun>(serial, n, weight, target), want_draw) << "trial " << trial;
    EXPECT_EQ(detail::draw_inverse_cdf<detail::kTileRun>(serial, n, weight, target), want_draw) << "trial " << trial;
    EXPECT_EQ(detail::nth_flagged_id(serial, n, flag, nth), want_nth) << "trial " << trial;
    for (int32_t threads : {2, 3, 8}) {
      int32_t got_draw = -9, got_short_draw = -9, got_nth = -9;
      run_threaded(threads, [&](ThreadedBlock& b) {
        const int32_t d = detail::draw_inverse_cdf<detail::kDrawRun>(b, n, weight, target);
        const int32_t s = detail::draw_inverse_cdf<detail::kTileRun>(b, n, weight, target);
        const int32_t k = detail::nth_flagged_id(b, n, flag, nth);
        if (b.rank() == 0) {
          got_draw = d;
          got_short_draw = s;
          got_nth = k;
        }
      });
      EXPECT_EQ(got_draw, want_draw) << "trial " << trial << ", " << threads << " threads";
      EXPECT_EQ(got_short_draw, want_draw) << "trial " << trial << ", " << threads << " threads, runs of kTileRun";
      EXPECT_EQ(got_nth, want_nth) << "trial " << trial << ", " << threads << " threads";
    }
  }
}

void expect_batch_matches_reference(const SamplingCase& c, const char* what) {
  const SamplingExpected want = expected_sampling(c);
  std::vector<float> probs(want.probs.size(), -1.0f);
  std::vector<int32_t> tokens(static_cast<std::size_t>(c.rows), -7), st(static_cast<std::size_t>(c.rows), -7);
  SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), probs.data(), st.data()));
  for (int32_t r = 0; r < c.rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    ASSERT_EQ(st[ur] == 0, want.ok[ur]) << what << " row " << r << " status " << st[ur];
    for (int32_t i = 0; i < c.vocab; ++i) {
      const std::size_t k = ur * static_cast<std::size_t>(c.vocab) + static_cast<std::size_t>(i);
      ASSERT_EQ(probs[k], want.probs[k]) << what << " row " << r << " token " << i << " top_k " << c.params[ur].top_k
                                         << " top_p " << c.params[ur].top_p << " min_p " << c.params[ur].min_p;
    }
  }
  SPECD_ASSERT_OK(sample_tokens_cpu(c.view(), c.params.data(), c.keys.data(), tokens.data(), st.data()));
  for (int32_t r = 0; r < c.rows; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    ASSERT_EQ(st[ur] == 0, want.ok[ur]) << what << " row " << r;
    EXPECT_EQ(tokens[ur], want.tokens[ur]) << what << " row " << r;
  }
  // Both at once: the same bits and tokens.
  std::vector<float> both_probs(want.probs.size(), -1.0f);
  std::vector<int32_t> both_tokens(tokens.size(), -7), both_st(st.size(), -7);
  SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(c.view(), c.params.data(), c.keys.data(), both_tokens.data(),
                                              both_probs.data(), both_st.data()));
  EXPECT_EQ(both_st, st) << what;
  EXPECT_EQ(both_tokens, tokens) << what;
  EXPECT_EQ(both_probs, want.probs) << what;
}

TEST(SamplingBatchCpu, MatchesReferenceOnRandomRows) {
  std::mt19937_64 g(17);
  for (int32_t vocab : {1, 2, 3, 7, 50, 300, 4097}) {
    const SamplingCase c = random_sampling_case(&g, vocab > 1000 ? 40 : 200, vocab);
    expect_batch_matches_reference(c, ("vocab " + std::to_string(vocab)).c_str());
  }
}

TEST(SamplingBatchCpu, ExactTiesAtTheTopKAndTopPCuts) {
  // Four equal tokens: top_k 2 keeps ids 1 and 2; top_p 0.5 reaches exactly 0.5 after two.
  SamplingCase c;
  c.rows = 3;
  c.vocab = 5;
  c.stride = 5;
  c.logits = {-1, 2, 2, 2, 2, /**/ -1, 2, 2, 2, 2, /**/ 2, 2, 2, 2, -INFINITY};
  SamplingParams k2, p5, p75;
  k2.top_k = 3;
  p5.top_p = 0.5;
  p75.top_p = 0.75;
  c.params = {k2, p5, p75};
  c.keys = {RngKey{1, 0, 0, 0}, RngKey{2, 0, 0, 0}, RngKey{3, 0, 0, 0}};
  expect_batch_matches_reference(c, "ties");
  std::vector<float> probs(15);
  std::vector<int32_t> st(3);
  SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), probs.data(), st.data()));
  EXPECT_EQ(std::vector<float>(probs.begin() + 10, probs.end()), (std::vector<float>{1 / 3.0f, 1 / 3.0f, 1 / 3.0f, 0, 0}));
}

// totals: each written row's floats summed as doubles in id order (what verification sums),
// 0 for a failed row; the rows and tokens are those of the calls without totals, both draws.
TEST(SamplingBatchCpu, TotalsAreTheWrittenRowsSums) {
  std::mt19937_64 g(29);
  SamplingCase c = random_sampling_case(&g, 120, 300);
  mark_edge_rows(&c, &g, [](float* row, int32_t at) { row[at] = INFINITY; });
  const auto n = static_cast<std::size_t>(c.rows);
  const auto size = n * static_cast<std::size_t>(c.vocab);
  std::vector<float> probs(size), plain_probs(size);
  std::vector<int32_t> st(n), plain_st(n), tokens(n), plain_tokens(n);
  std::vector<double> totals(n, -1.0);
  SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), probs.data(), st.data(), totals.data()));
  SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), plain_probs.data(), plain_st.data()));
  EXPECT_EQ(probs, plain_probs);
  EXPECT_EQ(st, plain_st);
  std::vector<double> want(n, 0.0);
  int32_t failed = 0;
  for (std::size_t r = 0; r < n; ++r) {
    for (int32_t i = 0; i < c.vocab; ++i) want[r] += static_cast<double>(probs[r * static_cast<std::size_t>(c.vocab) + i]);
    failed += st[r] != 0;
  }
  EXPECT_GT(failed, 0);
  EXPECT_EQ(totals, want);
  for (const DrawRule draw : {DrawRule::kInverseCdf, DrawRule::kGumbelMax}) {
    std::fill(totals.begin(), totals.end(), -1.0);
    SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(c.view(), c.params.data(), c.keys.data(), tokens.data(), probs.data(),
                                                st.data(), draw, totals.data()));
    SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(c.view(), c.params.data(), c.keys.data(), plain_tokens.data(),
                                                plain_probs.data(), plain_st.data(), draw));
    EXPECT_EQ(tokens, plain_tokens) << static_cast<int>(draw);
    EXPECT_EQ(probs, plain_probs) << static_cast<int>(draw);
    EXPECT_EQ(totals, want) << static_cast<int>(draw);
  }
}

TEST(SamplingBatchCpu, ReportsBadRowsPerRow) {
  SamplingCase c;
  c.rows = 5;
  c.vocab = 3;
  c.stride = 3;
  c.logits = {0, 1, 2, /**/ 0, NAN, 1, /**/ 0, INFINITY, 1, /**/ -INFINITY, -INFINITY, -INFINITY, /**/ 0, 1, 2};
  SamplingParams bad;
  bad.top_p = 0;
  c.params = {SamplingParams{}, SamplingParams{}, SamplingParams{}, SamplingParams{}, bad};
  c.keys.assign(5, RngKey{});
  std::vector<int32_t> tokens(5), st(5);
  SPECD_ASSERT_OK(sample_tokens_cpu(c.view(), c.params.data(), c.keys.data(), tokens.data(), st.data()));
  EXPECT_EQ(st, (std::vector<int32_t>{0, 2, 2, 3, 1}));
  EXPECT_EQ(tokens[1], -1);
  EXPECT_EQ(tokens[4], -1);
  std::vector<float> probs(15, 9.0f);
  SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), probs.data(), st.data()));
  EXPECT_EQ(std::vector<float>(probs.begin() + 3, probs.begin() + 6), std::vector<float>(3, 0.0f));
}

TEST(SamplingBatchCpu, ValidatesShapes) {
  std::vector<float> x(4);
  SamplingParams s;
  RngKey k;
  int32_t t = 0, st = 0;
  SPECD_EXPECT_CODE(sample_tokens_cpu(LogitRows{x.data(), LogitsDtype::kFloat32, 1, 4, 3}, &s, &k, &t, &st), kInvalidArgument);
  SPECD_EXPECT_CODE(sample_tokens_cpu(LogitRows{x.data(), LogitsDtype::kFloat32, 1, 0, 4}, &s, &k, &t, &st), kInvalidArgument);
  SPECD_EXPECT_CODE(sample_tokens_cpu(LogitRows{nullptr, LogitsDtype::kFloat32, 1, 4, 4}, &s, &k, &t, &st), kInvalidArgument);
  SPECD_EXPECT_CODE(sample_tokens_cpu(LogitRows{x.data(), static_cast<LogitsDtype>(7), 1, 4, 4}, &s, &k, &t, &st), kInvalidArgument);
  SPECD_EXPECT_CODE(sample_tokens_cpu(LogitRows{x.data(), LogitsDtype::kFloat32, 1, 4, 4}, &s, nullptr, &t, &st), kInvalidArgument);
  std::vector<float> p(4);
  SPECD_EXPECT_CODE(sample_tokens_and_probs_cpu(LogitRows{x.data(), LogitsDtype::kFloat32, 1, 4, 4}, &s, &k, &t, nullptr, &st),
                    kInvalidArgument);
  SPECD_EXPECT_CODE(sample_tokens_and_probs_cpu(LogitRows{x.data(), LogitsDtype::kFloat32, 1, 4, 3}, &s, &k, &t, p.data(), &st),
                    kInvalidArgument);
  SPECD_ASSERT_OK(sample_tokens_and_probs_cpu(LogitRows{x.data(), LogitsDtype::kFloat32, 1, 4, 4}, &s, &k, &t, p.data(), &st));
  SPECD_ASSERT_OK(sample_tokens_cpu(LogitRows{nullptr, LogitsDtype::kFloat32, 0, 4, 4}, nullptr, nullptr, nullptr, nullptr));
}

// 16-bit logits follow the float32 rules on their exactly decoded values.
TEST(SamplingBatchCpu, HalfAndBFloat16RowsMatchTheirFloatValues) {
  std::mt19937_64 g(5);
  SamplingCase c = random_sampling_case(&g, 60, 37);
  for (LogitsDtype dtype : {LogitsDtype::kFloat16, LogitsDtype::kBFloat16}) {
    std::vector<uint16_t> words(c.logits.size());
    SamplingCase decoded = c;
    for (std::size_t i = 0; i < words.size(); ++i) {
      words[i] = dtype == LogitsDtype::kFloat16 ? static_cast<uint16_t>(g() % 0x7C00) | static_cast<uint16_t>(g() % 2 << 15)
                                                : static_cast<uint16_t>(0x3000 + g() % 0x1000) | static_cast<uint16_t>(g() % 2 << 15);
      if (g() % 17 == 0) words[i] = dtype == LogitsDtype::kFloat16 ? 0xFC00 : 0xFF80;  // -inf
      decoded.logits[i] = dtype == LogitsDtype::kFloat16 ? detail::half_to_float(words[i]) : detail::bfloat16_to_float(words[i]);
    }
    const SamplingExpected want = expected_sampling(decoded);
    LogitRows rows{words.data(), dtype, c.rows, c.vocab, c.stride};
    std::vector<int32_t> tokens(static_cast<std::size_t>(c.rows)), st(tokens.size());
    SPECD_ASSERT_OK(sample_tokens_cpu(rows, c.params.data(), c.keys.data(), tokens.data(), st.data()));
    for (std::size_t r = 0; r < tokens.size(); ++r) {
      EXPECT_EQ(st[r] == 0, want.ok[r]) << "row " << r;
      EXPECT_EQ(tokens[r], want.tokens[r]) << "row " << r;
    }
  }
}

// greedy_token_row (the greedy rows' one pass of grouped loads) gives sample_token_row's
// token and status on greedy rows: ties, -inf, all -inf, NaN and +inf anywhere (the last
// group included), invalid parameters; with one thread and with 2, 3 and 8 per row.
TEST(SamplingBatchThreaded, GreedyRowsOwnPassMatchesTheGeneralRow) {
  std::mt19937_64 g(47);
  for (int32_t vocab : {1, 7, 8, 9, 64, 1001}) {
    SamplingCase c = random_sampling_case(&g, 40, vocab);
    mark_edge_rows(&c, &g, [vocab](float* row, int32_t at) {  // a tie at the top: the lower id
      row[at] = 1e30f;
      row[vocab - 1] = 1e30f;
    });
    for (int32_t r = 0; r < c.rows; ++r) {
      SamplingParams& p = c.params[static_cast<std::size_t>(r)];
      p.temperature = 0.0;
      if (r % 11 == 5) p.top_p = 1.5;  // invalid: kBadParams
    }
    for (int32_t r = 0; r < c.rows; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const auto row = detail::Float32Row::at(c.logits.data(), r * c.stride);
      detail::SerialBlock serial;
      int32_t want = -9, got = -9;
      const SampleStatus want_status = detail::sample_token_row(serial, row, vocab, c.params[ur], c.keys[ur], &want);
      EXPECT_EQ(detail::greedy_token_row(serial, row, vocab, c.params[ur], &got), want_status) << vocab << ", " << r;
      EXPECT_EQ(got, want) << "vocab " << vocab << ", row " << r;
      for (int32_t threads : {2, 3, 8}) {
        int32_t token = -9, status = -9;
        run_threaded(threads, [&](ThreadedBlock& b) {
          int32_t t = -1;
          const SampleStatus st = detail::greedy_token_row(b, row, vocab, c.params[ur], &t);
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
}

// The same for 16-bit rows, whose grouped pass keeps its groups as raw words (group8,
// decoded at use) with more of them in flight: fp16 and bf16 words (ties, -inf, NaN and +inf
// among them, the last partial group included), with one thread and with 2, 3 and 8 per row,
// against the general row code on the decoded floats.
TEST(SamplingBatchThreaded, GreedyRowsOfSixteenBitWordsMatchTheirFloatValues) {
  std::mt19937_64 g(53);
  for (LogitsDtype dtype : {LogitsDtype::kFloat16, LogitsDtype::kBFloat16}) {
    const bool half = dtype == LogitsDtype::kFloat16;
    for (int32_t vocab : {1, 7, 8, 9, 31, 64, 65, 1001}) {
      const int32_t rows = 24;
      std::vector<uint16_t> words(static_cast<std::size_t>(rows) * static_cast<std::size_t>(vocab));
      std::vector<float> decoded(words.size());
      for (std::size_t i = 0; i < words.size(); ++i) {
        // few distinct values: many ties
        words[i] = half ? static_cast<uint16_t>(0x3C00 + g() % 4) : static_cast<uint16_t>(0x3F80 + g() % 4);
        if (g() % 9 == 0) words[i] = half ? 0xFC00 : 0xFF80;  // -inf
      }
      for (int32_t r = 0; r < rows; ++r) {
        uint16_t* row = words.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(vocab);
        const auto at = static_cast<std::size_t>(g() % static_cast<uint64_t>(vocab));
        if (r % 6 == 0) row[at] = half ? 0x7E00 : 0x7FC0;                       // NaN
        if (r % 6 == 1) row[vocab - 1] = half ? 0x7C00 : 0x7F80;                // +inf, last group
        if (r % 6 == 2) std::fill(row, row + vocab, half ? 0xFC00 : 0xFF80);    // no finite logit
        if (r % 6 == 3) row[vocab - 1] = half ? 0x4400 : 0x4080;                // the top in the last group
      }
      for (std::size_t i = 0; i < words.size(); ++i)
        decoded[i] = half ? detail::half_to_float(words[i]) : detail::bfloat16_to_float(words[i]);
      SamplingParams greedy;
      greedy.temperature = 0.0;
      for (int32_t r = 0; r < rows; ++r) {
        const int64_t offset = int64_t{r} * vocab;
        detail::SerialBlock serial;
        int32_t want = -9;
        const SampleStatus want_status =
            detail::sample_token_row(serial, detail::Float32Row::at(decoded.data(), offset), vocab, greedy, RngKey{}, &want);
        const std::string what = std::string(half ? "fp16" : "bf16") + ", vocab " + std::to_string(vocab) + ", row " +
                                 std::to_string(r);
        for (int32_t threads : {1, 2, 3, 8}) {
          int32_t token = -9, status = -9;
          run_threaded(threads, [&](ThreadedBlock& b) {
            int32_t t = -1;
            const SampleStatus st = half ? detail::greedy_token_row(b, detail::Float16Row::at(words.data(), offset), vocab, greedy, &t)
                                         : detail::greedy_token_row(b, detail::BFloat16Row::at(words.data(), offset), vocab, greedy, &t);
            if (b.rank() == 0) {
              token = t;
              status = static_cast<int32_t>(st);
            }
          });
          EXPECT_EQ(status, static_cast<int32_t>(want_status)) << threads << " threads, " << what;
          EXPECT_EQ(token, want) << threads << " threads, " << what;
        }
      }
    }
  }
}

// The row algorithm with several threads per row (tiled and strided loops, cross-thread
// scans, concurrent histograms) gives the one-thread results: the same tokens and statuses,
// probabilities within one float ulp (the sums run in another order).
TEST(SamplingBatchThreaded, SeveralThreadsPerRowMatchOneThread) {
  std::mt19937_64 g(31);
  for (int32_t threads : {2, 3, 8}) {
    for (int32_t vocab : {1, 5, 64, 700}) {
      const SamplingCase c = random_sampling_case(&g, 30, vocab);
      std::vector<int32_t> want_tokens(static_cast<std::size_t>(c.rows)), want_status(want_tokens.size());
      std::vector<float> want_probs(static_cast<std::size_t>(c.rows) * vocab);
      SPECD_ASSERT_OK(sample_tokens_cpu(c.view(), c.params.data(), c.keys.data(), want_tokens.data(), want_status.data()));
      SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), want_probs.data(), want_status.data()));
      for (int32_t r = 0; r < c.rows; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        const auto row = detail::Float32Row::at(c.logits.data(), r * c.stride);
        int32_t token = -9, status = -9, probs_status = -9, both_token = -9;
        std::vector<float> probs(static_cast<std::size_t>(vocab), -1.0f), both_probs(probs.size(), -1.0f);
        run_threaded(threads, [&](ThreadedBlock& b) {
          int32_t t = -1, t2 = -1;
          const SampleStatus s = detail::sample_token_row(b, row, vocab, c.params[ur], c.keys[ur], &t);
          const SampleStatus s2 = detail::probs_row(b, row, vocab, c.params[ur], probs.data());
          // Both at once: the token drawn from the row this block just wrote.
          detail::probs_row(b, row, vocab, c.params[ur], both_probs.data(), &c.keys[ur], &t2);
          if (b.rank() == 0) {
            token = t;
            status = static_cast<int32_t>(s);
            probs_status = static_cast<int32_t>(s2);
            both_token = t2;
          }
        });
        EXPECT_EQ(both_token, token) << threads << " threads, vocab " << vocab << ", row " << r;
        EXPECT_EQ(both_probs, probs) << threads << " threads, vocab " << vocab << ", row " << r;
        ASSERT_EQ(status, want_status[ur]) << threads << " threads, vocab " << vocab << ", row " << r;
        EXPECT_EQ(probs_status, want_status[ur]);
        EXPECT_EQ(token, want_tokens[ur]) << threads << " threads, vocab " << vocab << ", row " << r;
        for (int32_t i = 0; i < vocab; ++i)
          EXPECT_NEAR(probs[static_cast<std::size_t>(i)], want_probs[ur * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(i)],
                      1.2e-7 * want_probs[ur * static_cast<std::size_t>(vocab) + static_cast<std::size_t>(i)])
              << threads << " threads, vocab " << vocab << ", row " << r << ", token " << i;
      }
    }
  }
}

}  // namespace
}  // namespace specd::testing
