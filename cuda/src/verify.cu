#include "specd/cuda/verify.h"

#include "detail/cluster_launch.cuh"
#include "detail/verify_config.cuh"
#include "detail/verify_logits_launch.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/serial_block.h"
#include "specd/detail/verify_walk.h"

namespace specd::cuda {
namespace {

using specd::detail::Emitter;
using specd::detail::RequestNodes;

// Kernel arguments are passed by value: their pointers are device pointers.

// Greedy verification of request r from its nodes' logits rows by the block (or cluster) b.
template <class Row, class B>
__device__ void greedy_request(B& b, int32_t r, const TreeBatchView& trees, const LogitRows& target,
                               const VerifyOutputs& out) {
  specd::detail::verify_request(b, trees, r, target.vocab, out, [&](const RequestNodes& n, Emitter& e) {
    return specd::detail::greedy_walk(b, n, e, [&](int32_t node, int32_t* token) {
      const Row row = Row::at(target.data, int64_t{n.begin + node} * target.stride);
      return specd::detail::row_argmax(b, row, target.vocab, token);
    });
  });
}

// The walk reads one row per visited node, so a request's time is its rows' latency: a whole
// 1024-thread block per request with many loads in flight (row_argmax) keeps it short.
template <class Row>
__global__ void __launch_bounds__(kGreedyThreads)
    verify_greedy_kernel(TreeBatchView trees, LogitRows target, VerifyOutputs out) {
  __shared__ GreedyBlock::Shared shared;
  GreedyBlock b(&shared);
  greedy_request<Row>(b, static_cast<int32_t>(blockIdx.x), trees, target, out);
}

// A cluster of kRowSplitClusterBlocks blocks of kThreads per request (sm_90+; the body is
// empty in code for older GPUs, which detail::cluster_ready() never launches): each row's
// argmax is spread over 8 SMs.
template <class Row>
__global__ void __launch_bounds__(kThreads)
    verify_greedy_cluster_kernel(TreeBatchView trees, LogitRows target, VerifyOutputs out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ ClusterBlk::Shared shared;
  ClusterBlk b(&shared);
  greedy_request<Row>(b, static_cast<int32_t>(blockIdx.x) / kRowSplitClusterBlocks, trees, target, out);
  b.finish();
#endif
}

__global__ void verify_greedy_tokens_kernel(TreeBatchView trees, const int32_t* target_tokens, VerifyOutputs out) {
  const int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (r >= trees.batch) return;
  specd::detail::SerialBlock b;  // this thread alone verifies request r
  specd::detail::verify_request(b, trees, static_cast<int32_t>(r), 0, out, [&](const RequestNodes& n, Emitter& e) {
    return specd::detail::greedy_walk(b, n, e, [&](int32_t node, int32_t* token) {
      *token = target_tokens[n.begin + node];
      return *token < 0 ? VerifyStatus::kBadToken : VerifyStatus::kOk;
    });
  });
}

// draft.data == nullptr: no draft rows.
__global__ void __launch_bounds__(kThreads)
    verify_stochastic_kernel(TreeBatchView trees, ProbRows target, ProbRows draft, StochasticRowOptions options,
                             DraftSampling sampling, const RngKey* rng, VerifyOutputs out) {
  __shared__ Block::Shared shared;
  __shared__ specd::detail::Rejection rejected[kMaxVerifyChildren];
  Block b(&shared);
  const auto r = static_cast<int32_t>(blockIdx.x);
  const RngKey key = rng[r];
  specd::detail::verify_request(b, trees, r, target.vocab, out, [&](const RequestNodes& n, Emitter& e) {
    specd::detail::ProbTarget rows{target, options.target_totals};
    return specd::detail::stochastic_walk(b, n, e, rows, draft, options, sampling, key, rejected);
  });
}

// A thread-block cluster of kRowSplitClusterBlocks blocks per request (sm_90+; the body is
// empty in code for older GPUs, which detail::cluster_ready() never launches). Each block
// keeps its own copy of the rejected siblings' totals (written by its leader).
__global__ void __launch_bounds__(kThreads, kStochasticClusterMinBlocks)
    verify_stochastic_cluster_kernel(TreeBatchView trees, ProbRows target, ProbRows draft,
                                     StochasticRowOptions options, DraftSampling sampling, const RngKey* rng,
                                     VerifyOutputs out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ ClusterBlk::Shared shared;
  __shared__ specd::detail::Rejection rejected[kMaxVerifyChildren];
  ClusterBlk b(&shared);
  const auto r = static_cast<int32_t>(blockIdx.x) / kRowSplitClusterBlocks;
  const RngKey key = rng[r];
  specd::detail::verify_request(b, trees, r, target.vocab, out, [&](const RequestNodes& n, Emitter& e) {
    specd::detail::ProbTarget rows{target, options.target_totals};
    return specd::detail::stochastic_walk(b, n, e, rows, draft, options, sampling, key, rejected);
  });
  b.finish();
#endif
}

}  // namespace

cudaError_t verify_greedy_batch(const TreeBatchView& trees, const LogitRows& target, const VerifyOutputs& out,
                                cudaStream_t stream, RowSplit split) {
  if (!validate_verify_greedy(trees, target, out).ok()) return cudaErrorInvalidValue;
  if (trees.batch == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(target.dtype, [&](auto row) {
    using Row = decltype(row);
    return detail::launch_rows(split, verify_greedy_kernel<Row>, kGreedyThreads, verify_greedy_cluster_kernel<Row>,
                               kThreads, trees.batch, stream, trees, target, out);
  });
}

cudaError_t verify_greedy_tokens_batch(const TreeBatchView& trees, const int32_t* target_tokens,
                                       const VerifyOutputs& out, cudaStream_t stream) {
  if (!validate_verify_greedy_tokens(trees, target_tokens, out).ok()) return cudaErrorInvalidValue;
  if (trees.batch == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((int64_t{trees.batch} + kTokensThreads - 1) / kTokensThreads);
  verify_greedy_tokens_kernel<<<blocks, kTokensThreads, 0, stream>>>(trees, target_tokens, out);
  return cudaGetLastError();
}

cudaError_t verify_stochastic_batch(const TreeBatchView& trees, const ProbRows& target, const ProbRows* draft,
                                    DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                    cudaStream_t stream, RowSplit split, const StochasticRowOptions& options) {
  if (!validate_verify_stochastic(trees, target, draft, sampling, rng, out, options).ok())
    return cudaErrorInvalidValue;
  if (trees.batch == 0) return cudaSuccess;
  const ProbRows draft_rows = draft != nullptr ? *draft : ProbRows{};
  return detail::launch_rows(split, verify_stochastic_kernel, kThreads, verify_stochastic_cluster_kernel, kThreads,
                             trees.batch, stream, trees, target, draft_rows, options, sampling, rng, out);
}

cudaError_t verify_stochastic_logits_batch(const TreeBatchView& trees, const TargetLogits& target,
                                           const ProbRows* draft, DraftSampling sampling, const RngKey* rng,
                                           const VerifyOutputs& out, cudaStream_t stream, RowSplit split,
                                           const StochasticRowOptions& options) {
  if (!validate_verify_stochastic_logits(trees, target, draft, sampling, rng, out, options).ok())
    return cudaErrorInvalidValue;
  if (trees.batch == 0) return cudaSuccess;
  const ProbRows draft_rows = draft != nullptr ? *draft : ProbRows{};
  return specd::detail::dispatch_logits_dtype(target.logits.dtype, [&](auto row) {  // detail/verify_logits_launch.h
    return detail::VerifyLogitsLaunch<decltype(row)>::run(trees, target, draft_rows, sampling, rng, out, stream, split,
                                                          options);
  });
}

bool verify_clusters_available() { return detail::cluster_ready(verify_stochastic_cluster_kernel); }

}  // namespace specd::cuda
