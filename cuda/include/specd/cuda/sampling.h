// CUDA batched sampling: the rules of specd/sampling_batch.h (CPU versions sample_tokens_cpu
// and sampling_probs_batch_cpu, which run the same row algorithm on one thread) on the
// device, one thread block (or one cluster of blocks: RowSplit) per row, on the
// caller's stream, without host synchronization.
//
// All pointers are device pointers except the LogitRows struct itself (host memory that
// describes device memory):
//   logits.data  [rows, stride] of logits.dtype
//   params       [rows] SamplingParams of each row (validated per row on the device)
//   rng          [rows] RngKey of each row (read only by rows with temperature > 0)
//   tokens       [rows] int32 out: the sampled token, -1 where status != 0
//   probs        [rows, vocab] float32 out: sampling_probs of each row, zeros where status != 0
//   status       [rows] int32 out: SampleStatus
// Returns cudaErrorInvalidValue when validate_sample_tokens / validate_sampling_probs_batch /
// validate_sample_tokens_and_probs fails, cudaSuccess without launching for rows == 0, else the launch error.
//
// Equality with the CPU: the same per-element formulas and the same decisions, so tokens and
// probabilities agree except where the order of a double sum matters: the kernels add in a
// fixed tree order (deterministic run to run), the CPU sequentially, and the device exp() may
// differ from the host's in the last bit. A token can differ only when a draw lands within
// ~1e-15 (relative) of a CDF step, or a top-k/top-p/min-p cut falls on values that differ in
// their last bit (e.g. exact ties whose top-p mass meets top_p exactly after a top-k
// renormalization); a probability may differ by one float ulp.
//
// Cost per row: one pass over the logits for the rows that take one (takes_one_pass,
// gumbel_row.h: greedy rows, and under DrawRule::kGumbelMax rows without a cut; grouped
// 16-byte loads). Under kInverseCdf a call is one launch: greedy rows run their one pass in
// the general kernel. Under kGumbelMax sample_tokens launches a lean kernel of its own for
// the one-pass rows before the general kernel, which skips them (two launches per call:
// inlined in one kernel, the clustered kernel spilled). For other sampled rows about 5 passes,
// plus 9 per top-k/top-p selection (radix selection, no sort) and 2 for min-p. Each pass
// recomputes exp() instead of storing a [rows, vocab] double workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specd/cuda/row_split.h"
#include "specd/sampling_batch.h"

namespace specd::cuda {

// split: one block per row, or a thread-block cluster per row on sm_90+ (specd/cuda/row_split.h).
// Whether kCluster launches clusters on the current device (cluster launch supported and
// sm_90+ code loaded).
bool sampling_clusters_available();

// draw: how sampled rows draw their token (sampling_batch.h). kGumbelMax reads a row without
// a top-k / top-p / min-p cut once, in the lean one-pass kernel (no sums: its tokens equal
// sample_tokens_cpu's exactly);
// rows with a cut run the selection passes first, then that one pass instead of the draw's
// three. An unknown rule fails the call (cudaErrorInvalidValue).
cudaError_t sample_tokens(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                          int32_t* tokens, int32_t* status, cudaStream_t stream,
                          RowSplit split = RowSplit::kOneBlock, DrawRule draw = DrawRule::kInverseCdf);

// totals (device [rows] double, optional): each row's total (sampling_batch.h), what
// verify_stochastic_batch takes instead of summing the row itself (one more block sum per row).
cudaError_t sampling_probs_batch(const LogitRows& logits, const SamplingParams* params, float* probs,
                                 int32_t* status, cudaStream_t stream,
                                 RowSplit split = RowSplit::kOneBlock, double* totals = nullptr);

// Both in one launch (sample_tokens_and_probs_cpu): each row's probabilities as
// sampling_probs_batch writes them, and the token sample_tokens gives, drawn from the row just
// written (the block reads it back after a barrier) instead of recomputing it from the logits.
// draw kGumbelMax: the same rows, tokens drawn from them by sample_tokens_and_probs_cpu's
// Gumbel-max rule (equal to the CPU's tokens whenever the rows are equal: an argmax of keys
// the host and the device compute alike), with no sum and no second pass over the row.
// totals: as sampling_probs_batch's (with the inverse-CDF draw, the draw's own first sum).
cudaError_t sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                    int32_t* tokens, float* probs, int32_t* status, cudaStream_t stream,
                                    RowSplit split = RowSplit::kOneBlock, DrawRule draw = DrawRule::kInverseCdf,
                                    double* totals = nullptr);

}  // namespace specd::cuda
