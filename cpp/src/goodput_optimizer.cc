// Goodput optimizer: the allocation of draft tokens described in goodput_optimizer.h.
#include "specd/goodput_optimizer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <queue>
#include <utility>

namespace specd {
namespace {

constexpr double kTiny = 1e-12;  // seconds: keeps ratios finite before any cost sample

const SpecOption* option_of(const SpecRequest& r, int32_t option) {
  return option >= 0 && static_cast<std::size_t>(option) < r.options.size() ? &r.options[static_cast<std::size_t>(option)]
                                                                             : nullptr;
}

// Tokens of request option `opt` in draft forward j (1-based; header, "Model of one step").
int64_t draft_forward_tokens(const SpecOption& opt, std::size_t j) {
  if (j == 1) return opt.draft_base_tokens;
  return opt.draft_width;
}

// The quantity optimize_goodput maximizes (goodput_optimizer.h, "Objective").
double objective(const StepCostModel& cost, double tokens, double seconds) {
  return cost.reference_goodput > 0 ? tokens - cost.reference_goodput * seconds : tokens / seconds;
}

Status validate(Span<const SpecRequest> requests, const StepCostModel& cost) {
  if (cost.target == nullptr) return error_status(StatusCode::kInvalidArgument, "optimize_goodput: no target cost model");
  if (!(cost.reference_goodput >= 0.0) || !std::isfinite(cost.reference_goodput))
    return error_status(StatusCode::kInvalidArgument, "optimize_goodput: reference_goodput must be finite and >= 0, got ",
                        cost.reference_goodput);
  if (cost.max_target_tokens < 0)
    return error_status(StatusCode::kInvalidArgument, "optimize_goodput: max_target_tokens must be >= 0, got ",
                        cost.max_target_tokens);
  for (double h : {cost.host.per_drafting_request, cost.host.per_draft_token, cost.host.per_draft_forward})
    if (!(h >= 0.0) || !std::isfinite(h))
      return error_status(StatusCode::kInvalidArgument, "optimize_goodput: host costs must be finite and >= 0, got ", h);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const SpecRequest& r = requests[i];
    if (r.base_tokens < 1)
      return error_status(StatusCode::kInvalidArgument, "request ", i, ": base_tokens must be >= 1, got ", r.base_tokens);
    for (std::size_t o = 0; o < r.options.size(); ++o) {
      const SpecOption& opt = r.options[o];
      if (opt.uses_draft_model && cost.draft == nullptr)
        return error_status(StatusCode::kInvalidArgument, "request ", i, " option ", o,
                            " uses the draft model but no draft cost model was given");
      if (opt.uses_draft_model && opt.draft_base_tokens < 1)
        return error_status(StatusCode::kInvalidArgument, "request ", i, ": draft_base_tokens must be >= 1");
      if (opt.draft_width < 1)
        return error_status(StatusCode::kInvalidArgument, "request ", i, ": draft_width must be >= 1, got ",
                            opt.draft_width);
      double previous = 1.0;
      for (std::size_t j = 0; j < opt.gains.size(); ++j) {
        const double g = opt.gains[j];
        if (!(g >= 0.0 && g <= 1.0) || g > previous + 1e-9)
          return error_status(StatusCode::kInvalidArgument, "request ", i, " option ", o, ": gain ", j, " = ", g,
                              " must be in [0, 1] and not above the previous one");
        previous = g;
      }
    }
  }
  return Status::Ok();
}

// The step's state while allocating: totals that the cost model needs, and the predicted
// seconds kept up to date as drafts are taken (one draft forward changes per draft).
class StepState {
 public:
  StepState(Span<const SpecRequest> requests, const StepCostModel& cost, const std::vector<int32_t>& option,
            int32_t prepaid_depth)
      : requests_(requests), cost_(cost), option_(option), prepaid_(prepaid_depth), k_(requests.size(), 0),
        draft_tokens_(static_cast<std::size_t>(std::max(1, prepaid_depth)) + 1, 0) {
    for (const SpecRequest& r : requests) {
      target_tokens_ += r.base_tokens;
      tokens_ += 1.0;
    }
    target_seconds_ = cost_.target->predict(target_tokens_);
    for (std::size_t j = 1; j < draft_tokens_.size(); ++j) draft_seconds_ += draft_cost(j, draft_tokens_[j]);
    next_target_ = cost_.target->predict(target_tokens_ + 1);
  }

