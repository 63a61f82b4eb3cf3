#include "specd/cuda/kv_slot_mapping.h"

namespace specd::cuda {
namespace {

constexpr int kThreads = 256;

// params is passed by value: its pointers are device pointers.
__global__ void slot_mapping_kernel(SlotMappingParams params) {
  const int64_t t = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t < params.num_tokens) params.slots[t] = slot_of_token(params, static_cast<int32_t>(t));
}

}  // namespace

cudaError_t slot_mapping(const SlotMappingParams& params, cudaStream_t stream) {
  if (!validate_slot_mapping(params).ok()) return cudaErrorInvalidValue;
  if (params.num_tokens == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((int64_t{params.num_tokens} + kThreads - 1) / kThreads);
  slot_mapping_kernel<<<blocks, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace specd::cuda
