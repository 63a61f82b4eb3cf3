// ClusterBlock<kThreads, kBlocks, kCache>: the Block concept of the shared row algorithms
// (cpp/include/specd/detail/serial_block.h) over a thread-block cluster (sm_90+) of kBlocks
// blocks of kThreads threads: one row is worked on by kBlocks * kThreads threads on up to
// kBlocks multiprocessors, where DeviceBlock (device_block.cuh) has one block. Used by the
// clustered sampling kernels (sampling.cu).
//
// rank() = block rank in the cluster * kThreads + threadIdx.x; size() = kThreads * kBlocks.
//
// Collectives. Each one first combines within the block as DeviceBlock does (warp butterfly,
// then the warps' partials in warp order), then publishes the block's value in its own shared
// memory, waits at a cluster barrier, and every thread folds the kBlocks values in block
// order through distributed shared memory. Results are deterministic for a given size() (they
// may differ in the last bits from DeviceBlock's, which folds 512 threads, as DeviceBlock's
// differ from the CPU's sequential sums). The published values alternate between two slots:
// a slot is written again two collectives later, after a barrier every reader has passed.
//
// Histogram: each block counts its own elements in its shared memory; hist_done() waits at a
// cluster barrier and merges the kBlocks histograms (bin by bin, in block order) into a local
// copy that hist_count / hist_mass read; hist_clear() waits at a cluster barrier first, so no
// block still merges the histogram it clears.
//
// Candidate cache (kCache > 0): each block pushes its own candidates; hist_done() records the
// blocks' prefix of cache sizes, and cache_key(s) / cache_mass(s) read entry s of the
// concatenation (block order) remotely. cache_capacity() is kCache, one block's capacity:
// radix_select caches only when the whole cluster's candidates fit, so no block overflows.
//
// sync() is a cluster barrier after a __threadfence(): global writes before it (probs_row's
// row) are visible to the whole cluster after it. Kernels call finish() before returning
// (a block's shared memory must outlive the other blocks' reads of it).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <type_traits>

#include "specd/detail/sampling_rules.h"

namespace specd::cuda::detail {

template <int kThreads, int kBlocks, int kCache = 0>
class ClusterBlock {
  static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static_assert(kBlocks >= 1 && kBlocks <= 16, "a cluster has at most 16 blocks");
  static constexpr int kWarps = kThreads / 32;
  static constexpr unsigned kFullMask = 0xFFFFFFFFu;

 public:
  union Value {
    double d;
    int32_t i;
    specd::detail::ArgMax a;
  };

  struct Shared {
    union {
      double d[kWarps];
      int32_t i[kWarps];
      specd::detail::ArgMax a[kWarps];
    } partial;
    Value published[2];  // this block's value of a collective (alternating slots)
    unsigned int hist_count[256];  // this block's histogram
    unsigned long long hist_mass[256];
    unsigned int merged_count[256];  // the cluster's, after hist_done()
    unsigned long long merged_mass[256];
    unsigned int cache_size;  // this block's entries
    unsigned int cache_start[kBlocks + 1];  // prefix of the blocks' sizes, after hist_done()
    unsigned long long cache_key[kCache > 0 ? kCache : 1];
    unsigned long long cache_mass[kCache > 0 ? kCache : 1];
  };

  __device__ explicit ClusterBlock(Shared* shared) : s_(shared) {}

  __device__ int32_t rank() const { return block_rank() * kThreads + static_cast<int32_t>(threadIdx.x); }
  __device__ int32_t size() const { return kThreads * kBlocks; }
  __device__ void sync() {
    __threadfence();
    cluster_sync();
  }
  // Every block calls it last, before exiting: after the last collective, other blocks may
  // still be reading this block's shared memory, which must outlive those reads.
  __device__ void finish() { cluster_sync(); }

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
  __device__ bool any(bool v) {
    const int32_t in_block = __syncthreads_or(v ? 1 : 0) != 0 ? 1 : 0;
    return across_blocks<false>(in_block, [](int32_t a, int32_t b) { return a > b ? a : b; }) != 0;
  }

  // Sum of v over the threads of lower rank (0 for rank 0): the earlier blocks' totals in
  // block order, then the block-level scan of DeviceBlock.
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
    T block_total = T(0);
    for (int w = 0; w < kWarps; ++w) block_total += part[w];
    // Earlier blocks' totals (the barrier inside also ends every read of `part`).
    const T before = across_blocks<true>(block_total, [](T a, T b) { return a + b; });
    return before + prefix + exclusive;
  }

