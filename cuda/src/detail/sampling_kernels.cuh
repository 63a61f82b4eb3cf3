// The sampling kernels and SamplingLaunch's definitions (sampling_launch.h). Included only by
// the per-dtype translation units (sampling_f32.cu, sampling_f16.cu, sampling_bf16.cu), each of
// which instantiates SamplingLaunch for its row type; the kernels have internal linkage there.
#pragma once

#include "cluster_block.cuh"
#include "cluster_launch.cuh"
#include "device_block.cuh"
#include "sampling_launch.h"
#include "specd/cuda/sampling.h"
#include "specd/detail/gumbel_row.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sample_row.h"

namespace specd::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kSelectCache = 2048;  // radix_select's candidate cache (32 KiB of shared memory)
using Block = detail::DeviceBlock<kThreads, kSelectCache>;

// The clustered kernels: kRowSplitClusterBlocks blocks of kClusterThreads threads per row.
constexpr int kClusterThreads = 256;
// Blocks per SM the clustered kernels are compiled for (registers: 80 at 3, 64 at 4). Measured
// on an H100 (docs/benchmarks.md, "Sixth GPU session"): at 4 (up to 528 resident blocks, where
// a 64-row call launches 512), sample_tokens' 64-row calls took 15% less time with
// temperature, 3% with top-p;
// the probability rows (the draft loop's 1-8 rows, where occupancy does not matter) keep 3,
// with fewer spills.
constexpr int kSampleClusterMinBlocks = 4;
constexpr int kProbsClusterMinBlocks = 3;
using ClusterBlk = detail::ClusterBlock<kClusterThreads, kRowSplitClusterBlocks, kSelectCache>;
// The one-pass rows' kernels under kGumbelMax (takes_one_pass: greedy_token_row,
// gumbel_uncut_row): no candidate cache, no plan.
using OnePassBlock = detail::DeviceBlock<kThreads>;
using OnePassClusterBlk = detail::ClusterBlock<kClusterThreads, kRowSplitClusterBlocks>;

// Where a row function keeps its RowPlan (sample_row.h): in shared memory for the clustered
// kernels (in registers it spilled there), else `local` (registers).
template <bool kShared>
__device__ specd::detail::RowPlan& row_plan(specd::detail::RowPlan& local) {
  __shared__ specd::detail::RowPlan shared;
  return kShared ? shared : local;
}

// The Gumbel-max screen's table (gumbel.h), filled by the block's threads.
__device__ void fill_bounds(float* bounds) {
  for (int32_t k = static_cast<int32_t>(threadIdx.x); k < specd::detail::kGumbelBuckets;
       k += static_cast<int32_t>(blockDim.x))
    bounds[k] = specd::detail::gumbel_bucket_bound(k);
  __syncthreads();
}

// The row code of the general kernels, for a Block (DeviceBlock or ClusterBlock) working on
// row r. Rows are dispatched as sample_tokens_cpu does. Under kInverseCdf (kGumbel false)
// every row of the call runs here, greedy rows by greedy_token_row (one pass of grouped
// loads, no plan, no sums), so a call is one launch. Under kGumbel (DrawRule::kGumbelMax;
// the block first fills its copy of the screen table) the rows that take one pass
// (takes_one_pass: greedy rows, rows without a cut) are left to one_pass_row, which
// sample_tokens launches first: inlined beside gumbel_cut_row, gumbel_uncut_row made the
// clustered kernel spill at its 64 registers (ptxas sm_90: 254 bytes, none apart).
template <class Row, bool kSharedPlan, bool kGumbel, class B>
__device__ void sample_tokens_row(B& block, int32_t r, const LogitRows& logits, const SamplingParams* params,
                                  const RngKey* rng, int32_t* tokens, int32_t* status) {
  __shared__ float bounds[kGumbel ? specd::detail::kGumbelBuckets : 1];
  const SamplingParams row_params = params[r];
  // uniform: the whole block (cluster) leaves
  if (kGumbel && specd::detail::takes_one_pass(row_params, DrawRule::kGumbelMax)) return;
  const Row row = Row::at(logits.data, r * logits.stride);
  int32_t token = -1;
  SampleStatus s;
  if (!kGumbel && row_params.temperature == 0) {  // uniform over the block (cluster)
    s = specd::detail::greedy_token_row(block, row, logits.vocab, row_params, &token);
  } else {
    specd::detail::RowPlan local_plan;
    specd::detail::RowPlan& plan = row_plan<kSharedPlan>(local_plan);
    const RngKey key = rng[r];
    if constexpr (kGumbel) {
      fill_bounds(bounds);
      s = specd::detail::gumbel_cut_row(block, row, logits.vocab, row_params, key, bounds, &token, plan);
    } else {
      s = specd::detail::sample_token_row(block, row, logits.vocab, row_params, key, &token, plan);
    }
  }
  if (block.rank() == 0) {
    tokens[r] = token;
    status[r] = static_cast<int32_t>(s);
  }
}

