// Device helpers shared by the tree-attention kernels (tree_attention.cu, the per-head kernel;
// tree_attention_grouped.cu, the split, head-grouped kernel): warp reductions, vector loads of
// K/V rows, and the rule that picks the aligned (vector-load) path.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kv_dtype.cuh"
#include "specd/tree_attention.h"

namespace specd::cuda::detail {

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;  // every lane holds the total
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// kN consecutive elements at src (aligned to min(16, kN * sizeof(T)) bytes) as floats: one
// load of 4 or 8 bytes, or 16-byte loads.
template <class T, int kN>
__device__ __forceinline__ void load_floats(const T* src, float (&out)[kN]) {
  constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes % 16 == 0, "4, 8 or a multiple of 16 bytes");
  using Word = std::conditional_t<kBytes == 4, unsigned, std::conditional_t<kBytes == 8, uint2, uint4>>;
  constexpr int kWords = kBytes < 16 ? 1 : kBytes / 16;
  Word raw[kWords];
#pragma unroll
  for (int c = 0; c < kWords; ++c) raw[c] = __ldg(reinterpret_cast<const Word*>(src) + c);
  const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
  for (int i = 0; i < kN; ++i) out[i] = detail::to_float(e[i]);
}

// Lanes' dims of the aligned path for this launch: 2, 4 or 8 when head_dim is 64, 128 or
// 256 and every K/V row the kernel reads starts 16 bytes aligned (the caches' base addresses
// and the page stride; rows and heads are multiples of head_dim); else 0 (element loads).
template <class T>
int aligned_lane_dims(const TreeAttentionParams& p) {
  constexpr int64_t kPer = 16 / sizeof(T);
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const int32_t dim = p.layout.head_dim;
  if (!(dim == 64 || dim == 128 || dim == 256)) return 0;
  if (!aligned(p.k_cache) || !aligned(p.v_cache) || p.layout.page_stride % kPer != 0) return 0;
  return dim / 32;
}

}  // namespace specd::cuda::detail
