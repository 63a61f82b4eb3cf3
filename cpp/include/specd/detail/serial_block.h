// SerialBlock: the "Block" of the row algorithms (detail/sample_row.h, detail/verify_walk.h)
// with one thread, so the CPU runs exactly the code the CUDA kernels run.
//
// The Block concept (the CUDA one is cuda/src/device_block.cuh):
// - rank() in [0, size()): this thread; leader(): whether this thread writes values that
//   every thread of its own thread block reads from block-local scratch (`__shared__`
//   arrays the row code keeps beside the Block): rank 0 for a single block, the first thread
//   of each block for a cluster of blocks (cuda/src/detail/cluster_block.cuh), whose blocks
//   each hold their own copy; loops over a row are strided (i = rank(); i < n;
//   i += size()) or tiled (block_algorithms.h: tiles of size() * kTileRun ids, rank()'s
//   kTileRun consecutive ids in each, threads ordered by a block scan).
// - Collectives: every thread of the block calls them, in the same order, with uniform
//   control flow, and every thread gets the same bits back: sum, max, min (of double or
//   int32), exclusive_sum (prefix over ranks below this one), any (of bool), argmax (of
//   ArgMax), sync. Reductions combine per-thread partials in a fixed order, so results are
//   deterministic for a given size().
// - A 256-bin histogram of (count, fixed-point mass): hist_clear(), hist_add(bin, mass)
//   from any thread, hist_done(), then hist_count(b) / hist_mass(b) read by every thread
//   until the next hist_clear().
// - Optionally, a candidate cache for radix_select (block_algorithms.h, HasSelectCache):
//   cache_capacity(), cache_clear(), cache_push(key, mass) from any thread, then after
//   hist_done() cache_size(), cache_key(s), cache_mass(s). A Block without it (the tests'
//   ThreadedBlock) always selects over the row.
// With one thread, a strided or tiled loop visits the row in id order and every
// reduction is that thread's sequential sum: the arithmetic of the CPU references.
#pragma once

#include <cstdint>

#include "specd/detail/sampling_rules.h"
#include "specd/host_device.h"

namespace specd::detail {

class SerialBlock {
 public:
  SPECD_HOST_DEVICE int32_t rank() const { return 0; }
  SPECD_HOST_DEVICE bool leader() const { return true; }
  SPECD_HOST_DEVICE int32_t size() const { return 1; }
  SPECD_HOST_DEVICE void sync() {}

  template <class T>
  SPECD_HOST_DEVICE T sum(T v) { return v; }
  template <class T>
  SPECD_HOST_DEVICE T max(T v) { return v; }
  template <class T>
  SPECD_HOST_DEVICE T min(T v) { return v; }
  template <class T>
  SPECD_HOST_DEVICE T exclusive_sum(T) { return T(0); }
  SPECD_HOST_DEVICE bool any(bool v) { return v; }
  SPECD_HOST_DEVICE ArgMax argmax(ArgMax v) { return v; }

  SPECD_HOST_DEVICE void hist_clear() {
    for (int32_t b = 0; b < 256; ++b) {
      count_[b] = 0;
      mass_[b] = 0;
    }
  }
  SPECD_HOST_DEVICE void hist_add(int32_t bin, uint64_t mass) {
    ++count_[bin];
    mass_[bin] += mass;
  }
  SPECD_HOST_DEVICE void hist_done() {}
  SPECD_HOST_DEVICE uint32_t hist_count(int32_t bin) const { return count_[bin]; }
  SPECD_HOST_DEVICE uint64_t hist_mass(int32_t bin) const { return mass_[bin]; }

  // A small cache, so that the CPU tests run radix_select's cached levels too.
  static constexpr uint32_t kCacheCapacity = 256;
  SPECD_HOST_DEVICE uint32_t cache_capacity() const { return kCacheCapacity; }
  SPECD_HOST_DEVICE void cache_clear() { cache_size_ = 0; }
  SPECD_HOST_DEVICE void cache_push(uint64_t key, uint64_t mass) {
    cache_key_[cache_size_] = key;
    cache_mass_[cache_size_] = mass;
    ++cache_size_;
  }
  SPECD_HOST_DEVICE uint32_t cache_size() const { return cache_size_; }
  SPECD_HOST_DEVICE uint64_t cache_key(uint32_t s) const { return cache_key_[s]; }
  SPECD_HOST_DEVICE uint64_t cache_mass(uint32_t s) const { return cache_mass_[s]; }

 private:
  uint32_t count_[256];  // written by hist_clear() before any read
  uint64_t mass_[256];
  uint32_t cache_size_ = 0;
  uint64_t cache_key_[kCacheCapacity];  // written by cache_push() before any read
  uint64_t cache_mass_[kCacheCapacity];
};

}  // namespace specd::detail
