// CUDA paged tree attention: the rule of specd/tree_attention.h (CPU reference
// tree_attention_cpu) on the device, on the caller's stream, without host sync.
//
// Kernel: one thread block of W warps per (query token, query head). The
// warps split the request's KV positions (warp w takes w, w + warps, ...); each runs an online
// softmax over its keys (one key at a time: lanes hold head_dim / 32 dimensions of q and of
// the running output, the q.k dot product is a warp reduction), then the warps' partial
// (max, sum, output) are merged through shared memory. Float accumulation for every dtype.
// Each key costs a warp a dependent chain (loads, a 5-step shuffle reduction, two expf), so a
// block's latency is about kv_len / W such chains. W (tree_attention_warps): 16 when the grid
// (tokens x q heads) fits in one wave of 512-thread blocks (4 per SM), else 4. Measured on an
// H100 (docs/benchmarks.md) for the pair's shapes at a 256-token context: 16 warps cut a batch-1
// draft step from 2.96 to 1.81 ms and lose from about 560 blocks on (more blocks than fit at
// once, and a longer merge); 4 warps keep the large batches and prefills as they were.
// Still a straightforward kernel (no K/V tiling in shared memory, no split over blocks for
// long histories, GQA heads re-read their K/V through the cache). It is the attention of the
// graph runners (KernelAttention); the eager plain path keeps torch SDPA.
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue
// when validate_tree_attention_launch fails, or the launch error. Keys without a slot are
// skipped and tokens no request owns get zeros (the kernel cannot report per-item errors).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specd/status.h"
#include "specd/tree_attention.h"

namespace specd::cuda {

inline constexpr int32_t kTreeAttentionMaxHeadDim = 256;
inline constexpr int32_t kTreeAttentionMaxQHeads = 65535;  // grid y
inline constexpr int kTreeAttentionWarpsFew = 4;
inline constexpr int kTreeAttentionWarpsMany = 16;
inline constexpr int kTreeAttentionBlocksPerSmForManyWarps = 4;  // 512-thread blocks resident per SM

// Warps per block for a grid of `blocks` (query tokens x q heads) on a GPU of `sm_count`
// multiprocessors: kTreeAttentionWarpsMany when blocks <= 4 * sm_count, else kTreeAttentionWarpsFew.
int tree_attention_warps(int64_t blocks, int sm_count);

// validate_tree_attention plus the kernel's limits: head_dim <= kTreeAttentionMaxHeadDim,
// q_heads <= kTreeAttentionMaxQHeads.
Status validate_tree_attention_launch(const TreeAttentionParams& params);

cudaError_t tree_attention(const TreeAttentionParams& params, cudaStream_t stream);

}  // namespace specd::cuda
