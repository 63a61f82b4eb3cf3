// CUDA draft step inputs: the rule of specd/draft_step_inputs.h (CPU reference
// draft_step_inputs_cpu) on the device, one thread per sequence, one launch for the batch, on
// the caller's stream, without host sync (so the draft k-step loop stays on the device and can
// be captured in a CUDA graph with the in-place form).
//
// All pointers in `params` are device pointers. Returns cudaSuccess, cudaErrorInvalidValue
// when the sizes/pointers fail validate_draft_step_inputs, or the launch error. Positions the
// block table does not cover get slot -1 (the kernel cannot report per-sequence errors).
#pragma once

#include <cuda_runtime_api.h>

#include "specd/draft_step_inputs.h"

namespace specd::cuda {

cudaError_t draft_step_inputs(const DraftStepInputsParams& params, cudaStream_t stream);

}  // namespace specd::cuda