// sample_tokens' one-pass rows under kGumbelMax (takes_one_pass; other rows are left to
// sample_tokens_row): greedy_token_row (temperature 0) and gumbel_uncut_row (no cut; the
// block fills its copy of the screen table first). One pass of grouped loads each.
template <class Row, class B>
__device__ void one_pass_row(B& block, int32_t r, const LogitRows& logits, const SamplingParams* params,
                             const RngKey* rng, int32_t* tokens, int32_t* status) {
  __shared__ float bounds[specd::detail::kGumbelBuckets];
  const SamplingParams row_params = params[r];
  // uniform: the whole block (cluster) leaves
  if (!specd::detail::takes_one_pass(row_params, DrawRule::kGumbelMax)) return;
  int32_t token = -1;
  const Row row = Row::at(logits.data, r * logits.stride);
  SampleStatus s;
  if (row_params.temperature == 0) {
    s = specd::detail::greedy_token_row(block, row, logits.vocab, row_params, &token);
  } else {
    fill_bounds(bounds);
    s = specd::detail::gumbel_uncut_row(block, row, logits.vocab, row_params, rng[r], bounds, &token);
  }
  if (block.rank() == 0) {
    tokens[r] = token;
    status[r] = static_cast<int32_t>(s);
  }
}

// rng and tokens null: probabilities only; else also the token drawn from each row
// (kGumbel: by DrawRule::kGumbelMax, rng and tokens non-null). totals non-null: each row's
// total too (sampling_batch.h).
template <class Row, bool kSharedPlan, bool kGumbel, class B>
__device__ void probs_row(B& block, int32_t r, const LogitRows& logits, const SamplingParams* params,
                          const RngKey* rng, int32_t* tokens, float* probs, int32_t* status, double* totals) {
  __shared__ float bounds[kGumbel ? specd::detail::kGumbelBuckets : 1];
  specd::detail::RowPlan local_plan;
  specd::detail::RowPlan& plan = row_plan<kSharedPlan>(local_plan);
  const SamplingParams row_params = params[r];
  const Row row = Row::at(logits.data, r * logits.stride);
  RngKey key{};
  if (rng != nullptr) key = rng[r];
  int32_t token = -1;
  float* out = probs + int64_t{r} * logits.vocab;
  double* row_total = totals != nullptr ? totals + r : nullptr;  // written by the block's rank 0
  SampleStatus s;
  if constexpr (kGumbel) {
    fill_bounds(bounds);
    s = specd::detail::gumbel_probs_row(block, row, logits.vocab, row_params, out, key, bounds, &token, plan,
                                        row_total);
  } else {
    s = specd::detail::probs_row(block, row, logits.vocab, row_params, out, rng != nullptr ? &key : nullptr,
                                 tokens != nullptr ? &token : nullptr, plan, row_total);
  }
  if (block.rank() == 0) {
    status[r] = static_cast<int32_t>(s);
    if (tokens != nullptr) tokens[r] = token;
  }
}

// One block per row. Arguments by value: their pointers are device pointers.
template <class Row, bool kGumbel>
__global__ void __launch_bounds__(kThreads)
    sample_tokens_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng, int32_t* tokens,
                         int32_t* status) {
  __shared__ Block::Shared shared;
  Block block(&shared);
  sample_tokens_row<Row, false, kGumbel>(block, static_cast<int32_t>(blockIdx.x), logits, params, rng, tokens,
                                         status);
}

template <class Row>
__global__ void __launch_bounds__(kThreads)
    one_pass_tokens_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng, int32_t* tokens,
                           int32_t* status) {
  __shared__ OnePassBlock::Shared shared;
  OnePassBlock block(&shared);
  one_pass_row<Row>(block, static_cast<int32_t>(blockIdx.x), logits, params, rng, tokens, status);
}

template <class Row, bool kGumbel>
__global__ void __launch_bounds__(kThreads)
    sampling_probs_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng, int32_t* tokens,
                          float* probs, int32_t* status, double* totals) {
  __shared__ Block::Shared shared;
  Block block(&shared);
  probs_row<Row, false, kGumbel>(block, static_cast<int32_t>(blockIdx.x), logits, params, rng, tokens, probs,
                                 status, totals);
}

