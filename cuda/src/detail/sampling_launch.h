// The sampling kernels' launchers for one logits dtype. Each dtype's kernels are compiled in a
// translation unit of their own (sampling_f32.cu, sampling_f16.cu, sampling_bf16.cu), so the
// three build side by side (as one file it was the longest compile of the build, with
// verify.cu); sampling.cu validates the arguments and dispatches by dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specd/cuda/row_split.h"
#include "specd/detail/logit_rows.h"
#include "specd/sampling_batch.h"

namespace specd::cuda::detail {

// Row: specd::detail::Float32Row, Float16Row or BFloat16Row (logit_rows.h). The arguments are
// sampling.h's, already validated; logits.rows > 0.
template <class Row>
struct SamplingLaunch {
  static cudaError_t sample_tokens(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                   int32_t* tokens, int32_t* status, cudaStream_t stream, RowSplit split,
                                   DrawRule draw);
  static cudaError_t sampling_probs(const LogitRows& logits, const SamplingParams* params, float* probs,
                                    int32_t* status, cudaStream_t stream, RowSplit split, double* totals);
  static cudaError_t sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params,
                                             const RngKey* rng, int32_t* tokens, float* probs, int32_t* status,
                                             cudaStream_t stream, RowSplit split, DrawRule draw, double* totals);
  // Whether the clustered kernels can launch on the current device (cluster_ready).
  static bool clusters_available();
};

extern template struct SamplingLaunch<specd::detail::Float32Row>;
extern template struct SamplingLaunch<specd::detail::Float16Row>;
extern template struct SamplingLaunch<specd::detail::BFloat16Row>;

}  // namespace specd::cuda::detail
