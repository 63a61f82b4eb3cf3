// KV write: stores the K and V rows of a forward pass's new tokens in the paged cache
// (kv_layout.h), at the slots of the slot mapping (kv_slot_mapping.h). The CPU reference is
// kv_write_cpu; the CUDA kernel (cuda/, specd::cuda::kv_write) follows the same rule.
//
// Rule, for token t in [0, num_tokens):
//   s = slot_mapping[t]
//   s < 0: nothing is written (padding, or a token whose KV is not kept).
//   s >= num_pages * block_size: nothing is written (kernel); an error naming t (CPU, strict).
//   otherwise: K row s of k_cache = k[t] and V row s of v_cache = v[t], bit for bit.
// The new rows and the cache have the same dtype (no conversion: the caller casts first).
// Slots of one call must be distinct (the block manager gives every token its own slot): the
// kernel writes tokens in parallel, so with a repeated slot which row wins is undefined (the
// CPU reference writes in token order, and reports repeats when strict). The new rows must not
// overlap the cache.
#pragma once

#include <cstdint>

#include "specd/host_device.h"
#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct KvWriteParams {
  const void* k = nullptr;     // [num_tokens, kv_heads, head_dim]; token t at k + t * k_token_stride
  const void* v = nullptr;     // [num_tokens, kv_heads, head_dim]; token t at v + t * v_token_stride
  int64_t k_token_stride = 0;  // elements between tokens (>= kv_heads * head_dim)
  int64_t v_token_stride = 0;
  const int64_t* slot_mapping = nullptr;  // [num_tokens] destination slot, < 0: skip
  void* k_cache = nullptr;     // paged [num_pages, block_size, kv_heads, head_dim] (page_stride apart)
  void* v_cache = nullptr;
  PagedKvLayout layout;
  KvDtype dtype = KvDtype::kFloat32;
  int32_t num_tokens = 0;
};

// Element offset of token t's destination row in k_cache / v_cache, or -1 (nothing written).
SPECD_HOST_DEVICE inline int64_t kv_write_dst_row(const KvWriteParams& p, int32_t t) {
  const int64_t slot = p.slot_mapping[t];
  return kv_slot_in_range(p.layout, slot) ? kv_row_offset(p.layout, slot) : -1;
}

// Checks sizes and pointers (not the contents of the arrays).
Status validate_kv_write(const KvWriteParams& params);

// CPU reference: validates, then writes by the rule above (host pointers, any dtype: rows are
// copied as bytes). strict = true reports slots past the cache and repeated slots (kOutOfRange
// / kInvalidArgument) before writing anything.
Status kv_write_cpu(const KvWriteParams& params, bool strict = false);

// The strict checks of the CPU references that write K/V rows at a slot mapping (this one and
// rope_kv_write.h): kOutOfRange for a slot past the cache, kInvalidArgument for a slot written
// twice; messages start with `op`.
Status check_kv_write_slots(const char* op, const int64_t* slot_mapping, int32_t num_tokens,
                            const PagedKvLayout& layout);

}  // namespace specd
