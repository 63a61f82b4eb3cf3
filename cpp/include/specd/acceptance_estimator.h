// AcceptanceEstimator: per-depth acceptance rates, learned online for every request and
// proposer, for the speculation controller.
//
// Words: alpha_d = P(the draft at depth d is accepted | the draft at depth d-1 was), so a
// chain of k drafts yields E[tokens] = 1 + sum_{j=1..k} prod_{m<=j} alpha_m.
//
// Model (decayed Beta counts)
// - For each (proposer, depth) a global pair (successes, trials) over all requests, and for
//   each (request, proposer, depth) a pair of the request's own. Each new observation first
//   multiplies the pair's old counts by a decay factor, so old behaviour fades (requests
//   drift between repetitive and novel text).
// - A request's estimate is (s + m * g) / (n + m): its own counts shrunk towards the
//   proposer's global estimate g with prior strength m. A new request therefore starts at
//   what the proposer achieves on other requests, and moves to its own rate after a few
//   steps.
// - Before any observation at all, g = initial_alpha at depths 2 and deeper.
// - Exploration at depth 1: until the proposer has been verified exploration_trials times
//   (a plain count over the run, never decayed or faded; once reached, for good), its
//   depth-1 estimate g is 1,
//   so that drafting is tried and measured however expensive a draft is, rather than judged
//   by the prior alone. (With g = initial_alpha = 0.6, a draft whose step costs more than
//   0.6 of a target step is never tried: on forward times measured on an H100 for the real
//   pair's shapes, the draft costs 0.6-0.7 of the target, and goodput decoded plainly at every
//   rate while k = 1 was 12% faster at low load.) Ten trials make the data decide: with
//   alpha = 0.9 the estimate then falls below 0.67 with probability under 2%; a useless
//   proposer costs about ten wasted drafts per run.
// - Retries: a proposer whose depth 1 has been explored is retried after retry_idle_steps
//   steps in which no request used it and nothing was speculated at all (idle_global with
//   speculating = false; steps in which another proposer serves requests do not count:
//   those requests are not decoding plainly, and a retry would move them to this proposer
//   for a step). While retried, its depth-1 global estimate is 1 again (where exploration
//   applies, explore = true) until its next observation; the wait before the following
//   retry doubles. Fading alone pulls a low estimate back to initial_alpha only, and a
//   draft model that pays only above it (on the measured H100 costs the pair's draft pays
//   from about 0.65) would then never be tried again: on the H100-profile sweep at 155
//   requests/s the first 23 verifications (mostly requests' first ones, which accept half
//   as often as later ones: 0.50 against 0.84 with k = 1) put depth 1 at 0.57, and goodput
//   decoded plainly for the remaining 470 steps (1.065x the best static k). Doubling bounds
//   what a useless proposer costs: about log2(steps / retry_idle_steps) retried steps in a
//   run.
// - Exploration one depth deeper: a depth d >= 2 that has been tested fewer than
//   exploration_trials times (a plain count per depth: a step tests depths 1..A+1, at most
//   D, as below) while depth d-1 has had its trials is estimated at no less than depth
//   d-1's global estimate, so the chain grows a depth at a time while the data support it
//   rather than waiting for the prior to be outweighed: with the prior at depth 2, a
//   16-request run at 19.4 requests/s on measured H100 costs drafted k = 1 for a hundred
//   steps where k = 2 was best (1.043x its latency). The same optimism applied always (a
//   hierarchical prior: any depth starts at the estimate of the depth above) drafted k = 1.89
//   at saturation on the 256-request sweep (1.203x no speculation); here it applies only
//   where depth-1 exploration does (explore = true: no request waiting) and only until the
//   depth has its own trials.
// - Observation of one verify step: drafts reached depth D (the deepest proposed node) and
//   A <= D were accepted. Depths 1..A are successes; depth A+1 is a failure if A < D;
//   deeper depths were not tested (no information).
// - Exploration by forgetting: a step in which a request does not use a proposer (k = 0,
//   or another proposer) multiplies the request's own counts for it by idle_decay (idle()).
//   A request that stopped speculating because its drafts failed thus drifts back towards
//   the proposer's global estimate and is tried again if that estimate makes drafting pay,
//   so text that turns repetitive later is noticed. A step in which no request uses the
//   proposer fades its global counts the same way (idle_global()), towards initial_alpha:
//   otherwise a few early failures could stop every request from ever trying it again
//   (requests without counts of their own use the global estimate, which only observations
//   would change). Only depths whose estimate is below initial_alpha fade globally: fading
//   exists to retry, and pulling a good estimate down towards the prior while the proposer
//   is idle (say, while a batch is compute-bound) would only make it harder to retry.
// - Tree calibration: a proposer that estimates each node's probability of acceptance
//   (the suffix and n-gram proposers' node_probs, from frequencies in the text) can be
//   over- or under-confident, and how much depends on the evidence behind the tree: one
//   occurrence of a continuation gives probability 1 as surely as twenty do. In the
//   suffix-tree load benchmark (static budget 8), trees whose candidates' probabilities
//   summed to under 2 realised 47% of that sum, trees summing to 7.5 or more 97%; a tenth of
//   the requests realised under half, the median request 94%. So the calibration has two
//   factors, both decayed ratios of realised to predicted accepted drafts:
//   - the proposer's, per strength class of the tree: strength S is the sum of the node
//     probabilities of the request's whole candidate tree in that step (the probe at the
//     request's largest budget, before k is chosen), class floor(log2(1 + S)) (S < 1, < 3,
//     < 7, < 15, ...). A verified tree whose drafts' probabilities summed to P with A
//     accepted adds P and A to its class's sums (global_decay);
//     c_g(S) = (sum A + m) / (sum P + m), m = prior_strength: 1 before data;
//   - the request's: its trees' accepted drafts over what c_g predicted for them, decayed
//     per observation (request_decay), f_r = (A_r + m) / (E_r + m).
//   tree_calibration(id, proposer, S) = c_g(S) f_r (observe_tree records both).
//   Fading as for the rates: idle() fades the request's sums, idle_global() every class
//   whose calibration is below 1, so that early over-confidence (trees of a cold index)
//   cannot switch trees off for good.
// Nothing here needs tuning by a user: the constants in the config are fixed defaults.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "specd/proposer.h"
#include "specd/span.h"
#include "specd/status.h"

