#include "specd/cuda/kv_write.h"

#include <cstdint>

#include "detail/row_copy.cuh"

namespace specd::cuda {
namespace {

constexpr int kThreads = 128;

// One block per token t; U is the copy unit (detail/row_copy.cuh). params by value: its
// pointers are device pointers.
template <class U>
__global__ void kv_write_kernel(KvWriteParams p, int32_t units_per_row) {
  const int32_t t = static_cast<int32_t>(blockIdx.x);
  const int64_t dst = kv_write_dst_row(p, t);
  if (dst < 0) return;
  const int64_t esize = kv_dtype_size(p.dtype);
  const auto* k_src = reinterpret_cast<const U*>(static_cast<const char*>(p.k) + t * p.k_token_stride * esize);
  const auto* v_src = reinterpret_cast<const U*>(static_cast<const char*>(p.v) + t * p.v_token_stride * esize);
  auto* k_dst = reinterpret_cast<U*>(static_cast<char*>(p.k_cache) + dst * esize);
  auto* v_dst = reinterpret_cast<U*>(static_cast<char*>(p.v_cache) + dst * esize);
  for (int32_t i = static_cast<int32_t>(threadIdx.x); i < units_per_row; i += kThreads) {
    k_dst[i] = k_src[i];
    v_dst[i] = v_src[i];
  }
}

}  // namespace

cudaError_t kv_write(const KvWriteParams& p, cudaStream_t stream) {
  if (!validate_kv_write(p).ok()) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  const uint64_t esize = static_cast<uint64_t>(kv_dtype_size(p.dtype));
  const uint64_t row_bytes = static_cast<uint64_t>(kv_row_elems(p.layout)) * esize;
  const int unit = detail::copy_unit_bytes(
      {reinterpret_cast<uintptr_t>(p.k), reinterpret_cast<uintptr_t>(p.v),
       reinterpret_cast<uintptr_t>(p.k_cache), reinterpret_cast<uintptr_t>(p.v_cache), row_bytes,
       static_cast<uint64_t>(p.k_token_stride) * esize, static_cast<uint64_t>(p.v_token_stride) * esize,
       static_cast<uint64_t>(p.layout.page_stride) * esize});
  const uint64_t units = row_bytes / static_cast<uint64_t>(unit);
  if (units > static_cast<uint64_t>(INT32_MAX)) return cudaErrorInvalidValue;
  return detail::dispatch_copy_unit(unit, [&](auto tag) {
    using U = typename decltype(tag)::type;
    kv_write_kernel<U><<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(
        p, static_cast<int32_t>(units));
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
