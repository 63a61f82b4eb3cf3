#include "specd/cuda/tree_attention_grouped.h"

#include <cmath>  // INFINITY
#include <cstdint>

#include "detail/attention_math.cuh"
#include "detail/kv_dtype.cuh"
#include "specd/cuda/tree_attention.h"  // kTreeAttentionMaxHeadDim
#include "specd/detail/attention_split.h"

namespace specd::cuda {
namespace {

constexpr int kWarps = kTreeAttentionGroupedWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kHeads = kTreeAttentionGroupedHeads;
constexpr int kMaxDim = kTreeAttentionMaxHeadDim;
constexpr int kTile = 32;  // keys per warp step (a lane per key)
static_assert(kTreeAttentionMinKeysPerSplit % kTile == 0, "splits of whole tiles");
static_assert(kTreeAttentionMaxSplits <= 64, "the merge reads two splits per lane of one warp");

// score[hh] += q[hh] . k over a key row of exactly kDim elements, 16-byte aligned, for the
// block's nh heads (q rows in shared memory as float): 16-byte loads, up to eight in flight.
template <class T, int kDim>
__device__ __forceinline__ void key_dots_aligned(const float (*s_q)[kMaxDim], const T* k, int nh,
                                                 float (&score)[kHeads]) {
  detail::for_each_aligned_element<T, kDim>(k, [&](int d, float kf) {
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh)
      if (hh < nh) score[hh] += s_q[hh][d] * kf;
  });
}

// The same for any dim (element loads).
template <class T>
__device__ __forceinline__ void key_dots(const float (*s_q)[kMaxDim], const T* k, int32_t dim, int nh,
                                         float (&score)[kHeads]) {
  for (int32_t d = 0; d < dim; ++d) {
    const float kf = detail::to_float(k[d]);
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh)
      if (hh < nh) score[hh] += s_q[hh][d] * kf;
  }
}

