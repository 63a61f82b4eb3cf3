// Goodput optimizer: how many draft tokens k_i (0 included) each request of a step gets, so
// that the step's expected goodput = E[generated tokens] / E[step time] is largest
// (vLLM RFC #4565 / SmartSpec), from per-request acceptance estimates and learned costs.
//
// Model of one step
// - Request i yields 1 + sum_{j<k_i} gains_i[j] tokens in expectation: the bonus token plus,
//   for its j-th draft, the probability that the draft is accepted. For a chain that is
//   prod_{m<=j} alpha_m (AcceptanceEstimator); for a tree of deterministic candidates, the
//   j-th largest node probability (the proposer's estimate, calibrated). Gains are
//   non-increasing in j and lie in [0, 1].
// - The target verifies sum_i (base_i + k_i) tokens in one forward:
//   T_target = target.predict(that sum).
// - Requests with a draft model run a draft loop of K = max k_i forwards. Forward j processes
//   one token of each request with k_i >= j (w for a draft tree of width w), except
//   the first forward, which processes each such request's catch-up tokens (draft_base_i).
//   T_draft = sum_j draft.predict(tokens_j).
// - Host time outside the forwards (overhead_model.h): fixed_seconds for the step, plus what
//   speculation adds: host.per_drafting_request for each request with k_i > 0,
//   host.per_draft_token for each draft token, host.per_draft_forward for each draft forward.
//   The first draft of a request thus costs more than its next ones; the greedy's look-ahead
//   and the polish below handle that as they handle the draft loop's fixed costs.
// - T = fixed_seconds + T_target + T_draft + host.
//
// Objective
// - reference_goodput == 0: maximize the step's own goodput E / T.
// - reference_goodput = G > 0 (tokens per second): maximize E - G * T, the step's
//   contribution to the long-run goodput sum(E) / sum(T) over many steps when the other
//   steps run at G: a change (dE, dT) to this step raises the long-run ratio iff dE > G dT.
//   The caller passes the goodput of the batch's typical (decode-only) step. This matters
//   in atypical steps: a step that also prefills a prompt is slow anyway, so its own E / T
//   is low and would make every draft look cheap; priced at G, drafts are bought only where
//   they pay at the rate the batch's tokens are worth. When G equals this step's optimal
//   E / T the two objectives have the same optimum (Dinkelbach).
//
// Solution (exact for linear costs, checked by brute force in the tests; within a few per
// cent on measured non-convex curves, also checked)
// - For each draft depth K in 0..max, the draft loop's first-token-of-forward costs are paid
//   up front. Increments are then taken greedily in order of marginal gain per marginal
//   second, and the best prefix of that order is kept. With non-increasing gains and
//   constant marginal costs the optimal set is such a prefix (Dinkelbach), and goodput
//   rises along the order up to it.
// - Measured curves are monotone but not convex (a CPU draft forward measured 0.15, 0.26,
//   0.44, 0.45 s at 1..4 tokens): a draft that lowers goodput alone can be followed by
//   nearly free ones. So the greedy does not stop at the first increment that lowers the
//   objective; it goes on for one increment per request plus a chain's length past the
//   best prefix so far.
// - Each K's result is scored exactly and the best is kept; k_i = 0 for all is always a
//   candidate, so the answer is never predicted to be slower than plain decoding.
// - A depth K is skipped when an upper bound on any allocation that runs K draft forwards
//   (the largest gains it could take, over the least those forwards and the target can
//   cost) does not beat the best so far. The greedy's work grows with K, and deep loops
//   rarely pay on a GPU, where each draft forward has a large fixed cost.
// - Steps of up to 16 requests are then polished by local search (a request's k set to any
//   other value, or one draft moved between two requests, until no move helps): on
//   non-convex curves a deep chain for one request can beat a draft each for two, which no
//   prefix finds, and a drafting request's host time is paid once, so starting or dropping a
//   whole chain can pay where no single draft does. Each move is scored from the step's
//   totals, which it changes in at most one chain's draft forwards.
// - Requests may offer several options (proposers). Options are chosen by each option's net
//   value sum_j max(0, g_j - lambda c_j) at goodput lambda (the reference goodput when given) (a draft-model option also pays
//   its share of the draft forwards' fixed cost); candidates with and without the draft
//   model, and again at the goodput found, are each allocated exactly and the best kept.
//   Steps with at most 64 (request, option) pairs also search options one request at a time
//   until no change helps. The option choice is therefore a heuristic for large batches
//   (within 3% of brute force on the tested small cases); the allocation given the options
//   is exact.
#pragma once

#include <cstdint>
#include <vector>

#include "specd/cost_model.h"
#include "specd/overhead_model.h"
#include "specd/span.h"
#include "specd/status.h"

namespace specd {

struct SpecOption {
  Span<const double> gains;     // [max_k] non-increasing expected gain of each draft
  bool uses_draft_model = false;
  int32_t draft_base_tokens = 1;  // tokens in the first draft forward (catch-up), when k > 0
  // 1: a draft chain (draft forward j >= 2 processes one token). w > 1: a draft tree of width
  // w (engine/draft_tree.py): forward j >= 2 feeds its frontier of w nodes (the nodes fed
  // before are in the draft's KV cache).
  int32_t draft_width = 1;
};

struct SpecRequest {
  int32_t base_tokens = 1;        // tokens the target verifies for it anyway (prefix + root)
  Span<const SpecOption> options; // 0 options: plain decoding only
};

struct StepCostModel {
  const CostModel* target = nullptr;  // required
  const CostModel* draft = nullptr;   // required when an option uses the draft model
  double fixed_seconds = 0.0;         // per-step overhead outside the forwards
  double reference_goodput = 0.0;     // tokens/s; > 0 selects the objective E - G T (above)
  // > 0: drafts are allocated only while the target verifies at most this many tokens in
  // all (the controller's exploration limit, CostModel::explored_limit); 0: no limit. Base
  // tokens are never cut: a step whose bases exceed it gets no drafts.
  int64_t max_target_tokens = 0;
  HostCosts host;                     // host time speculation adds (header, "Model of one step")
};

struct Allocation {
  std::vector<int32_t> k;        // [num requests] draft tokens (0 = plain decoding)
  std::vector<int32_t> option;   // [num requests] chosen option (-1 when it has none)
  double expected_tokens = 0;
  double expected_seconds = 0;
  double goodput = 0;            // expected_tokens / expected_seconds (0 when unknown)
  double plain_goodput = 0;      // the same with every k = 0
  double objective = 0;          // the maximized quantity: goodput, or E - G T
  int32_t draft_depth = 0;       // K: draft-model forwards of the step
};

Status optimize_goodput(Span<const SpecRequest> requests, const StepCostModel& cost, Allocation* out);

// Expected tokens and seconds of a given allocation (k and option per request).
Status evaluate_allocation(Span<const SpecRequest> requests, const StepCostModel& cost,
                           Span<const int32_t> k, Span<const int32_t> option, double* tokens,
                           double* seconds);

}  // namespace specd
