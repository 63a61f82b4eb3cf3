// CUDA batched verification: the rules of specd/verify_batch.h (CPU versions
// verify_*_batch_cpu, which run the same per-request algorithm on one thread) on the device,
// on the caller's stream, without host synchronization. Each request's result equals the
// single-request CPU reference (verify_greedy / verify_greedy_tokens / verify_stochastic) for
// the same inputs and RngKey.
//
// All pointers are device pointers except the structs themselves (host memory describing
// device memory); layouts as in verify_batch.h:
//   trees.node_offsets [batch + 1], trees.parents / trees.tokens [num_nodes]
//   target / draft rows [rows >= num_nodes, stride]: row of global node n = n
//   target_tokens [num_nodes] (greedy tokens: the target's argmax per node)
//   rng [batch]
//   out.tokens / out.path [num_nodes] (node layout) or [batch, out.stride] (padded layout),
//   out.num_accepted / out.status [batch]
// Returns cudaErrorInvalidValue when the matching validate_verify_* fails, cudaSuccess
// without launching for batch == 0, else the launch error. Input errors of one request are
// reported in out.status[r] (VerifyStatus), never as a failed call.
//
// Launch shapes: greedy uses one block of 1024 threads per request or, with RowSplit::kCluster,
// a cluster of 8 blocks of 256 threads (a request's rows are read in turn, so one block per
// request leaves every SM but `batch` idle: 8 of 132 on an H200 at batch 8); stochastic one
// block of 256 threads per request or, with kCluster, a cluster of 8 such blocks (a row pass
// is a strided loop with block or cluster reductions); greedy tokens uses one thread per
// request.
// Stochastic verification recomputes the residual distribution of a node from its rows and
// the totals of the siblings rejected so far (at most kMaxVerifyChildren, kept in shared
// memory), so a node whose j-th child is tried costs O(j * vocab) per pass.
//
// Equality with the CPU: tokens agree except when a random draw lands within ~1e-15
// (relative) of an acceptance or CDF boundary, because the kernels' double sums are tree
// sums and the CPU's are sequential (see cuda/sampling.h); greedy results agree exactly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specd/cuda/row_split.h"
#include "specd/verify_batch.h"

namespace specd::cuda {

// split: as verify_stochastic_batch's (the argmax does not depend on it: the same results).
cudaError_t verify_greedy_batch(const TreeBatchView& trees, const LogitRows& target, const VerifyOutputs& out,
                                cudaStream_t stream, RowSplit split = RowSplit::kOneBlock);

cudaError_t verify_greedy_tokens_batch(const TreeBatchView& trees, const int32_t* target_tokens,
                                       const VerifyOutputs& out, cudaStream_t stream);

// draft == nullptr: no draft rows (deterministic proposals; `sampling` is ignored).
// split: one block of 256 threads per request, or a thread-block cluster of 8 blocks of 256
// per request on sm_90+ (specd/cuda/row_split.h; validated and timed on an H100).
// options: device pointers (or null), as verify_stochastic_batch_cpu's (verify_batch.h).
cudaError_t verify_stochastic_batch(const TreeBatchView& trees, const ProbRows& target, const ProbRows* draft,
                                    DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                    cudaStream_t stream, RowSplit split = RowSplit::kOneBlock,
                                    const StochasticRowOptions& options = {});

// From the target's logits and each request's SamplingParams (verify_batch.h, TargetLogits;
// target.logits.data and target.params are device pointers): each visited node's row is
// planned in the kernel (the sampling kernels' plan, kept in shared memory) and its entries
// recomputed from the logits where they are read; no probability row is written or read for
// the target. split, draft, options as verify_stochastic_batch's (options.target_totals null).
// Equality with verify_stochastic_batch on sampling_probs_batch's rows and totals: the same
// bits where the two calls fold their sums alike (clusters of 8 x 256 threads on both: kCluster
// here and sampling_probs_batch's kCluster), else up to the order of the additions, as above.
cudaError_t verify_stochastic_logits_batch(const TreeBatchView& trees, const TargetLogits& target,
                                           const ProbRows* draft, DraftSampling sampling, const RngKey* rng,
                                           const VerifyOutputs& out, cudaStream_t stream,
                                           RowSplit split = RowSplit::kOneBlock,
                                           const StochasticRowOptions& options = {});

// Whether RowSplit::kCluster launches clusters for verify_stochastic_batch (and
// verify_stochastic_logits_batch) on this device.
bool verify_clusters_available();

}  // namespace specd::cuda