// Block (t, y, s): query token t; kv head g = y / blocks_per_kv and its query heads
// [h0, h0 + nh) (the sub-group y % blocks_per_kv of at most kHeads); split s of the request's
// keys (detail/attention_split.h). Within the split the warps take tiles of 32 keys (warp w:
// tiles w, w + kWarps, ...); each lane scores one key for every head, the warp updates the
// heads' online softmax once per tile, writes the tile's weights to shared memory and
// accumulates the values with lanes over dimensions (eight keys' rows loaded before their
// products). kDpl as in the per-head kernel: 2, 4 or 8 = aligned rows of exactly 32 kDpl dims
// (lane holds dims [kDpl lane, kDpl lane + kDpl)); 0 = any dim <= 256 (lane holds lane + 32 i).
template <class T, int kDpl>
__global__ void __launch_bounds__(kThreads)
    tree_attention_grouped_kernel(TreeAttentionParams p, float* workspace, int32_t max_splits, int32_t blocks_per_kv) {
  constexpr int kLaneDims = kDpl > 0 ? kDpl : kMaxDim / 32;
  __shared__ float s_q[kHeads][kMaxDim];
  __shared__ float s_w[kWarps][kHeads][kTile];
  __shared__ float s_max[kWarps][kHeads];
  __shared__ float s_sum[kWarps][kHeads];
  __shared__ float s_out[kWarps][kHeads][kMaxDim];

  const int32_t t = static_cast<int32_t>(blockIdx.x);
  const int32_t g = static_cast<int32_t>(blockIdx.y) / blocks_per_kv;
  const int32_t sub = static_cast<int32_t>(blockIdx.y) % blocks_per_kv;
  const int32_t s = static_cast<int32_t>(blockIdx.z);
  const int32_t group = p.q_heads / p.layout.kv_heads;
  const int32_t h0 = g * group + sub * kHeads;
  const int nh = group - sub * kHeads < kHeads ? group - sub * kHeads : kHeads;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int32_t dim = p.layout.head_dim;
  T* out = static_cast<T*>(p.out) + t * p.out_token_stride;
  const TreeQuery tq = tree_attention_query(p, t);
  if (tq.seq < 0) {  // no request owns the token: zeros, written once
    if (s == 0)
      for (int32_t e = static_cast<int32_t>(threadIdx.x); e < nh * dim; e += kThreads)
        out[int64_t{h0} * dim + e] = detail::from_float<T>(0.f);
    return;
  }
  const specd::detail::KeySplit plan =
      specd::detail::plan_key_split(tq.kv_len, max_splits, kTreeAttentionMinKeysPerSplit, kTile);
  if (s >= plan.splits) return;  // uniform over the block
  const specd::detail::KeyRange keys = specd::detail::key_split_range(plan, tq.kv_len, s);
  const auto lane_dim = [&](int i) { return kDpl > 0 ? kDpl * lane + i : lane + 32 * i; };

  const T* q = static_cast<const T*>(p.q) + t * p.q_token_stride + int64_t{h0} * dim;
  for (int32_t e = static_cast<int32_t>(threadIdx.x); e < nh * dim; e += kThreads)
    s_q[e / dim][e % dim] = detail::to_float(q[e]);
  __syncthreads();

  // Per head: running max m, sum l of exp(score - m), acc = sum of exp(score - m) * v.
  float m[kHeads], l[kHeads], acc[kHeads][kLaneDims];
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.f;
#pragma unroll
    for (int i = 0; i < kLaneDims; ++i) acc[hh][i] = 0.f;
  }
  const int64_t head = int64_t{g} * dim;
  const int32_t* row = p.block_table + int64_t{tq.seq} * p.table_stride;
  const T* k_cache = static_cast<const T*>(p.k_cache);
  const T* v_cache = static_cast<const T*>(p.v_cache);
  for (int32_t base = keys.begin + warp * kTile; base < keys.end; base += kThreads) {
    const int32_t pos = base + lane;
    long long off = -1;  // this lane's key row, or -1: no key (past the split, masked, no slot)
    if (pos < keys.end && tree_attention_visible(p, tq, t, pos)) {
      const int64_t slot = paged_kv_slot(row, p.table_width, p.layout.block_size, p.layout.num_pages, pos);
      if (slot >= 0) off = kv_row_offset(p.layout, slot) + head;
    }
    if (__ballot_sync(0xffffffffu, off >= 0) == 0) continue;  // no key in the tile (uniform)
    float score[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) score[hh] = 0.f;
    if (off >= 0) {
      if constexpr (kDpl > 0) {
        key_dots_aligned<T, 32 * kDpl>(s_q, k_cache + off, nh, score);
      } else {
        key_dots(s_q, k_cache + off, dim, nh, score);
      }
    }
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) {
      if (hh < nh) {  // uniform
        const float sc = off >= 0 ? score[hh] * p.scale : -INFINITY;
        const float m_new = fmaxf(m[hh], detail::warp_max(sc));  // finite: the tile has a key
        const float alpha = expf(m[hh] - m_new);                 // 0 at the first key
        const float w = off >= 0 ? expf(sc - m_new) : 0.f;
        l[hh] = l[hh] * alpha + detail::warp_sum(w);
#pragma unroll
        for (int i = 0; i < kLaneDims; ++i) acc[hh][i] *= alpha;
        m[hh] = m_new;
        s_w[warp][hh][lane] = w;
      }
    }
    __syncwarp();