// A cluster of kRowSplitClusterBlocks blocks per row (launched with the cluster dimension
// by detail::launch_rows; sm_90+ only: the body is empty in code for older GPUs, which
// cluster_ready() never launches).
template <class Row, bool kGumbel>
__global__ void __launch_bounds__(kClusterThreads, kSampleClusterMinBlocks)
    sample_tokens_cluster_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng, int32_t* tokens,
                                 int32_t* status) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ ClusterBlk::Shared shared;
  ClusterBlk block(&shared);
  sample_tokens_row<Row, true, kGumbel>(block, static_cast<int32_t>(blockIdx.x) / kRowSplitClusterBlocks, logits,
                                        params, rng, tokens, status);
  block.finish();
#endif
}

template <class Row>
__global__ void __launch_bounds__(kClusterThreads)
    one_pass_tokens_cluster_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng,
                                   int32_t* tokens, int32_t* status) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ OnePassClusterBlk::Shared shared;
  OnePassClusterBlk block(&shared);
  one_pass_row<Row>(block, static_cast<int32_t>(blockIdx.x) / kRowSplitClusterBlocks, logits, params, rng,
                             tokens, status);
  block.finish();
#endif
}

template <class Row, bool kGumbel>
__global__ void __launch_bounds__(kClusterThreads, kProbsClusterMinBlocks)
    sampling_probs_cluster_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng,
                                  int32_t* tokens, float* probs, int32_t* status, double* totals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ ClusterBlk::Shared shared;
  ClusterBlk block(&shared);
  probs_row<Row, true, kGumbel>(block, static_cast<int32_t>(blockIdx.x) / kRowSplitClusterBlocks, logits, params, rng,
                                tokens, probs, status, totals);
  block.finish();
#endif
}

}  // namespace

namespace detail {

template <class Row>
cudaError_t SamplingLaunch<Row>::sample_tokens(const LogitRows& logits, const SamplingParams* params,
                                               const RngKey* rng, int32_t* tokens, int32_t* status,
                                               cudaStream_t stream, RowSplit split, DrawRule draw) {
  if (draw != DrawRule::kGumbelMax)  // one kernel for every row
    return launch_rows(split, sample_tokens_kernel<Row, false>, kThreads, sample_tokens_cluster_kernel<Row, false>,
                       kClusterThreads, logits.rows, stream, logits, params, rng, tokens, status);
  // Gumbel-max: the one-pass rows first, in their own kernel, then the rows with a cut.
  const cudaError_t one_pass = launch_rows(split, one_pass_tokens_kernel<Row>, kThreads,
                                           one_pass_tokens_cluster_kernel<Row>, kClusterThreads, logits.rows, stream,
                                           logits, params, rng, tokens, status);
  if (one_pass != cudaSuccess) return one_pass;
  return launch_rows(split, sample_tokens_kernel<Row, true>, kThreads, sample_tokens_cluster_kernel<Row, true>,
                     kClusterThreads, logits.rows, stream, logits, params, rng, tokens, status);
}

template <class Row>
cudaError_t SamplingLaunch<Row>::sampling_probs(const LogitRows& logits, const SamplingParams* params, float* probs,
                                                int32_t* status, cudaStream_t stream, RowSplit split,
                                                double* totals) {
  return launch_rows(split, sampling_probs_kernel<Row, false>, kThreads, sampling_probs_cluster_kernel<Row, false>,
                     kClusterThreads, logits.rows, stream, logits, params, static_cast<const RngKey*>(nullptr),
                     static_cast<int32_t*>(nullptr), probs, status, totals);
}

template <class Row>
cudaError_t SamplingLaunch<Row>::sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params,
                                                         const RngKey* rng, int32_t* tokens, float* probs,
                                                         int32_t* status, cudaStream_t stream, RowSplit split,
                                                         DrawRule draw, double* totals) {
  if (draw == DrawRule::kGumbelMax)
    return launch_rows(split, sampling_probs_kernel<Row, true>, kThreads, sampling_probs_cluster_kernel<Row, true>,
                       kClusterThreads, logits.rows, stream, logits, params, rng, tokens, probs, status, totals);
  return launch_rows(split, sampling_probs_kernel<Row, false>, kThreads, sampling_probs_cluster_kernel<Row, false>,
                     kClusterThreads, logits.rows, stream, logits, params, rng, tokens, probs, status, totals);
}

template <class Row>
bool SamplingLaunch<Row>::clusters_available() {
  return cluster_ready(sample_tokens_cluster_kernel<Row, false>);
}

}  // namespace detail
}  // namespace specd::cuda
