// CUDA KV compaction: the rule of specd/kv_compact.h (CPU reference kv_compact_cpu) on the
// device, on the caller's stream, without host sync. One thread block per (request, layer,
// K or V); within a block, each thread owns the same slice of the row for every move d, and
// performs the request's moves in increasing d, which is what makes the in-place moves safe
// (see the header of specd/kv_compact.h).
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue
// when validate_kv_compact_launch fails, or the launch error. Invalid paths and moves
// without a slot are skipped (the kernel cannot report per-request errors).
#pragma once

#include <cuda_runtime_api.h>

#include "specd/kv_compact.h"
#include "specd/status.h"

namespace specd::cuda {

// Largest num_layers one launch moves (grid y is 2 * num_layers).
inline constexpr int32_t kKvCompactMaxLayers = 32767;

// validate_kv_compact plus the launch limit above.
Status validate_kv_compact_launch(const KvCompactParams& params);

cudaError_t kv_compact(const KvCompactParams& params, cudaStream_t stream);

}  // namespace specd::cuda
