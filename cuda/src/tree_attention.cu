#include "specd/cuda/tree_attention.h"

#include <cmath>  // INFINITY
#include <cstdint>

#include "detail/attention_math.cuh"
#include "detail/kv_dtype.cuh"

namespace specd::cuda {
namespace {

constexpr int kDimsPerLane = kTreeAttentionMaxHeadDim / 32;  // lane holds dims lane + 32 * i

// q . k for one key row of `dim` elements at k (element loads), q in shared memory (float).
// Four partial sums keep the FMA chain short.
template <class T>
__device__ __forceinline__ float key_dot(const float* s_q, const T* k, int32_t dim) {
  float part[4] = {0.f, 0.f, 0.f, 0.f};
  for (int32_t d = 0; d < dim; ++d) part[d & 3] += s_q[d] * detail::to_float(k[d]);
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// The same for a row of exactly kDim elements, 16-byte aligned: 16-byte loads, issued up to
// eight at a time before their products.
template <class T, int kDim>
__device__ __forceinline__ float key_dot_aligned(const float* s_q, const T* k) {
  float part[4] = {0.f, 0.f, 0.f, 0.f};
  detail::for_each_aligned_element<T, kDim>(k, [&](int d, float kf) { part[d & 3] += s_q[d] * kf; });
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// Block (t, h): query token t, query head h, kWarps warps. params by value: its pointers are
// device pointers. Keys go in tiles of 32, a warp per tile (warp w takes tiles w, w + kWarps,
// ...): each lane scores one key (its whole q.k dot product, so the 32 keys' loads are in
// flight together), the warp updates its online softmax once per tile, then accumulates the
// tile's values with lanes over dimensions, loading eight keys' values before using them.
// kDpl: 0, any head_dim, lane holds dims lane + 32 i (element loads); 2, 4 or 8: head_dim is
// exactly 32 kDpl and rows are aligned (aligned_lane_dims), lane holds dims [kDpl lane, kDpl lane +
// kDpl) and loads them with one vector load per key.
template <class T, int kWarps, int kDpl>
__global__ void __launch_bounds__(kWarps * 32) tree_attention_kernel(TreeAttentionParams p) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kLaneDims = kDpl > 0 ? kDpl : kDimsPerLane;
  __shared__ float s_q[kTreeAttentionMaxHeadDim];
  __shared__ float s_max[kWarps];
  __shared__ float s_sum[kWarps];
  __shared__ float s_out[kWarps][kTreeAttentionMaxHeadDim];

  const int32_t t = static_cast<int32_t>(blockIdx.x);
  const int32_t h = static_cast<int32_t>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int32_t dim = p.layout.head_dim;
  const TreeQuery tq = tree_attention_query(p, t);
  // Dimension i of this lane (kLaneDims of them; >= dim: none).
  const auto lane_dim = [&](int i) { return kDpl > 0 ? kDpl * lane + i : lane + 32 * i; };

  // Online softmax state of this warp over its keys: running max m, sum l of exp(score - m),
  // and acc = sum of exp(score - m) * v (lane's dimensions). m = -inf until the first key.
  float m = -INFINITY;
  float l = 0.f;
  float acc[kLaneDims];
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) acc[i] = 0.f;

  if (tq.seq >= 0) {  // uniform over the block
    const T* q = static_cast<const T*>(p.q) + t * p.q_token_stride + int64_t{h} * dim;
    for (int32_t d = static_cast<int32_t>(threadIdx.x); d < dim; d += kThreads) s_q[d] = detail::to_float(q[d]);
    __syncthreads();
    const int64_t head = int64_t{tree_attention_kv_head(p, h)} * dim;
    const int32_t* row = p.block_table + int64_t{tq.seq} * p.table_stride;
    const T* k_cache = static_cast<const T*>(p.k_cache);
    const T* v_cache = static_cast<const T*>(p.v_cache);
    for (int32_t base = warp * 32; base < tq.kv_len; base += kThreads) {
      const int32_t pos = base + lane;
      long long off = -1;  // this lane's key row, or -1: no key (past kv_len, masked, no slot)
      if (pos < tq.kv_len && tree_attention_visible(p, tq, t, pos)) {
        const int64_t slot = paged_kv_slot(row, p.table_width, p.layout.block_size, p.layout.num_pages, pos);
        if (slot >= 0) off = kv_row_offset(p.layout, slot) + head;
      }
      float score = -INFINITY;
      if (off >= 0) {
        if constexpr (kDpl > 0) {
          score = key_dot_aligned<T, 32 * kDpl>(s_q, k_cache + off) * p.scale;
        } else {
          score = key_dot(s_q, k_cache + off, dim) * p.scale;
        }
      }
      const float tile_max = detail::warp_max(score);
      if (tile_max == -INFINITY) continue;  // no key in the tile (uniform: every lane holds the max)
      const float m_new = fmaxf(m, tile_max);
      const float alpha = expf(m - m_new);  // rescales the old state; 0 at the first key
      const float weight = off >= 0 ? expf(score - m_new) : 0.f;
      l = l * alpha + detail::warp_sum(weight);
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) acc[i] *= alpha;
      // Eight keys at a time: their weights and rows from the lanes that scored them, all
      // eight loads issued, then the products (a key without a row contributes zeros).
#pragma unroll
      for (int j0 = 0; j0 < 32; j0 += 8) {
        float w8[8];
        float v8[8][kLaneDims];
#pragma unroll
        for (int u = 0; u < 8; ++u) w8[u] = __shfl_sync(0xffffffffu, weight, j0 + u);
        detail::load_value_rows<T, kDpl>(v_cache, off, j0, lane, dim, v8);
#pragma unroll
        for (int u = 0; u < 8; ++u)
#pragma unroll
          for (int i = 0; i < kLaneDims; ++i) acc[i] += w8[u] * v8[u][i];
      }
      m = m_new;
    }
  }

// Merge the warps: out = sum_w e^(m_w - M) acc_w / sum_w e^(m_w - M) l_w, M = max_w m_w over
  // warps that saw a key (l_w > 0: l >= 1 once a key is seen). No key at all: zeros.
  if (lane == 0) {
    s_max[warp] = m;
    s_sum[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kLaneDims; ++i) {
    const int d = lane_dim(i);
    if (d < dim) s_out[warp][d] = acc[i];
  }
  __syncthreads();
  float max_all = -INFINITY;
  for (int w = 0; w < kWarps; ++w)
    if (s_sum[w] > 0.f) max_all = fmaxf(max_all, s_max[w]);
  float sum_all = 0.f;
  for (int w = 0; w < kWarps; ++w)
    if (s_sum[w] > 0.f) sum_all += expf(s_max[w] - max_all) * s_sum[w];
  T* out = static_cast<T*>(p.out) + t * p.out_token_stride + int64_t{h} * dim;
  for (int d = static_cast<int>(threadIdx.x); d < dim; d += kThreads) {
    float o = 0.f;
    if (sum_all > 0.f) {
      for (int w = 0; w < kWarps; ++w)
        if (s_sum[w] > 0.f) o += expf(s_max[w] - max_all) * s_out[w][d];
      o /= sum_all;
    }
    out[d] = detail::from_float<T>(o);
  }
}

template <class T, int kWarps>
void launch(const TreeAttentionParams& p, dim3 grid, cudaStream_t stream) {
  switch (detail::aligned_lane_dims<T>(p)) {
    case 2: tree_attention_kernel<T, kWarps, 2><<<grid, kWarps * 32, 0, stream>>>(p); break;
    case 4: tree_attention_kernel<T, kWarps, 4><<<grid, kWarps * 32, 0, stream>>>(p); break;
    case 8: tree_attention_kernel<T, kWarps, 8><<<grid, kWarps * 32, 0, stream>>>(p); break;
    default: tree_attention_kernel<T, kWarps, 0><<<grid, kWarps * 32, 0, stream>>>(p); break;
  }
}

}  // namespace

int tree_attention_warps(int64_t blocks, int sm_count) {
  return blocks <= int64_t{kTreeAttentionBlocksPerSmForManyWarps} * sm_count ? kTreeAttentionWarpsMany
                                                                           : kTreeAttentionWarpsFew;
}

Status validate_tree_attention_launch(const TreeAttentionParams& p) {
  SPECD_RETURN_IF_ERROR(validate_tree_attention(p));
  if (p.layout.head_dim > kTreeAttentionMaxHeadDim)
    return error_status(StatusCode::kInvalidArgument, "tree_attention (CUDA): head_dim ",
                        p.layout.head_dim, " exceeds the kernel's limit ", kTreeAttentionMaxHeadDim);
  if (p.q_heads > kTreeAttentionMaxQHeads)
    return error_status(StatusCode::kInvalidArgument, "tree_attention (CUDA): q_heads ", p.q_heads,
                        " exceeds the kernel's limit ", kTreeAttentionMaxQHeads);
  return Status::Ok();
}

cudaError_t tree_attention(const TreeAttentionParams& p, cudaStream_t stream) {
  if (!validate_tree_attention_launch(p).ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.q_heads));
  int device = 0, sm_count = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const bool many = tree_attention_warps(int64_t{p.num_tokens} * p.q_heads, sm_count) == kTreeAttentionWarpsMany;
  return detail::dispatch_kv_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (many) {
      launch<T, kTreeAttentionWarpsMany>(p, grid, stream);
    } else {
      launch<T, kTreeAttentionWarpsFew>(p, grid, stream);
    }
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
