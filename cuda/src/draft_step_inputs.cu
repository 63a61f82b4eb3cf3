#include "specd/cuda/draft_step_inputs.h"

namespace specd::cuda {
namespace {

constexpr int kThreads = 256;

// params by value: its pointers are device pointers. Each thread reads and writes only its
// own row, so the in-place (aliased) form is race-free.
__global__ void draft_step_inputs_kernel(DraftStepInputsParams params) {
  const int64_t s = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (s < params.num_seqs) draft_step_inputs_row(params, static_cast<int32_t>(s));
}

}  // namespace

cudaError_t draft_step_inputs(const DraftStepInputsParams& params, cudaStream_t stream) {
  if (!validate_draft_step_inputs(params).ok()) return cudaErrorInvalidValue;
  if (params.num_seqs == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((int64_t{params.num_seqs} + kThreads - 1) / kThreads);
  draft_step_inputs_kernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace specd::cuda
