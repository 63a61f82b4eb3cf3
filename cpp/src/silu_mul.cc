#include "specd/silu_mul.h"

#include <cmath>

namespace specd {

Status validate_silu_mul(const SiluMulParams& p) {
  SPECD_RETURN_IF_ERROR(validate_kv_dtype(p.dtype, "silu_mul"));
  if (p.num_tokens < 0 || p.width < 1)
    return error_status(StatusCode::kInvalidArgument, "silu_mul: need num_tokens >= 0 and width >= 1, got ",
                        p.num_tokens, " and ", p.width);
  if (p.in_stride < 2 * int64_t{p.width} || p.out_stride < p.width)
    return error_status(StatusCode::kInvalidArgument, "silu_mul: row strides (in ", p.in_stride, ", out ",
                        p.out_stride, ") must be >= 2 * width and width (width = ", p.width, ")");
  if (p.num_tokens > 0 && (!p.gate_up || !p.out))
    return error_status(StatusCode::kInvalidArgument, "silu_mul: null gate_up or out");
  return Status::Ok();
}

Status silu_mul_cpu(const SiluMulParams& p) {
  SPECD_RETURN_IF_ERROR(validate_silu_mul(p));
  SPECD_RETURN_IF_ERROR(require_cpu_float32(p.dtype, "silu_mul"));
  const auto* in = static_cast<const float*>(p.gate_up);
  auto* out = static_cast<float*>(p.out);
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const float* row = in + t * p.in_stride;
    float* o = out + t * p.out_stride;
    for (int32_t i = 0; i < p.width; ++i) {
      const float g = row[i];
      o[i] = (g / (1.0f + std::exp(-g))) * row[p.width + i];
    }
  }
  return Status::Ok();
}

}  // namespace specd
