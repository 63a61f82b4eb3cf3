#include "specd/cuda/silu_mul.h"

#include "detail/kv_dtype.cuh"

namespace specd::cuda {
namespace {

constexpr int kThreads = 256;

// Grid x: chunks of kThreads elements of a row; grid y: rows.
template <class T>
__global__ void __launch_bounds__(kThreads) silu_mul_kernel(SiluMulParams p) {
  const int32_t i = static_cast<int32_t>(blockIdx.x) * kThreads + static_cast<int32_t>(threadIdx.x);
  if (i >= p.width) return;
  const int64_t t = blockIdx.y;
  const T* row = static_cast<const T*>(p.gate_up) + t * p.in_stride;
  const float g = detail::to_float(row[i]);
  const float silu = detail::to_float(detail::from_float<T>(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g)))));
  static_cast<T*>(p.out)[t * p.out_stride + i] = detail::from_float<T>(__fmul_rn(silu, detail::to_float(row[p.width + i])));
}

}  // namespace

cudaError_t silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  if (!validate_silu_mul(p).ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.num_tokens > 65535) return cudaErrorInvalidValue;  // grid y
  const dim3 grid(static_cast<unsigned>((p.width + kThreads - 1) / kThreads), static_cast<unsigned>(p.num_tokens));
  return detail::dispatch_kv_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    silu_mul_kernel<T><<<grid, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
