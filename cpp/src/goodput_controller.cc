// Goodput controller: the per-step rules of goodput_controller.h.
#include "specd/goodput_controller.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

namespace specd {
namespace {

constexpr RequestId kUnseen = -1;  // a request id the estimator has not seen: its answers are the priors

using Gains = std::vector<std::vector<double>>;  // [proposer][draft] expected gain of each draft

// The optimizer's view of a step; owns the storage its spans point into.
struct StepProblem {
  std::vector<std::vector<SpecOption>> options;
  std::vector<SpecRequest> requests;

  int32_t draft_width = 1;  // SpecOption::draft_width of draft-model options

  void add(int32_t base_tokens, const Gains& gains, const std::vector<bool>& uses_draft,
           const std::vector<int32_t>& draft_base, const std::vector<bool>& allowed) {
    std::vector<SpecOption> opts;
    for (std::size_t p = 0; p < gains.size(); ++p) {
      const Span<const double> g = allowed[p] ? Span<const double>(gains[p]) : Span<const double>();
      opts.push_back(SpecOption{g, uses_draft[p], draft_base[p], uses_draft[p] ? draft_width : 1});
    }
    options.push_back(std::move(opts));
    requests.push_back(SpecRequest{base_tokens, {}});
  }
  // Spans are taken once every request was added (the vectors no longer move).
  Span<const SpecRequest> finish() {
    for (std::size_t i = 0; i < requests.size(); ++i) requests[i].options = Span<const SpecOption>(options[i]);
    return Span<const SpecRequest>(requests);
  }
};

double sum_first(const std::vector<double>& g, int32_t k) {
  double s = 0;
  for (int32_t j = 0; j < k && static_cast<std::size_t>(j) < g.size(); ++j) s += g[static_cast<std::size_t>(j)];
  return s;
}

// The expected tokens of `plan`'s requests that draft with proposer `draft` (the bonus
// token included), and marks them in users (optional).
double drafted_tokens(const Allocation& plan, Span<const Gains> all, int32_t draft, std::vector<bool>* users = nullptr) {
  if (users != nullptr) users->assign(all.size(), false);
  double drafted = 0.0;
  for (std::size_t i = 0; i < all.size() && draft >= 0; ++i)
    if (plan.k[i] > 0 && plan.option[i] == draft) {
      drafted += 1.0 + sum_first(all[i][static_cast<std::size_t>(draft)], plan.k[i]);
      if (users != nullptr) (*users)[i] = true;
    }
  return drafted;
}

}  // namespace

GoodputController::GoodputController(GoodputControllerConfig config)
    : config_(std::move(config)),
      estimator_(config_.acceptance, std::max<int32_t>(1, static_cast<int32_t>(config_.proposer_uses_draft.size()))),
      overhead_(config_.overhead) {
  for (std::size_t p = 0; p < config_.proposer_uses_draft.size(); ++p)
    if (config_.proposer_uses_draft[p] && draft_proposer_ < 0) draft_proposer_ = static_cast<int32_t>(p);
}

Status GoodputController::validate_config() const {
  if (config_.proposer_uses_draft.empty())
    return error_status(StatusCode::kInvalidArgument, "GoodputController: no proposers configured");
  if (std::count(config_.proposer_uses_draft.begin(), config_.proposer_uses_draft.end(), true) > 1)
    return error_status(StatusCode::kInvalidArgument, "GoodputController: at most one proposer may use the draft model");
  if (config_.k_max < 0)
    return error_status(StatusCode::kInvalidArgument, "GoodputController: k_max must be >= 0, got ", config_.k_max);
  if (!(config_.overhead.decay >= 0.0 && config_.overhead.decay < 1.0) || !(config_.overhead.ridge >= 0.0))
    return error_status(StatusCode::kInvalidArgument,
                        "GoodputController: overhead.decay must be in [0, 1) and overhead.ridge >= 0");
  if (config_.draft_tree_width < 1)
    return error_status(StatusCode::kInvalidArgument, "GoodputController: draft_tree_width must be >= 1, got ",
                        config_.draft_tree_width);
  if (!(config_.long_run_decay >= 0.0 && config_.long_run_decay < 1.0))
    return error_status(StatusCode::kInvalidArgument, "GoodputController: long_run_decay must be in [0, 1)");
  return Status::Ok();
}

StepCostModel GoodputController::costs(double reference, int64_t base_tokens, int64_t requests) const {
  const int64_t limit = base_tokens > 0 ? target_.explored_limit(base_tokens) : 0;
  return StepCostModel{&target_, uses_draft() ? &draft_view_ : nullptr, overhead_.fixed(requests), reference, limit,
                       overhead_.speculation_costs()};
}

std::vector<std::vector<double>> GoodputController::gains(RequestId id, int32_t cap, bool explore,
                                                          Span<const std::vector<double>> node_probs) const {
  Gains out(static_cast<std::size_t>(num_proposers()));
  if (cap <= 0) return out;
  std::vector<double> alphas(static_cast<std::size_t>(std::min(cap, estimator_.max_depth())));
  for (int32_t p = 0; p < num_proposers(); ++p) {
    auto& g = out[static_cast<std::size_t>(p)];
    if (!node_probs.empty() && !config_.proposer_uses_draft[static_cast<std::size_t>(p)]) {
      g = node_probs[static_cast<std::size_t>(p)];
      const double strength = std::accumulate(g.begin(), g.end(), 0.0);
      std::sort(g.begin(), g.end(), std::greater<double>());
      if (g.size() > static_cast<std::size_t>(cap)) g.resize(static_cast<std::size_t>(cap));
      const double c = estimator_.tree_calibration(id, p, strength);
      for (double& x : g) x = std::clamp(c * x, 0.0, 1.0);
      continue;
    }
    if (!estimator_.alphas(id, p, Span<double>(alphas), explore).ok()) continue;
    double prod = 1.0;
    for (double a : alphas) out[static_cast<std::size_t>(p)].push_back(prod *= a);
    if (config_.proposer_uses_draft[static_cast<std::size_t>(p)] && draft_guessed_ && out[static_cast<std::size_t>(p)].size() > 2)
      out[static_cast<std::size_t>(p)].resize(2);  // a draft not yet timed at two sizes (header)
  }
  return out;
}

Status GoodputController::decide(Span<const ControllerRequest> batch, std::vector<ControllerDecision>* decisions_out) {
  SPECD_RETURN_IF_ERROR(validate_config());
  for (const ControllerRequest& r : batch) {
    if (r.base_tokens < 1)
      return error_status(StatusCode::kInvalidArgument, "request ", r.id, ": base_tokens must be >= 1");
    if (!r.node_probs.empty() && r.node_probs.size() != static_cast<std::size_t>(num_proposers()))
      return error_status(StatusCode::kInvalidArgument, "request ", r.id, ": node_probs has ", r.node_probs.size(),
                          " entries for ", num_proposers(), " proposers");
    for (const std::vector<double>& probs : r.node_probs)
      for (double x : probs)
        if (!(x >= 0.0 && x <= 1.0))
          return error_status(StatusCode::kInvalidArgument, "request ", r.id, ": node probability ", x,
                              " is not in [0, 1]");
    if (r.draft_catch_up < 0 || r.k_max < 0 || r.remaining_tokens < 0)
      return error_status(StatusCode::kInvalidArgument, "request ", r.id,
                          ": k_max, draft_catch_up and remaining_tokens must be >= 0");
  }
  const std::size_t n = batch.size();
  decisions_out->assign(n, ControllerDecision{});
  // Before the draft was timed at two sizes (header, "An untimed draft"): two draft tokens per
  // request; before any timing free while exploring, priced like the target's under a backlog.
  draft_view_ = draft_.has_data() || waiting_ == 0 ? draft_.shaped_like(target_) : target_;
  draft_guessed_ = draft_.measured().size() < 2;
  for (const ControllerRequest& r : batch) load_.arrive(r.id, r.base_tokens, r.remaining_tokens);
  decode_tokens_ = 0;  // until the decisions: a step's target forward beyond it is prefill
  target_forward_pending_ = true;
  if (n == 0) return Status::Ok();

  std::vector<Gains> all(n);
  explorers_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const bool explore = waiting_ == 0 && static_cast<double>(i) < config_.acceptance.exploration_trials;  // rule 2
    if (explore) explorers_.insert(batch[i].id);
    all[i] = gains(batch[i].id, std::min(config_.k_max, batch[i].k_max), explore, batch[i].node_probs);
    if (batch[i].node_probs.empty()) continue;
    std::vector<double>& strength = tree_strength_[batch[i].id];  // for observe_tree
    strength.assign(static_cast<std::size_t>(num_proposers()), 0.0);
    for (std::size_t p = 0; p < strength.size(); ++p)
      strength[p] = std::accumulate(batch[i].node_probs[p].begin(), batch[i].node_probs[p].end(), 0.0);
  }
  const std::vector<bool> all_allowed(static_cast<std::size_t>(num_proposers()), true);
  // The typical step's draft base (header, rule 3): 2 tokens, what the draft processes after
  // a step whose drafts were all accepted.
  const std::vector<int32_t> drafting_in_sync(static_cast<std::size_t>(num_proposers()), 2);

