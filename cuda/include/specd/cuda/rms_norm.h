// CUDA RMS norm (with the fused residual add): the rule of specd/rms_norm.h (CPU reference
// rms_norm_cpu) on the device, one thread block per token row, on the caller's stream, without
// host sync. The row's sum of squares is a block reduction in float (fixed order: results do
// not depend on scheduling).
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue when
// validate_rms_norm fails, or the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include "specd/rms_norm.h"

namespace specd::cuda {

cudaError_t rms_norm(const RmsNormParams& params, cudaStream_t stream);

}  // namespace specd::cuda
