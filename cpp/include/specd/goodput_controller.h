// Goodput controller: per step and per request, the number of draft tokens k (0 included)
// and the proposer, maximizing expected goodput from acceptance and costs learned online
// (vLLM RFC #4565 / SmartSpec, automated end to end). It owns the AcceptanceEstimator, the
// target and draft CostModels, the OverheadModel (host time by step shape) and the
// LoadForecast, and asks
// optimize_goodput (goodput_optimizer.h) for each step's allocation. docs/controller.md has
// the maths; the Python GoodputPolicy is a thin adapter over this class.
//
// Per step (decide)
// 1. Every request of the batch is an arrival for the LoadForecast the first time it is seen.
// 2. Gains: for request i and proposer p, g_j = prod_{m<=j} alpha_m (the estimator's
//    per-request, per-depth acceptance), for j up to min(config k_max, request k_max).
//    The estimator's exploration (acceptance_estimator.h: depth 1, retries, one depth
//    deeper) applies only in steps with no request waiting for admission (under a backlog
//    every step's time is also the queue's, so drafts are bought on the data alone there),
//    and only to the step's first exploration_trials requests (in batch order): the trials
//    an exploration needs, not a whole batch (size_trees prices the same requests' trees
//    with exploration). (When a 64-request batch on the H100-profile
//    sweep at 620 requests/s was left without a queue, every request explored: a retry of
//    depth 1, then depths 2 to 7 one per step, each with all 64 requests drafting up to 7
//    tokens: 1.028x the latency of no speculation.)
//    Where the request brings node probabilities (the model-free proposers' candidate
//    trees for this step, ControllerRequest::node_probs), a model-free p's gains are those
//    probabilities, sorted in decreasing order and times the request's tree calibration
//    for a tree of that strength (their sum; AcceptanceEstimator::tree_calibration, capped at 1): the j-th draft of a node budget
//    is the j-th most probable node, so k is the tree's node budget, chosen from this
//    request's own evidence in this step (a repeated passage: a deep or wide tree; a weak
//    match: a small one or none; no candidates: k = 0).
// 3. The typical step: the same requests decode only (base 1) with every draft in sync;
//    its optimal goodput G* is the step's price of time, lowered towards the long-run
//    goodput G_run under a backlog (below). A drafting request's draft base there is 2:
//    the draft model never runs on its own last draft, so after a step whose drafts were all
//    accepted its first forward of the next step processes that draft and the bonus token.
//    (With base 1, G* assumed cheaper drafts than the steps that follow acceptance get; at
//    34.6 requests/s on the H100-profile sweep those steps, priced at that G*, declined to
//    draft, the drafts fell further behind, and goodput drafted in half of the steps: 1.031x
//    the best static k; with base 2, 1.013x.)
// 4. Catch-up: a request whose draft has tokens to catch up (draft_catch_up > 1) may use a
//    draft-model proposer only if the investment pays: in the steady plan at the forecast
//    batch (requests beyond today's batch at the proposers' prior acceptance; like every
//    plan, its verification within the target's explored_limit from there: on a line
//    through prefill-heavy forwards alone, at the start of a load ramp, 64 requests'
//    verification looked as cheap as 64 prompt tokens, and new requests caught up their
//    drafts for drafting that did not pay), the request
//    drafts k tokens with that proposer for D extra tokens per step at marginal time d; with
//    G that plan's goodput and S = remaining_tokens / (1 + D) steps left, invest iff
//    S (D / G - d) > the batch's wait for the catch-up: the draft's predicted time for the
//    missing tokens, from its own measured curve up to twice the largest size it was timed
//    at; beyond that, no less than the target's time for them scaled by the two models'
//    single-token ratio (before the draft was ever timed, the target's time). Requests in
//    sync always may draft.
// 5. The step itself: base tokens and catch-up as they are, the catch-up charged to the
//    step spread over the request's remaining steps (1 + ceil(behind / steps left) tokens),
//    maximizing E - G T at the price G of 3. A typical step (all base 1, all in sync) is
//    the plan of 3 (at G* that is the step's own optimal E / T).
// Host time: every plan (the typical step, the step, the catch-up and backlog tests) prices
//    the time outside the forwards by the OverheadModel learned from observe_overhead's step
//    shapes (overhead_model.h): the part independent of speculation as the step's fixed time,
//    and per drafting request, draft token and draft forward what speculation adds
//    (HostCosts in goodput_optimizer.h). A catch-up's return counts the request's host time
//    per drafting step. size_trees, after the draft ran, prices only the host time per
//    verified node (the request's and the forwards' are spent).
// An untimed draft: until the draft model has been timed at two sizes its costs are a guess
//    (none, or one size scaled by the target's shape: CostModel::shaped_like). Priced at
//    nothing (an empty cost model) it would buy the deepest chain for every request on that
//    guess (k = 8 with 180-token catch-ups for the first requests of a load sweep on H100
//    costs: 28 ms of draft time before anything was known); priced like the target it ties
//    with plain decoding and is never tried, so its cost is never learnt. So a request may
//    draft at most two tokens with it until then: the first call times both its catch-up
//    forward and a one-token forward (with one token only, a catch-up of 600 tokens scaled
//    by the target's shape made one-token forwards look as dear as the target's, and the
//    draft was never tried again). Before any timing the draft is free while the estimator
//    explores (no request waiting) and at the target's cost under a backlog. Catch-ups are
//    priced as rule 4 says.
// The price under a backlog: when requests wait for admission, what delays them is the
//    engine's throughput over the whole backlog, prefills included: sum(E) / sum(T) over all
//    steps. By Dinkelbach's argument a change (dE, dT) to one step raises that ratio iff
//    dE > G_run dT, where G_run is the ratio itself: the tokens the engine emitted over the
//    time it ran (observe_step; exponential averages over steps, weight long_run_decay
//    kept). Under a prefill-heavy backlog G_run is well below the decode-only G* (much of
//    the time goes to prompts), so a second of a step is worth fewer tokens and drafts that
//    pay at G_run are bought. Without a backlog the running requests' latency is what a
//    step's time costs, and G* is the right price: other requests' prefills stretch a
//    request's remaining steps and the delay a longer step causes alike, so they cancel.
//    The price is therefore G = (1 - w) G* + w min(G*, G_run) while requests wait for
//    admission (observe_load), with w the share of recent steps (same decay) after which
//    requests were left waiting, and G* once none waits: with the queue empty no admission
//    is pending, and the steps ahead serve the running requests, whose latency a step's
//    time costs. (With the share alone the backlog's price outlived the backlog: on the
//    H100-profile sweep at 620 requests/s, traces recorded in bfloat16, a batch of 64 left
//    when the queue emptied was priced near G_run for dozens of steps and caught up its
//    draft, 35 ms of draft prefill, for drafts that barely beat plain decoding: 1.055x the
//    latency of no speculation; priced at G*, 1.039x.) A G_run above G* (realised
//    acceptance above the estimates) never prices time above the step's own optimum.
//    G_run is trusted only once as many requests have finished as the engine's batch limit
//    (observe_load's max_batch): a request's prompt is prefilled before any of its tokens are
//    emitted, so while the engine fills up G_run counts the prefills of tokens still to come
//    and lies far below the rate the backlog will be served at (on the H100-profile sweep
//    at 553 requests/s it was a fifth of it 14 steps in, and the drafts it bought lowered
//    throughput by 14%). Until then the price is G*.
//    The draft's admission work: a drafting engine also makes the draft prefill every prompt
//    it admits (a_draft below, per admitted request), one per R emitted tokens of drafting
//    requests; time spent on it is not in a step's T. So where the typical step's plan
//    has a share s of its expected tokens from requests drafting with the draft model, a
//    second of a step is worth G_run / (1 - G_run s a_draft / R) tokens instead of G_run
//    (at most G*): each token emitted sooner brings that much more draft prefill sooner.
//    (At G_run alone, on the H100 profile with its host costs by shape at 738 requests/s,
//    the drafting plan at the backlog price went to k = 3-4 and served the backlog more
//    slowly than plain decoding, so the draft was switched off where static k = 2 is 1.4%
//    faster than plain decoding: 1.017x the latency of plain decoding; with the markup,
//    1.005x. Marking up for the target's admission work too, which every plan brings,
//    made that row 0.980x, but the suffix-tree sweep's backlog rows lost 3-8%: there the
//    lower price's larger trees shorten the running requests' service, which dominates.)
// The backlog's throughput (the draft model under a backlog): the price above weighs a
//    step's own tokens and time, but a drafting engine also makes the draft model prefill
//    every prompt it admits (its catch-up), and under a backlog tokens emitted sooner only
//    admit the next requests sooner: each emitted token brings P / R prompt tokens of
//    admission work (P prompt tokens per arrival, R tokens per request: LoadForecast).
//    So while requests wait, the typical step's plan at the price (3) is compared with
//    the best plan without the draft model in steady-state throughput, admissions included:
//    E / (T + E / R (a_target + s a_draft)), with s the share of the plan's tokens that
//    drafting requests emit and a_target and a_draft the target's and the draft's time for
//    one prompt as the engine admits them: its share (P / C) of the prefill of C prompt
//    tokens beside the batch, C the prompt tokens per step that prefills (at least P): a
//    step's target forward beyond its decoding requests' last tokens (base 1) and every
//    request's drafts, averaged by LoadForecast::prefill_chunk (not measured in steps
//    whose draft trees size_trees sized: their verified nodes are not the decided k). If
//    the plan without the draft model serves the backlog faster, no request may use the
//    draft model in this step. (Priced one prompt at a time beside the batch, admissions
//    are dearer than they are where prompts are prefilled together and the cost curve is
//    steeper at small sizes: on the H100 profile with its host costs by shape at 738
//    requests/s, plain decoding looked 0.3% faster while static k = 2 served 0.8% more
//    tokens per second.) (On the H100-profile sweep at 620
//    requests/s, traces recorded in bfloat16: goodput drafted k = 3-6 for 64 requests while
//    128 waited, the draft's catch-ups over the admitted prompts cost more than the drafts
//    saved, and its latency was 1.184x that of plain decoding.) Model-free proposers have
//    no admission cost of their own and are not restricted.
// Catching up under a backlog: when the draft model may be used (above) but a drafting
//    request is behind (draft_catch_up beyond max(2, base_tokens): a decoding request that
//    did not draft lately; a prompt's own prefill is the admission cost above), its
//    catch-up is paid once, before any gain: the draft's time for its missing tokens beside
//    the drafting requests' first forward (priced as in rule 4). It may catch up only if
//    that time is won back by its share of the time drafting saves over its remaining
//    tokens W_i (remaining_tokens, at most R): catch-up < W_i (1 / without - 1 / with),
//    with and without the two throughputs above. Requests in sync draft regardless. (A
//    first version judged all behind requests together against the whole batch's saving
//    and, where part of the batch was behind, switched the draft off for the requests in
//    sync too: on the same profile at 185 requests/s, arrival seed 2, it drafted for 35
//    steps and never again, 1.085x the best static k; judged per request, 1.021x.)
//    (Each request's own test, rule 4, assumes drafting goes on for the rest of the request;
//    under a backlog where the two throughputs differed by a percent or two, the draft was
//    switched off, the batch fell behind, and every few dozen steps all 64 requests caught
//    up 1.4k-9.2k tokens, 7-37 ms of draft time, to draft for one to four steps before it
//    was switched off again: 1.067x the latency of plain decoding on the H100 profile with
//    its host costs by shape at 738 requests/s, arrival seed 1; with the first version of
//    this rule, 1.037x, and with the admissions and the price above, 1.006x.)
// Feedback: observe() after each verification, observe_forward() after each forward,
// observe_overhead() and observe_step() once per step, observe_load() before decide(),
// forget() at the end of a request.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "specd/acceptance_estimator.h"
#include "specd/cost_model.h"
#include "specd/goodput_optimizer.h"
#include "specd/load_forecast.h"
#include "specd/overhead_model.h"
#include "specd/proposer.h"
#include "specd/span.h"
#include "specd/status.h"