  double tokens() const { return tokens_; }
  double seconds() const {
    return std::max(cost_.fixed_seconds + target_seconds_ + draft_seconds_ + host_seconds_, kTiny);
  }
  int32_t k(std::size_t i) const { return k_[i]; }
  const std::vector<int32_t>& ks() const { return k_; }

  // Gain and added seconds of request i's next draft, or false if it can take no more.
  bool next(std::size_t i, double* gain, double* delta) const {
    const SpecOption* opt = option_of(requests_[i], option_[i]);
    const auto k = static_cast<std::size_t>(k_[i]);
    if (opt == nullptr || k >= opt->gains.size()) return false;
    if (opt->uses_draft_model && static_cast<int32_t>(k) + 1 > prepaid_) return false;
    if (cost_.max_target_tokens > 0 && target_tokens_ + 1 > cost_.max_target_tokens) return false;
    *gain = opt->gains[k];
    double d = next_target_ - target_seconds_ + host_cost(k);
    if (opt->uses_draft_model) {
      const std::size_t j = k + 1;
      d += draft_cost(j, draft_tokens_[j] + draft_forward_tokens(*opt, j)) - draft_cost(j, draft_tokens_[j]);
    }
    *delta = std::max(d, 0.0);
    return true;
  }

  void take(std::size_t i, double gain) {
    const SpecOption* opt = option_of(requests_[i], option_[i]);
    const std::size_t j = static_cast<std::size_t>(k_[i]) + 1;
    if (opt->uses_draft_model) {
      const double before = draft_cost(j, draft_tokens_[j]);
      draft_tokens_[j] += draft_forward_tokens(*opt, j);
      draft_seconds_ += draft_cost(j, draft_tokens_[j]) - before;
    }
    ++target_tokens_;
    target_seconds_ = next_target_;
    next_target_ = cost_.target->predict(target_tokens_ + 1);
    host_seconds_ += host_cost(static_cast<std::size_t>(k_[i]));
    tokens_ += gain;
    ++k_[i];
  }

 private:
  // Draft forward j's predicted time; forwards within the prepaid depth are charged even
  // when empty (their fixed cost is what the outer search over depths decides about).
  double draft_cost(std::size_t j, int64_t tokens) const {
    if (cost_.draft == nullptr) return 0.0;
    const double per_forward = cost_.host.per_draft_forward;
    if (static_cast<int32_t>(j) <= prepaid_) return cost_.draft->predict(std::max<int64_t>(tokens, 1)) + per_forward;
    return tokens > 0 ? cost_.draft->predict(tokens) + per_forward : 0.0;
  }
  // Host seconds of a request's draft number k + 1 (its first one also makes it a drafting
  // request).
  double host_cost(std::size_t k) const {
    return cost_.host.per_draft_token + (k == 0 ? cost_.host.per_drafting_request : 0.0);
  }

  Span<const SpecRequest> requests_;
  const StepCostModel& cost_;
  const std::vector<int32_t>& option_;
  int32_t prepaid_;
  std::vector<int32_t> k_;
  std::vector<int64_t> draft_tokens_;  // [prepaid + 1] tokens of draft forward j (index 0 unused)
  int64_t target_tokens_ = 0;
  double tokens_ = 0;
  double target_seconds_ = 0;  // target.predict(target_tokens_)
  double next_target_ = 0;     // target.predict(target_tokens_ + 1)
  double draft_seconds_ = 0;   // sum of draft_cost over the forwards
  double host_seconds_ = 0;    // host time of the drafts taken (host_cost)
};

// The totals of an allocation with fixed options (expected tokens, verified tokens, drafted
// tokens, tokens of each draft forward). evaluate_allocation reads them; polish, which tries
// O(n^2) moves per round, finds the value of changing one or two requests' k by one from
// them with O(draft depth) cached predictions instead of re-evaluating every request.
class AllocationTotals {
 public:
  struct Change {
    std::size_t request = 0;
    int32_t delta = 0;  // drafts added (> 0) or removed (< 0)
  };

