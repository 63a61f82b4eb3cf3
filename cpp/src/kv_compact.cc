#include "specd/kv_compact.h"

#include <cstring>

namespace specd {

Status validate_kv_compact(const KvCompactParams& p) {
  SPECD_RETURN_IF_ERROR(validate_paged_kv_layout(p.layout, "kv_compact"));
  SPECD_RETURN_IF_ERROR(validate_kv_dtype(p.dtype, "kv_compact"));
  SPECD_RETURN_IF_ERROR(validate_block_table(p.block_table, p.num_seqs, p.table_width,
                                             p.table_stride, "kv_compact"));
  if (p.num_layers < 1)
    return error_status(StatusCode::kInvalidArgument, "kv_compact: num_layers must be >= 1, got ",
                        p.num_layers);
  if (p.num_seqs > 0 && p.path_stride < 1)
    return error_status(StatusCode::kInvalidArgument, "kv_compact: path_stride must be >= 1, got ",
                        p.path_stride);
  if (p.num_seqs > 0 && (!p.tree_start || !p.path || !p.num_accepted))
    return error_status(StatusCode::kInvalidArgument,
                        "kv_compact: null tree_start, path or num_accepted");
  if (p.num_seqs > 0 && p.layout.num_pages > 0 && (!p.k_cache || !p.v_cache))
    return error_status(StatusCode::kInvalidArgument, "kv_compact: null k_cache or v_cache");
  return Status::Ok();
}

namespace {

Status check_moves(const KvCompactParams& p) {
  for (int32_t r = 0; r < p.num_seqs; ++r) {
    if (!kv_compact_path_valid(p, r))
      return error_status(StatusCode::kInvalidArgument, "kv_compact: request ", r,
                          " has an invalid accepted path (num_accepted ", p.num_accepted[r],
                          ", path_stride ", p.path_stride,
                          "; the path must start at node 0 and strictly increase)");
    for (int32_t d = 1; d <= p.num_accepted[r]; ++d) {
      const KvMove m = kv_compact_move(p, r, d);
      if (m.src_slot < 0 || m.dst_slot < 0)
        return error_status(StatusCode::kOutOfRange, "kv_compact: request ", r, " move ", d,
                            " (node ", p.path[int64_t{r} * p.path_stride + d],
                            ", tree_start ", p.tree_start[r],
                            ") reaches a position its block table does not cover");
    }
  }
  return Status::Ok();
}

}  // namespace

Status kv_compact_cpu(const KvCompactParams& p, bool strict) {
  SPECD_RETURN_IF_ERROR(validate_kv_compact(p));
  if (strict) SPECD_RETURN_IF_ERROR(check_moves(p));
  const std::size_t esize = static_cast<std::size_t>(kv_dtype_size(p.dtype));
  const std::size_t row_bytes = static_cast<std::size_t>(kv_row_elems(p.layout)) * esize;
  for (int32_t r = 0; r < p.num_seqs; ++r) {
    if (!kv_compact_path_valid(p, r)) continue;
    for (int32_t d = 1; d <= p.num_accepted[r]; ++d) {  // increasing d: see the header
      const KvMove m = kv_compact_move(p, r, d);
      if (m.src_slot < 0 || m.dst_slot < 0 || m.src_slot == m.dst_slot) continue;
      const int64_t src = kv_row_offset(p.layout, m.src_slot);
      const int64_t dst = kv_row_offset(p.layout, m.dst_slot);
      for (int32_t layer = 0; layer < p.num_layers; ++layer) {
        const int64_t base = layer * p.layer_stride;
        for (void* cache : {p.k_cache, p.v_cache}) {
          auto* bytes = static_cast<unsigned char*>(cache);
          std::memcpy(bytes + static_cast<std::size_t>(base + dst) * esize,
                       bytes + static_cast<std::size_t>(base + src) * esize, row_bytes);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace specd