#pragma unroll
    for (int j0 = 0; j0 < kTile; j0 += 8) {
      float v8[8][kLaneDims];
      detail::load_value_rows<T, kDpl>(v_cache, off, j0, lane, dim, v8);
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) {
        if (hh < nh) {
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const float w = s_w[warp][hh][j0 + u];  // broadcast
#pragma unroll
            for (int i = 0; i < kLaneDims; ++i) acc[hh][i] += w * v8[u][i];
          }
        }
      }
    }
    __syncwarp();  // s_w is rewritten by the next tile
  }

  // Merge the warps (detail/attention_split.h's merge over the block's 4 warps), then write
  // out (one split) or this split's partial state (unnormalized acc, max, sum).
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    if (hh < nh) {
      if (lane == 0) {
        s_max[warp][hh] = m[hh];
        s_sum[warp][hh] = l[hh];
      }
#pragma unroll
      for (int i = 0; i < kLaneDims; ++i) {
        const int d = lane_dim(i);
        if (d < dim) s_out[warp][hh][d] = acc[hh][i];
      }
    }
  }
  __syncthreads();
  for (int32_t e = static_cast<int32_t>(threadIdx.x); e < nh * dim; e += kThreads) {
    const int32_t hh = e / dim, d = e % dim;
    float max_all = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      if (s_sum[w][hh] > 0.f) max_all = fmaxf(max_all, s_max[w][hh]);
    float total = 0.f, o = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = specd::detail::softmax_part_weight(s_max[w][hh], s_sum[w][hh], max_all);
      total += weight * s_sum[w][hh];
      o += weight * s_out[w][hh][d];
    }
    const int32_t h = h0 + hh;
    if (plan.splits == 1) {
      out[int64_t{h} * dim + d] = detail::from_float<T>(total > 0.f ? o / total : 0.f);
    } else {
      float* part = workspace + ((int64_t{t} * p.q_heads + h) * max_splits + s) * (dim + 2);
      part[d] = o;
      if (d == 0) {
        part[dim] = max_all;
        part[dim + 1] = total;
      }
    }
  }
}

// Block (t, h): merges the partial states of query token t, head h, when its request's plan
// has more than one split (else the main kernel wrote out). Warp 0 finds each split's weight
// (two splits per lane), then the block sums the weighted partial outputs per dimension.
template <class T>
__global__ void __launch_bounds__(kThreads)
    tree_attention_merge_kernel(TreeAttentionParams p, const float* workspace, int32_t max_splits) {
  __shared__ float s_weight[kTreeAttentionMaxSplits];
  __shared__ float s_total;
  const int32_t t = static_cast<int32_t>(blockIdx.x);
  const int32_t h = static_cast<int32_t>(blockIdx.y);
  const TreeQuery tq = tree_attention_query(p, t);
  if (tq.seq < 0) return;
  const specd::detail::KeySplit plan =
      specd::detail::plan_key_split(tq.kv_len, max_splits, kTreeAttentionMinKeysPerSplit, kTile);
  if (plan.splits == 1) return;
  const int32_t dim = p.layout.head_dim;
  const float* parts = workspace + (int64_t{t} * p.q_heads + h) * max_splits * (dim + 2);
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    float m2[2] = {-INFINITY, -INFINITY}, l2[2] = {0.f, 0.f};
    for (int k = 0; k < 2; ++k) {
      const int32_t sp = lane + 32 * k;
      if (sp < plan.splits) {
        m2[k] = parts[int64_t{sp} * (dim + 2) + dim];
        l2[k] = parts[int64_t{sp} * (dim + 2) + dim + 1];
      }
    }
    const float max_all = detail::warp_max(fmaxf(l2[0] > 0.f ? m2[0] : -INFINITY, l2[1] > 0.f ? m2[1] : -INFINITY));
    float mine = 0.f;
    for (int k = 0; k < 2; ++k) {
      const float weight = specd::detail::softmax_part_weight(m2[k], l2[k], max_all);
      s_weight[lane + 32 * k] = weight;
      mine += weight * l2[k];
    }
    const float total = detail::warp_sum(mine);
    if (lane == 0) s_total = total;
  }
  __syncthreads();
  const float total = s_total;
  T* out = static_cast<T*>(p.out) + t * p.out_token_stride + int64_t{h} * dim;
  for (int32_t d = static_cast<int32_t>(threadIdx.x); d < dim; d += kThreads) {
    float o = 0.f;
    for (int32_t sp = 0; sp < plan.splits; ++sp)
      if (s_weight[sp] > 0.f) o += s_weight[sp] * parts[int64_t{sp} * (dim + 2) + d];
    out[d] = detail::from_float<T>(total > 0.f ? o / total : 0.f);
  }
}

int32_t blocks_per_kv_head(const TreeAttentionParams& p) {
  const int32_t group = p.q_heads / p.layout.kv_heads;
  return (group + kHeads - 1) / kHeads;
}

