// verify_stochastic_logits_batch's launcher for one logits dtype. Each dtype's kernels are
// compiled in a translation unit of their own (verify_logits_f32.cu, verify_logits_f16.cu,
// verify_logits_bf16.cu), so the three build side by side (in verify.cu they made it the
// longest compile of the build); verify.cu validates the arguments and dispatches by dtype.
#pragma once

#include <cuda_runtime_api.h>

#include "specd/cuda/row_split.h"
#include "specd/detail/logit_rows.h"
#include "specd/verify_batch.h"

namespace specd::cuda::detail {

// Row: specd::detail::Float32Row, Float16Row or BFloat16Row (logit_rows.h). The arguments are
// verify.h's, already validated; trees.batch > 0; draft: empty rows (data null) for none.
template <class Row>
struct VerifyLogitsLaunch {
  static cudaError_t run(const TreeBatchView& trees, const TargetLogits& target, const ProbRows& draft,
                         DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out, cudaStream_t stream,
                         RowSplit split, const StochasticRowOptions& options);
};

extern template struct VerifyLogitsLaunch<specd::detail::Float32Row>;
extern template struct VerifyLogitsLaunch<specd::detail::Float16Row>;
extern template struct VerifyLogitsLaunch<specd::detail::BFloat16Row>;

}  // namespace specd::cuda::detail
