// CUDA paged tree attention: the rule of specd/tree_attention.h (CPU reference
// tree_attention_cpu) on the device, on the caller's stream, without host sync.
//
// Kernel: one thread block of kTreeAttentionWarps warps per (query token, query head). The
// warps split the request's KV positions (warp w takes w, w + warps, ...); each runs an online
// softmax over its keys (one key at a time: lanes hold head_dim / 32 dimensions of q and of
// the running output, the q.k dot product is a warp reduction), then the warps' partial
// (max, sum, output) are merged through shared memory. Float accumulation for every dtype.
// Each key costs a warp a dependent chain (loads, a 5-step shuffle reduction, two expf), so a
// decode step's latency is about kv_len / kTreeAttentionWarps such chains: 16 warps (was 4,
// which made a 24-layer draft step at a 256-token context spend most of its time here).
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
inline constexpr int kTreeAttentionWarps = 16;

// validate_tree_attention plus the kernel's limits: head_dim <= kTreeAttentionMaxHeadDim,
// q_heads <= kTreeAttentionMaxQHeads.
Status validate_tree_attention_launch(const TreeAttentionParams& params);

cudaError_t tree_attention(const TreeAttentionParams& params, cudaStream_t stream);

}  // namespace specd::cuda
