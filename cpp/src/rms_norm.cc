#include "specd/rms_norm.h"

#include <cmath>

namespace specd {

Status validate_rms_norm(const RmsNormParams& p) {
  SPECD_RETURN_IF_ERROR(validate_kv_dtype(p.dtype, "rms_norm"));
  if (p.num_tokens < 0 || p.hidden < 1)
    return error_status(StatusCode::kInvalidArgument, "rms_norm: need num_tokens >= 0 and hidden >= 1, got ",
                        p.num_tokens, " and ", p.hidden);
  if (p.x_stride < p.hidden || p.out_stride < p.hidden || (p.residual && p.residual_stride < p.hidden))
    return error_status(StatusCode::kInvalidArgument, "rms_norm: row strides (x ", p.x_stride, ", out ",
                        p.out_stride, ", residual ", p.residual_stride, ") must be >= hidden = ", p.hidden);
  if (!(p.eps >= 0.0f) || !std::isfinite(p.eps))
    return error_status(StatusCode::kInvalidArgument, "rms_norm: eps must be finite and >= 0, got ", p.eps);
  if (p.num_tokens > 0 && (!p.x || !p.weight || !p.out))
    return error_status(StatusCode::kInvalidArgument, "rms_norm: null x, weight or out");
  return Status::Ok();
}

Status rms_norm_cpu(const RmsNormParams& p) {
  SPECD_RETURN_IF_ERROR(validate_rms_norm(p));
  SPECD_RETURN_IF_ERROR(require_cpu_float32(p.dtype, "rms_norm"));
  const auto* x = static_cast<const float*>(p.x);
  auto* residual = static_cast<float*>(p.residual);
  const auto* w = static_cast<const float*>(p.weight);
  auto* out = static_cast<float*>(p.out);
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const float* xt = x + t * p.x_stride;
    float* rt = residual ? residual + t * p.residual_stride : nullptr;
    float* ot = out + t * p.out_stride;
    float sum = 0.0f;
    for (int32_t i = 0; i < p.hidden; ++i) {
      float r = xt[i];
      if (rt) rt[i] = r = r + rt[i];
      sum += r * r;
    }
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(p.hidden) + p.eps);
    for (int32_t i = 0; i < p.hidden; ++i) {
      const float r = rt ? rt[i] : xt[i];
      ot[i] = w[i] * (r * inv);
    }
  }
  return Status::Ok();
}

}  // namespace specd
