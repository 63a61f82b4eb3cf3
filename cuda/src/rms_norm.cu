#include "specd/cuda/rms_norm.h"

#include "detail/kv_dtype.cuh"

namespace specd::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Sum of v over the block, the same bits in every thread: warp butterflies, then the warp
// partials folded in warp order.
__device__ float block_sum(float v, float* partial) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += partial[w];
  return total;
}

// One block per row t; each thread owns elements i = threadIdx.x + j * kThreads, reading back
// in the second pass exactly the residual values it wrote in the first.
template <class T>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(RmsNormParams p) {
  __shared__ float partial[kWarps];
  const int64_t t = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + t * p.x_stride;
  T* residual = p.residual ? static_cast<T*>(p.residual) + t * p.residual_stride : nullptr;
  const T* w = static_cast<const T*>(p.weight);
  T* out = static_cast<T*>(p.out) + t * p.out_stride;
  float sq = 0.0f;
  for (int32_t i = threadIdx.x; i < p.hidden; i += kThreads) {
    float r = detail::to_float(x[i]);
    if (residual) {
      const T sum = detail::from_float<T>(__fadd_rn(r, detail::to_float(residual[i])));
      residual[i] = sum;
      r = detail::to_float(sum);
    }
    sq = __fadd_rn(sq, __fmul_rn(r, r));
  }
  const float total = block_sum(sq, partial);
  const float inv = 1.0f / sqrtf(__fadd_rn(total / static_cast<float>(p.hidden), p.eps));
  for (int32_t i = threadIdx.x; i < p.hidden; i += kThreads) {
    const float r = detail::to_float(residual ? residual[i] : x[i]);
    const float normed = detail::to_float(detail::from_float<T>(__fmul_rn(r, inv)));
    out[i] = detail::from_float<T>(__fmul_rn(detail::to_float(w[i]), normed));
  }
}

}  // namespace

cudaError_t rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (!validate_rms_norm(p).ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return detail::dispatch_kv_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rms_norm_kernel<T><<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