  // The typical step: decode only, every draft in sync. Its optimal goodput G*, or the
  // long-run goodput where lower, prices this step (header: "The long-run price").
  StepProblem typical_step;
  typical_step.draft_width = config_.draft_tree_width;
  for (std::size_t i = 0; i < n; ++i) typical_step.add(1, all[i], config_.proposer_uses_draft, drafting_in_sync, all_allowed);
  const Span<const SpecRequest> typical_requests = typical_step.finish();
  Allocation steady;
  SPECD_RETURN_IF_ERROR(optimize_goodput(typical_requests, costs(0.0, static_cast<int64_t>(n), static_cast<int64_t>(n)), &steady));
  // The typical step's share of tokens from requests that draft with the draft model (price).
  draft_share_ = steady.expected_tokens > 0
                     ? drafted_tokens(steady, Span<const Gains>(all), draft_proposer_) / steady.expected_tokens
                     : 0.0;
  last_batch_ = static_cast<int64_t>(n);
  const double price = this->price(steady.goodput);
  last_g_star_ = steady.goodput;
  last_price_ = price;
  const bool typical = std::all_of(batch.begin(), batch.end(), [](const ControllerRequest& r) {
    return r.base_tokens == 1 && r.draft_catch_up <= 1;
  });

  // The backlog's throughput (header): under a backlog the draft model may be ruled out.
  std::vector<bool> may_catch_up;
  const bool draft_ok = draft_serves_backlog(batch, all, price, &may_catch_up);
  Allocation plan;
  if (typical && draft_ok && price >= steady.goodput) {
    plan = std::move(steady);
  } else if (typical && draft_ok) {
    SPECD_RETURN_IF_ERROR(optimize_goodput(typical_requests, costs(price, static_cast<int64_t>(n), static_cast<int64_t>(n)), &plan));
  } else {
    // Requests may use the draft model where their catch-up pays (rule 4) and the backlog allows.
    std::vector<bool> invest = draft_ok ? worth_catching_up(batch, all, steady) : std::vector<bool>(n, false);
    for (std::size_t i = 0; i < n; ++i) invest[i] = invest[i] && may_catch_up[i];
    StepProblem step;
    step.draft_width = config_.draft_tree_width;
    for (std::size_t i = 0; i < n; ++i) {
      const ControllerRequest& r = batch[i];
      std::vector<bool> allowed(all_allowed);
      std::vector<int32_t> base(static_cast<std::size_t>(num_proposers()), 1);
      const int64_t behind = std::max(0, r.draft_catch_up - 1);
      for (int32_t p = 0; p < num_proposers(); ++p) {
        const auto& g = all[i][static_cast<std::size_t>(p)];
        if (config_.proposer_uses_draft[static_cast<std::size_t>(p)] && !invest[i]) allowed[static_cast<std::size_t>(p)] = false;
        // The catch-up, paid once, is charged spread over the steps the request still has.
        const double steps_left = std::max(1.0, static_cast<double>(r.remaining_tokens) / (1.0 + sum_first(g, static_cast<int32_t>(g.size()))));
        base[static_cast<std::size_t>(p)] = 1 + static_cast<int32_t>(std::ceil(static_cast<double>(behind) / steps_left));
      }
      step.add(r.base_tokens, all[i], config_.proposer_uses_draft, base, allowed);
    }
    int64_t base_total = 0;
    for (const ControllerRequest& r : batch) base_total += r.base_tokens;
    SPECD_RETURN_IF_ERROR(optimize_goodput(step.finish(), costs(price, base_total, static_cast<int64_t>(n)), &plan));
  }
  for (std::size_t i = 0; i < n; ++i) {
    ControllerDecision& d = (*decisions_out)[i];
    d.k = plan.k[i];
    decode_tokens_ += (batch[i].base_tokens == 1 ? 1 : 0) + d.k;  // drafts are not prompt tokens
    d.proposer = d.k > 0 ? plan.option[i] : -1;
    d.predicted_tokens = 1.0 + (d.k > 0 ? sum_first(all[i][static_cast<std::size_t>(d.proposer)], d.k) : 0.0);
    // Exploration by forgetting (acceptance_estimator.h): proposers the request could use
    // but does not use this step fade towards their global estimate.
    if (batch[i].k_max > 0 && config_.k_max > 0)
      for (int32_t p = 0; p < num_proposers(); ++p)
        if (p != d.proposer) SPECD_RETURN_IF_ERROR(estimator_.idle(batch[i].id, p));
  }
  // A proposer that no request used this step (while some could have) fades globally.
  const bool any_cap = config_.k_max > 0 && std::any_of(batch.begin(), batch.end(),
                                                         [](const ControllerRequest& r) { return r.k_max > 0; });
  const bool speculating = std::any_of(decisions_out->begin(), decisions_out->end(),
                                       [](const ControllerDecision& x) { return x.k > 0; });
  for (int32_t p = 0; any_cap && p < num_proposers(); ++p)
    if (std::none_of(decisions_out->begin(), decisions_out->end(), [p](const ControllerDecision& x) { return x.proposer == p; }))
      SPECD_RETURN_IF_ERROR(estimator_.idle_global(p, speculating));
  return Status::Ok();
}