  // `k` must be allowed by `option` (0 <= k <= its gains; 0 without an option).
  AllocationTotals(Span<const SpecRequest> requests, const StepCostModel& cost, Span<const int32_t> option,
                   Span<const int32_t> k)
      : requests_(requests), cost_(cost), option_(option), k_(k) {
    std::size_t depth = 1;
    for (std::size_t i = 0; i < requests.size(); ++i)
      if (const SpecOption* opt = option_of(requests[i], option[i])) depth = std::max(depth, opt->gains.size());
    draft_.assign(depth + 1, 0);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      tokens_ += 1.0;
      base_ += requests[i].base_tokens;
      verified_ += requests[i].base_tokens + k[i];
      drafted_ += k[i];
      drafting_ += k[i] > 0 ? 1 : 0;
      const SpecOption* opt = option_of(requests[i], option[i]);
      for (int32_t j = 0; j < k[i]; ++j) tokens_ += opt->gains[static_cast<std::size_t>(j)];
      if (opt != nullptr && opt->uses_draft_model)
        for (int32_t j = 1; j <= k[i]; ++j) draft_[static_cast<std::size_t>(j)] += draft_forward_tokens(*opt, static_cast<std::size_t>(j));
    }
  }

  // Whether `changes` (to different requests) give an allocation polish may take: k within
  // [0, gains], a last draft with some gain, and no more verified tokens than the limit
  // while drafting.
  bool allows(std::initializer_list<Change> changes) const {
    int64_t verified = verified_, drafted = drafted_;
    for (const Change& c : changes) {
      const SpecOption* opt = option_of(requests_[c.request], option_[c.request]);
      const int32_t k = k_[c.request] + c.delta;
      const int32_t cap = opt ? static_cast<int32_t>(opt->gains.size()) : 0;
      if (k < 0 || k > cap || (k > 0 && opt->gains[static_cast<std::size_t>(k - 1)] <= 0)) return false;
      verified += c.delta;
      drafted += c.delta;
    }
    return !(cost_.max_target_tokens > 0 && drafted > 0 && verified > cost_.max_target_tokens);
  }

  // Expected tokens and seconds after `changes` (allowed ones; none: the allocation itself).
  void totals_after(std::initializer_list<Change> changes, double* tokens, double* seconds) {
    double e = tokens_;
    int64_t verified = verified_, drafting = drafting_;
    touched_.clear();
    for (const Change& c : changes) {
      const SpecOption* opt = option_of(requests_[c.request], option_[c.request]);
      const int32_t k = k_[c.request], after = k + c.delta;
      const int32_t sign = c.delta > 0 ? 1 : -1;
      // The drafts added or removed: numbers (min(k, after), max(k, after)], 1-based.
      for (int32_t d = std::min(k, after) + 1; d <= std::max(k, after); ++d) {
        const auto j = static_cast<std::size_t>(d);
        e += sign * opt->gains[j - 1];
        if (opt->uses_draft_model) touched_.push_back({j, sign * draft_forward_tokens(*opt, j)});
      }
      verified += c.delta;
      drafting += (after > 0 ? 1 : 0) - (k > 0 ? 1 : 0);
    }
    for (const auto& [j, d] : touched_) draft_[j] += d;
    const HostCosts& host = cost_.host;
    double s = cost_.fixed_seconds + cost_.target->predict(verified) +
               host.per_drafting_request * static_cast<double>(drafting) +
               host.per_draft_token * static_cast<double>(verified - base_);
    if (cost_.draft != nullptr)
      for (std::size_t j = 1; j < draft_.size(); ++j)
        if (draft_[j] > 0) s += cost_.draft->predict(draft_[j]) + host.per_draft_forward;
    for (const auto& [j, d] : touched_) draft_[j] -= d;
    *tokens = e;
    *seconds = std::max(s, kTiny);
  }

 private:
  Span<const SpecRequest> requests_;
  const StepCostModel& cost_;
  Span<const int32_t> option_;
  Span<const int32_t> k_;
  double tokens_ = 0;
  int64_t base_ = 0, verified_ = 0, drafted_ = 0, drafting_ = 0;  // drafting_: requests with k > 0
  std::vector<int64_t> draft_;  // [depth + 1] tokens of draft forward j (index 0 unused)
  std::vector<std::pair<std::size_t, int64_t>> touched_;
};

