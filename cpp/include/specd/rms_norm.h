// RMS norm of a decoder layer, optionally fused with the residual add before it: the Llama
// family's "x = x + h; y = norm(x)" in one pass over each row. The CPU reference is
// rms_norm_cpu (float32); the CUDA kernel (cuda/, specd::cuda::rms_norm) takes float32,
// float16 and bfloat16 and follows the same rule.
//
// Rule, for token row t in [0, num_tokens), i in [0, hidden), round() = to the dtype, nearest
// even (the identity for float32):
//   residual given:  r_i = round(float(x[t][i]) + float(residual[t][i]));  residual[t][i] = r_i
//   else:            r_i = x[t][i]
//   inv = 1 / sqrt(mean_i(float(r_i)^2) + eps)      (float accumulation; the order of the sum
//                                                     is unspecified, so inv may differ in its
//                                                     last bits between implementations)
//   out[t][i] = round(float(weight[i]) * float(round(float(r_i) * inv)))
// This is specd's torch RMSNorm (models/llama.py: the row in float, normalised, cast to the
// dtype, times the weight in the dtype) and Hugging Face's LlamaRMSNorm, with the residual add
// of the decoder layer (done in the dtype, as torch adds two tensors of that dtype).
// out must not overlap x or residual; x must not overlap residual.
#pragma once

#include <cstdint>

#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct RmsNormParams {
  const void* x = nullptr;   // [num_tokens, hidden]; row t at x + t * x_stride
  int64_t x_stride = 0;      // elements between rows (>= hidden)
  void* residual = nullptr;  // [num_tokens, hidden], updated in place; null: no residual add
  int64_t residual_stride = 0;
  const void* weight = nullptr;  // [hidden]
  void* out = nullptr;           // [num_tokens, hidden]
  int64_t out_stride = 0;
  int32_t num_tokens = 0;
  int32_t hidden = 0;
  float eps = 1e-6f;
  KvDtype dtype = KvDtype::kFloat32;  // of x, residual, weight and out
};

// Checks sizes, strides, eps and pointers (not the contents of the arrays).
Status validate_rms_norm(const RmsNormParams& params);

// CPU reference: validates, then computes the rule above (host pointers, float32 only).
Status rms_norm_cpu(const RmsNormParams& params);

}  // namespace specd