bool GoodputController::draft_serves_backlog(Span<const ControllerRequest> batch, Span<const Gains> all,
                                             double price, std::vector<bool>* may_catch_up) const {
  may_catch_up->assign(batch.size(), true);
  if (!uses_draft() || waiting_ == 0 || all.empty()) return true;
  const auto n = static_cast<int64_t>(all.size());
  const std::optional<std::pair<double, double>> admission = admission_seconds(n);
  if (!admission) return true;
  const auto [a_target, a_draft] = *admission;
  const double per_request = load_.request_tokens();
  const std::vector<int32_t> in_sync(static_cast<std::size_t>(num_proposers()), 2);  // as the typical step's
  // The typical step's plan at the price, with or without the draft model: its steady-state
  // throughput with the admissions its tokens bring (header), and which requests draft.
  const auto serve = [&](bool with_draft, std::vector<bool>* users) {
    std::vector<bool> allowed(static_cast<std::size_t>(num_proposers()), true);
    allowed[static_cast<std::size_t>(draft_proposer_)] = with_draft;
    StepProblem step;
    step.draft_width = config_.draft_tree_width;
    for (const Gains& g : all) step.add(1, g, config_.proposer_uses_draft, in_sync, allowed);
    Allocation plan;
    users->assign(all.size(), false);
    if (!optimize_goodput(step.finish(), costs(price, n, n), &plan).ok() || !(plan.expected_seconds > 0)) return 0.0;
    const double drafted = drafted_tokens(plan, all, draft_proposer_, users);
    const double e = plan.expected_tokens;
    const double share = e > 0 ? drafted / e : 0.0;
    return e / (plan.expected_seconds + e / per_request * (a_target + share * a_draft));
  };
  std::vector<bool> users, unused;
  const double with = serve(true, &users);
  if (std::none_of(users.begin(), users.end(), [](bool u) { return u; })) return true;
  const double without = serve(false, &unused);
  if (!(with > without)) return false;
  // Catching up under a backlog (header): a drafting request whose draft is behind catches
  // up, once, only if its share of the time drafting saves wins that back: the saving per
  // token over its remaining tokens (at most the tokens of a typical request).
  int64_t drafting = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) drafting += users[i] ? 1 : 0;
  const double saved_per_token = 1.0 / without - 1.0 / with;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const ControllerRequest& r = batch[i];
    const int64_t excess = std::max(0, r.draft_catch_up - std::max(2, r.base_tokens));
    if (!users[i] || excess == 0) continue;
    const double remaining = std::min(static_cast<double>(r.remaining_tokens), per_request);
    (*may_catch_up)[i] = catch_up_seconds(2 * drafting, excess, n) < remaining * saved_per_token;
  }
  return true;
}