// Greedy allocation at prepaid draft depth K; returns the ks: the best prefix of the greedy
// order, looking a draft per request plus a chain past the last improvement (rules in the
// header: measured curves are not convex, so a draft that does not pay alone can be followed
// by nearly free ones).
std::vector<int32_t> allocate(Span<const SpecRequest> requests, const StepCostModel& cost,
                              const std::vector<int32_t>& option, int32_t depth) {
  StepState state(requests, cost, option, depth);
  using Entry = std::pair<double, std::size_t>;  // (gain per second, request)
  std::priority_queue<Entry> heap;
  auto ratio = [](double g, double d) { return d > kTiny ? g / d : g / kTiny; };
  // A request's first draft also pays its host time as a drafting request (h): it is ranked
  // by the best average ratio of its first m drafts, (g_1 + ... + g_m) / (d + (m - 1)(d - h)),
  // so a chain that pays only as a whole is not ranked by its first draft alone. With h = 0
  // that is g_1 / d (gains never increase): the plain order.
  const double h = cost.host.per_drafting_request;
  auto priority = [&](std::size_t i, double g, double d) {
    const SpecOption* opt = option_of(requests[i], option[i]);
    if (h <= 0 || state.k(i) != 0 || opt == nullptr) return ratio(g, d);
    const double next = std::max(0.0, d - h);
    double best = ratio(g, d), sum = 0;
    for (std::size_t m = 1; m <= opt->gains.size(); ++m) {
      sum += opt->gains[m - 1];
      best = std::max(best, ratio(sum, d + static_cast<double>(m - 1) * next));
    }
    return best;
  };
  for (std::size_t i = 0; i < requests.size(); ++i) {
    double g = 0, d = 0;
    if (state.next(i, &g, &d) && g > 0) heap.push({priority(i, g, d), i});
  }
  std::size_t deepest = 1;
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (const SpecOption* opt = option_of(requests[i], option[i])) deepest = std::max(deepest, opt->gains.size());
  const std::size_t window = requests.size() + deepest;  // a draft for every request, or a chain
  std::vector<std::size_t> taken;  // requests in the order their drafts were taken
  std::size_t best_taken = 0;
  double best = objective(cost, state.tokens(), state.seconds());
  while (!heap.empty() && taken.size() < best_taken + window) {
    const auto [r, i] = heap.top();
    heap.pop();
    double g = 0, d = 0;
    if (!state.next(i, &g, &d) || g <= 0) continue;
    const double now = priority(i, g, d);
    if (now < r * (1 - 1e-12)) {  // stale: its cost grew since it was pushed
      heap.push({now, i});
      continue;
    }
    state.take(i, g);
    taken.push_back(i);
    const double value = objective(cost, state.tokens(), state.seconds());
    if (value > best + 1e-12 * std::abs(best)) {
      best = value;
      best_taken = taken.size();
    }
    if (state.next(i, &g, &d) && g > 0) heap.push({ratio(g, d), i});
  }
  std::vector<int32_t> k(requests.size(), 0);
  for (std::size_t t = 0; t < best_taken; ++t) ++k[taken[t]];
  return k;
}

}  // namespace

Status evaluate_allocation(Span<const SpecRequest> requests, const StepCostModel& cost, Span<const int32_t> k,
                           Span<const int32_t> option, double* tokens, double* seconds) {
  if (k.size() != requests.size() || option.size() != requests.size())
    return error_status(StatusCode::kInvalidArgument, "evaluate_allocation: sizes differ");
  if (cost.target == nullptr) return error_status(StatusCode::kInvalidArgument, "no target cost model");
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (k[i] == 0) continue;
    const SpecOption* opt = option_of(requests[i], option[i]);
    if (opt == nullptr || k[i] < 0 || static_cast<std::size_t>(k[i]) > opt->gains.size())
      return error_status(StatusCode::kInvalidArgument, "request ", i, ": k ", k[i], " is not allowed by its option");
  }
  AllocationTotals(requests, cost, option, k).totals_after({}, tokens, seconds);
  return Status::Ok();
}

