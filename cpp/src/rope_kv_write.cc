#include "specd/rope_kv_write.h"

#include <cstring>

#include "specd/kv_write.h"

namespace specd {

Status validate_rope_kv_write(const RopeKvWriteParams& p) {
  SPECD_RETURN_IF_ERROR(validate_paged_kv_layout(p.layout, "rope_kv_write"));
  SPECD_RETURN_IF_ERROR(validate_kv_dtype(p.dtype, "rope_kv_write"));
  const int32_t d = p.layout.head_dim;
  if (d % 2 != 0)
    return error_status(StatusCode::kInvalidArgument, "rope_kv_write: head_dim must be even, got ", d);
  if (p.num_tokens < 0 || p.q_heads < 1)
    return error_status(StatusCode::kInvalidArgument, "rope_kv_write: need num_tokens >= 0 and q_heads >= 1, got ",
                        p.num_tokens, " and ", p.q_heads);
  if (p.qkv_stride < rope_qkv_row_elems(p) || p.cos_sin_stride < d || p.q_out_stride < int64_t{p.q_heads} * d)
    return error_status(StatusCode::kInvalidArgument, "rope_kv_write: row strides (qkv ", p.qkv_stride,
                        ", cos/sin ", p.cos_sin_stride, ", q_out ", p.q_out_stride,
                        ") must cover (q_heads + 2 kv_heads) * head_dim = ", rope_qkv_row_elems(p),
                        ", head_dim and q_heads * head_dim");
  if (p.num_tokens > 0 && (!p.qkv || !p.cos || !p.sin || !p.q_out || !p.slot_mapping))
    return error_status(StatusCode::kInvalidArgument, "rope_kv_write: null qkv, cos, sin, q_out or slot_mapping");
  if (p.num_tokens > 0 && p.layout.num_pages > 0 && (!p.k_cache || !p.v_cache))
    return error_status(StatusCode::kInvalidArgument, "rope_kv_write: null k_cache or v_cache");
  return Status::Ok();
}

namespace {

// rope(x) of one head row (the header's rule, float32: no rounding but the float ops').
void rope_row(const float* x, const float* c, const float* s, int32_t d, float* out) {
  const int32_t h = d / 2;
  for (int32_t i = 0; i < h; ++i) {
    const float a = x[i] * c[i];
    const float b = -x[i + h] * s[i];
    const float e = x[i + h] * c[i + h];
    const float f = x[i] * s[i + h];
    out[i] = a + b;
    out[i + h] = e + f;
  }
}

}  // namespace

Status rope_kv_write_cpu(const RopeKvWriteParams& p, bool strict) {
  SPECD_RETURN_IF_ERROR(validate_rope_kv_write(p));
  SPECD_RETURN_IF_ERROR(require_cpu_float32(p.dtype, "rope_kv_write"));
  if (strict) SPECD_RETURN_IF_ERROR(check_kv_write_slots("rope_kv_write", p.slot_mapping, p.num_tokens, p.layout));
  const int32_t d = p.layout.head_dim, kv_heads = p.layout.kv_heads;
  const auto* qkv = static_cast<const float*>(p.qkv);
  const auto* cos = static_cast<const float*>(p.cos);
  const auto* sin = static_cast<const float*>(p.sin);
  auto* q_out = static_cast<float*>(p.q_out);
  auto* k_cache = static_cast<float*>(p.k_cache);
  auto* v_cache = static_cast<float*>(p.v_cache);
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const float* row = qkv + t * p.qkv_stride;
    const float* c = cos + t * p.cos_sin_stride;
    const float* s = sin + t * p.cos_sin_stride;
    for (int32_t head = 0; head < p.q_heads; ++head)
      rope_row(row + int64_t{head} * d, c, s, d, q_out + t * p.q_out_stride + int64_t{head} * d);
    const int64_t slot = p.slot_mapping[t];
    if (!kv_slot_in_range(p.layout, slot)) continue;
    const int64_t dst = kv_row_offset(p.layout, slot);
    const float* k = row + int64_t{p.q_heads} * d;
    for (int32_t head = 0; head < kv_heads; ++head)
      rope_row(k + int64_t{head} * d, c, s, d, k_cache + dst + int64_t{head} * d);
    std::memcpy(v_cache + dst, k + int64_t{kv_heads} * d, sizeof(float) * static_cast<std::size_t>(kv_heads) * d);
  }
  return Status::Ok();
}

}  // namespace specd