std::optional<std::pair<double, double>> GoodputController::admission_seconds(int64_t n) const {
  const std::optional<double> prompt = load_.prompt_tokens();
  if (!prompt || !target_.has_data()) return std::nullopt;
  const auto p = static_cast<int64_t>(std::llround(*prompt));
  if (p <= 0) return std::nullopt;
  // One prompt's share of a prefill of `chunk` tokens beside the batch (header).
  const auto chunk = static_cast<int64_t>(
      std::llround(std::max<double>(static_cast<double>(p), load_.prefill_chunk().value_or(0.0))));
  const double share = static_cast<double>(p) / static_cast<double>(chunk);
  return std::make_pair(share * std::max(0.0, target_.predict(n + chunk) - target_.predict(n)),
                        uses_draft() ? share * std::max(0.0, draft_view_.predict(n + chunk) - draft_view_.predict(n)) : 0.0);
}

double GoodputController::catch_up_seconds(int64_t base, int64_t tokens, int64_t verified) const {
  // Before the draft's costs have a slope, its tokens are assumed to cost what the target's
  // do, scaled by the two models' forward times; before the draft was ever timed, as much as
  // the target's (the first catch-up is not free: on a CPU it can take seconds).
  const double ratio = !draft_.has_data() ? 1.0
                       : target_.predict(1) > 0 ? draft_view_.predict(1) / target_.predict(1) : 0.0;
  // Up to twice the largest size the draft was timed at, its own curve prices the catch-up
  // (header, rule 4); the target's scaled curve is only a floor beyond that. (On a 2-core
  // CPU the draft/target ratio is 0.4 at one token and 0.25 at 179: the floor put a 171-token
  // catch-up at 1.6 s where the draft's own measurements said 0.9 s.)
  const std::vector<std::pair<double, double>> timed = draft_.measured();
  const double draft_reach = timed.empty() ? 0.0 : 2.0 * timed.back().first;
  const double own = draft_view_.predict(base + tokens) - draft_view_.predict(base);
  const double floor = static_cast<double>(base + tokens) <= draft_reach
                           ? 0.0
                           : ratio * (target_.predict(verified + tokens) - target_.predict(verified));
  return std::max({own, floor, 0.0});
}