namespace {

// Option per request by net value sum_j max(0, g_j - lambda c_j) at goodput lambda, where a
// draft-model option also pays its share of the draft forwards' fixed cost (split over
// `draft_users` requests). allow_draft = false keeps every request off the draft model.
std::vector<int32_t> choose_options(Span<const SpecRequest> requests, const StepCostModel& cost, double lambda,
                                    int32_t draft_users, bool allow_draft) {
  int64_t base = 0;
  for (const SpecRequest& r : requests) base += r.base_tokens;
  const double target_token = std::max(0.0, cost.target->predict(base + 1) - cost.target->predict(base));
  const double draft_token = cost.draft ? std::max(0.0, cost.draft->predict(2) - cost.draft->predict(1)) : 0.0;
  const double draft_fixed =
      cost.draft ? std::max(0.0, cost.draft->predict(1) - draft_token) + cost.host.per_draft_forward : 0.0;
  std::vector<int32_t> option(requests.size(), -1);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    double best = -1;
    for (std::size_t o = 0; o < requests[i].options.size(); ++o) {
      const SpecOption& opt = requests[i].options[o];
      if (opt.uses_draft_model && !allow_draft) continue;
      const double c = target_token + cost.host.per_draft_token + (opt.uses_draft_model ? draft_token : 0.0);
      double value = 0;
      int32_t useful = 0;
      for (double g : opt.gains) {
        if (g - lambda * c <= 0) break;
        value += g - lambda * c;
        ++useful;
      }
      if (opt.uses_draft_model) value -= lambda * draft_fixed * useful / std::max(1, draft_users);
      if (useful > 0) value -= lambda * cost.host.per_drafting_request;
      if (value > best) {
        best = value;
        option[i] = static_cast<int32_t>(o);
      }
    }
  }
  return option;
}

int32_t count_draft_users(Span<const SpecRequest> requests, const std::vector<int32_t>& option) {
  int32_t n = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const SpecOption* opt = option_of(requests[i], option[i]);
    n += (opt && opt->uses_draft_model) ? 1 : 0;
  }
  return n;
}