namespace specd {

struct GoodputControllerConfig {
  std::vector<bool> proposer_uses_draft;  // [num proposers] true for the draft model (at most one)
  int32_t k_max = 8;                      // the largest k of any request
  AcceptanceEstimatorConfig acceptance;
  OverheadModelConfig overhead;           // the host time by step shape (overhead_model.h)
  double long_run_decay = 0.98;           // weight kept per step by the long-run goodput's sums
  int32_t draft_tree_width = 1;           // > 1: the draft model grows trees of this width (size_trees)
};

// One request of a step as the controller sees it.
struct ControllerRequest {
  RequestId id = 0;
  // Tokens the target verifies for it anyway (prefix + root). For a waiting request, those
  // past the prefix it would adopt from the prefix cache (StepPlanner::cached_prefix): the
  // load forecast and the step's costs take it as the work its admission brings.
  int32_t base_tokens = 1;
  int32_t k_max = 0;                    // its cap (config, max_tokens, context)
  int32_t draft_catch_up = 1;           // tokens its first draft-model forward would process (likewise)
  int64_t remaining_tokens = 1 << 30;   // tokens it may still generate
  // Empty, or [num proposers]: for each model-free proposer, the acceptance probabilities of
  // its candidate nodes for this request this step (any order; none: no candidates, k = 0
  // with it). Entries of the draft-model proposer are ignored (it uses the estimates).
  Span<const std::vector<double>> node_probs;
};

// A draft-model tree grown this step (draft_tree_width > 1), to be sized by size_trees. Its
// draft nodes are numbered 0..n-1; a node's parent comes before it.
struct TreeSizingRequest {
  RequestId id = 0;
  Span<const double> path_probs;  // [n] the draft's path probability of each node (product of
                                  // its path's draft probabilities)
  Span<const int32_t> parents;    // [n] parent node, -1 for the root's children
  int32_t max_nodes = 0;          // the nodes reserved for it (its budget's cap)
};

// size_trees' answer for one tree.
struct TreeSizing {
  std::vector<int32_t> nodes;  // the nodes to verify, most valuable first (closed under parents)
  double predicted = 0.0;      // their uncalibrated gains summed (observe_tree's `predicted`)
};

struct ControllerDecision {
  int32_t k = 0;
  int32_t proposer = -1;          // -1 when k == 0
  double predicted_tokens = 1.0;  // expected tokens this step yields for the request
};

enum class ForwardKind : int32_t { kTarget = 0, kDraft = 1 };

class GoodputController {
 public:
  // Invalid configs (no proposers, more than one draft-model proposer, k_max < 0) make every
  // call return kInvalidArgument with the reason.
  explicit GoodputController(GoodputControllerConfig config);

