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

// Calls fn(d, k[d] as float) for d = 0 .. kDim - 1 in order, over a row of exactly kDim
// elements starting 16 bytes aligned: 16-byte loads, up to eight issued before their elements
// are used.
template <class T, int kDim, class Fn>
__device__ __forceinline__ void for_each_aligned_element(const T* k, Fn&& fn) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  constexpr int kVectors = kDim / kPer;
  constexpr int kChunk = kVectors < 8 ? kVectors : 8;
  static_assert(kDim % kPer == 0 && kVectors % kChunk == 0, "whole 16-byte vectors");
  const uint4* src = reinterpret_cast<const uint4*>(k);
#pragma unroll
  for (int c0 = 0; c0 < kVectors; c0 += kChunk) {
    uint4 raw[kChunk];
#pragma unroll
    for (int c = 0; c < kChunk; ++c) raw[c] = __ldg(src + c0 + c);
#pragma unroll
    for (int c = 0; c < kChunk; ++c) {
      const T* e = reinterpret_cast<const T*>(&raw[c]);
#pragma unroll
      for (int i = 0; i < kPer; ++i) fn((c0 + c) * kPer + i, to_float(e[i]));
    }
  }
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

// The value rows of keys j0 .. j0 + 7 of a warp's tile of 32 (key u's row offset `off` is held
// by lane u; -1: no row), this lane's kLaneDims dims of each, as floats in v8[u][i]: zeros for
// a key without a row and for dims past `dim`. All eight loads are issued before any use.
// kDpl > 0: the lane's dims are [kDpl lane, kDpl lane + kDpl) of an aligned row of exactly
// 32 kDpl dims, one vector load per key; kDpl = 0: dims lane + 32 i, element loads.
template <class T, int kDpl, int kLaneDims>
__device__ __forceinline__ void load_value_rows(const T* v_cache, long long off, int j0, int lane, int32_t dim,
                                                float (&v8)[8][kLaneDims]) {
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const long long o = __shfl_sync(0xffffffffu, off, j0 + u);
    if constexpr (kDpl > 0) {
      if (o >= 0) {
        load_floats<T, kDpl>(v_cache + o + kDpl * lane, v8[u]);
      } else {
#pragma unroll
        for (int i = 0; i < kLaneDims; ++i) v8[u][i] = 0.f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) {
        const int d = lane + 32 * i;
        v8[u][i] = (o >= 0 && d < dim) ? to_float(v_cache[o + d]) : 0.f;
      }
    }
  }
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
