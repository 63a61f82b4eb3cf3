// CUDA KV write: the rule of specd/kv_write.h (CPU reference kv_write_cpu) on the device, one
// thread block per token copying its K and V rows, on the caller's stream, without host sync.
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue
// when the sizes/pointers fail validate_kv_write, or the launch error. Tokens whose slot is
// negative or past the cache are skipped (the kernel cannot report per-token errors).
#pragma once

#include <cuda_runtime_api.h>

#include "specd/kv_write.h"

namespace specd::cuda {

cudaError_t kv_write(const KvWriteParams& params, cudaStream_t stream);

}  // namespace specd::cuda
