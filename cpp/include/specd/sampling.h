// Sampling rules: turning a row of logits into the distribution a token is drawn from, and
// drawing it. Speculative verification applies the same transform to target and draft rows,
// so accepted tokens follow exactly the distribution plain sampling would use.
//
// Rules (one row of `vocab` logits; arithmetic in double)
// - temperature == 0: greedy. The distribution is one-hot at argmax(logits), the lowest
//   token id among equal maxima.
// - Otherwise p = softmax(logits / temperature), then, each on the renormalized result of
//   the previous (the softmax as detail/sampling_rules.h computes it: weights
//   w_i = exp((l_i - max) * (1 / temperature)) by a float polynomial that gives the same
//   bits on the host and the device, within 1.1e-7 of exp, relative; p_i = w_i * (1 /
//   sum of w), the sum in double; every renormalization below is likewise a product with
//   the inverse of the sum):
//   1. top_k > 0: keep the top_k most probable tokens (ties at the boundary: lower id first);
//   2. top_p < 1: order tokens by (probability desc, id asc) and keep the shortest prefix
//      whose probability mass is >= top_p (at least one token); the mass is summed in 2^-62
//      fixed point (floor(p * 2^62) per token, detail/sampling_rules.h), which is exact, so
//      parallel code finds the same cut;
//   3. min_p > 0: keep tokens with probability >= min_p * (largest probability).
//   Removed tokens get probability exactly 0; the result is renormalized.
// - Valid parameters: temperature finite and >= 0; top_k >= 0 (0 = off); 0 < top_p <= 1;
//   0 <= min_p <= 1. Logits must not be NaN or +inf (-inf is allowed: probability 0; a row
//   with no finite logit is invalid).
// - Drawing from weights w (>= 0, total > 0) with a uniform u in [0, 1): the first token i, in
//   id order, whose running sum of w exceeds u * total (among tokens with w > 0); if rounding
//   leaves none, the last token with w > 0 (inverse CDF).
#pragma once

#include <cstdint>

#include "specd/span.h"
#include "specd/status.h"

namespace specd {

struct SamplingParams {
  double temperature = 1.0;
  int32_t top_k = 0;
  double top_p = 1.0;
  double min_p = 0.0;
};

Status validate_sampling_params(const SamplingParams& params);

// Index of the largest value (lowest index among ties). `row` must be non-empty and NaN-free.
int32_t argmax(Span<const float> row);

// probs_out[vocab] = the distribution of the rules above for one row of logits[vocab].
Status sampling_probs(Span<const float> logits, const SamplingParams& params, Span<float> probs_out);
// The same for `rows` rows of a row-major [rows, vocab] matrix (row stride `stride` elements).
Status sampling_probs_rows(const float* logits, int32_t rows, int32_t vocab, int64_t stride,
                           const SamplingParams& params, float* probs_out);

// The inverse-CDF draw described above. `total` must be the sum of `weights` (> 0).
int32_t sample_from_weights(Span<const double> weights, double total, double u);

}  // namespace specd