  __device__ void hist_clear() {
    cluster_sync();  // no block still merges this block's histogram; this block's readers are done
    for (int b = static_cast<int>(threadIdx.x); b < 256; b += kThreads) {
      s_->hist_count[b] = 0u;
      s_->hist_mass[b] = 0ull;
    }
    __syncthreads();
  }
  // Warp-aggregated as in DeviceBlock (integer sums: the order of the adds does not matter).
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
  __device__ void hist_done() {
    cluster_sync();  // every block's histogram (and cache) is complete and visible
    auto cluster = cooperative_groups::this_cluster();
    for (int bin = static_cast<int>(threadIdx.x); bin < 256; bin += kThreads) {
      unsigned int count = 0u;
      unsigned long long mass = 0ull;
      for (int blk = 0; blk < kBlocks; ++blk) {
        const Shared* remote = cluster.map_shared_rank(s_, blk);
        count += remote->hist_count[bin];
        mass += remote->hist_mass[bin];
      }
      s_->merged_count[bin] = count;
      s_->merged_mass[bin] = mass;
    }
    if (threadIdx.x == 0) {
      unsigned int start = 0u;
      for (int blk = 0; blk < kBlocks; ++blk) {
        s_->cache_start[blk] = start;
        start += cluster.map_shared_rank(s_, blk)->cache_size;
      }
      s_->cache_start[kBlocks] = start;
    }
    __syncthreads();
  }
  __device__ uint32_t hist_count(int32_t bin) const { return s_->merged_count[bin]; }
  __device__ uint64_t hist_mass(int32_t bin) const { return s_->merged_mass[bin]; }

  template <int kC = kCache, class = std::enable_if_t<(kC > 0)>>
  __device__ uint32_t cache_capacity() const {
    return static_cast<uint32_t>(kCache);
  }
  __device__ void cache_clear() {
    cluster_sync();  // no block still reads this block's entries or size
    if (threadIdx.x == 0) s_->cache_size = 0u;
    __syncthreads();
  }
  __device__ void cache_push(uint64_t key, uint64_t mass) {
    const unsigned s = atomicAdd(&s_->cache_size, 1u);
    s_->cache_key[s] = key;
    s_->cache_mass[s] = mass;
  }
  __device__ uint32_t cache_size() const { return s_->cache_start[kBlocks]; }
  __device__ uint64_t cache_key(uint32_t s) const { return entry(s)->cache_key[s - s_->cache_start[owner(s)]]; }
  __device__ uint64_t cache_mass(uint32_t s) const { return entry(s)->cache_mass[s - s_->cache_start[owner(s)]]; }

 private:
  __device__ static int32_t block_rank() {
    return static_cast<int32_t>(cooperative_groups::this_cluster().block_rank());
  }
  __device__ static void cluster_sync() { cooperative_groups::this_cluster().sync(); }

  __device__ int owner(uint32_t s) const {
    int blk = 0;
    while (blk + 1 < kBlocks && s >= s_->cache_start[blk + 1]) ++blk;
    return blk;
  }
  __device__ const Shared* entry(uint32_t s) const {
    return cooperative_groups::this_cluster().map_shared_rank(s_, owner(s));
  }

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

  __device__ static void put(Value& slot, double v) { slot.d = v; }
  __device__ static void put(Value& slot, int32_t v) { slot.i = v; }
  __device__ static void put(Value& slot, specd::detail::ArgMax v) { slot.a = v; }
  __device__ static double get(const Value& slot, double*) { return slot.d; }
  __device__ static int32_t get(const Value& slot, int32_t*) { return slot.i; }
  __device__ static specd::detail::ArgMax get(const Value& slot, specd::detail::ArgMax*) { return slot.a; }

  __device__ static double shfl_xor(double v, int m) { return __shfl_xor_sync(kFullMask, v, m); }
  __device__ static int32_t shfl_xor(int32_t v, int m) { return __shfl_xor_sync(kFullMask, v, m); }
  __device__ static specd::detail::ArgMax shfl_xor(specd::detail::ArgMax v, int m) {
    return specd::detail::ArgMax{__shfl_xor_sync(kFullMask, v.value, m), __shfl_xor_sync(kFullMask, v.index, m)};
  }

  // `v` is uniform over the block. Publishes it, waits for the cluster, and folds the blocks'
  // values in block order: all of them, or (kEarlierOnly) the sum of those of lower block
  // rank. The cluster barrier also ends every read of the block's scratch before it.
  template <bool kEarlierOnly, class T, class Op>
  __device__ T across_blocks(T v, Op op) {
    Value& mine = s_->published[parity_];
    if (threadIdx.x == 0) put(mine, v);
    cluster_sync();
    auto cluster = cooperative_groups::this_cluster();
    const auto value_of = [&](int blk) {
      return get(cluster.map_shared_rank(s_, blk)->published[parity_], static_cast<T*>(nullptr));
    };
    T r;
    if constexpr (kEarlierOnly) {
      r = T(0);
      for (int blk = 0; blk < block_rank(); ++blk) r = op(r, value_of(blk));
    } else {
      r = value_of(0);
      for (int blk = 1; blk < kBlocks; ++blk) r = op(r, value_of(blk));
    }
    parity_ ^= 1;
    return r;
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
    return across_blocks<false>(r, op);
  }

  Shared* s_;
  int parity_ = 0;
};

}  // namespace specd::cuda::detail
