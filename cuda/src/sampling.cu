#include "specd/cuda/sampling.h"

#include "detail/sampling_launch.h"

namespace specd::cuda {

// The kernels are compiled per logits dtype (detail/sampling_launch.h); these validate and dispatch.

bool sampling_clusters_available() {
  return detail::SamplingLaunch<specd::detail::Float32Row>::clusters_available();
}

cudaError_t sample_tokens(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                          int32_t* tokens, int32_t* status, cudaStream_t stream, RowSplit split, DrawRule draw) {
  if (!validate_sample_tokens(logits, params, rng, tokens, status).ok() || !validate_draw_rule(draw).ok())
    return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(logits.dtype, [&](auto row) {
    return detail::SamplingLaunch<decltype(row)>::sample_tokens(logits, params, rng, tokens, status, stream, split,
                                                                draw);
  });
}

cudaError_t sampling_probs_batch(const LogitRows& logits, const SamplingParams* params, float* probs,
                                 int32_t* status, cudaStream_t stream, RowSplit split, double* totals) {
  if (!validate_sampling_probs_batch(logits, params, probs, status).ok()) return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(logits.dtype, [&](auto row) {
    return detail::SamplingLaunch<decltype(row)>::sampling_probs(logits, params, probs, status, stream, split, totals);
  });
}

cudaError_t sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                    int32_t* tokens, float* probs, int32_t* status, cudaStream_t stream,
                                    RowSplit split, DrawRule draw, double* totals) {
  if (!validate_sample_tokens_and_probs(logits, params, rng, tokens, probs, status).ok() ||
      !validate_draw_rule(draw).ok())
    return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(logits.dtype, [&](auto row) {
    return detail::SamplingLaunch<decltype(row)>::sample_tokens_and_probs(logits, params, rng, tokens, probs, status,
                                                                          stream, split, draw, totals);
  });
}

}  // namespace specd::cuda
