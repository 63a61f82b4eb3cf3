// DeviceBlock<kThreads>: the Block concept of the shared row algorithms
// (cpp/include/specd/detail/serial_block.h) for one CUDA thread block of exactly kThreads
// threads. Used by the sampling and verification kernels.
//
// Determinism: a reduction is a warp butterfly (every lane ends with the same bits, as the
// operations used are commutative), then every thread folds the per-warp partials in warp
// order. A scan is a Hillis-Steele warp scan plus the sum of the earlier warps' totals. No
// floating-point atomics: the histogram adds integers only (warp-aggregated). So results
// depend on kThreads but never on scheduling.
//
// Barriers: each collective ends with __syncthreads() after its last read of shared
// scratch, so back-to-back collectives never overwrite data still being read;
// hist_clear() starts with one, so the previous histogram may be read until then.
#pragma once

#include <cstdint>
#include <type_traits>

#include "specd/detail/sampling_rules.h"

namespace specd::cuda::detail {

// kCache > 0: a candidate cache of that many (key, mass) entries in shared memory, for
// radix_select (16 bytes each; the sampling kernels' static shared memory stays < 48 KiB).
template <int kThreads, int kCache = 0>
class DeviceBlock {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static constexpr int kWarps = kThreads / 32;
  static constexpr unsigned kFullMask = 0xFFFFFFFFu;

 public:
  // Shared scratch: declare one `__shared__ Shared` per block and pass its address.
  struct Shared {
    union {
      double d[kWarps];
      int32_t i[kWarps];
      specd::detail::ArgMax a[kWarps];
    } partial;
    unsigned int hist_count[256];
    unsigned long long hist_mass[256];
    unsigned int cache_size;
    unsigned long long cache_key[kCache > 0 ? kCache : 1];
    unsigned long long cache_mass[kCache > 0 ? kCache : 1];
  };

  __device__ explicit DeviceBlock(Shared* shared) : s_(shared) {}

  __device__ int32_t rank() const { return static_cast<int32_t>(threadIdx.x); }
  __device__ bool leader() const { return threadIdx.x == 0; }
  __device__ int32_t size() const { return kThreads; }
  __device__ void sync() { __syncthreads(); }

  template <class T>
  __device__ T sum(T v) {
    return reduce(v, [](T a, T b) { return a + b; });
  }
  template <class T>
  __device__ T max(T v) {
    return reduce(v, [](T a, T b) { return a > b ? a : b; });
  }
  template <class T>
  __device__ T min(T v) {
    return reduce(v, [](T a, T b) { return a < b ? a : b; });
  }
  __device__ specd::detail::ArgMax argmax(specd::detail::ArgMax v) {
    return reduce(v, [](specd::detail::ArgMax a, specd::detail::ArgMax b) { return specd::detail::better(a, b); });
  }
  __device__ bool any(bool v) { return __syncthreads_or(v ? 1 : 0) != 0; }
  // The largest v among this thread's warp (every lane calls it; no barrier, not a
  // collective of the block). No NaN. Used by the Gumbel-max draw's screen (gumbel_row.h).
  __device__ static float warp_max(float v) {
#if __CUDA_ARCH__ >= 800
    int32_t k = __float_as_int(v);
    k = k >= 0 ? k : (k ^ 0x7FFFFFFF);  // ordered like the floats
    k = __reduce_max_sync(kFullMask, k);
    return __int_as_float(k >= 0 ? k : (k ^ 0x7FFFFFFF));
#else
    for (int m = 16; m > 0; m >>= 1) {
      const float other = __shfl_xor_sync(kFullMask, v, m);
      v = other > v ? other : v;
    }
    return v;
#endif
  }

  // Sum of v over the threads of lower rank (0 for rank 0).
  template <class T>
  __device__ T exclusive_sum(T v) {
    const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
    T inclusive = v;
    for (int d = 1; d < 32; d <<= 1) {
      const T up = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive = up + inclusive;
    }
    T exclusive = __shfl_up_sync(kFullMask, inclusive, 1);
    if (lane == 0) exclusive = T(0);
    T* part = slots(static_cast<T*>(nullptr));
    if (lane == 31) part[warp] = inclusive;
    __syncthreads();
    T prefix = T(0);
    for (int w = 0; w < warp; ++w) prefix += part[w];
    __syncthreads();
    return prefix + exclusive;
  }