// An upper bound on the objective of any allocation with fixed options in which some
// request drafts `depth` tokens with the draft model (depth 0: none drafts with it). With m
// drafts in all, the tokens are at most 1 per request plus the m largest allowed gains, and
// the seconds at least the fixed cost, the target verifying base + m tokens, and `depth`
// draft forwards of which one processes at least ceil(m_draft / depth) tokens (predict is
// non-decreasing): every draft-model draft is processed by one of the depth forwards.
class DepthBound {
 public:
  DepthBound(Span<const SpecRequest> requests, const StepCostModel& cost, const std::vector<int32_t>& option)
      : cost_(cost) {
    for (std::size_t i = 0; i < requests.size(); ++i) {
      base_ += requests[i].base_tokens;
      const SpecOption* opt = option_of(requests[i], option[i]);
      if (opt == nullptr) continue;
      longest_ = std::max<int64_t>(longest_, static_cast<int64_t>(opt->gains.size()));
      for (std::size_t j = 0; j < opt->gains.size(); ++j)
        if (opt->gains[j] > 0) gains_.push_back({opt->gains[j], opt->uses_draft_model ? static_cast<int32_t>(j + 1) : 0});
    }
    std::sort(gains_.begin(), gains_.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    tokens_ = static_cast<double>(requests.size());
  }

  double objective_at_most(int32_t depth) const {
    int64_t limit = static_cast<int64_t>(gains_.size());
    if (cost_.max_target_tokens > 0) limit = std::min<int64_t>(limit, std::max<int64_t>(0, cost_.max_target_tokens - base_));
    const double prepaid = depth > 0 && cost_.draft != nullptr ? (depth - 1) * cost_.draft->predict(1) : 0.0;
    double tokens = tokens_;
    int64_t m = 0, drafted_with_model = 0;
    double best = bound(tokens, m, depth, prepaid, drafted_with_model);
    for (const auto& [g, j] : gains_) {
      if (m >= limit) break;
      if (j > depth) continue;  // deeper than the draft loop runs
      tokens += g;
      ++m;
      drafted_with_model += j > 0 ? 1 : 0;
      best = std::max(best, bound(tokens, m, depth, prepaid, drafted_with_model));
    }
    return best;
  }

 private:
  double bound(double tokens, int64_t m, int32_t depth, double prepaid, int64_t drafted_with_model) const {
    // Host time: m draft tokens come from at least ceil(m / longest) drafting requests.
    const HostCosts& host = cost_.host;
    double seconds = cost_.fixed_seconds + cost_.target->predict(base_ + m) + prepaid +
                     host.per_draft_token * static_cast<double>(m) +
                     (m > 0 ? host.per_drafting_request * static_cast<double>((m + longest_ - 1) / longest_) : 0.0);
    if (depth > 0 && cost_.draft != nullptr)
      seconds += cost_.draft->predict(std::max<int64_t>(1, (drafted_with_model + depth - 1) / depth)) +
                 host.per_draft_forward * depth;
    return objective(cost_, tokens, std::max(seconds, kTiny));
  }

  const StepCostModel& cost_;
  int64_t base_ = 0;
  int64_t longest_ = 1;  // the most drafts one request may take
  double tokens_ = 0;
  std::vector<std::pair<double, int32_t>> gains_;  // (gain, its draft forward; 0: no draft model), by gain
};

// The best allocation for fixed options: the greedy allocation at every draft depth whose
// bound (DepthBound) can beat the best so far.
Status best_for_options(Span<const SpecRequest> requests, const StepCostModel& cost, const std::vector<int32_t>& option,
                        Allocation* best) {
  int32_t max_depth = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const SpecOption* opt = option_of(requests[i], option[i]);
    if (opt && opt->uses_draft_model) max_depth = std::max(max_depth, static_cast<int32_t>(opt->gains.size()));
  }
  const DepthBound bound(requests, cost, option);
  for (int32_t depth = 0; depth <= max_depth; ++depth) {
    if (!(bound.objective_at_most(depth) > best->objective + 1e-12 * std::abs(best->objective))) continue;
    std::vector<int32_t> k = allocate(requests, cost, option, depth);
    double tokens = 0, seconds = 0;
    SPECD_RETURN_IF_ERROR(evaluate_allocation(requests, cost, k, option, &tokens, &seconds));
    const double value = objective(cost, tokens, seconds);
    if (value > best->objective + 1e-12 * std::abs(best->objective)) {
      best->k = std::move(k);
      best->option = option;
      best->objective = value;
      best->goodput = tokens / seconds;
      best->expected_tokens = tokens;
      best->expected_seconds = seconds;
    }
  }
  return Status::Ok();
}

// Steps of up to this many requests get their allocation polished by local search.
constexpr std::size_t kPolishLimit = 16;

// Hill climbing from `best` over single moves (a request's k set to any other value it
// allows, or one draft moved from one request to another) with the options fixed, taking the
// best improving move until none improves. The greedy's prefix is exact for linear costs; on
// measured non-convex curves the best set is not always a prefix of its order (a deep
// chain for one request can beat a draft each for two).
Status polish(Span<const SpecRequest> requests, const StepCostModel& cost, Allocation* best) {
  const std::size_t n = requests.size();
  for (int round = 0; round < 64; ++round) {
    AllocationTotals totals(requests, cost, best->option, best->k);
    double best_value = best->objective;
    // The best move: from == to: request from's k set to set_to; else one draft moved from
    // `from` to `to`; from == n: none.
    std::size_t from = n, to = n;
    int32_t set_to = 0;
    auto consider = [&](std::initializer_list<AllocationTotals::Change> changes, std::size_t f, std::size_t t,
                        int32_t k) {
      if (!totals.allows(changes)) return;
      double tokens = 0, seconds = 0;
      totals.totals_after(changes, &tokens, &seconds);
      const double value = objective(cost, tokens, seconds);
      if (value > best_value + 1e-12 * std::abs(best_value)) {
        best_value = value;
        from = f;
        to = t;
        set_to = k;
      }
    };
    for (std::size_t i = 0; i < n; ++i) {
      // Request i's k set to any other value (one draft more or fewer among them): a
      // drafting request's host time is paid once, so dropping or starting a whole chain
      // can pay where no single draft does.
      const SpecOption* opt = option_of(requests[i], best->option[i]);
      const int32_t cap = opt ? static_cast<int32_t>(opt->gains.size()) : 0;
      for (int32_t k = 0; k <= cap; ++k)
        if (k != best->k[i]) consider({{i, k - best->k[i]}}, i, i, k);
      for (std::size_t j = 0; j < n; ++j)
        if (j != i) consider({{i, -1}, {j, 1}}, i, j, 0);
    }
    if (from == n) break;
    if (from == to) {
      best->k[from] = set_to;
    } else {
      --best->k[from];
      ++best->k[to];
    }
    double tokens = 0, seconds = 0;
    SPECD_RETURN_IF_ERROR(evaluate_allocation(requests, cost, best->k, best->option, &tokens, &seconds));
    best->objective = objective(cost, tokens, seconds);
    best->goodput = tokens / seconds;
    best->expected_tokens = tokens;
    best->expected_seconds = seconds;
  }
  return Status::Ok();
}