std::vector<bool> GoodputController::worth_catching_up(Span<const ControllerRequest> batch,
                                                       const std::vector<Gains>& all, const Allocation& steady) const {
  const std::size_t n = batch.size();
  std::vector<int64_t> behind(n);
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) any |= (behind[i] = std::max(0, batch[i].draft_catch_up - 1)) > 0;
  if (!uses_draft() || !any) return std::vector<bool>(n, true);

  // The steady plan at the forecast batch: today's requests plus typical new ones.
  const int32_t forecast = load_.batch(static_cast<int32_t>(n), target_);
  Allocation forecast_plan;
  const Allocation* plan = &steady;
  if (static_cast<std::size_t>(forecast) > n) {
    int32_t cap = 0;
    for (const Gains& g : all) cap = std::max(cap, static_cast<int32_t>(g[0].size()));
    const Gains prior = gains(kUnseen, cap, /*explore=*/waiting_ == 0);
    const std::vector<bool> allowed(static_cast<std::size_t>(num_proposers()), true);
    const std::vector<int32_t> in_sync(static_cast<std::size_t>(num_proposers()), 2);  // as the typical step's
    StepProblem future;
    future.draft_width = config_.draft_tree_width;
    for (std::size_t i = 0; i < n; ++i) future.add(1, all[i], config_.proposer_uses_draft, in_sync, allowed);
    for (std::size_t i = n; i < static_cast<std::size_t>(forecast); ++i)
      future.add(1, prior, config_.proposer_uses_draft, in_sync, allowed);
    if (optimize_goodput(future.finish(), costs(0.0, forecast, forecast), &forecast_plan).ok()) plan = &forecast_plan;
  }
  const int32_t d = draft_proposer_;
  const double goodput = plan->goodput;
  int64_t verified = forecast, users = 0;
  for (std::size_t i = 0; i < plan->k.size(); ++i) {
    verified += plan->k[i];
    users += (plan->k[i] > 0 && plan->option[i] == d) ? 1 : 0;
  }
  const double draft_token = std::max(0.0, draft_view_.predict(users + 1) - draft_view_.predict(users));
  const HostCosts host = overhead_.speculation_costs();
  std::vector<bool> invest(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    if (behind[i] == 0) {
      invest[i] = true;
      continue;
    }
    const int32_t k = plan->k[i];
    if (plan->option[i] != d || k == 0 || goodput <= 0) continue;
    const double extra = sum_first(all[i][static_cast<std::size_t>(d)], k);
    // Its marginal time per step: the target's, the draft's and the host's for its k drafts.
    const double delta = std::max(0.0, target_.predict(verified) - target_.predict(verified - k)) + k * draft_token +
                         k * host.per_draft_token + host.per_drafting_request;
    const double per_step = extra / goodput - delta;
    const double steps_left = static_cast<double>(batch[i].remaining_tokens) / (1.0 + extra);
    invest[i] = steps_left * per_step > catch_up_seconds(users + 1, behind[i], verified);
  }
  return invest;
}

