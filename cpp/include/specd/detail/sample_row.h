// One row of batched sampling (sampling_batch.h), written against the Block concept
// (detail/serial_block.h): the CUDA kernels run it with a thread block per row, the *_cpu
// functions with SerialBlock. It follows sampling.cc step by step, without a sort:
//
//   plan_row   validates, finds the argmax (greedy) or the softmax normalizer, then the
//              top-k cut (radix selection by count), the top-p cut (by fixed-point mass) and
//              the min-p floor, each with its renormalizing total, into a RowPlan;
//   row_prob   the final probability of token i from its logit and the plan (recomputed
//              where needed instead of stored: no workspace);
//   greedy_token_row  sample_token_row's token and status for a greedy row (temperature 0),
//              in one pass of grouped vector loads: the CUDA launcher runs it in a lean
//              kernel of its own, and the general kernels skip greedy rows;
//   sample_token_row  rounds the probabilities to float as sampling_probs' output does, then
//              draws as sample_token does (normalize in double, final draw at rng.position);
//   probs_row  writes the float probability row, and optionally draws sample_token_row's
//              token from the row it wrote (the draft loop needs both: the token and the
//              distribution verification checks it against).
//
// Every pass is a block-wide sum/max over the row. With SerialBlock they are sequential sums
// in id order, the CPU reference's arithmetic; on the GPU they are tree sums, which can
// differ in the last bits (see sampling_batch.h for the consequence).
#pragma once

#include <cstdint>

#include "specd/detail/bits.h"
#include "specd/detail/block_algorithms.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sampling_rules.h"
#include "specd/host_device.h"
#include "specd/philox.h"
#include "specd/sampling.h"
#include "specd/sampling_batch.h"
#include "specd/verify.h"

