// Stochastic verification from the target's logits (verify_stochastic_logits_batch): random
// batches with per-request SamplingParams in float32, float16 or bfloat16 logits, and the
// result it must equal: verify_stochastic_batch on the rows and totals sampling_probs_batch
// writes. Shared by the CPU and CUDA tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "specd/detail/bits.h"
#include "specd/sampling.h"
#include "specd/sampling_batch.h"
#include "specd/verify_batch.h"
#include "verify_batch_test_util.h"

namespace specd::testing {

struct LogitVerifyCase {
  VerifyCase c;                             // trees, draft rows, keys; c.logits: float32 logits per node
  LogitsDtype dtype = LogitsDtype::kFloat32;
  std::vector<uint16_t> words;              // [num_nodes, stride] the logits as 16-bit words (16-bit dtypes)
  std::vector<SamplingParams> params;       // [batch] each request's
  std::vector<SamplingParams> node_params;  // [num_nodes] its request's, per row (what sampling_probs takes)
  std::vector<bool> bad_params;             // [batch]

  LogitRows logits() const {
    const void* data = dtype == LogitsDtype::kFloat32 ? static_cast<const void*>(c.logits.data())
                                                      : static_cast<const void*>(words.data());
    return LogitRows{data, dtype, c.num_nodes(), c.vocab, c.stride};
  }
  TargetLogits target() const { return TargetLogits{logits(), params.data()}; }
};

// A 16-bit word for a float (bfloat16: truncated; float16: a nearby value, the infinities and
// NaN kept): the reference and the function under test read the same words, so any finite
// word per value will do.
inline uint16_t float_word(float f, LogitsDtype dtype) {
  if (dtype == LogitsDtype::kBFloat16) return static_cast<uint16_t>(detail::float_bits(f) >> 16);
  // float16: sign, and the value clamped into the finite half range by exponent (-inf kept).
  if (f == -INFINITY) return 0xFC00;
  if (f == INFINITY) return 0x7C00;
  if (f != f) return 0x7E00;
  const uint16_t sign = f < 0 ? 0x8000 : 0;
  const float a = std::fabs(f) > 60000.0f ? 60000.0f : std::fabs(f);
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  if (a < 6.2e-5f) return sign;       // flush the tiny ones to 0
  const auto exponent = static_cast<uint16_t>(e - 1 + 15);
  const auto mantissa = static_cast<uint16_t>(static_cast<int>((m * 2.0f - 1.0f) * 1024.0f) & 0x3FF);
  return static_cast<uint16_t>(sign | exponent << 10 | mantissa);
}

// A random case: random_verify_case's trees and draft rows, and per request parameters from
// greedy to every filter combined; `bad` > 0: that many requests get an error (invalid
// parameters, or a NaN logit in their root's row or in a row further down, which the walk may
// not reach).
inline LogitVerifyCase random_logit_verify_case(uint64_t seed, int32_t batch, int32_t vocab, Proposal how,
                                                LogitsDtype dtype, int32_t bad = 0) {
  std::mt19937_64 g(seed);
  LogitVerifyCase lc;
  lc.c = random_verify_case(&g, batch, vocab, how);
  lc.dtype = dtype;
  VerifyCase& c = lc.c;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int32_t r = 0; r < c.batch(); ++r) {
    SamplingParams s;
    const int kind = static_cast<int>(g() % 8);
    s.temperature = kind == 0 ? 0.0 : std::vector<double>{0.5, 0.8, 1.0, 1.4}[g() % 4];
    if (kind == 2 || kind >= 5) s.top_k = std::vector<int32_t>{1, 3, vocab / 2, vocab}[g() % 4];
    if (kind == 3 || kind >= 6) s.top_p = 0.3 + 0.69 * unit(g);
    if (kind == 4 || kind == 7) s.min_p = 0.3 * unit(g);
    lc.params.push_back(s);
  }
  lc.bad_params.assign(static_cast<std::size_t>(c.batch()), false);
  for (int32_t k = 0; k < bad && k < c.batch(); ++k) {
    const auto r = static_cast<std::size_t>(g() % static_cast<uint64_t>(c.batch()));
    const int32_t begin = c.offsets[r], end = c.offsets[r + 1];
    switch (k % 3) {
      case 0:
        lc.params[r].temperature = -1.0;
        lc.bad_params[r] = true;
        break;
      case 1:
        c.logits[static_cast<std::size_t>(int64_t{begin} * c.stride + static_cast<int64_t>(g() % static_cast<uint64_t>(vocab)))] = NAN;
        break;
      default: {
        const int32_t node = begin + static_cast<int32_t>(g() % static_cast<uint64_t>(end - begin));
        c.logits[static_cast<std::size_t>(int64_t{node} * c.stride)] = INFINITY;
        break;
      }
    }
  }
  for (int32_t r = 0; r < c.batch(); ++r)
    for (int32_t v = c.offsets[static_cast<std::size_t>(r)]; v < c.offsets[static_cast<std::size_t>(r) + 1]; ++v)
      lc.node_params.push_back(lc.params[static_cast<std::size_t>(r)]);
  if (dtype != LogitsDtype::kFloat32) {
    lc.words.resize(c.logits.size());
    for (std::size_t i = 0; i < c.logits.size(); ++i) lc.words[i] = float_word(c.logits[i], dtype);
  }
  return lc;
}

// sampling_probs_batch_cpu's rows and totals of the case's logits (each row with its
// request's parameters).
struct SampledRows {
  std::vector<float> probs;  // [num_nodes, vocab]
  std::vector<int32_t> status;
  std::vector<double> totals;
  ProbRows view(const LogitVerifyCase& lc) const {
    return ProbRows{probs.data(), lc.c.num_nodes(), lc.c.vocab, lc.c.vocab};
  }
};
inline SampledRows sampled_rows(const LogitVerifyCase& lc) {
  SampledRows s;
  const auto n = static_cast<std::size_t>(lc.c.num_nodes());
  s.probs.assign(n * static_cast<std::size_t>(lc.c.vocab), 0.0f);
  s.status.assign(n, 0);
  s.totals.assign(n, 0.0);
  EXPECT_TRUE(sampling_probs_batch_cpu(lc.logits(), lc.node_params.data(), s.probs.data(), s.status.data(),
                                       s.totals.data())
                  .ok());
  return s;
}

// What verification from the logits must give: verify_stochastic_batch_cpu on sampled_rows
// (with their totals), draft rows as given; a request with bad parameters gets
// kBadSamplingParams where the rows (all zeros) give kBadTargetRow.
inline void expected_logit_verify(const LogitVerifyCase& lc, const ProbRows* draft, const StochasticRowOptions& draft_options,
                                  BatchOutputs* want) {
  const SampledRows rows = sampled_rows(lc);
  StochasticRowOptions options = draft_options;
  options.target_totals = rows.totals.data();
  ASSERT_TRUE(verify_stochastic_batch_cpu(lc.c.view(), rows.view(lc), draft, lc.c.sampling, lc.c.keys.data(),
                                          want->view(), options)
                  .ok());
  for (std::size_t r = 0; r < lc.bad_params.size(); ++r)
    if (lc.bad_params[r] && want->status[r] == static_cast<int32_t>(VerifyStatus::kBadTargetRow))
      want->status[r] = static_cast<int32_t>(VerifyStatus::kBadSamplingParams);
}

inline void expect_same_outputs(const BatchOutputs& got, const BatchOutputs& want, const std::string& what) {
  EXPECT_EQ(got.status, want.status) << what;
  EXPECT_EQ(got.num_accepted, want.num_accepted) << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.path, want.path) << what;
}

}  // namespace specd::testing
