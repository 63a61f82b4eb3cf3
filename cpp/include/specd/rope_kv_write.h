// Rotary position embedding of a forward pass's new tokens fused with the KV write: one pass
// over the fused q/k/v projection's output rotates q and k and stores k and v in the paged
// cache (kv_layout.h) at the slots of the slot mapping (kv_write.h's rule). The CPU reference
// is rope_kv_write_cpu (float32); the CUDA kernel (cuda/, specd::cuda::rope_kv_write) takes
// float32, float16 and bfloat16 and follows the same rule.
//
// Rule. Token t's projection row is [q (q_heads x D) | k (kv_heads x D) | v (kv_heads x D)],
// D = head_dim (even), h = D / 2. cos[t], sin[t] are [D] rows of the dtype, computed by the
// caller from the token's position (models/rope.py: angles duplicated over both halves). For a
// head row x (q or k), with round() = to the dtype, nearest even, and every product and sum in
// float, rounded once (torch's "x * cos + rotate_half(x) * sin" on tensors of the dtype):
//   rope(x)[d]     = round(round(x[d] * cos[d])         + round(-x[d + h] * sin[d]))      d < h
//   rope(x)[d + h] = round(round(x[d + h] * cos[d + h]) + round(x[d] * sin[d + h]))
//   q_out[t][head] = rope(q[t][head]) for every q head
//   s = slot_mapping[t]; s < 0 or s >= num_pages * block_size: nothing is written (CPU strict:
//   an error naming t); else K row s = rope(k[t][head]) per kv head, V row s = v[t], bit for bit.
// Products and sums are not fused (no FMA), so the float32 result is torch's to the bit.
// Slots of one call must be distinct; the outputs must not overlap the inputs.
#pragma once

#include <cstdint>

#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct RopeKvWriteParams {
  const void* qkv = nullptr;  // [num_tokens, (q_heads + 2 kv_heads) * head_dim]
  int64_t qkv_stride = 0;     // elements between tokens
  const void* cos = nullptr;  // [num_tokens, head_dim]
  const void* sin = nullptr;  // [num_tokens, head_dim]
  int64_t cos_sin_stride = 0; // elements between tokens of cos and of sin (>= head_dim)
  void* q_out = nullptr;      // [num_tokens, q_heads, head_dim]
  int64_t q_out_stride = 0;   // elements between tokens (>= q_heads * head_dim)
  int32_t q_heads = 0;
  const int64_t* slot_mapping = nullptr;  // [num_tokens], < 0: not written
  void* k_cache = nullptr;  // paged [num_pages, block_size, kv_heads, head_dim] (page_stride apart)
  void* v_cache = nullptr;
  PagedKvLayout layout;     // kv_heads and head_dim are the projection's too
  KvDtype dtype = KvDtype::kFloat32;  // of every array but slot_mapping
  int32_t num_tokens = 0;
};

// Elements of a projection row: (q_heads + 2 kv_heads) * head_dim.
inline int64_t rope_qkv_row_elems(const RopeKvWriteParams& p) {
  return (int64_t{p.q_heads} + 2 * int64_t{p.layout.kv_heads}) * p.layout.head_dim;
}

Status validate_rope_kv_write(const RopeKvWriteParams& params);

// CPU reference: validates, then computes the rule above (host pointers, float32 only).
// strict = true reports slots past the cache and repeated slots before writing anything.
Status rope_kv_write_cpu(const RopeKvWriteParams& params, bool strict = false);

}  // namespace specd
