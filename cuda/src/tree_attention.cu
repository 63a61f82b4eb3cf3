#include "specd/cuda/tree_attention.h"

#include <cmath>  // INFINITY
#include <cstdint>

#include "detail/kv_dtype.cuh"

namespace specd::cuda {
namespace {

constexpr int kDimsPerLane = kTreeAttentionMaxHeadDim / 32;  // lane holds dims lane + 32 * i

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;  // every lane holds the total
}

// Block (t, h): query token t, query head h, kWarps warps. params by value: its pointers are
// device pointers.
template <class T, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) tree_attention_kernel(TreeAttentionParams p) {
  constexpr int kThreads = kWarps * 32;
  __shared__ float s_max[kWarps];
  __shared__ float s_sum[kWarps];
  __shared__ float s_out[kWarps][kTreeAttentionMaxHeadDim];

  const int32_t t = static_cast<int32_t>(blockIdx.x);
  const int32_t h = static_cast<int32_t>(blockIdx.y);
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int32_t dim = p.layout.head_dim;
  const TreeQuery tq = tree_attention_query(p, t);

  // Online softmax state of this warp over its keys: running max m, sum l of exp(score - m),
  // and acc = sum of exp(score - m) * v (lane's dimensions). m = -inf until the first key.
  float m = -INFINITY;
  float l = 0.f;
  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.f;

  if (tq.seq >= 0) {  // uniform over the block
    const T* q = static_cast<const T*>(p.q) + t * p.q_token_stride + int64_t{h} * dim;
    float qv[kDimsPerLane];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      qv[i] = d < dim ? detail::to_float(q[d]) : 0.f;
    }
    const int64_t head = int64_t{tree_attention_kv_head(p, h)} * dim;
    const int32_t* row = p.block_table + int64_t{tq.seq} * p.table_stride;
    const T* k_cache = static_cast<const T*>(p.k_cache);
    const T* v_cache = static_cast<const T*>(p.v_cache);
    for (int32_t pos = warp; pos < tq.kv_len; pos += kWarps) {
      // Both tests depend on pos only, so the whole warp skips together (warp_sum needs all lanes).
      if (!tree_attention_visible(p, tq, t, pos)) continue;
      const int64_t slot =
          paged_kv_slot(row, p.table_width, p.layout.block_size, p.layout.num_pages, pos);
      if (slot < 0) continue;
      const int64_t off = kv_row_offset(p.layout, slot) + head;
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < dim) dot += qv[i] * detail::to_float(k_cache[off + d]);
      }
      const float score = warp_sum(dot) * p.scale;
      const float m_new = fmaxf(m, score);
      const float alpha = expf(m - m_new);  // rescales the old state; 0 at the first key
      const float beta = expf(score - m_new);
      l = l * alpha + beta;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < dim) acc[i] = acc[i] * alpha + beta * detail::to_float(v_cache[off + d]);
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
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
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
      tree_attention_kernel<T, kTreeAttentionWarpsMany><<<grid, kTreeAttentionWarpsMany * 32, 0, stream>>>(p);
    } else {
      tree_attention_kernel<T, kTreeAttentionWarpsFew><<<grid, kTreeAttentionWarpsFew * 32, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
