// OverheadModel: the engine's time per step outside the model forwards (scheduling, the
// policy's decision, model-free proposals, verification and KV commits on the host, emitting
// tokens, whatever the draft loop does between its timed forwards), as a function of the
// step's shape, learned online for the speculation controller.
//
// Why a shape and not one average
// - Speculation costs host time of its own: each drafting request gets a proposal, a longer
//   verification and a commit; each draft token a row to check and a slot to commit; each
//   draft forward its inputs and launch. On an H100 host the engine's time outside the
//   forwards was 0.16 ms per plain step and 0.98 ms per step drafting k = 4, at batch 1
//   (docs/bench/gpu/h100_forward_profile.json, "step_overhead_ms_by_run"): a third of the
//   target's forward. On this project's 2-core CPU (bench/host_step.py, null forwards) a batch
//   of 16 takes 0.36 ms per plain step and 0.79 ms drafting k = 2.
// - An average over all steps charges that time to plain decoding as much as to speculation.
//   A constant also cancels out of every comparison between plans of one step, so the host
//   cost of drafting was invisible to the controller's decision.
//
// Model
//   seconds = c_step + c_request * requests + c_drafting * drafting_requests
//             + c_token * draft_tokens + c_forward * draft_forwards,   every c >= 0.
// - Fitted by exponentially weighted least squares (weight `decay` kept per observed step).
//   The non-negativity constraints are solved exactly: the problem is a convex quadratic in
//   five unknowns, so its optimum is the best of the unconstrained optima over the subsets of
//   coefficients that come out non-negative (32 subsets, each a 5 x 5 solve at most).
// - Features the data cannot tell apart get a tiny ridge (1e-7), relative to each feature's
//   own weighted sum of squares: steps in which every request drafts the same k make
//   drafting_requests proportional to requests, and a batch that never changes size makes
//   requests proportional to the constant. Such a group of features then shares the time it
//   explains equally (x_j c_j alike) instead of by rounding. Without a ridge on the
//   constant, a controller that drafted k = 4 for all 8 requests in every step put the whole
//   step's host time into the constant: speculation looked free, and it never learnt
//   otherwise.
// - The per-request coefficient is fitted only once steps of two batch sizes or more were
//   seen (until then it is 0 and the constant takes its share): from one batch size nothing
//   says how host time grows with the batch, and it is extrapolated the furthest (to the
//   forecast batch of a load ramp). Shared equally with the constant, the first step of a
//   run (one request, 0.5 ms) priced a step of 64 requests at 16 ms.
//   A step of another shape (prefill, a request that does not draft, another batch) then
//   tells the parts apart; the ridge must stay far below such a rare observation's weight
//   (at 1e-3 one plain step among fifty drafting ones was predicted at 6.7 ms instead of
//   0.5). A feature never seen non-zero keeps a coefficient of 0, so a controller that has
//   not yet speculated prices speculation's host time at 0 until it measures some.
// - A per-item coefficient below a nanosecond is rounding residue of the solve and is set to
//   0. (Where the host time was constant, residue of 1e-10 s per drafting request broke a tie
//   between two equally good plans the other way, and the suffix sweep at 23.9 requests/s
//   went from 0.952x to 1.014x the best static k: that rate is that sensitive.)
// - Old data fades only relative to new data, so a coefficient measured while speculating
//   stays while a run decodes plainly for a long time.
// - Before the first sample predict() returns 0 and has_data() is false.
// Nothing needs tuning by a user; the decay is a fixed default.
#pragma once

#include <array>
#include <cstdint>

#include "specd/status.h"

namespace specd {

// What a step did, as far as its host time depends on it.
struct StepShape {
  int64_t requests = 0;           // requests the step ran (prefill chunks and verifications)
  int64_t drafting_requests = 0;  // of them, requests verifying at least one draft token (k > 0)
  int64_t draft_tokens = 0;       // draft tokens verified (chain drafts, tree nodes)
  int64_t draft_forwards = 0;     // draft-model forwards the step ran
};

// The host time that speculation adds to a step (seconds), as the optimizer prices it
// (goodput_optimizer.h).
struct HostCosts {
  double per_drafting_request = 0.0;  // a request that drafts at all (k > 0)
  double per_draft_token = 0.0;       // each draft token verified
  double per_draft_forward = 0.0;     // each draft-model forward
};

struct OverheadModelConfig {
  double decay = 0.99;  // weight kept by the sums at each observed step
  double ridge = 1e-7;  // relative ridge on every coefficient (header)
};

class OverheadModel {
 public:
  static constexpr int kFeatures = 5;  // constant, requests, drafting, draft tokens, draft forwards
  using Coefficients = std::array<double, kFeatures>;

  explicit OverheadModel(const OverheadModelConfig& config = OverheadModelConfig());

  // One step's time outside the forwards. Negative counts, or seconds that are negative or not
  // finite, are kInvalidArgument (the model is unchanged).
  Status observe(const StepShape& shape, double seconds);
  // Predicted seconds outside the forwards of a step of this shape (0 before any sample).
  double predict(const StepShape& shape) const;
  // The part that does not depend on speculation: c_step + c_request * requests.
  double fixed(int64_t requests) const;
  // What speculation adds (c_drafting, c_token, c_forward).
  HostCosts speculation_costs() const { return HostCosts{coef_[2], coef_[3], coef_[4]}; }
  // [c_step, c_request, c_drafting, c_token, c_forward], seconds; all 0 before any sample.
  const Coefficients& coefficients() const { return coef_; }
  bool has_data() const { return samples_ > 0; }
  int64_t samples() const { return samples_; }

 private:
  void refit();

  OverheadModelConfig config_;
  std::array<std::array<double, kFeatures>, kFeatures> xx_{};  // decayed sum of x x^T
  Coefficients xy_{};                                           // decayed sum of x * seconds
  Coefficients coef_{};
  int64_t samples_ = 0;
};

}  // namespace specd
