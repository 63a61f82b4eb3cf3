// Paged KV-cache layout: where the K (or V) row of a token slot lives in memory, and which
// slot a sequence position maps to through its block table. Shared by the KV kernels
// (kv_write.h, kv_compact.h, draft_step_inputs.h, tree_attention.h), their CPU references
// and the CUDA launchers in cuda/, so all of them address the cache the same way.
//
// Layout rules (the layout of specd/kv_cache.py, one model, one layer, K and V separately):
// - The cache is `num_pages` pages; page g starts `g * page_stride` elements after the base
//   pointer. A page holds `block_size` token rows, each row [kv_heads, head_dim] contiguous
//   (so a page is [block_size, kv_heads, head_dim] packed from its start). page_stride may
//   exceed block_size * kv_heads * head_dim: the Python pool packs all layers and both K and
//   V of a page together, so one layer's K view has gaps between pages.
// - Slot s is token row s % block_size of page s / block_size: the block manager's numbering.
//   Slots valid for a cache are [0, num_pages * block_size).
// - Position pos of a sequence whose block table row is `row` (page ids, `table_width` valid
//   entries) has slot row[pos / block_size] * block_size + pos % block_size, or -1 when
//   pos < 0, pos / block_size >= table_width, or the page id is outside [0, num_pages).
//   -1 means "no slot": kernels skip it (they cannot report per-item errors); the CPU
//   references report it as an error when asked to be strict.
#pragma once

#include <cstdint>

#include "specd/host_device.h"
#include "specd/status.h"

namespace specd {

// Element type of K/V (and of q / the attention output). Copies only need the size.
enum class KvDtype : int32_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};

SPECD_HOST_DEVICE inline int32_t kv_dtype_size(KvDtype dtype) {
  return dtype == KvDtype::kFloat32 ? 4 : 2;
}
// "float32", "float16", "bfloat16"; "invalid" for any other value.
const char* kv_dtype_name(KvDtype dtype);
// Parses the names above; kInvalidArgument for anything else.
Status parse_kv_dtype(const char* name, KvDtype* out);
// kInvalidArgument (naming `what`) unless dtype is one of the enumerators.
Status validate_kv_dtype(KvDtype dtype, const char* what);
// kInvalidArgument (naming `what`) unless dtype is float32: the CPU references of the attention
// and decoder-layer kernels compute in float32 only (their CUDA kernels take 16-bit types too).
Status require_cpu_float32(KvDtype dtype, const char* what);

struct PagedKvLayout {
  int32_t num_pages = 0;
  int32_t block_size = 0;  // tokens per page
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  int64_t page_stride = 0;  // elements between the starts of consecutive pages
};

// Elements of one token row: [kv_heads, head_dim].
SPECD_HOST_DEVICE inline int64_t kv_row_elems(const PagedKvLayout& l) {
  return int64_t{l.kv_heads} * l.head_dim;
}

SPECD_HOST_DEVICE inline bool kv_slot_in_range(const PagedKvLayout& l, int64_t slot) {
  return slot >= 0 && slot < int64_t{l.num_pages} * l.block_size;
}

// Element offset of slot's token row from the cache base. Requires kv_slot_in_range.
SPECD_HOST_DEVICE inline int64_t kv_row_offset(const PagedKvLayout& l, int64_t slot) {
  const int64_t page = slot / l.block_size;
  const int64_t row = slot - page * l.block_size;
  return page * l.page_stride + row * kv_row_elems(l);
}

// Slot of sequence position `pos` through block table row `row` (the rule above), or -1.
SPECD_HOST_DEVICE inline int64_t paged_kv_slot(const int32_t* row, int32_t table_width,
                                               int32_t block_size, int32_t num_pages,
                                               int64_t pos) {
  if (pos < 0) return -1;
  const int64_t block = pos / block_size;
  if (block >= table_width) return -1;
  const int32_t page = row[block];
  if (page < 0 || page >= num_pages) return -1;
  return int64_t{page} * block_size + (pos - block * block_size);
}

// Checks the sizes: positive block_size, kv_heads, head_dim; num_pages >= 0; page_stride at
// least one page's rows. `what` names the caller in messages ("kv_write").
Status validate_paged_kv_layout(const PagedKvLayout& layout, const char* what);

// Checks a block table's sizes (not its contents): rows >= 0, 0 <= width <= stride, and a
// non-null pointer when rows * width > 0.
Status validate_block_table(const int32_t* table, int32_t rows, int32_t width, int32_t stride,
                            const char* what);

}  // namespace specd
