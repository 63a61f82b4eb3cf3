// One row of batched sampling under DrawRule::kGumbelMax (sampling_batch.h), written against
// the Block concept (detail/serial_block.h) like sample_row.h: the CUDA kernels run it with a
// thread block or cluster per row, sample_tokens_cpu with SerialBlock.
//
//   gumbel_token_row  greedy rows and rows with a top-k / top-p / min-p cut first run
//              plan_row (sample_row.h); then one pass over the row in groups of 8 tokens
//              (one Philox call and, on the device, one or two 16-byte loads per group; a second
//              Philox call per token the screen keeps)
//              keeps each thread's largest key (gumbel.h), and two collectives (max of the
//              keys, least id holding it) pick the token. A row without a cut is validated
//              in the same pass: it reads its logits once.
//
// The result is an argmax, so it does not depend on the thread layout: the kernels give
// exactly the CPU's tokens (the inverse-CDF draw's sums can differ in their last bits).
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "specd/detail/gumbel.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sample_row.h"
#include "specd/host_device.h"
#include "specd/sampling.h"
#include "specd/sampling_batch.h"
#include "specd/verify.h"

namespace specd::detail {

static_assert(kGumbelGroup == kLoadGroup, "a Philox call serves one load group");

// A Block may offer warp_max(float): the largest value among the threads of this thread's
// warp (every lane calls it; uniform control flow). The screen then uses the warp's best key
// instead of the thread's own, and rules out more tokens.
template <class Block, class = void>
struct HasWarpMax : std::false_type {};
template <class Block>
struct HasWarpMax<Block, decltype(void(std::declval<Block&>().warp_max(0.0f)))> : std::true_type {};

// The screen table: bounds[k] = gumbel_bucket_bound(k) for k < kGumbelBuckets (the kernels
// fill their shared copy with a block's threads instead).
SPECD_HOST_DEVICE inline void fill_gumbel_bounds(float* bounds) {
  for (int32_t k = 0; k < kGumbelBuckets; ++k) bounds[k] = gumbel_bucket_bound(k);
}

// The token DrawRule::kGumbelMax draws from this row with key `rng` (sampling_batch.h);
// `bounds`: fill_gumbel_bounds' table; `plan`: as sample_token_row's.
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus gumbel_token_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                                const RngKey& rng, const float* bounds, int32_t* token, RowPlan& plan) {
  *token = -1;
  if (sampling_params_code(params) != 0) return SampleStatus::kBadParams;
  const bool cuts = has_filters(params);
  if (params.temperature == 0 || cuts) {
    const SampleStatus status = plan_row(b, load, vocab, params, &plan);
    if (status != SampleStatus::kOk) return status;
    if (plan.greedy) {
      *token = plan.argmax;
      return SampleStatus::kOk;
    }
  }
  const GumbelScale scale = gumbel_scale(params.temperature);
  bool bad = false, finite = false;  // rows without a cut are validated here
  double best = -INFINITY;           // this thread's largest key, at best_id
  int32_t best_id = INT32_MAX;
  float floor = -INFINITY;  // a float at most some key found in the row: keys below it cannot win
  const int32_t groups = vocab / kGumbelGroup + (vocab % kGumbelGroup != 0 ? 1 : 0);
  // Every thread runs every round (the warp's share below needs all lanes).
  for (int32_t base = 0; base < groups; base += b.size()) {
    const int32_t group = base + b.rank();
    if (group < groups) {
      const int32_t i0 = group * kGumbelGroup;
      float logits[kGumbelGroup];
      load_group(load, i0, vocab, logits);
      // Which tokens may be drawn: finite, valid, and not below a cut's exponent floor (the
      // cheap half of kept_prob's test); a group with none skips its Philox call.
      uint32_t live = 0;
      SPECD_UNROLL
      for (int32_t j = 0; j < kGumbelGroup; ++j) {
        const float l = logits[j];
        if (!cuts) {
          bad = bad || is_bad_logit(l);
          finite = finite || l > -INFINITY;
        }
        if (!(l > -INFINITY) || is_bad_logit(l)) continue;  // probability 0, or a row reported below
        if (cuts && plan.keep_floor > -INFINITY &&
            softmax_exponent(l, plan.max_logit, plan.inv_temperature) < plan.keep_floor)
          continue;
        live |= 1u << j;
      }
      if (live != 0) {
        const Philox4x32Out high = gumbel_high_bits(rng, group);
        SPECD_UNROLL
        for (int32_t j = 0; j < kGumbelGroup; ++j) {
          if (!(live >> j & 1u)) continue;
          const float l = logits[j];
          const uint32_t h = philox_half(high, j);
          if (screen_upper(scale, l, bounds[gumbel_bucket(h)]) < floor) continue;
          if (cuts && !(kept_prob(plan, i0 + j, l) > 0)) continue;
          const double key = gumbel_key(scale, l, gumbel_from_bits(gumbel_bits(rng, i0 + j, h)));
          if (key > best) {  // ids rise through a thread's groups: equal keys keep the lower id
            best = key;
            best_id = i0 + j;
            const float f = float_at_most(key);
            floor = f > floor ? f : floor;
          }
        }
      }
    }
    if constexpr (HasWarpMax<Block>::value) floor = b.warp_max(floor);
  }
  if (!cuts) {
    if (b.any(bad)) return SampleStatus::kBadLogit;
    if (!b.any(finite)) return SampleStatus::kNoFiniteLogit;
  }
  const double top = b.max(best);
  *token = b.min(best == top ? best_id : INT32_MAX);
  return SampleStatus::kOk;
}

}  // namespace specd::detail