Status GoodputController::size_trees(Span<const TreeSizingRequest> trees, int64_t other_tokens,
                                     std::vector<TreeSizing>* sizings_out) {
  SPECD_RETURN_IF_ERROR(validate_config());
  if (!uses_draft())
    return error_status(StatusCode::kInvalidArgument, "GoodputController::size_trees: no draft-model proposer");
  if (other_tokens < 0)
    return error_status(StatusCode::kInvalidArgument, "GoodputController::size_trees: other_tokens must be >= 0");
  // The trees' nodes replace the decided depths: this step's prefill is not measured.
  target_forward_pending_ = false;
  const std::size_t n = trees.size();
  std::vector<std::vector<int32_t>> ranked(n);  // [tree] nodes by gain
  std::vector<std::vector<double>> raw(n);      // [tree][node] uncalibrated gain
  Gains calibrated(n);                          // [tree] gains of `ranked`, calibrated
  for (std::size_t i = 0; i < n; ++i) {
    const TreeSizingRequest& t = trees[i];
    const std::size_t size = t.path_probs.size();
    if (t.max_nodes < 0 || t.parents.size() != size)
      return error_status(StatusCode::kInvalidArgument, "tree of request ", t.id,
                          ": max_nodes must be >= 0 and parents must have one entry per node");
    std::vector<int32_t> depth(size, 1);
    std::vector<double> q(size), q_max(size + 1, 0.0);  // q_max[parent + 1]
    std::vector<int32_t> top(size + 1, -1);             // top[parent + 1]: its most probable child
    for (std::size_t v = 0; v < size; ++v) {
      const int32_t parent = t.parents[v];
      const double p = t.path_probs[v];
      if (parent < -1 || parent >= static_cast<int32_t>(v) || !(p > 0.0 && p <= 1.0))
        return error_status(StatusCode::kInvalidArgument, "tree of request ", t.id, ": node ", v, " has parent ",
                            parent, " and path probability ", p, " (parents come first; probabilities in (0, 1])");
      const double above = parent < 0 ? 1.0 : t.path_probs[static_cast<std::size_t>(parent)];
      q[v] = std::min(1.0, p / above);
      if (parent >= 0) depth[v] = depth[static_cast<std::size_t>(parent)] + 1;
      const auto group = static_cast<std::size_t>(parent + 1);
      if (q[v] > q_max[group]) {
        q_max[group] = q[v];
        top[group] = static_cast<int32_t>(v);
      }
    }
    const int32_t deepest = size ? *std::max_element(depth.begin(), depth.end()) : 0;
    std::vector<double> alphas(static_cast<std::size_t>(std::min(deepest, estimator_.max_depth())), 0.0);
    if (!alphas.empty())
      SPECD_RETURN_IF_ERROR(estimator_.alphas(t.id, draft_proposer_, Span<double>(alphas),
                                              /*explore=*/explorers_.count(t.id) > 0));
    std::vector<double>& g = raw[i];
    g.assign(size, 0.0);
    for (std::size_t v = 0; v < size; ++v) {
      const auto d = static_cast<std::size_t>(depth[v]);
      if (d > alphas.size()) continue;  // deeper than the estimator tracks: no gain
      const auto group = static_cast<std::size_t>(t.parents[v] + 1);
      const double above = t.parents[v] < 0 ? 1.0 : g[static_cast<std::size_t>(t.parents[v])];
      const double alpha = alphas[d - 1];
      g[v] = top[group] == static_cast<int32_t>(v) ? above * alpha
             : q_max[group] < 1.0                   ? above * (1 - alpha) * q[v] / (1 - q_max[group])
                                                    : 0.0;
    }
    std::vector<int32_t>& order = ranked[i];
    order.resize(size);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const auto ua = static_cast<std::size_t>(a), ub = static_cast<std::size_t>(b);
      if (g[ua] != g[ub]) return g[ua] > g[ub];
      return depth[ua] != depth[ub] ? depth[ua] < depth[ub] : a < b;
    });
    if (order.size() > static_cast<std::size_t>(t.max_nodes)) order.resize(static_cast<std::size_t>(t.max_nodes));
    while (!order.empty() && g[static_cast<std::size_t>(order.back())] <= 0.0) order.pop_back();
    const double strength = std::accumulate(g.begin(), g.end(), 0.0);
    const double c = estimator_.tree_calibration(t.id, draft_proposer_, strength);
    for (int32_t v : order) calibrated[i].push_back(std::clamp(c * g[static_cast<std::size_t>(v)], 0.0, 1.0));
    std::vector<double>& remembered = tree_strength_[t.id];  // for observe_tree
    remembered.resize(static_cast<std::size_t>(num_proposers()), 0.0);
    remembered[static_cast<std::size_t>(draft_proposer_)] = strength;
  }
  // The draft's time is spent: each tree is an option without the draft model's costs.
  // (StepProblem keeps spans into the gains: one single-option Gains per tree, alive here.)
  std::vector<Gains> options(n);
  for (std::size_t i = 0; i < n; ++i) options[i].push_back(std::move(calibrated[i]));
  StepProblem step;
  const std::vector<bool> model_free(1, false), allowed(1, true);
  const std::vector<int32_t> base(1, 1);
  for (std::size_t i = 0; i < n; ++i) step.add(1, options[i], model_free, base, allowed);
  if (other_tokens > 0)
    step.add(static_cast<int32_t>(std::min<int64_t>(other_tokens, std::numeric_limits<int32_t>::max())), Gains{}, {},
             {}, {});
  Allocation plan;
  const int64_t base_total = static_cast<int64_t>(n) + other_tokens;
  StepCostModel cost = costs(last_price_, base_total, static_cast<int64_t>(n));
  cost.host.per_drafting_request = cost.host.per_draft_forward = 0.0;  // spent (header, "Host time")
  SPECD_RETURN_IF_ERROR(optimize_goodput(step.finish(), cost, &plan));
  sizings_out->assign(n, TreeSizing{});
  for (std::size_t i = 0; i < n; ++i) {
    TreeSizing& out = (*sizings_out)[i];
    out.nodes.assign(ranked[i].begin(), ranked[i].begin() + plan.k[i]);
    for (int32_t v : out.nodes) out.predicted += raw[i][static_cast<std::size_t>(v)];
  }
  return Status::Ok();
}