// Requests * options up to this size also get a coordinate search over options.
constexpr std::size_t kLocalSearchLimit = 64;

}  // namespace

Status optimize_goodput(Span<const SpecRequest> requests, const StepCostModel& cost, Allocation* out) {
  SPECD_RETURN_IF_ERROR(validate(requests, cost));
  const std::size_t n = requests.size();
  out->k.assign(n, 0);
  out->option.assign(n, -1);
  out->draft_depth = 0;
  double tokens = 0, seconds = 0;
  SPECD_RETURN_IF_ERROR(evaluate_allocation(requests, cost, out->k, out->option, &tokens, &seconds));
  out->expected_tokens = tokens;
  out->expected_seconds = seconds;
  out->plain_goodput = out->goodput = tokens / seconds;
  out->objective = objective(cost, tokens, seconds);
  if (n == 0 || !cost.target->has_data()) return Status::Ok();  // no costs yet: measure plain first

  // Options: candidates from the net-value rule (with and without the draft model, and
  // again at the goodput found), each allocated exactly; small steps also search options
  // one request at a time.
  const double lambda = cost.reference_goodput > 0 ? cost.reference_goodput : out->plain_goodput;
  // An option vector allocated once cannot improve `out` a second time (each of its depths
  // was compared against a best that has only grown since, and `v > b + 1e-12 |b|` is
  // monotone in b), so repeats are skipped: the same answer for less work.
  std::vector<std::vector<int32_t>> tried;
  auto try_options = [&](const std::vector<int32_t>& option) -> Status {
    if (std::find(tried.begin(), tried.end(), option) != tried.end()) return Status::Ok();
    tried.push_back(option);
    return best_for_options(requests, cost, option, out);
  };
  const std::vector<int32_t> first = choose_options(requests, cost, lambda, 1 << 30, true);
  const int32_t users = count_draft_users(requests, first);
  for (const auto& option : {first, choose_options(requests, cost, lambda, users, true),
                             choose_options(requests, cost, lambda, users, false)})
    SPECD_RETURN_IF_ERROR(try_options(option));
  const std::vector<int32_t> refined =
      choose_options(requests, cost, cost.reference_goodput > 0 ? cost.reference_goodput : out->goodput,
                     count_draft_users(requests, out->option), true);
  SPECD_RETURN_IF_ERROR(try_options(refined));
  std::size_t total_options = 0;
  for (const SpecRequest& r : requests) total_options += r.options.size();
  if (total_options <= kLocalSearchLimit) {
    for (bool improved = true; improved;) {
      improved = false;
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t o = 0; o < requests[i].options.size(); ++o) {
          if (out->option[i] == static_cast<int32_t>(o)) continue;
          std::vector<int32_t> option = out->option;
          option[i] = static_cast<int32_t>(o);
          const double before = out->objective;
          SPECD_RETURN_IF_ERROR(try_options(option));
          improved = improved || out->objective > before;
        }
      }
    }
  }
  if (n <= kPolishLimit) SPECD_RETURN_IF_ERROR(polish(requests, cost, out));
  out->draft_depth = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const SpecOption* opt = option_of(requests[i], out->option[i]);
    if (opt && opt->uses_draft_model) out->draft_depth = std::max(out->draft_depth, out->k[i]);
  }
  return Status::Ok();
}

}  // namespace specd
