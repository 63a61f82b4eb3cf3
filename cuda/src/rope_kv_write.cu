#include "specd/cuda/rope_kv_write.h"

#include "detail/kv_dtype.cuh"

namespace specd::cuda {
namespace {

constexpr int kThreads = 128;

template <class T>
__device__ __forceinline__ float rounded_product(float a, float b) {
  return detail::to_float(detail::from_float<T>(__fmul_rn(a, b)));
}

// One block per token t. Pair j of (q_heads + kv_heads) * head_dim / 2 is element d of head
// j / half and its partner d + half; heads past q_heads are K heads (written to the cache when
// the token has a slot). Then the V row is copied.
template <class T>
__global__ void __launch_bounds__(kThreads) rope_kv_write_kernel(RopeKvWriteParams p) {
  const int64_t t = blockIdx.x;
  const int32_t d = p.layout.head_dim, half = d / 2, kv_heads = p.layout.kv_heads;
  const int64_t slot = p.slot_mapping[t];
  const int64_t dst = kv_slot_in_range(p.layout, slot) ? kv_row_offset(p.layout, slot) : -1;
  const T* row = static_cast<const T*>(p.qkv) + t * p.qkv_stride;
  const T* c = static_cast<const T*>(p.cos) + t * p.cos_sin_stride;
  const T* s = static_cast<const T*>(p.sin) + t * p.cos_sin_stride;
  const int32_t pairs = (p.q_heads + kv_heads) * half;
  for (int32_t j = threadIdx.x; j < pairs; j += kThreads) {
    const int32_t head = j / half, i = j % half;
    T* out;
    if (head < p.q_heads) {
      out = static_cast<T*>(p.q_out) + t * p.q_out_stride + int64_t{head} * d;
    } else {
      if (dst < 0) continue;
      out = static_cast<T*>(p.k_cache) + dst + int64_t{head - p.q_heads} * d;
    }
    const T* x = row + int64_t{head} * d;
    const float lo = detail::to_float(x[i]), hi = detail::to_float(x[i + half]);
    out[i] = detail::from_float<T>(__fadd_rn(rounded_product<T>(lo, detail::to_float(c[i])),
                                             rounded_product<T>(-hi, detail::to_float(s[i]))));
    out[i + half] = detail::from_float<T>(__fadd_rn(rounded_product<T>(hi, detail::to_float(c[i + half])),
                                                    rounded_product<T>(lo, detail::to_float(s[i + half]))));
  }
  if (dst < 0) return;
  const T* v = row + int64_t{p.q_heads + kv_heads} * d;
  T* v_out = static_cast<T*>(p.v_cache) + dst;
  for (int32_t i = threadIdx.x; i < kv_heads * d; i += kThreads) v_out[i] = v[i];
}

}  // namespace

cudaError_t rope_kv_write(const RopeKvWriteParams& p, cudaStream_t stream) {
  if (!validate_rope_kv_write(p).ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  return detail::dispatch_kv_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rope_kv_write_kernel<T><<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