  // decisions_out[i] for batch[i].
  Status decide(Span<const ControllerRequest> batch, std::vector<ControllerDecision>* decisions_out);

  // Draft-model trees (draft_tree_width > 1), after the draft grew them this step: which nodes
  // of each to verify (sizings_out[i] for trees[i], at most max_nodes).
  // - A node's gain (its probability of acceptance) comes from the request's per-depth
  //   acceptance of the draft's greedy chain, alpha_d (what decided the depth; the engine
  //   reports the chain's part of each verified tree to observe()). With q(v) the draft's
  //   probability of v given its parent and q_top that of v's most probable sibling:
  //     the most probable child:  gain(v) = gain(parent) alpha_d;
  //     any other child:          gain(v) = gain(parent) (1 - alpha_d) q(v) / (1 - q_top),
  //   the rejected top child's probability shared by the draft's confidence in the rest (as
  //   if the target's token, when not the draft's first choice, were distributed like the
  //   draft's remaining mass). The draft's greedy path thus gets the chain's gains prod
  //   alpha; a draft that is always right gets no siblings, an unsure one wide trees. A
  //   child never gains more than its parent, and a node's children gain at most its own.
  // - The gains are times the draft proposer's tree calibration for a tree of their summed
  //   strength (as for model-free trees in decide; observe_tree learns it).
  // - Nodes are ranked by gain (then depth, then index: parents first); the draft's time is
  //   spent, so only the target's verify time is priced, at this step's price (last_price),
  //   on top of `other_tokens` the target verifies anyway this step. The best prefix of the
  //   ranking is verified.
  Status size_trees(Span<const TreeSizingRequest> trees, int64_t other_tokens, std::vector<TreeSizing>* sizings_out);

