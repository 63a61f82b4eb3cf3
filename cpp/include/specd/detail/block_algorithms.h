// Row algorithms written once against the Block concept (detail/serial_block.h): a radix
// selection of the ranking order (key desc, id asc), the n-th flagged id, and the
// inverse-CDF draw. The CUDA kernels run them with a thread block; the CPU with SerialBlock.
//
// All functions are collectives: every thread of the block calls them with the same
// arguments (uniform control flow) and gets the same result.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "specd/host_device.h"

namespace specd::detail {

// One element as a radix selection sees it: whether it takes part, its ranking key (larger
// ranks first; equal keys: lower id first) and its fixed-point mass.
struct SelectItem {
  bool in_set;
  uint64_t key;
  uint64_t mass;
};

// Count and mass of a set of elements.
struct SelectStats {
  uint64_t count;
  uint64_t mass;
};

// "The first element (in ranking order) at which the running count (or mass) reaches
// `target`": the top-k (count >= k) and top-p (mass >= threshold) cuts.
struct SelectCriterion {
  bool by_mass;
  uint64_t target;  // >= 1

  SPECD_HOST_DEVICE bool met(const SelectStats& s) const { return (by_mass ? s.mass : s.count) >= target; }
  // The smallest n >= 1 with met(above + n elements of unit_mass), given !met(above) and that
  // some n up to the number of tied elements meets it (so unit_mass > 0 when by_mass).
  SPECD_HOST_DEVICE uint64_t ties_needed(const SelectStats& above, uint64_t unit_mass) const {
    const uint64_t have = by_mass ? above.mass : above.count;
    const uint64_t unit = by_mass ? unit_mass : 1;
    return (target - have + unit - 1) / unit;
  }
};

// Where a selection cut the ranking: the elements ranked at or above the cut are those of
// the set with key > key, or key == key and id <= id.
struct SelectCut {
  bool found;          // false: the criterion is not met even by the whole set
  uint64_t key;
  int32_t id;
  uint32_t set_count;  // elements in the set
};

SPECD_HOST_DEVICE inline bool ranks_at_or_above(uint64_t key, int32_t id, uint64_t cut_key, int32_t cut_id) {
  return key > cut_key || (key == cut_key && id <= cut_id);
}

#if defined(__CUDA_ARCH__)
#define SPECD_UNROLL _Pragma("unroll")
#else
#define SPECD_UNROLL
#endif

// Loads per thread issued together by for_each_strided (for 2-byte logits twice as many).
inline constexpr int32_t kLoadBatch = 8;

// Strided iteration with batched loads: calls fn(i, load(i)) for i = rank, rank + size, ...
// < n, in increasing i, exactly as the loop `for (i = rank; i < n; i += size) fn(i, load(i))`
// does (the same calls in the same order, so every per-thread sum is unchanged), but issues
// the loads of kBatch consecutive iterations before the first use. load(i) must be a pure
// read. On the GPU this keeps kBatch loads per thread in flight instead of one: the row
// passes were bound by memory latency, not bandwidth.
template <int32_t kBatch = kLoadBatch, class Block, class Load, class Fn>
SPECD_HOST_DEVICE void for_each_strided(const Block& b, int32_t n, const Load& load, const Fn& fn) {
  using Value = decltype(load(0));
  const int64_t step = b.size();
  int64_t i = b.rank();
  for (; i + (kBatch - 1) * step < n; i += kBatch * step) {
    Value v[kBatch];
    SPECD_UNROLL
    for (int32_t u = 0; u < kBatch; ++u) v[u] = load(static_cast<int32_t>(i + u * step));
    SPECD_UNROLL
    for (int32_t u = 0; u < kBatch; ++u) fn(static_cast<int32_t>(i + u * step), v[u]);
  }
  for (; i < n; i += step) fn(static_cast<int32_t>(i), load(static_cast<int32_t>(i)));
}

// Tiled iteration in id order: the block walks [0, n) in tiles of size() * kTileRun
// consecutive ids; in each tile, thread rank takes the kTileRun consecutive ids starting at
// tile base + rank * kTileRun (so neighbouring threads read neighbouring ids: coalesced
// loads), and a block scan of the per-thread partials orders the threads. A walk that finds
// what it looks for stops after that tile. With one thread (SerialBlock) a tile is
// kTileRun consecutive ids and every running value is the sequential one.
inline constexpr int32_t kTileRun = 8;

// The nth (1-based) id in [0, n) with flag(id) true; INT32_MAX when there are fewer.
// Integer counts only, so the result does not depend on the tiling.
template <class Block, class Flag>
SPECD_HOST_DEVICE int32_t nth_flagged_id(Block& b, int32_t n, const Flag& flag, uint64_t nth) {
  const int64_t tile = int64_t{b.size()} * kTileRun;
  uint64_t seen = 0;  // flagged ids in the tiles before this one (uniform)
  for (int64_t base = 0; base < n; base += tile) {
    const int64_t lo = base + int64_t{b.rank()} * kTileRun;
    bool f[kTileRun];
    int32_t local = 0;
    SPECD_UNROLL
    for (int32_t u = 0; u < kTileRun; ++u) {
      f[u] = lo + u < n && flag(static_cast<int32_t>(lo + u));
      local += f[u] ? 1 : 0;
    }
    const int32_t before = b.exclusive_sum(local);
    int32_t found = INT32_MAX;
    const uint64_t first = seen + static_cast<uint64_t>(before);  // flagged ids before this thread's run
    if (first < nth && nth <= first + static_cast<uint64_t>(local)) {
      uint64_t count = first;
      SPECD_UNROLL
      for (int32_t u = 0; u < kTileRun; ++u) {
        if (f[u] && ++count == nth && found == INT32_MAX) found = static_cast<int32_t>(lo + u);
      }
    }
    if (b.any(found != INT32_MAX)) return b.min(found);  // exactly one thread found it
    seen += static_cast<uint64_t>(b.sum(local));
  }
  return INT32_MAX;
}

// Whether a Block has a candidate cache (optional part of the concept, serial_block.h):
// cache_capacity(), cache_clear(), cache_push(key, mass) from any thread, then after a
// hist_done() cache_size() and cache_key(s) / cache_mass(s) for s < cache_size().
template <class Block, class = void>
struct HasSelectCache : std::false_type {};
template <class Block>
struct HasSelectCache<Block, decltype(void(std::declval<Block&>().cache_capacity()))> : std::true_type {};

// Radix selection over the elements i in [0, n) with item(i, load(i)).in_set, ranked by (key
// desc, id asc): the first element at which the running stats meet `crit`. Eight passes of 8
// bits (most significant first) fix the cut's key; one more pass in id order breaks ties.
// `load` is a pure read (for_each_strided batches it); the histograms add integers, so the
// result does not depend on the order of the adds.
//
// With a candidate cache: once the candidates left (the chosen bin's count) fit in it, the
// next pass over the row also stores their (key, mass), and the later levels histogram the
// cache instead of the row. The cache holds exactly the elements that pass would histogram,
// with the same keys and masses, and every later level keeps a subset of them by the same
// prefix test, so the histograms (integer sums) and the cut are the same as without it.
//
// `key_range_filter(key_lo, key_hi)` (called once per level after the first, by every
// thread, and once for the tie pass) returns a test `may_match(i, load(i))` that may be false
// only for an element that is not in the set or whose key is outside [key_lo, key_hi]: the
// levels skip item() for those (item() may be costly: a softmax probability). The result is
// the same with any such filter, since every element it skips is one the level would not
// histogram.
template <class Block, class Load, class ItemFn, class KeyRangeFilter>
SPECD_HOST_DEVICE SelectCut radix_select(Block& b, int32_t n, const Load& load, const ItemFn& item,
                                         SelectCriterion crit, const KeyRangeFilter& key_range_filter) {
  SelectCut cut{false, 0, -1, 0};
  SelectStats above{0, 0};  // stats of the elements ranked above every candidate left
  uint64_t prefix = 0;      // key bits fixed so far
  int32_t chosen = -1;
  bool caching = false;  // this level's pass over the row fills the cache
  bool cached = false;   // the candidates are in the cache
  for (int32_t level = 0; level < 8; ++level) {
    const int32_t shift = 56 - 8 * level;
    const auto candidate = [&](uint64_t key) { return level == 0 || (key >> (shift + 8)) == (prefix >> (shift + 8)); };
    b.hist_clear();
    if constexpr (HasSelectCache<Block>::value) {
      if (cached) {
        const uint32_t size = b.cache_size();
        for (uint32_t s = static_cast<uint32_t>(b.rank()); s < size; s += static_cast<uint32_t>(b.size())) {
          const uint64_t key = b.cache_key(s);
          if (candidate(key)) b.hist_add(static_cast<int32_t>((key >> shift) & 0xFFu), b.cache_mass(s));
        }
      }
    }
    if (!cached) {
      // The candidates' keys: the prefix fixed so far, any lower bits.
      const uint64_t free_bits = level == 0 ? ~uint64_t{0} : (uint64_t{1} << (shift + 8)) - 1;
      const uint64_t key_lo = level == 0 ? 0 : prefix & ~free_bits;
      const auto may_match = key_range_filter(key_lo, key_lo | free_bits);
      for_each_strided(b, n, load, [&](int32_t i, const auto& value) {
        if (level > 0 && !may_match(i, value)) return;
        const SelectItem it = item(i, value);
        if (!it.in_set || !candidate(it.key)) return;
        b.hist_add(static_cast<int32_t>((it.key >> shift) & 0xFFu), it.mass);
        if constexpr (HasSelectCache<Block>::value) {
          if (caching) b.cache_push(it.key, it.mass);
        }
      });
    }
    b.hist_done();
    if (level == 0)
      for (int32_t bin = 0; bin < 256; ++bin) cut.set_count += b.hist_count(bin);
    chosen = -1;
    for (int32_t bin = 255; bin >= 0; --bin) {
      const SelectStats with{above.count + b.hist_count(bin), above.mass + b.hist_mass(bin)};
      if (crit.met(with)) {
        chosen = bin;
        break;
      }
      above = with;
    }
    if (chosen < 0) return cut;  // uniform: every thread read the same histogram
    prefix |= static_cast<uint64_t>(chosen) << shift;
    if constexpr (HasSelectCache<Block>::value) {
      cached = cached || caching;
      caching = !cached && level < 7 && b.hist_count(chosen) <= b.cache_capacity();
      if (caching) b.cache_clear();
    }
  }
  // Every element left has key == prefix; they share one mass. Keep the first `needed` of
  // them in id order.
  const uint32_t ties = b.hist_count(chosen);
  const uint64_t needed = crit.ties_needed(above, b.hist_mass(chosen) / ties);
  cut.found = true;
  cut.key = prefix;
  const auto may_match = key_range_filter(prefix, prefix);
  cut.id = needed >= ties ? INT32_MAX
                          : nth_flagged_id(b, n, [&](int32_t i) {
                              const auto value = load(i);
                              if (!may_match(i, value)) return false;
                              const SelectItem it = item(i, value);
                              return it.in_set && it.key == prefix;
                            }, needed);
  return cut;
}

// Without a filter (every element's item computed at every level).
template <class Block, class Load, class ItemFn>
SPECD_HOST_DEVICE SelectCut radix_select(Block& b, int32_t n, const Load& load, const ItemFn& item,
                                         SelectCriterion crit) {
  return radix_select(b, n, load, item, crit, [](uint64_t, uint64_t) {
    return [](int32_t, const auto&) { return true; };
  });
}

// The same with item(i) doing its own reads.
template <class Block, class ItemFn>
SPECD_HOST_DEVICE SelectCut radix_select(Block& b, int32_t n, const ItemFn& item, SelectCriterion crit) {
  return radix_select(b, n, [](int32_t i) { return i; }, [&](int32_t i, int32_t) { return item(i); }, crit);
}

// Ids per thread and tile of the sampling kernels' draw_inverse_cdf: longer runs than
// kTileRun, since each tile of the draw costs three block-wide collectives (a scan, an any,
// then a min or a max; cluster barriers in a ClusterBlock): 152k ids take 10 tiles of
// 512 x 32 instead of 38 of 512 x 8. The run is draw_inverse_cdf's template argument: with
// one thread (SerialBlock) the draw is the same for any run; with more, the run sets the
// order in which the GPU's running sums are added (deterministic either way). Measured on an
// H100 (docs/benchmarks.md, fifth GPU session): clustered draft sampling 1.14x faster with
// it; stochastic verification kept kTileRun (its clustered kernel was 0.89x with 32, which
// took 128 registers and so fewer resident blocks).
inline constexpr int32_t kDrawRun = 32;

// Inverse-CDF draw over weights w(i) >= 0, i in [0, n): the first i with w(i) > 0 whose
// running sum exceeds `target`, else the last i with w(i) > 0 (-1 if none): the rule of
// sample_from_weights. Tiled as kTileRun says, with runs of kDrawRun ids (the template
// argument: detail::kDrawRun or kTileRun): in each tile,
// thread t's running sum starts at carried + (exclusive block scan of the threads' run
// sums) and adds its run's positive weights in id order; `carried` of the next tile is the
// last thread's final running sum.
// The walk stops after the first tile where some running sum exceeds `target`, so each
// weight is computed once, and only up to that tile. With one thread the running sum is
// exactly the sequential one (carried + 0, then one weight at a time).
template <int32_t kDrawRun, class Block, class Weight>
SPECD_HOST_DEVICE int32_t draw_inverse_cdf(Block& b, int32_t n, const Weight& weight, double target) {
  const int64_t tile = int64_t{b.size()} * kDrawRun;
  double carried = 0;  // running sum before this tile (uniform)
  int32_t last = -1;   // this thread's last id with w > 0 so far
  for (int64_t base = 0; base < n; base += tile) {
    const int64_t lo = base + int64_t{b.rank()} * kDrawRun;
    double w[kDrawRun];
    double local = 0;
    SPECD_UNROLL
    for (int32_t u = 0; u < kDrawRun; ++u) {
      w[u] = lo + u < n ? weight(static_cast<int32_t>(lo + u)) : 0.0;
      if (w[u] > 0) local += w[u];
    }
    double running = carried + b.exclusive_sum(local);
    int32_t found = INT32_MAX;
    SPECD_UNROLL
    for (int32_t u = 0; u < kDrawRun; ++u) {
      if (!(w[u] > 0) || found != INT32_MAX) continue;
      running += w[u];
      last = static_cast<int32_t>(lo + u);
      if (target < running) found = last;
    }
    if (b.any(found != INT32_MAX)) return b.min(found);
    // No thread stopped early: the last thread's running sum covers the whole tile.
    carried = b.max(b.rank() == b.size() - 1 ? running : -INFINITY);
  }
  return b.max(last);
}

}  // namespace specd::detail
