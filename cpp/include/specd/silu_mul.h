// SiLU-gated product of a Llama MLP: the gate and up projections come out of ONE matrix product
// as [gate | up] rows, and this kernel forms silu(gate) * up, which the down projection reads.
// The CPU reference is silu_mul_cpu (float32); the CUDA kernel (cuda/, specd::cuda::silu_mul)
// takes float32, float16 and bfloat16 and follows the same rule.
//
// Rule, for row t in [0, num_tokens), i in [0, width), round() = to the dtype, nearest even:
//   g = float(gate_up[t][i]), u = float(gate_up[t][width + i])
//   out[t][i] = round(float(round(g / (1 + exp(-g)))) * u)
// i.e. torch's F.silu(gate) * up on tensors of the dtype (each op computed in float and
// rounded once). exp() may differ in its last bit between the host and the device.
// out must not overlap gate_up.
#pragma once

#include <cstdint>

#include "specd/kv_layout.h"
#include "specd/status.h"

namespace specd {

struct SiluMulParams {
  const void* gate_up = nullptr;  // [num_tokens, 2 * width]; row t at gate_up + t * in_stride
  int64_t in_stride = 0;          // elements between rows (>= 2 * width)
  void* out = nullptr;            // [num_tokens, width]
  int64_t out_stride = 0;         // >= width
  int32_t num_tokens = 0;
  int32_t width = 0;
  KvDtype dtype = KvDtype::kFloat32;
};

Status validate_silu_mul(const SiluMulParams& params);

// CPU reference: validates, then computes the rule above (host pointers, float32 only).
Status silu_mul_cpu(const SiluMulParams& params);

}  // namespace specd