namespace specd::detail {

// Everything row_prob needs besides the logit: the scalars plan_row found.
struct RowPlan {
  bool greedy;
  int32_t argmax;       // lowest id among the largest logits
  double max_logit;
  double inv_temperature;  // inverse_temperature(params.temperature)
  double total;         // sum of softmax weights
  double inv_total;     // 1 / total: softmax probabilities are weight * inv_total
  double log_total;     // natural_log(total), for exponent_floor / exponent_ceiling
  // Exponents below it (softmax_exponent) belong to tokens a top-k, top-p or min-p cut
  // drops (exponent_floor of the least probability the cut keeps): kept_prob gives them 0
  // without their exponential. -inf while no cut applies.
  double keep_floor;
  bool top_k_on;        // top_k cut some tokens (then renormalized: times top_k_inv)
  uint64_t top_k_key;
  int32_t top_k_id;
  double top_k_inv;     // 1 / the sum of the kept probabilities
  bool top_p_on;        // top_p < 1 (always renormalized: times top_p_inv)
  bool top_p_cut;       // the top-p mass was reached (else every ranked token is kept)
  uint64_t top_p_key;
  int32_t top_p_id;
  double top_p_inv;
  bool min_p_on;
  double min_p_floor;
  double min_p_inv;
};

// Probability of token i after softmax, before filters.
SPECD_HOST_DEVICE inline double softmax_prob(const RowPlan& plan, float logit) {
  return exact_mul(softmax_weight(logit, plan.max_logit, plan.inv_temperature), plan.inv_total);
}

// The filters of the plan applied to token i of softmax probability p (the filters that are
// on: a total of 1.0 divides exactly, which plan_row uses to sum a stage before its total is
// known).
SPECD_HOST_DEVICE inline double filtered_prob(const RowPlan& plan, int32_t i, double p) {
  const uint64_t key = double_bits(p);
  double q = p;
  if (plan.top_k_on) {
    if (!(p > 0 && ranks_at_or_above(key, i, plan.top_k_key, plan.top_k_id))) return 0.0;
    q = exact_mul(q, plan.top_k_inv);
  }
  if (plan.top_p_on) {
    if (!(p > 0) || (plan.top_p_cut && !ranks_at_or_above(key, i, plan.top_p_key, plan.top_p_id))) return 0.0;
    q = exact_mul(q, plan.top_p_inv);
  }
  if (plan.min_p_on) {
    if (!(q >= plan.min_p_floor)) return 0.0;
    q = exact_mul(q, plan.min_p_inv);
  }
  return q;
}

// filtered_prob(plan, i, softmax_prob(plan, logit)), without the exponential for a token
// below the plan's keep_floor (a cut drops it: filtered_prob would give 0). The exponent is
// computed twice for a kept token (two double operations) on purpose: passing it on to the
// exponential instead made the rows without a cut 1.5x slower on the CPU (g++ 12, measured
// with specd_bench_sampling), and the floor test is skipped while no cut applies.
SPECD_HOST_DEVICE inline double kept_prob(const RowPlan& plan, int32_t i, float logit) {
  if (plan.keep_floor > -INFINITY &&
      softmax_exponent(logit, plan.max_logit, plan.inv_temperature) < plan.keep_floor)
    return 0.0;
  return filtered_prob(plan, i, softmax_prob(plan, logit));
}

// The final probability of token i (double; sampling_probs outputs it rounded to float).
SPECD_HOST_DEVICE inline double row_prob(const RowPlan& plan, int32_t i, float logit) {
  if (plan.greedy) return i == plan.argmax ? 1.0 : 0.0;
  return kept_prob(plan, i, logit);
}

// radix_select's key range filter for probability keys (double_bits(p)): a token may have
// its key in [key_lo, key_hi] only if its exponent lies within the exponent bounds of those
// probabilities (sampling_rules.h); the bounds are computed once per call.
SPECD_HOST_DEVICE inline auto probability_key_filter(const RowPlan& plan) {
  return [&plan](uint64_t key_lo, uint64_t key_hi) {
    const double lo = exponent_floor(double_from_bits(key_lo), plan.log_total);
    const double hi = exponent_ceiling(double_from_bits(key_hi), plan.log_total);
    return [&plan, lo, hi](int32_t, float logit) {
      const double x = softmax_exponent(logit, plan.max_logit, plan.inv_temperature);
      return x >= lo && x <= hi;
    };
  };
}

template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus plan_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                        RowPlan* plan) {
  *plan = RowPlan{};
  plan->keep_floor = -INFINITY;
  if (sampling_params_code(params) != 0) return SampleStatus::kBadParams;
  // Validation and argmax in one pass (sampling_probs: NaN/+inf first, then all -inf). (The
  // grouped vector-load walk, for_each_group, would be exact here too, but in the clustered
  // kernels' 64 registers it raised ptxas sm_90's spills, 256 -> 292-476 bytes for
  // sample_tokens, 0 -> 52-364 for the Gumbel kernel, even when only greedy rows took it:
  // left for a GPU session to time.)
  // A bad logit makes the thread's pair kBadArgMax, which wins every comparison: one
  // collective says both whether the row is valid and where its maximum is.
  ArgMax best = empty_argmax();
  for_each_strided<2 * kLoadBatch>(b, vocab, load, [&](int32_t i, float l) {
    best = is_bad_logit(l) ? bad_argmax() : better(best, ArgMax{l, i});
  });
  best = b.argmax(best);
  if (best.index < 0) return SampleStatus::kBadLogit;
  if (!(best.value > -INFINITY)) return SampleStatus::kNoFiniteLogit;
  plan->argmax = best.index;
  plan->max_logit = static_cast<double>(best.value);
  if (params.temperature == 0) {
    plan->greedy = true;
    return SampleStatus::kOk;
  }
  plan->inv_temperature = inverse_temperature(params.temperature);
  double total = 0;
  for_each_strided(b, vocab, load,
                   [&](int32_t, float l) { total += softmax_weight(l, plan->max_logit, plan->inv_temperature); });
  plan->total = b.sum(total);
  plan->inv_total = 1.0 / plan->total;
  if (!has_filters(params)) return SampleStatus::kOk;
  plan->log_total = natural_log(plan->total);
  const auto key_filter = probability_key_filter(*plan);

  // The sum over the row of filtered_prob with the plan as it stands.
  const auto stage_total = [&]() {
    double s = 0;
    for_each_strided(b, vocab, load, [&](int32_t i, float l) { s += kept_prob(*plan, i, l); });
    return b.sum(s);
  };
  // A cut that drops every token of softmax probability below p.
  const auto raise_floor = [&](double p) {
    const double floor = exponent_floor(p, plan->log_total);
    plan->keep_floor = floor > plan->keep_floor ? floor : plan->keep_floor;
  };
  if (params.top_k > 0) {
    const SelectCut cut = radix_select(b, vocab, load, [&](int32_t, float l) {
      const double p = softmax_prob(*plan, l);
      return SelectItem{p > 0, double_bits(p), 0};
    }, SelectCriterion{false, static_cast<uint64_t>(params.top_k)}, key_filter);
    if (static_cast<uint64_t>(params.top_k) < cut.set_count) {  // else sampling.cc keeps all, unrenormalized
      plan->top_k_on = true;
      plan->top_k_key = cut.key;
      plan->top_k_id = cut.id;
      raise_floor(double_from_bits(cut.key));
      plan->top_k_inv = 1.0;
      plan->top_k_inv = 1.0 / stage_total();
    }
  }
  if (params.top_p < 1) {
    // Ranked set: tokens kept by top-k (p > 0); mass: their probability after top-k.
    const SelectCut cut = radix_select(b, vocab, load, [&](int32_t i, float l) {
      const double p = softmax_prob(*plan, l);
      const double kept = filtered_prob(*plan, i, p);
      const bool in_set = p > 0 && (!plan->top_k_on || ranks_at_or_above(double_bits(p), i, plan->top_k_key, plan->top_k_id));
      return SelectItem{in_set, double_bits(p), fixed_mass(kept)};
    }, SelectCriterion{true, fixed_threshold(params.top_p)}, key_filter);
    plan->top_p_on = true;
    plan->top_p_cut = cut.found;
    plan->top_p_key = cut.key;
    plan->top_p_id = cut.id;
    if (cut.found) raise_floor(double_from_bits(cut.key));
    plan->top_p_inv = 1.0;
    plan->top_p_inv = 1.0 / stage_total();
  }
  if (params.min_p > 0) {
    double top = 0;  // the largest probability so far: that of the top-ranked token
    for_each_strided(b, vocab, load, [&](int32_t i, float l) {
      const double q = kept_prob(*plan, i, l);
      top = q > top ? q : top;
    });
    plan->min_p_floor = params.min_p * b.max(top);
    // filtered_prob keeps q = p * top_k_inv * top_p_inv (those on, each product rounded) only
    // when q >= min_p_floor, so only p >= min_p_floor / (their product), to a few ulps: far
    // inside exponent_floor's margin.
    double scale = 1.0;
    if (plan->top_k_on) scale *= plan->top_k_inv;
    if (plan->top_p_on) scale *= plan->top_p_inv;
    raise_floor(plan->min_p_floor / scale);
    plan->min_p_on = true;
    plan->min_p_inv = 1.0;
    plan->min_p_inv = 1.0 / stage_total();
  }
  return SampleStatus::kOk;
}