namespace specd {

struct AcceptanceEstimatorConfig {
  int32_t max_depth = 32;       // depths tracked (1..max_depth)
  double request_decay = 0.85;  // per observation of the request
  double global_decay = 0.995;  // per observation of the proposer
  double prior_strength = 3.0;  // pseudo-trials of the global estimate in a request's estimate
  double initial_alpha = 0.6;   // global estimate before any data
  double idle_decay = 0.95;     // per step a request does not use the proposer
  double exploration_trials = 10.0;  // verifications before the depth-1 estimate follows the data
  int64_t retry_idle_steps = 16;     // idle steps before the first retry (then doubling)
};

class AcceptanceEstimator {
 public:
  AcceptanceEstimator(const AcceptanceEstimatorConfig& config, int32_t num_proposers);

  int32_t num_proposers() const { return num_proposers_; }
  int32_t max_depth() const { return config_.max_depth; }

  // One verify step of request `id` whose proposal by `proposer` reached depth `depth` with
  // `accepted` drafts accepted (0 <= accepted <= depth). depth == 0 records nothing.
  Status observe(RequestId id, int32_t proposer, int32_t depth, int32_t accepted);
  // alpha_1..alpha_n of the request (the proposer's global estimate when it has no data).
  // explore = false: the data's estimates even while a depth is explored (for steps that
  // must not explore; rules above).
  Status alphas(RequestId id, int32_t proposer, Span<double> out, bool explore = true) const;
  // The proposer's global estimate at depth d (1-based); 1 at depth 1 while it is explored,
  // at least depth d-1's at a deeper depth explored (unless explore = false).
  double global_alpha(int32_t proposer, int32_t depth, bool explore = true) const;
  // Whether the proposer's depth 1 has had its exploration_trials (rules above).
  bool explored(int32_t proposer) const;
  // One verify step of request `id`'s tree whose drafts' node probabilities summed to
  // `predicted` (>= 0, finite) and of which `accepted` (>= 0) were accepted; `strength`
  // (>= 0, finite) is the sum over the whole candidate tree it was chosen from (rules above).
  Status observe_tree(RequestId id, int32_t proposer, double predicted, int32_t accepted, double strength);
  // The factor that turns the proposer's node probabilities into acceptance probabilities
  // for a tree of this strength: the proposer's (c_g), and request `id`'s (c_g f_r; c_g for
  // a request without trees).
  double tree_calibration(int32_t proposer, double strength) const;
  double tree_calibration(RequestId id, int32_t proposer, double strength) const;
  static constexpr int32_t kTreeClasses = 8;  // strength classes (the last one takes the rest)
  static int32_t tree_class(double strength);
  // A step in which request `id` did not use `proposer`: its own counts fade (rules above).
  Status idle(RequestId id, int32_t proposer);
  // A step in which no request used `proposer`: its global counts fade, and, if no request
  // speculated with any proposer (`speculating` false), its retry comes nearer (rules above).
  Status idle_global(int32_t proposer, bool speculating = false);
  // Whether the proposer's depth 1 is being retried (rules above).
  bool retrying(int32_t proposer) const;
  void remove(RequestId id) { requests_.erase(id); }
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }

 private:
  // Decayed sums of predicted and accepted drafts (tree calibration).
  struct TreeSums {
    double predicted = 0.0, accepted = 0.0;
    void add(double p, double a, double decay) {
      predicted = decay * predicted + p;
      accepted = decay * accepted + a;
    }
    void fade(double decay) { add(0.0, 0.0, decay); }
    double ratio(double m) const { return (accepted + m) / (predicted + m); }  // 1 before data
  };
  struct Counts {
    std::vector<double> successes, trials;  // [max_depth]
    TreeSums tree;  // a request's trees: accepted against what the classes' calibration expected
  };
  Status check(int32_t proposer) const;
  static void add(Counts* c, int32_t depth, int32_t accepted, double decay);
  std::vector<Counts>& request_counts(RequestId id);

  AcceptanceEstimatorConfig config_;
  int32_t num_proposers_;
  std::vector<Counts> global_;                                 // [num_proposers]
  std::vector<bool> explored_;                                 // [num_proposers] depth 1 explored
  std::vector<std::vector<int64_t>> depth_trials_;             // [num_proposers][max_depth] never decayed
  std::vector<int64_t> idle_steps_;                            // [num_proposers] plain steps since its last observation
  std::vector<int64_t> retry_gap_;                             // [num_proposers] idle steps before a retry
  std::vector<bool> retrying_;                                 // [num_proposers] retried until observed
  std::vector<std::array<TreeSums, kTreeClasses>> tree_classes_;  // [num_proposers] per strength class
  std::unordered_map<RequestId, std::vector<Counts>> requests_;  // [num_proposers] each
};

}  // namespace specd
