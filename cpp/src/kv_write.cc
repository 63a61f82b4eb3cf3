#include "specd/kv_write.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace specd {

Status validate_kv_write(const KvWriteParams& p) {
  SPECD_RETURN_IF_ERROR(validate_paged_kv_layout(p.layout, "kv_write"));
  SPECD_RETURN_IF_ERROR(validate_kv_dtype(p.dtype, "kv_write"));
  if (p.num_tokens < 0)
    return error_status(StatusCode::kInvalidArgument, "kv_write: num_tokens must be >= 0, got ",
                        p.num_tokens);
  const int64_t row = kv_row_elems(p.layout);
  if (p.k_token_stride < row || p.v_token_stride < row)
    return error_status(StatusCode::kInvalidArgument, "kv_write: token strides ", p.k_token_stride,
                        " (k) and ", p.v_token_stride, " (v) must be >= kv_heads * head_dim = ", row);
  if (p.num_tokens > 0 && (!p.k || !p.v || !p.slot_mapping))
    return error_status(StatusCode::kInvalidArgument, "kv_write: null k, v or slot_mapping");
  if (p.num_tokens > 0 && p.layout.num_pages > 0 && (!p.k_cache || !p.v_cache))
    return error_status(StatusCode::kInvalidArgument, "kv_write: null k_cache or v_cache");
  return Status::Ok();
}

Status check_kv_write_slots(const char* op, const int64_t* slot_mapping, int32_t num_tokens,
                            const PagedKvLayout& layout) {
  const int64_t num_slots = int64_t{layout.num_pages} * layout.block_size;
  std::vector<int64_t> used;
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t s = slot_mapping[t];
    if (s < 0) continue;
    if (s >= num_slots)
      return error_status(StatusCode::kOutOfRange, op, ": token ", t, " has slot ", s,
                          " past the cache (", layout.num_pages, " pages x ", layout.block_size,
                          " slots)");
    used.push_back(s);
  }
  std::sort(used.begin(), used.end());
  const auto dup = std::adjacent_find(used.begin(), used.end());
  if (dup != used.end())
    return error_status(StatusCode::kInvalidArgument, op, ": slot ", *dup,
                        " is written by more than one token");
  return Status::Ok();
}

Status kv_write_cpu(const KvWriteParams& p, bool strict) {
  SPECD_RETURN_IF_ERROR(validate_kv_write(p));
  if (strict) SPECD_RETURN_IF_ERROR(check_kv_write_slots("kv_write", p.slot_mapping, p.num_tokens, p.layout));
  const std::size_t esize = static_cast<std::size_t>(kv_dtype_size(p.dtype));
  const std::size_t row_bytes = static_cast<std::size_t>(kv_row_elems(p.layout)) * esize;
  const auto* k = static_cast<const unsigned char*>(p.k);
  const auto* v = static_cast<const unsigned char*>(p.v);
  auto* k_cache = static_cast<unsigned char*>(p.k_cache);
  auto* v_cache = static_cast<unsigned char*>(p.v_cache);
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t dst = kv_write_dst_row(p, t);
    if (dst < 0) continue;
    const std::size_t dst_bytes = static_cast<std::size_t>(dst) * esize;
    std::memcpy(k_cache + dst_bytes, k + static_cast<std::size_t>(t * p.k_token_stride) * esize, row_bytes);
    std::memcpy(v_cache + dst_bytes, v + static_cast<std::size_t>(t * p.v_token_stride) * esize, row_bytes);
  }
  return Status::Ok();
}

}  // namespace specd