// sample_token's draw (verify.cc) from a row whose float probabilities are
// float_prob(i, load(i)) (a double holding a float value): p = float probs * (1 / their sum);
// target = u * sum(p) with u the final draw at rng.position. `load` is a pure read
// (for_each_strided batches it). `float_partial`, when given, is this thread's sum of the
// float probabilities in for_each_strided's order (a pass that wrote the row summed it), so
// the first pass is skipped: the same per-thread sums, the same total. `float_total_out`,
// when given, gets that total from rank 0 (probs_row's `total`).
template <class Block, class Load, class FloatProb>
SPECD_HOST_DEVICE SampleStatus draw_from_float_probs(Block& b, int32_t vocab, const Load& load,
                                                     const FloatProb& float_prob, const RngKey& rng, int32_t* token,
                                                     const double* float_partial = nullptr,
                                                     double* float_total_out = nullptr) {
  double local = 0;
  if (float_partial != nullptr) {
    local = *float_partial;
  } else {
    for_each_strided(b, vocab, load, [&](int32_t i, auto v) { local += float_prob(i, v); });
  }
  const double float_total = b.sum(local);
  if (float_total_out != nullptr && b.rank() == 0) *float_total_out = float_total;
  if (!(float_total > 0)) return SampleStatus::kNoFiniteLogit;  // unreachable: the top token keeps >= 1/vocab
  const double inv_float_total = 1.0 / float_total;
  local = 0;
  for_each_strided(b, vocab, load, [&](int32_t i, auto v) { local += exact_mul(float_prob(i, v), inv_float_total); });
  const double total = b.sum(local);
  const double u = philox_uniform(rng.seed, rng.request, rng.step, rng.position, kFinalDraw);
  const auto normalized = [&](int32_t i) { return exact_mul(float_prob(i, load(i)), inv_float_total); };
  *token = draw_inverse_cdf<kDrawRun>(b, vocab, normalized, u * total);
  return SampleStatus::kOk;
}

