// One row of batched sampling under DrawRule::kGumbelMax (sampling_batch.h), written against
// the Block concept (detail/serial_block.h) like sample_row.h: the CUDA kernels run it with a
// thread block or cluster per row, sample_tokens_cpu with SerialBlock.
//
//   gumbel_token_row  greedy rows and rows with a top-k / top-p / min-p cut first run
//              plan_row (sample_row.h); then gumbel_pass: one pass over the row in groups
//              of 8 tokens (one Philox call and, on the device, one or two 16-byte loads per
//              group; a second Philox call per token the screen keeps) keeps each thread's
//              largest key (gumbel.h), and two collectives (max of the keys, least id holding
//              it) pick the token. A row without a cut is validated in the same pass (a bad
//              logit makes the thread's key +inf): it reads its logits once.
//   gumbel_uncut_row / gumbel_cut_row  its two halves: a sampled row without a cut (no
//              RowPlan: sample_tokens' lean one-pass kernel runs it beside the greedy rows,
//              takes_one_pass), and every other row (the general kernels').
//   gumbel_probs_row  the probability row (probs_row's bits) and a token drawn from the
//              written floats by the same noise: sample_tokens_and_probs under kGumbelMax.
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

// A thread's running draw: its largest key and that key's id, and `floor`, a float at most
// some key found in the row (a token whose key bound is below it cannot win). Ids rise
// through a thread's groups, so keeping only larger keys keeps the lower id of equal ones.
struct GumbelBest {
  double key = -INFINITY;
  int32_t id = INT32_MAX;
  float floor = -INFINITY;
  SPECD_HOST_DEVICE void offer(double k, int32_t i) {
    if (!(k > key)) return;
    key = k;
    id = i;
    const float f = float_at_most(k);
    floor = f > floor ? f : floor;
  }
};

// The tokens of group `group` whose bit is set in `live` (bit j: token 8 group + j): each
// whose float key bound upper(j, noise bound) reaches best.floor and that eligible(j) admits
// gets its noise g and offers key(j, g). One Philox call for the group's high bits, one more
// per token offered.
template <class Upper, class Eligible, class Key>
SPECD_HOST_DEVICE void offer_group(const RngKey& rng, int32_t group, uint32_t live, const float* bounds,
                                   GumbelBest& best, const Upper& upper, const Eligible& eligible, const Key& key) {
  const Philox4x32Out high = gumbel_high_bits(rng, group);
  SPECD_UNROLL
  for (int32_t j = 0; j < kGumbelGroup; ++j) {
    if (!(live >> j & 1u)) continue;
    const uint32_t h = philox_half(high, j);
    if (upper(j, bounds[gumbel_bucket(h)]) < best.floor || !eligible(j)) continue;
    const int32_t i = group * kGumbelGroup + j;
    best.offer(key(j, gumbel_from_bits(gumbel_bits(rng, i, h))), i);
  }
}

// The rounds of a Gumbel pass over a row of `vocab`: thread rank takes groups rank, rank +
// size, ..., and fn(group, i0, values) gets each group's first id and its 8 logits (-inf past
// the row's end). Every thread runs every round, so that the warp can share best.floor after
// each (Blocks with warp_max).
template <class Block, class Load, class Fn>
SPECD_HOST_DEVICE void gumbel_rounds(Block& b, const Load& load, int32_t vocab, GumbelBest& best, const Fn& fn) {
  const int32_t groups = vocab / kGumbelGroup + (vocab % kGumbelGroup != 0 ? 1 : 0);
  for (int32_t base = 0; base < groups; base += b.size()) {
    const int32_t group = base + b.rank();
    if (group < groups) {
      float values[kGumbelGroup];
      load_group(load, group * kGumbelGroup, vocab, values);
      fn(group, group * kGumbelGroup, values);
    }
    if constexpr (HasWarpMax<Block>::value) best.floor = b.warp_max(best.floor);
  }
}