  __device__ void hist_clear() {
    __syncthreads();  // readers of the previous histogram are done
    for (int b = static_cast<int>(threadIdx.x); b < 256; b += kThreads) {
      s_->hist_count[b] = 0u;
      s_->hist_mass[b] = 0ull;
    }
    __syncthreads();
  }
  // Warp-aggregated: the lanes calling together that share a bin add their count and mass
  // with one atomic each (most elements of a softmax row fall into a few bins, and 32 lanes
  // serialized on one shared address were the radix selection's bottleneck). The sums are
  // integers, so the histogram is the same as with one add per element, in any order.
  __device__ void hist_add(int32_t bin, uint64_t mass) {
    const unsigned active = __activemask();
    const unsigned peers = __match_any_sync(active, bin);
    unsigned long long group_mass = mass;
    if (__any_sync(active, mass != 0)) group_mass = peer_sum(peers, mass);
    if ((threadIdx.x & 31) == static_cast<unsigned>(__ffs(peers) - 1)) {
      atomicAdd(&s_->hist_count[bin], static_cast<unsigned>(__popc(peers)));
      if (group_mass != 0) atomicAdd(&s_->hist_mass[bin], group_mass);
    }
  }
  __device__ void hist_done() { __syncthreads(); }
  __device__ uint32_t hist_count(int32_t bin) const { return s_->hist_count[bin]; }
  __device__ uint64_t hist_mass(int32_t bin) const { return s_->hist_mass[bin]; }

  // The candidate cache (serial_block.h); declared only with kCache > 0, so that
  // radix_select sees none otherwise. Pushes take slots with a shared atomic: the order of
  // the entries varies, which radix_select's integer histograms do not see.
  template <int kC = kCache, class = std::enable_if_t<(kC > 0)>>
  __device__ uint32_t cache_capacity() const {
    return static_cast<uint32_t>(kCache);
  }
  __device__ void cache_clear() {
    __syncthreads();  // readers of the previous cache are done
    if (threadIdx.x == 0) s_->cache_size = 0u;
    __syncthreads();
  }
  __device__ void cache_push(uint64_t key, uint64_t mass) {
    const unsigned s = atomicAdd(&s_->cache_size, 1u);
    s_->cache_key[s] = key;
    s_->cache_mass[s] = mass;
  }
  __device__ uint32_t cache_size() const { return s_->cache_size; }
  __device__ uint64_t cache_key(uint32_t s) const { return s_->cache_key[s]; }
  __device__ uint64_t cache_mass(uint32_t s) const { return s_->cache_mass[s]; }

 private:
  // Sum over the lanes of `peers` (every one of them calls with the same mask) of a 64-bit
  // value, mod 2^64 as the serial sum: three 32-bit reductions of 27, 27 and 10 bits, whose
  // sums over at most 32 lanes cannot overflow.
  __device__ static unsigned long long peer_sum(unsigned peers, uint64_t v) {
    constexpr uint64_t k27 = (uint64_t{1} << 27) - 1;
    const auto lo = static_cast<unsigned long long>(__reduce_add_sync(peers, static_cast<unsigned>(v & k27)));
    const auto mid = static_cast<unsigned long long>(__reduce_add_sync(peers, static_cast<unsigned>((v >> 27) & k27)));
    const auto hi = static_cast<unsigned long long>(__reduce_add_sync(peers, static_cast<unsigned>(v >> 54)));
    return lo + (mid << 27) + (hi << 54);
  }

  __device__ double* slots(double*) { return s_->partial.d; }
  __device__ int32_t* slots(int32_t*) { return s_->partial.i; }
  __device__ specd::detail::ArgMax* slots(specd::detail::ArgMax*) { return s_->partial.a; }

  __device__ static double shfl_xor(double v, int m) { return __shfl_xor_sync(kFullMask, v, m); }
  __device__ static int32_t shfl_xor(int32_t v, int m) { return __shfl_xor_sync(kFullMask, v, m); }
  __device__ static specd::detail::ArgMax shfl_xor(specd::detail::ArgMax v, int m) {
    return specd::detail::ArgMax{__shfl_xor_sync(kFullMask, v.value, m), __shfl_xor_sync(kFullMask, v.index, m)};
  }

  template <class T, class Op>
  __device__ T reduce(T v, Op op) {
    for (int m = 16; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
    T* part = slots(static_cast<T*>(nullptr));
    const int warp = static_cast<int>(threadIdx.x) >> 5;
    if ((threadIdx.x & 31) == 0) part[warp] = v;
    __syncthreads();
    T r = part[0];
    for (int w = 1; w < kWarps; ++w) r = op(r, part[w]);
    __syncthreads();
    return r;
  }

  Shared* s_;
};

}  // namespace specd::cuda::detail
