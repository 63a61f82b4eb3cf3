// CUDA SiLU-gated product: the rule of specd/silu_mul.h (CPU reference silu_mul_cpu) on the
// device, one thread per output element, on the caller's stream, without host sync.
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue when
// validate_silu_mul fails, or the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include "specd/silu_mul.h"

namespace specd::cuda {

cudaError_t silu_mul(const SiluMulParams& params, cudaStream_t stream);

}  // namespace specd::cuda
