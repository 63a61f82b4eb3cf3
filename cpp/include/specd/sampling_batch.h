// Batched sampling: one token (or one probability row) per row of a logits matrix, each row
// with its own SamplingParams and RngKey. This is the interface of the CUDA sampling kernels
// (cuda/include/specd/cuda/sampling.h); the *_cpu functions here run the kernels' algorithm
// (detail/sample_row.h) on one CPU thread.
//
// Rules
// - The rules are those of sampling.h: row r's token is what
//     sampling_probs(row r, params[r]) followed by sample_token(probs, vocab, rng[r])
//   returns (the draw uses the verifier's final draw at rng[r].position, so a token sampled
//   here and a bonus token of verify_stochastic use the same key layout).
// - Greedy rows (temperature 0) give the argmax (lowest id among ties) and read no RngKey.
// - Top-k / top-p / min-p are applied without sorting the vocabulary: radix selections of
//   the ranking key (probability desc, id asc), 8 bits at a time, find the k-th token and
//   the top-p cut. The top-p mass is accumulated in 2^-62 fixed point, as sampling.h's rule
//   says (exact and order-independent, so the GPU result does not depend on thread
//   scheduling), so the same tokens are kept as by sampling_probs.
// - Per-row input errors do not fail the call: status[r] (SampleStatus) says what was
//   wrong, tokens[r] is -1 and a probability row is all zeros. The call itself fails only
//   for bad shapes or pointers (validate_logit_rows).
// - A call that does not fail writes every output of every row (token, status, probability
//   row, total), the CPU functions and the CUDA kernels alike: callers need not initialize
//   them.
// - Logits may be float32, float16 or bfloat16 (raw 16-bit words); 16-bit values are
//   converted to float exactly and then follow the float32 rules.
// - How sample_tokens draws a row's token (DrawRule; greedy rows are the argmax either way):
//   kInverseCdf (the default) is the rule above, the verifier's final draw; kGumbelMax draws
//   the kept token of largest key l_i / T + g_i, g_i Gumbel noise from Philox bits per token
//   (detail/gumbel.h states the keys and bits exactly; "kept": probability > 0 under the
//   rules of sampling.h, in double). Both draw from the same distribution; the same seed
//   gives different tokens under the two. kGumbelMax reads a row without a cut once, with
//   no sum: the GPU's tokens equal the CPU's exactly, for any thread layout. Its noise comes
//   from 52-bit uniforms (gumbel.h).
#pragma once

#include <cstdint>

#include "specd/sampling.h"
#include "specd/status.h"
#include "specd/verify.h"

namespace specd {

enum class LogitsDtype : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// A row-major [rows, stride] matrix of logits (or scores); row r is data + r * stride
// elements of `dtype`, of which the first `vocab` are used.
struct LogitRows {
  const void* data = nullptr;
  LogitsDtype dtype = LogitsDtype::kFloat32;
  int32_t rows = 0;
  int32_t vocab = 0;    // 1 <= vocab <= kMaxBatchVocab
  int64_t stride = 0;   // elements between rows, >= vocab
};

inline constexpr int32_t kMaxBatchVocab = 1 << 30;

// status[r] of the batched calls.
enum class SampleStatus : int32_t {
  kOk = 0,
  kBadParams = 1,       // params[r] fails validate_sampling_params
  kBadLogit = 2,        // a logit is NaN or +inf
  kNoFiniteLogit = 3,   // every logit is -inf
};

// How sample_tokens draws sampled rows' tokens (the rules above).
enum class DrawRule : int32_t { kInverseCdf = 0, kGumbelMax = 1 };

// Checks shape, dtype and pointer (not the values).
Status validate_logit_rows(const LogitRows& logits);
// The checks of each call (its arrays must be non-null when rows > 0), shared by the CPU
// functions and the CUDA launchers.
Status validate_sample_tokens(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                              const int32_t* tokens, const int32_t* status);
// kInverseCdf or kGumbelMax (a value cast from an integer may be neither).
Status validate_draw_rule(DrawRule draw);
Status validate_sampling_probs_batch(const LogitRows& logits, const SamplingParams* params, const float* probs,
                                     const int32_t* status);
Status validate_sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                        const int32_t* tokens, const float* probs, const int32_t* status);

// tokens[r], status[r] for each row r (all arrays [logits.rows], host memory).
Status sample_tokens_cpu(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                         int32_t* tokens, int32_t* status, DrawRule draw = DrawRule::kInverseCdf);

// probs[r * vocab + i] = sampling_probs(row r, params[r])[i]; probs is [rows, vocab] float32,
// status [rows].
// totals (optional, [rows] double): totals[r] = the sum of row r's floats as doubles (0 for a
// failed row), summed as stochastic verification sums a row it normalizes, so that
// verify_stochastic_batch can take it (StochasticRowOptions, verify_batch.h) instead of reading
// the whole row: on the CPU the same bits as its own sum; on the GPU the same bits when both
// kernels run the same Block (clusters of 8 x 256 threads), else equal up to the order of
// the additions.
Status sampling_probs_batch_cpu(const LogitRows& logits, const SamplingParams* params, float* probs,
                                int32_t* status, double* totals = nullptr);

// Both at once: probs[r * vocab + i] as sampling_probs_batch_cpu and tokens[r] as
// sample_tokens_cpu (the same bits and tokens), the token drawn from the row just written
// (no second pass over the logits). What a sampling draft step needs: its tokens and the
// distributions verification checks them against.
// draw kGumbelMax: the same rows, and each token drawn from its written row by the
// Gumbel-max rule of the floats (detail/gumbel_row.h, gumbel_probs_row): the largest
// ln(q_i) + g_i among q_i > 0, with sample_tokens' noise g_i. Its distribution is the written
// row normalized, as the inverse-CDF draw's; other tokens for the same seed, and not
// sample_tokens' Gumbel-max tokens (that rule keys on l_i / T).
// totals: as sampling_probs_batch_cpu's.
Status sample_tokens_and_probs_cpu(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                   int32_t* tokens, float* probs, int32_t* status,
                                   DrawRule draw = DrawRule::kInverseCdf, double* totals = nullptr);

}  // namespace specd
