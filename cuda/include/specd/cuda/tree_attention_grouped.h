// CUDA paged tree attention, split and head-grouped: the rule of specd/tree_attention.h (CPU
// reference tree_attention_cpu), like specd::cuda::tree_attention, with a different
// distribution of the work:
//
// - Head groups. One thread block serves up to kTreeAttentionGroupedHeads query heads that
//   share a kv head (GQA group; a larger group takes several blocks), so each K/V row is read
//   once per block instead of once per query head, and each key's block-table walk is shared.
//   Each lane scores one key of a tile of 32 for every head of the block.
// - Split KV (detail/attention_split.h). The request's KV positions are cut into up to
//   max_splits contiguous splits of at least kTreeAttentionMinKeysPerSplit keys; a block
//   per (query token, head group, split) writes its partial softmax state to the workspace,
//   and a second kernel merges them into out. A request whose plan has one split is written
//   straight to out. So a batch of one request with a long history still fills the GPU.
//
// Grid: (num_tokens, kv_heads * ceil(group / kTreeAttentionGroupedHeads), max_splits), 4 warps
// per block; blocks whose split is past their request's plan return at once. max_splits is the
// host's choice (tree_attention_grouped_max_splits: by grid size only, so a CUDA graph captured
// once serves any kv_lens); the workspace (float, caller-allocated on the device) holds
// [num_tokens, q_heads, max_splits, head_dim + 2] partial states and is not needed when
// max_splits is 1.
//
// Status: checked against the CPU reference on an H100 (test_tree_attention_cuda.cc) and timed
// there (docs/benchmarks.md, "Fifth GPU session"): the engine takes it for forwards of many
// query tokens (KernelChoice grouped_attention "auto"), the per-head kernel
// (cuda/tree_attention.h) below.
//
// All pointers are device pointers. Returns cudaSuccess, cudaErrorInvalidValue when
// validate_tree_attention_grouped_launch fails, or the launch error. Keys without a slot are
// skipped and tokens no request owns get zeros, as in the per-head kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "specd/status.h"
#include "specd/tree_attention.h"

namespace specd::cuda {

inline constexpr int32_t kTreeAttentionGroupedHeads = 8;      // query heads per block at most
inline constexpr int32_t kTreeAttentionGroupedWarps = 4;
inline constexpr int32_t kTreeAttentionMaxSplits = 64;
inline constexpr int32_t kTreeAttentionMinKeysPerSplit = 128;  // one round of the block's 4 warps

struct TreeAttentionWorkspace {
  float* data = nullptr;    // [num_tokens, q_heads, max_splits, head_dim + 2]; may be null when max_splits == 1
  int64_t floats = 0;       // its size in floats
  int32_t max_splits = 1;   // in [1, kTreeAttentionMaxSplits]
};

// Blocks of the grid before splitting: num_tokens x kv_heads x ceil(group / kTreeAttentionGroupedHeads).
int64_t tree_attention_grouped_blocks(int32_t num_tokens, int32_t q_heads, int32_t kv_heads);

// Splits for a grid of `blocks` (above) on a GPU of `sm_count` multiprocessors: enough for four
// blocks per multiprocessor, ceil(4 * sm_count / blocks), within [1, kTreeAttentionMaxSplits];
// 1 when sm_count <= 0.
int32_t tree_attention_grouped_max_splits(int64_t blocks, int sm_count);

// Workspace floats the launch needs: 0 when max_splits == 1, else
// num_tokens * q_heads * max_splits * (head_dim + 2).
int64_t tree_attention_grouped_workspace_floats(const TreeAttentionParams& params, int32_t max_splits);

// validate_tree_attention plus this kernel's limits: head_dim <= 256, max_splits in
// [1, kTreeAttentionMaxSplits], a workspace of at least tree_attention_grouped_workspace_floats
// when max_splits > 1, and a grid within CUDA's limits.
Status validate_tree_attention_grouped_launch(const TreeAttentionParams& params, const TreeAttentionWorkspace& workspace);

cudaError_t tree_attention_grouped(const TreeAttentionParams& params, const TreeAttentionWorkspace& workspace,
                                   cudaStream_t stream);

}  // namespace specd::cuda
