// CUDA paged tree attention: the rule of specd/tree_attention.h (CPU reference
// tree_attention_cpu) on the device, on the caller's stream, without host sync.
//
// Kernel: one thread block of W warps per (query token, query head). The warps split the
// request's KV positions in tiles of 32 (warp w takes tiles w, w + W, ...). In a tile each lane
// scores one key: it walks the block table, then reads the key's whole row (16-byte vector
// loads when rows are aligned, else element loads) against q held in shared memory, so the 32
// keys' loads are in flight together. The warp then updates its online softmax once per tile
// (a max and a sum over lanes) and accumulates the tile's values with lanes over dimensions.
// The warps' partial (max, sum, output) are merged through shared memory. Float accumulation
// for every dtype. W (tree_attention_warps): 16 when the grid (tokens x q heads) fits in one
// wave of 512-thread blocks (4 per SM), else 4 (the rule measured on an H100 for the first,
// key-per-warp version of this kernel; docs/benchmarks.md). No split over blocks for long
// histories, and GQA heads re-read their K/V through the cache. It is the attention of the
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