Status GoodputController::observe(RequestId id, int32_t proposer, int32_t depth, int32_t accepted) {
  SPECD_RETURN_IF_ERROR(validate_config());
  if (depth <= 0) return Status::Ok();
  return estimator_.observe(id, proposer, depth, accepted);
}

Status GoodputController::observe_tree(RequestId id, int32_t proposer, double predicted, int32_t accepted) {
  SPECD_RETURN_IF_ERROR(validate_config());
  double strength = predicted;  // without a probe in decide: the tree itself
  const auto it = tree_strength_.find(id);
  if (it != tree_strength_.end() && proposer >= 0 && static_cast<std::size_t>(proposer) < it->second.size())
    strength = it->second[static_cast<std::size_t>(proposer)];
  return estimator_.observe_tree(id, proposer, predicted, accepted, strength);
}

Status GoodputController::observe_forward(ForwardKind kind, int64_t tokens, double seconds) {
  load_.tick(seconds);
  if (tokens <= 0) return Status::Ok();
  if (kind == ForwardKind::kTarget && target_forward_pending_) {  // the step's prefill (header)
    load_.prefill(tokens - decode_tokens_);
    target_forward_pending_ = false;
  }
  return (kind == ForwardKind::kTarget ? target_ : draft_).observe(tokens, seconds);
}