// Whether sample_tokens answers a row in one pass over its logits, with no plan and no sums:
// greedy rows (temperature 0: greedy_token_row) under either rule, and under kGumbelMax rows
// without a top-k / top-p / min-p cut (gumbel_uncut_row). Under kGumbelMax the CUDA launcher
// runs these rows in a lean kernel of their own and the general kernels skip them; under
// kInverseCdf the general kernels run greedy rows' one pass themselves
// (cuda/src/detail/sampling_kernels.cuh). sample_tokens_cpu dispatches alike. Rows with
// invalid parameters get kBadParams either way.
SPECD_HOST_DEVICE inline bool takes_one_pass(const SamplingParams& params, DrawRule draw) {
  return params.temperature == 0 || (draw == DrawRule::kGumbelMax && !has_filters(params));
}

// The Gumbel pass over a row. kCut false: a row without a cut (validated here: a bad logit
// gives kBadLogit; `plan` is not read). kCut true: plan_row ran on the row (validated;
// plan.keep_floor and kept_prob give the cut). `token`: the kept token of largest key, -1
// with a bad status. (A template flag, not a runtime one: each kernel compiles only the
// pass it runs.)
template <bool kCut, class Block, class Load>
SPECD_HOST_DEVICE SampleStatus gumbel_pass(Block& b, const Load& load, int32_t vocab, double temperature,
                                           const RngKey& rng, const float* bounds, const RowPlan& plan,
                                           int32_t* token) {
  const GumbelScale scale = gumbel_scale(temperature);
  bool bad = false;  // rows without a cut are validated here
  GumbelBest best;
  gumbel_rounds(b, load, vocab, best, [&](int32_t group, int32_t i0, float (&logits)[kGumbelGroup]) {
    // Which tokens may be drawn: finite, valid, and not below a cut's exponent floor (the
    // cheap half of kept_prob's test); a group with none skips its Philox call.
    uint32_t live = 0;
    SPECD_UNROLL
    for (int32_t j = 0; j < kGumbelGroup; ++j) {
      const float l = logits[j];
      if constexpr (!kCut) bad = bad || is_bad_logit(l);
      if (!(l > -INFINITY) || is_bad_logit(l)) continue;  // probability 0, or a row reported below
      if constexpr (kCut) {
        if (plan.keep_floor > -INFINITY && softmax_exponent(l, plan.max_logit, plan.inv_temperature) < plan.keep_floor)
          continue;
      }
      live |= 1u << j;
    }
    if (live != 0)
      offer_group(
          rng, group, live, bounds, best, [&](int32_t j, float g) { return screen_upper(scale, logits[j], g); },
          [&](int32_t j) { return !kCut || kept_prob(plan, i0 + j, logits[j]) > 0; },
          [&](int32_t j, double g) { return gumbel_key(scale, logits[j], g); });
  });
  // Keys are finite, so +inf marks a thread that read a bad logit (a row without a cut); and
  // every finite logit is a candidate until a key is found, so a row with one has a key
  // above -inf. Two collectives: the largest key, then the least id holding it.
  const double top = b.max(bad ? INFINITY : best.key);
  if (top == INFINITY) return SampleStatus::kBadLogit;
  if (!(top > -INFINITY)) return SampleStatus::kNoFiniteLogit;
  *token = b.min(best.key == top ? best.id : INT32_MAX);
  return SampleStatus::kOk;
}

// gumbel_token_row's token and status for a row that takes_one_pass under kGumbelMax with
// temperature != 0 (no cut): its parameters' status, then one Gumbel pass. It needs no
// RowPlan, so its kernel stays small (cuda/src/detail/sampling_kernels.cuh).
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus gumbel_uncut_row(Block& b, const Load& load, int32_t vocab,
                                                const SamplingParams& params, const RngKey& rng, const float* bounds,
                                                int32_t* token) {
  *token = -1;
  if (sampling_params_code(params) != 0) return SampleStatus::kBadParams;
  const RowPlan unused{};
  return gumbel_pass<false>(b, load, vocab, params.temperature, rng, bounds, unused, token);
}

