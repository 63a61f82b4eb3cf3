#include "specd/cuda/kv_compact.h"

#include <cstdint>

#include "detail/row_copy.cuh"

namespace specd::cuda {
namespace {

constexpr int kThreads = 128;

// Block (r, 2 * layer + kv). Thread i copies units i, i + kThreads, ... of the row for every
// move d = 1..n in increasing d, so for each unit of memory one thread performs all of the
// request's reads and writes in the order of the rule. The cache pointers are deliberately
// neither const nor __restrict__ (no read-only/non-coherent loads): a thread may read a row
// it wrote earlier in the loop.
template <class U>
__global__ void kv_compact_kernel(KvCompactParams p, int32_t units_per_row) {
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  const int64_t layer = blockIdx.y >> 1;
  const bool is_v = (blockIdx.y & 1u) != 0;
  if (!kv_compact_path_valid(p, r)) return;  // uniform over the block
  const int64_t esize = kv_dtype_size(p.dtype);
  char* base = static_cast<char*>(is_v ? p.v_cache : p.k_cache) + layer * p.layer_stride * esize;
  const int32_t n = p.num_accepted[r];
  for (int32_t d = 1; d <= n; ++d) {  // increasing d: see specd/kv_compact.h
    const KvMove m = kv_compact_move(p, r, d);
    if (m.src_slot < 0 || m.dst_slot < 0 || m.src_slot == m.dst_slot) continue;
    U* src = reinterpret_cast<U*>(base + kv_row_offset(p.layout, m.src_slot) * esize);
    U* dst = reinterpret_cast<U*>(base + kv_row_offset(p.layout, m.dst_slot) * esize);
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < units_per_row; i += kThreads) dst[i] = src[i];
  }
}

}  // namespace

Status validate_kv_compact_launch(const KvCompactParams& p) {
  SPECD_RETURN_IF_ERROR(validate_kv_compact(p));
  if (p.num_layers > kKvCompactMaxLayers)
    return error_status(StatusCode::kInvalidArgument, "kv_compact: one launch moves at most ",
                        kKvCompactMaxLayers, " layers, got ", p.num_layers);
  return Status::Ok();
}

cudaError_t kv_compact(const KvCompactParams& p, cudaStream_t stream) {
  if (!validate_kv_compact_launch(p).ok()) return cudaErrorInvalidValue;
  if (p.num_seqs == 0 || p.layout.num_pages == 0) return cudaSuccess;  // no slot exists
  const uint64_t esize = static_cast<uint64_t>(kv_dtype_size(p.dtype));
  const uint64_t row_bytes = static_cast<uint64_t>(kv_row_elems(p.layout)) * esize;
  // A negative layer_stride wraps modulo 2^64, which keeps its divisibility by 2..16.
  const int unit = detail::copy_unit_bytes(
      {reinterpret_cast<uintptr_t>(p.k_cache), reinterpret_cast<uintptr_t>(p.v_cache), row_bytes,
       static_cast<uint64_t>(p.layout.page_stride) * esize,
       static_cast<uint64_t>(p.layer_stride) * esize});
  const uint64_t units = row_bytes / static_cast<uint64_t>(unit);
  if (units > static_cast<uint64_t>(INT32_MAX)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.num_seqs), 2u * static_cast<unsigned>(p.num_layers));
  return detail::dispatch_copy_unit(unit, [&](auto tag) {
    using U = typename decltype(tag)::type;
    kv_compact_kernel<U><<<grid, kThreads, 0, stream>>>(p, static_cast<int32_t>(units));
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