  Status observe(RequestId id, int32_t proposer, int32_t depth, int32_t accepted);
  // A verified tree of request `id` by `proposer` whose drafts' node probabilities summed to
  // `predicted` (AcceptanceEstimator::observe_tree, with the strength of the candidate tree
  // of the request's last decide; without one, `predicted`).
  Status observe_tree(RequestId id, int32_t proposer, double predicted, int32_t accepted);
  Status observe_forward(ForwardKind kind, int64_t tokens, double seconds);
  // One step's time outside the forwards, and what the step did (overhead_model.h). A
  // negative time (a step timed a hair shorter than its forwards) counts as 0; negative
  // counts and NaN or infinite times are kInvalidArgument (nothing is learnt from them).
  Status observe_overhead(double seconds, const StepShape& shape);
  // One whole step: the tokens it emitted for all requests (accepted drafts plus bonus
  // tokens; 0 for a prefill-only step), its time (forwards and overhead together) and the
  // requests left waiting for admission after it.
  Status observe_step(int64_t emitted_tokens, double seconds, int64_t waiting);
  void observe_load(int64_t waiting, int32_t max_batch) {
    load_.queue(waiting, max_batch);
    waiting_ = waiting;
    max_batch_ = max_batch;
  }
  void forget(RequestId id, int64_t generated_tokens);

