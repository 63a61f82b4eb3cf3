// CUDA rotary embedding fused with the KV write: the rule of specd/rope_kv_write.h (CPU
// reference rope_kv_write_cpu) on the device, one thread block per token (a thread per pair of
// rotated elements, then the V row copied), on the caller's stream, without host sync. Products
// and sums use the non-contracting intrinsics (__fmul_rn, __fadd_rn), so float32 results equal
// torch's unfused ones to the bit.
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue when
// validate_rope_kv_write fails, or the launch error. Tokens whose slot is negative or past the
// cache write no K/V (the kernel cannot report per-token errors); their q is still rotated.
#pragma once

#include <cuda_runtime_api.h>

#include "specd/rope_kv_write.h"

namespace specd::cuda {

cudaError_t rope_kv_write(const RopeKvWriteParams& params, cudaStream_t stream);

}  // namespace specd::cuda
