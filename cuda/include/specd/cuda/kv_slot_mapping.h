// CUDA slot mapping: the rule of specd/kv_slot_mapping.h (CPU reference slot_mapping_cpu)
// computed on the device, one thread per token, on the caller's stream, without host sync.
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue
// when the sizes/pointers fail validate_slot_mapping, or the launch error. The kernel writes
// -1 for any token whose slot the rule leaves undefined (it cannot report per-token errors).
#pragma once

#include <cuda_runtime_api.h>

#include "specd/kv_slot_mapping.h"

namespace specd::cuda {

cudaError_t slot_mapping(const SlotMappingParams& params, cudaStream_t stream);

}  // namespace specd::cuda
