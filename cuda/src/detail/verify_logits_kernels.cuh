// The kernels of verification from the target's logits and VerifyLogitsLaunch's definition
// (verify_logits_launch.h). Included only by the per-dtype translation units
// (verify_logits_f32.cu, verify_logits_f16.cu, verify_logits_bf16.cu), each of which
// instantiates VerifyLogitsLaunch for its row type; the kernels have internal linkage there.
#pragma once

#include "cluster_launch.cuh"
#include "specd/detail/verify_walk.h"
#include "verify_config.cuh"
#include "verify_logits_launch.h"

namespace specd::cuda {
namespace {

using specd::detail::Emitter;
using specd::detail::RequestNodes;

// From the target's logits (verify_batch.h, TargetLogits): each visited node's row is planned
// by the block (cluster) as the sampling kernels plan a row, the plan kept in shared memory
// (in registers it spilled in those kernels; sample_row.h), one copy per block.
template <class Row, class B>
__device__ void verify_logits_request(B& b, int32_t r, const TreeBatchView& trees, const TargetLogits& target,
                                      const ProbRows& draft, const StochasticRowOptions& options,
                                      DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                      specd::detail::Rejection* rejected) {
  __shared__ specd::detail::RowPlan plan;
  const RngKey key = rng[r];
  const SamplingParams params = target.params[r];
  specd::detail::verify_request(b, trees, r, target.logits.vocab, out, [&](const RequestNodes& n, Emitter& e) {
    specd::detail::LogitTarget<Row> rows{target.logits, target.row_index, params, &plan};
    return specd::detail::stochastic_walk(b, n, e, rows, draft, options, sampling, key, rejected);
  });
}

template <class Row>
__global__ void __launch_bounds__(kThreads)
    verify_logits_kernel(TreeBatchView trees, TargetLogits target, ProbRows draft, StochasticRowOptions options,
                         DraftSampling sampling, const RngKey* rng, VerifyOutputs out) {
  __shared__ PlanBlock::Shared shared;
  __shared__ specd::detail::Rejection rejected[kMaxVerifyChildren];
  PlanBlock b(&shared);
  verify_logits_request<Row>(b, static_cast<int32_t>(blockIdx.x), trees, target, draft, options, sampling, rng, out,
                             rejected);
}

template <class Row>
__global__ void __launch_bounds__(kThreads, kStochasticClusterMinBlocks)
    verify_logits_cluster_kernel(TreeBatchView trees, TargetLogits target, ProbRows draft,
                                 StochasticRowOptions options, DraftSampling sampling, const RngKey* rng,
                                 VerifyOutputs out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ PlanClusterBlk::Shared shared;
  __shared__ specd::detail::Rejection rejected[kMaxVerifyChildren];
  PlanClusterBlk b(&shared);
  verify_logits_request<Row>(b, static_cast<int32_t>(blockIdx.x) / kRowSplitClusterBlocks, trees, target, draft,
                             options, sampling, rng, out, rejected);
  b.finish();
#endif
}

}  // namespace

namespace detail {

template <class Row>
cudaError_t VerifyLogitsLaunch<Row>::run(const TreeBatchView& trees, const TargetLogits& target, const ProbRows& draft,
                                         DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                         cudaStream_t stream, RowSplit split, const StochasticRowOptions& options) {
  return launch_rows(split, verify_logits_kernel<Row>, kThreads, verify_logits_cluster_kernel<Row>, kThreads,
                     trees.batch, stream, trees, target, draft, options, sampling, rng, out);
}

}  // namespace detail
}  // namespace specd::cuda