  int32_t num_proposers() const { return static_cast<int32_t>(config_.proposer_uses_draft.size()); }
  const AcceptanceEstimator& estimator() const { return estimator_; }
  const CostModel& target_costs() const { return target_; }
  const CostModel& draft_costs() const { return draft_; }
  const OverheadModel& overhead() const { return overhead_; }
  // G_run: emitted tokens per second over the steps observed (decayed); 0 before any.
  double long_run_goodput() const { return run_seconds_ > 0 ? run_tokens_ / run_seconds_ : 0.0; }
  // w: the decayed share of observed steps that left requests waiting (0 before any).
  double backlog_share() const { return run_steps_ > 0 ? backlog_steps_ / run_steps_ : 0.0; }
  // The price of time for a step whose typical step's optimal goodput is g_star (header), at
  // the queue of the last observe_load.
  double price(double g_star) const;
  // The last decide()'s typical-step goodput G* and its price of time (0 before any step
  // with cost data): the controller's view of the load, for telemetry.
  double last_typical_goodput() const { return last_g_star_; }
  double last_price() const { return last_price_; }
  const LoadForecast& load() const { return load_; }

 private:
  Status validate_config() const;
  bool uses_draft() const { return draft_proposer_ >= 0; }
  // The optimizer's costs for a step of `requests` requests verifying at least `base_tokens`
  // (> 0: its drafts stay within the target's explored_limit from there).
  StepCostModel costs(double reference, int64_t base_tokens, int64_t requests) const;
  // node_probs: as ControllerRequest::node_probs (empty: the acceptance estimates only);
  // explore: the estimator's exploration applies (rule 2).
  std::vector<std::vector<double>> gains(RequestId id, int32_t cap, bool explore,
                                         Span<const std::vector<double>> node_probs = {}) const;
  // The backlog's throughput rule: whether the draft model may be used in this step.
  // may_catch_up[i]: whether request i may catch its draft up under the backlog (header).
  bool draft_serves_backlog(Span<const ControllerRequest> batch, Span<const std::vector<std::vector<double>>> gains,
                            double price, std::vector<bool>* may_catch_up) const;
  // One admitted prompt's prefill time beside a batch of n tokens, as the engine batches
  // admissions: the target's and the draft's (0 without a draft); nullopt before any prompt
  // or target timing.
  std::optional<std::pair<double, double>> admission_seconds(int64_t n) const;
  // The batch's wait for `tokens` draft tokens to catch up beside a draft forward of `base`
  // tokens, in a step verifying `verified` target tokens (rule 4's pricing).
  double catch_up_seconds(int64_t base, int64_t tokens, int64_t verified) const;
  std::vector<bool> worth_catching_up(Span<const ControllerRequest> batch,
                                      const std::vector<std::vector<std::vector<double>>>& gains,
                                      const Allocation& steady) const;

  GoodputControllerConfig config_;
  int32_t draft_proposer_ = -1;
  AcceptanceEstimator estimator_;
  CostModel target_, draft_;
  CostModel draft_view_;  // what decide() plans with: draft_, or shaped like the target (cost_model.h)
  OverheadModel overhead_;
  int64_t waiting_ = 0;  // requests waiting for admission at the last observe_load
  int32_t max_batch_ = 0;  // the engine's batch limit at the last observe_load
  int64_t finished_ = 0;   // requests forgotten (finished) so far
  bool draft_guessed_ = true;  // the draft's costs are not yet timed at two sizes (decide)
  // Decayed sums behind long_run_goodput() and backlog_share().
  double run_tokens_ = 0.0, run_seconds_ = 0.0, run_steps_ = 0.0, backlog_steps_ = 0.0;
  double last_g_star_ = 0.0, last_price_ = 0.0;
  // The last decide's verified tokens that are not prompt tokens (1 per decoding request,
  // base_tokens 1, and every request's k drafts), and whether its step's target forward is
  // still to come: the forward's tokens beyond them are the step's prefill
  // (LoadForecast::prefill).
  int64_t decode_tokens_ = 0;
  bool target_forward_pending_ = false;
  // The last decide's batch size, and the share of its typical step's expected tokens from
  // requests drafting with the draft model: price()'s admission work of the draft.
  int64_t last_batch_ = 1;
  double draft_share_ = 0.0;
  LoadForecast load_;
  // [request] -> [proposer] the strength (summed node probabilities) of the candidate tree
  // it was last decided from, for observe_tree (AcceptanceEstimator's calibration classes).
  std::unordered_map<RequestId, std::vector<double>> tree_strength_;
  std::unordered_set<RequestId> explorers_;  // the last decide's exploring requests (rule 2; size_trees)
};

}  // namespace specd