Status GoodputController::observe_overhead(double seconds, const StepShape& shape) {
  SPECD_RETURN_IF_ERROR(validate_config());
  // A step timed a hair shorter than its forwards (clock rounding) took no host time.
  SPECD_RETURN_IF_ERROR(overhead_.observe(shape, seconds < 0.0 ? 0.0 : seconds));
  load_.tick(seconds);
  return Status::Ok();
}

Status GoodputController::observe_step(int64_t emitted_tokens, double seconds, int64_t waiting) {
  SPECD_RETURN_IF_ERROR(validate_config());
  if (emitted_tokens < 0 || waiting < 0 || !(seconds >= 0.0) || !std::isfinite(seconds))
    return error_status(StatusCode::kInvalidArgument, "GoodputController::observe_step: tokens ", emitted_tokens,
                        ", seconds ", seconds, " and waiting ", waiting, " must be >= 0 and finite");
  const double keep = config_.long_run_decay;
  run_tokens_ = keep * run_tokens_ + static_cast<double>(emitted_tokens);
  run_seconds_ = keep * run_seconds_ + seconds;
  run_steps_ = keep * run_steps_ + 1.0;
  backlog_steps_ = keep * backlog_steps_ + (waiting > 0 ? 1.0 : 0.0);
  return Status::Ok();
}

double GoodputController::price(double g_star) const {
  double run = long_run_goodput();
  if (waiting_ == 0 || run <= 0 || run >= g_star || finished_ < max_batch_) return g_star;
  // The draft's admission work that drafting brings per emitted token (header): a second of
  // a drafting step is worth that many more tokens.
  if (const std::optional<std::pair<double, double>> admission = admission_seconds(last_batch_)) {
    const double busy = run * draft_share_ * admission->second / load_.request_tokens();
    run = busy < 1.0 ? std::min(g_star, run / (1.0 - busy)) : g_star;
  }
  const double w = backlog_share();
  return (1 - w) * g_star + w * run;
}

void GoodputController::forget(RequestId id, int64_t generated_tokens) {
  estimator_.remove(id);
  tree_strength_.erase(id);
  ++finished_;
  load_.finish(id, generated_tokens);
}

}  // namespace specd