template <class T>
void launch(const TreeAttentionParams& p, const TreeAttentionWorkspace& ws, cudaStream_t stream) {
  const int32_t per_kv = blocks_per_kv_head(p);
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.layout.kv_heads * per_kv),
                  static_cast<unsigned>(ws.max_splits));
  switch (detail::aligned_lane_dims<T>(p)) {
    case 2: tree_attention_grouped_kernel<T, 2><<<grid, kThreads, 0, stream>>>(p, ws.data, ws.max_splits, per_kv); break;
    case 4: tree_attention_grouped_kernel<T, 4><<<grid, kThreads, 0, stream>>>(p, ws.data, ws.max_splits, per_kv); break;
    case 8: tree_attention_grouped_kernel<T, 8><<<grid, kThreads, 0, stream>>>(p, ws.data, ws.max_splits, per_kv); break;
    default: tree_attention_grouped_kernel<T, 0><<<grid, kThreads, 0, stream>>>(p, ws.data, ws.max_splits, per_kv); break;
  }
  if (ws.max_splits > 1) {
    const dim3 merge_grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.q_heads));
    tree_attention_merge_kernel<T><<<merge_grid, kThreads, 0, stream>>>(p, ws.data, ws.max_splits);
  }
}

}  // namespace

int64_t tree_attention_grouped_blocks(int32_t num_tokens, int32_t q_heads, int32_t kv_heads) {
  if (num_tokens <= 0 || q_heads <= 0 || kv_heads <= 0) return 0;
  const int64_t group = q_heads / kv_heads;
  return int64_t{num_tokens} * kv_heads * ((group + kHeads - 1) / kHeads);
}

int32_t tree_attention_grouped_max_splits(int64_t blocks, int sm_count) {
  if (sm_count <= 0 || blocks <= 0) return 1;
  const int64_t want = (int64_t{4} * sm_count + blocks - 1) / blocks;
  return static_cast<int32_t>(want < 1 ? 1 : want > kTreeAttentionMaxSplits ? kTreeAttentionMaxSplits : want);
}

int64_t tree_attention_grouped_workspace_floats(const TreeAttentionParams& p, int32_t max_splits) {
  if (max_splits <= 1) return 0;
  return int64_t{p.num_tokens} * p.q_heads * max_splits * (int64_t{p.layout.head_dim} + 2);
}

Status validate_tree_attention_grouped_launch(const TreeAttentionParams& p, const TreeAttentionWorkspace& ws) {
  SPECD_RETURN_IF_ERROR(validate_tree_attention(p));
  if (p.layout.head_dim > kMaxDim)
    return error_status(StatusCode::kInvalidArgument, "tree_attention_grouped (CUDA): head_dim ", p.layout.head_dim,
                        " exceeds the kernel's limit ", kMaxDim);
  if (ws.max_splits < 1 || ws.max_splits > kTreeAttentionMaxSplits)
    return error_status(StatusCode::kInvalidArgument, "tree_attention_grouped (CUDA): max_splits must be in [1, ",
                        kTreeAttentionMaxSplits, "], got ", ws.max_splits);
  const int64_t need = tree_attention_grouped_workspace_floats(p, ws.max_splits);
  if (need > 0 && (ws.data == nullptr || ws.floats < need))
    return error_status(StatusCode::kInvalidArgument, "tree_attention_grouped (CUDA): ", ws.max_splits,
                        " splits need a workspace of ", need, " floats, got ", ws.data == nullptr ? 0 : ws.floats);
  const int64_t grid_y = int64_t{p.layout.kv_heads} * blocks_per_kv_head(p);
  if (grid_y > 65535 || p.q_heads > 65535)
    return error_status(StatusCode::kInvalidArgument, "tree_attention_grouped (CUDA): ", p.q_heads,
                        " query heads exceed the kernel's grid limit 65535");
  return Status::Ok();
}

cudaError_t tree_attention_grouped(const TreeAttentionParams& p, const TreeAttentionWorkspace& ws,
                                   cudaStream_t stream) {
  if (!validate_tree_attention_grouped_launch(p, ws).ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return detail::dispatch_kv_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch<T>(p, ws, stream);
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