// sample_token_row's token and status for a row with params.temperature == 0: the
// parameters' status, then the row's (a NaN or +inf logit: kBadLogit; no finite logit:
// kNoFiniteLogit), else the lowest id among the largest logits; token -1 with a bad status.
// One pass of grouped loads (for_each_group: 16-byte loads on the device, several groups in
// flight); an argmax with its id tie-break does not depend on the order, so the result is
// plan_row's exactly. It needs no RowPlan and no sums, so its kernel stays small
// (cuda/src/detail/sampling_kernels.cuh).
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus greedy_token_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                                int32_t* token) {
  *token = -1;
  if (sampling_params_code(params) != 0) return SampleStatus::kBadParams;
  ArgMax best = empty_argmax();
  for_each_group(b, vocab, load, [&](int32_t i, float l) {
    best = is_bad_logit(l) ? bad_argmax() : better(best, ArgMax{l, i});
  });
  best = b.argmax(best);
  if (best.index < 0) return SampleStatus::kBadLogit;
  if (!(best.value > -INFINITY)) return SampleStatus::kNoFiniteLogit;
  *token = best.index;
  return SampleStatus::kOk;
}

// The token sample_token would draw from this row's float probabilities with key `rng`.
// `plan`: where the row's plan is kept. The clustered kernels pass one in shared memory, shared
// by the block: every thread writes the same values between the same collectives (a value is
// never overwritten without a collective in between), so every thread reads its own. Held in
// registers, the plan made those kernels spill (ptxas sm_90, sample_tokens' clustered kernel
// at 80 registers: 440 bytes; 84 with the plan in shared memory).
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus sample_token_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                                const RngKey& rng, int32_t* token, RowPlan& plan) {
  *token = -1;
  const SampleStatus status = plan_row(b, load, vocab, params, &plan);
  if (status != SampleStatus::kOk) return status;
  if (plan.greedy) {  // a one-hot row: the draw always returns its token
    *token = plan.argmax;
    return SampleStatus::kOk;
  }
  return draw_from_float_probs(b, vocab, load, [&](int32_t i, float l) {
    return static_cast<double>(static_cast<float>(row_prob(plan, i, l)));
  }, rng, token);
}
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus sample_token_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                                const RngKey& rng, int32_t* token) {
  RowPlan plan;
  return sample_token_row(b, load, vocab, params, rng, token, plan);
}

// The probability row sampling_probs writes (probs[vocab]); all zeros when status != kOk.
// With `token` non-null, also the token sample_token draws from that row with key `rng`
// (sample_token_row's token, drawn from the row just written instead of recomputing it):
// -1 when status != kOk.
// `plan`: as sample_token_row's.
// `total` non-null: rank 0 writes the row's total there, the sum of its floats as doubles, as
// stochastic verification sums a row (verify_walk.h, load_prob_row: the same ids per thread
// in the same order, so the same bits for the same Block type); 0 when status != kOk. (An
// output written once, like the kernels' outputs: no address of a local is taken.)
template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus probs_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                         float* probs, const RngKey* rng, int32_t* token, RowPlan& plan,
                                         double* total = nullptr) {
  if (token != nullptr) *token = -1;
  if (total != nullptr && b.rank() == 0) *total = 0;
  const SampleStatus status = plan_row(b, load, vocab, params, &plan);
  if (status != SampleStatus::kOk) {
    for (int32_t i = b.rank(); i < vocab; i += b.size()) probs[i] = 0.0f;
    return status;
  }
  // The float total of the draw below, summed as its first pass would (same ids, same order).
  double float_partial = 0;
  for_each_strided(b, vocab, load, [&](int32_t i, float l) {
    const float p = static_cast<float>(row_prob(plan, i, l));
    probs[i] = p;
    float_partial += static_cast<double>(p);
  });
  if (token == nullptr || plan.greedy) {
    if (total != nullptr) {
      const double sum = b.sum(float_partial);
      if (b.rank() == 0) *total = sum;
    }
    if (token != nullptr) *token = plan.argmax;
    return status;
  }
  b.sync();  // the row written above, read back by every thread of the block
  const float* written = probs;
  return draw_from_float_probs(b, vocab, [written](int32_t i) { return written[i]; },
                               [](int32_t, float p) { return static_cast<double>(p); }, *rng, token, &float_partial,
                               total);
}

template <class Block, class Load>
SPECD_HOST_DEVICE SampleStatus probs_row(Block& b, const Load& load, int32_t vocab, const SamplingParams& params,
                                         float* probs, const RngKey* rng = nullptr, int32_t* token = nullptr) {
  RowPlan plan;
  return probs_row(b, load, vocab, params, probs, rng, token, plan);
}

}  // namespace specd::detail