// gumbel_token_row's token and status for any other row (greedy, or with a cut): its
// parameters' status, plan_row, then (unless the plan leaves one token) the Gumbel pass
// over the kept tokens. The general kernels run it: they skip the one-pass rows.
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus gumbel_cut_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                              const RngKey& rng, const float* bounds, int32_t* token, RowPlan& plan) {
  *token = -1;
  if (sampling_params_code(params) != 0) return SampleStatus::kBadParams;
  const SampleStatus status = plan_row(b, load, vocab, params, &plan);
  if (status != SampleStatus::kOk) return status;
  if (plan.greedy) {
    *token = plan.argmax;
    return SampleStatus::kOk;
  }
  return gumbel_pass<true>(b, load, vocab, params.temperature, rng, bounds, plan, token);
}

// The token DrawRule::kGumbelMax draws from this row with key `rng` (sampling_batch.h);
// `bounds`: fill_gumbel_bounds' table; `plan`: as sample_token_row's.
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus gumbel_token_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                                const RngKey& rng, const float* bounds, int32_t* token, RowPlan& plan) {
  if (params.temperature != 0 && takes_one_pass(params, DrawRule::kGumbelMax))
    return gumbel_uncut_row(b, load, vocab, params, rng, bounds, token);
  return gumbel_cut_row(b, load, vocab, params, rng, bounds, token, plan);
}

// probs_row (sample_row.h) under DrawRule::kGumbelMax: the same probability row, bit for
// bit, written in groups of 8, and the token drawn from it by the Gumbel-max rule of the
// written floats: the id of largest deterministic_log(q_i) + g_i among q_i > 0 (g_i the noise
// of sample_tokens' rule, the same bits), lowest id among equal keys. Its distribution is the
// written row normalized, what verification takes for the draft. No sum, no second pass.
// `total` non-null: probs_row's total of the row, written by rank 0 (its floats summed as
// doubles, per thread in id order; 0 when status != kOk), the same bits as probs_row's with
// one thread.
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus gumbel_probs_row(Block& b, const Load& load, int32_t vocab,
                                                const SamplingParams& params, float* probs, const RngKey& rng,
                                                const float* bounds, int32_t* token, RowPlan& plan,
                                                double* total = nullptr) {
  *token = -1;
  if (total != nullptr && b.rank() == 0) *total = 0;
  const SampleStatus status = plan_row(b, load, vocab, params, &plan);
  if (status != SampleStatus::kOk) {
    for (int32_t i = b.rank(); i < vocab; i += b.size()) probs[i] = 0.0f;
    return status;
  }
  GumbelBest best;
  double partial = 0;
  gumbel_rounds(b, load, vocab, best, [&](int32_t group, int32_t i0, float (&q)[kGumbelGroup]) {
    uint32_t live = 0;  // the logits become the row's probabilities
    SPECD_UNROLL
    for (int32_t j = 0; j < kGumbelGroup; ++j) {
      if (i0 + j >= vocab) break;
      q[j] = static_cast<float>(row_prob(plan, i0 + j, q[j]));
      probs[i0 + j] = q[j];
      if (total != nullptr) partial += static_cast<double>(q[j]);
      if (q[j] > 0) live |= 1u << j;
    }
    if (live != 0 && !plan.greedy)
      offer_group(
          rng, group, live, bounds, best,
          [&](int32_t j, float g) { return sum_upper(log_upper(q[j]), g); },
          [](int32_t) { return true; },
          [&](int32_t j, double g) { return exact_add(deterministic_log(static_cast<double>(q[j])), g); });
  });
  if (total != nullptr) {
    const double sum = b.sum(partial);
    if (b.rank() == 0) *total = sum;
  }
  if (plan.greedy) {  // a one-hot row: its token
    *token = plan.argmax;
    return status;
  }
  const double top = b.max(best.key);  // finite: the row's largest probability is > 0
  *token = b.min(best.key == top ? best.id : INT32_MAX);
  return status;
}

}  // namespace specd::detail
