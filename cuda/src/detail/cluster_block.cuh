// ClusterBlock<kThreads, kBlocks, kCache>: the Block concept of the shared row algorithms
// (cpp/include/specd/detail/serial_block.h) over a thread-block cluster (sm_90+) of kBlocks
// blocks of kThreads threads: one row is worked on by kBlocks * kThreads threads on up to
// kBlocks multiprocessors, where DeviceBlock (device_block.cuh) has one block. Used by the
// clustered sampling kernels (sampling.cu).
//
// rank() = block rank in the cluster * kThreads + threadIdx.x; size() = kThreads * kBlocks.
//
// Collectives. Each one first combines within the block with DeviceBlock's collective (a
// DeviceBlock over the block's part of the shared scratch), then publishes the block's value
// in its own shared memory, waits at a cluster barrier, and every thread folds the kBlocks
// values in block order through distributed shared memory. Results are deterministic for a given size() (they
// may differ in the last bits from DeviceBlock's, which folds 512 threads, as DeviceBlock's
// differ from the CPU's sequential sums). The published values alternate between two slots:
// a slot is written again two collectives later, after a barrier every reader has passed.
//
// Histogram: each block counts its own elements in DeviceBlock's histogram; hist_done() waits at a
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

#include "device_block.cuh"
#include "specd/detail/sampling_rules.h"

namespace specd::cuda::detail {

template <int kThreads, int kBlocks, int kCache = 0>
class ClusterBlock {
  static_assert(kBlocks >= 1 && kBlocks <= 16, "a cluster has at most 16 blocks");
  using Local = DeviceBlock<kThreads, kCache>;  // this block's part of every collective

 public:
  union Value {
    double d;
    int32_t i;
    specd::detail::ArgMax a;
  };

  struct Shared {
    typename Local::Shared local;  // this block's scratch, histogram and candidate cache
    Value published[2];            // this block's value of a collective (alternating slots)
    unsigned int merged_count[256];  // the cluster's histogram, after hist_done()
    unsigned long long merged_mass[256];
    unsigned int cache_start[kBlocks + 1];  // prefix of the blocks' cache sizes, after hist_done()
  };

  __device__ explicit ClusterBlock(Shared* shared) : s_(shared), local_(&shared->local) {}

  __device__ int32_t rank() const { return block_rank() * kThreads + static_cast<int32_t>(threadIdx.x); }
  __device__ int32_t size() const { return kThreads * kBlocks; }
  __device__ bool leader() const { return threadIdx.x == 0; }  // every block has its own scratch
  __device__ void sync() {
    __threadfence();
    cluster_sync();
  }
  // Every block calls it last, before exiting: after the last collective, other blocks may
  // still be reading this block's shared memory, which must outlive those reads.
  __device__ void finish() { cluster_sync(); }

  template <class T>
  __device__ T sum(T v) {
    return across_blocks<false>(local_.sum(v), [](T a, T b) { return a + b; });
  }
  template <class T>
  __device__ T max(T v) {
    return across_blocks<false>(local_.max(v), [](T a, T b) { return a > b ? a : b; });
  }
  template <class T>
  __device__ T min(T v) {
    return across_blocks<false>(local_.min(v), [](T a, T b) { return a < b ? a : b; });
  }
  __device__ static float warp_max(float v) { return Local::warp_max(v); }  // DeviceBlock's
  __device__ specd::detail::ArgMax argmax(specd::detail::ArgMax v) {
    return across_blocks<false>(local_.argmax(v), [](specd::detail::ArgMax a, specd::detail::ArgMax b) {
      return specd::detail::better(a, b);
    });
  }
  __device__ bool any(bool v) {
    const int32_t in_block = local_.any(v) ? 1 : 0;
    return across_blocks<false>(in_block, [](int32_t a, int32_t b) { return a > b ? a : b; }) != 0;
  }
  // The earlier blocks' totals (in block order), plus the prefix within the block.
  template <class T>
  __device__ T exclusive_sum(T v) {
    const T within = local_.exclusive_sum(v);
    const T before = across_blocks<true>(local_.sum(v), [](T a, T b) { return a + b; });
    return before + within;
  }

  __device__ void hist_clear() {
    cluster_sync();  // no block still merges this block's histogram
    local_.hist_clear();
  }
  __device__ void hist_add(int32_t bin, uint64_t mass) { local_.hist_add(bin, mass); }
  __device__ void hist_done() {
    cluster_sync();  // every block's histogram (and cache) is complete and visible
    auto cluster = cooperative_groups::this_cluster();
    for (int bin = static_cast<int>(threadIdx.x); bin < 256; bin += kThreads) {
      unsigned int count = 0u;
      unsigned long long mass = 0ull;
      for (int blk = 0; blk < kBlocks; ++blk) {
        const Shared* remote = cluster.map_shared_rank(s_, blk);
        count += remote->local.hist_count[bin];
        mass += remote->local.hist_mass[bin];
      }
      s_->merged_count[bin] = count;
      s_->merged_mass[bin] = mass;
    }
    if (threadIdx.x == 0) {
      unsigned int start = 0u;
      for (int blk = 0; blk < kBlocks; ++blk) {
        s_->cache_start[blk] = start;
        start += cluster.map_shared_rank(s_, blk)->local.cache_size;
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
    local_.cache_clear();
  }
  __device__ void cache_push(uint64_t key, uint64_t mass) { local_.cache_push(key, mass); }
  __device__ uint32_t cache_size() const { return s_->cache_start[kBlocks]; }
  __device__ uint64_t cache_key(uint32_t s) const {
    const int blk = owner(s);
    return remote(blk)->local.cache_key[s - s_->cache_start[blk]];
  }
  __device__ uint64_t cache_mass(uint32_t s) const {
    const int blk = owner(s);
    return remote(blk)->local.cache_mass[s - s_->cache_start[blk]];
  }

 private:
  __device__ static int32_t block_rank() {
    return static_cast<int32_t>(cooperative_groups::this_cluster().block_rank());
  }
  __device__ static void cluster_sync() { cooperative_groups::this_cluster().sync(); }
  __device__ const Shared* remote(int blk) const { return cooperative_groups::this_cluster().map_shared_rank(s_, blk); }

  // The block whose cache holds entry s of the concatenation.
  __device__ int owner(uint32_t s) const {
    int blk = 0;
    while (blk + 1 < kBlocks && s >= s_->cache_start[blk + 1]) ++blk;
    return blk;
  }

  __device__ static void put(Value& slot, double v) { slot.d = v; }
  __device__ static void put(Value& slot, int32_t v) { slot.i = v; }
  __device__ static void put(Value& slot, specd::detail::ArgMax v) { slot.a = v; }
  __device__ static double get(const Value& slot, double*) { return slot.d; }
  __device__ static int32_t get(const Value& slot, int32_t*) { return slot.i; }
  __device__ static specd::detail::ArgMax get(const Value& slot, specd::detail::ArgMax*) { return slot.a; }

  // `v` is uniform over the block (a Local collective's result). Publishes it, waits for the
  // cluster, and folds the blocks' values in block order: all of them, or (kEarlierOnly) the
  // sum of those of lower block rank. Every thread gets the same bits.
  template <bool kEarlierOnly, class T, class Op>
  __device__ T across_blocks(T v, Op op) {
    if (threadIdx.x == 0) put(s_->published[parity_], v);
    cluster_sync();
    const auto value_of = [&](int blk) { return get(remote(blk)->published[parity_], static_cast<T*>(nullptr)); };
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

  Shared* s_;
  Local local_;
  int parity_ = 0;
};

}  // namespace specd::cuda::detail
