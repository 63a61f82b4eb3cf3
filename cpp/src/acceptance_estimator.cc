#include "specd/acceptance_estimator.h"

#include <algorithm>
#include <cmath>

namespace specd {

AcceptanceEstimator::AcceptanceEstimator(const AcceptanceEstimatorConfig& config, int32_t num_proposers)
    : config_(config), num_proposers_(std::max(1, num_proposers)) {
  config_.max_depth = std::max(1, config_.max_depth);
  const auto d = static_cast<std::size_t>(config_.max_depth);
  global_.assign(static_cast<std::size_t>(num_proposers_), Counts{std::vector<double>(d, 0.0), std::vector<double>(d, 0.0), {}});
  tree_classes_.assign(static_cast<std::size_t>(num_proposers_), {});
  explored_.assign(static_cast<std::size_t>(num_proposers_), config_.exploration_trials <= 0.0);
  idle_steps_.assign(static_cast<std::size_t>(num_proposers_), 0);
  retry_gap_.assign(static_cast<std::size_t>(num_proposers_), std::max<int64_t>(1, config_.retry_idle_steps));
  retrying_.assign(static_cast<std::size_t>(num_proposers_), false);
  depth_trials_.assign(static_cast<std::size_t>(num_proposers_), std::vector<int64_t>(d, 0));
}

Status AcceptanceEstimator::check(int32_t proposer) const {
  if (proposer < 0 || proposer >= num_proposers_)
    return error_status(StatusCode::kInvalidArgument, "proposer ", proposer, " is not in [0, ", num_proposers_, ")");
  return Status::Ok();
}

void AcceptanceEstimator::add(Counts* c, int32_t depth, int32_t accepted, double decay) {
  for (std::size_t d = 0; d < c->trials.size(); ++d) {
    c->successes[d] *= decay;
    c->trials[d] *= decay;
  }
  const auto limit = static_cast<int32_t>(c->trials.size());
  for (int32_t d = 0; d < std::min(accepted, limit); ++d) {
    c->successes[static_cast<std::size_t>(d)] += 1.0;
    c->trials[static_cast<std::size_t>(d)] += 1.0;
  }
  if (accepted < depth && accepted < limit) c->trials[static_cast<std::size_t>(accepted)] += 1.0;
}

Status AcceptanceEstimator::observe(RequestId id, int32_t proposer, int32_t depth, int32_t accepted) {
  SPECD_RETURN_IF_ERROR(check(proposer));
  if (depth < 0 || accepted < 0 || accepted > depth)
    return error_status(StatusCode::kInvalidArgument, "observe: need 0 <= accepted <= depth, got accepted ", accepted,
                        " of depth ", depth);
  if (depth == 0) return Status::Ok();
  Counts& g = global_[static_cast<std::size_t>(proposer)];
  add(&g, depth, accepted, config_.global_decay);
  std::vector<int64_t>& tried = depth_trials_[static_cast<std::size_t>(proposer)];
  for (int32_t t = 0; t < std::min({accepted + 1, depth, config_.max_depth}); ++t)
    tried[static_cast<std::size_t>(t)] += 1;  // depths 1..A tested, and A+1 if A < D
  if (static_cast<double>(tried[0]) >= config_.exploration_trials) explored_[static_cast<std::size_t>(proposer)] = true;
  idle_steps_[static_cast<std::size_t>(proposer)] = 0;
  retrying_[static_cast<std::size_t>(proposer)] = false;
  add(&request_counts(id)[static_cast<std::size_t>(proposer)], depth, accepted, config_.request_decay);
  return Status::Ok();
}

std::vector<AcceptanceEstimator::Counts>& AcceptanceEstimator::request_counts(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    const auto d = static_cast<std::size_t>(config_.max_depth);
    it = requests_.emplace(id, std::vector<Counts>(static_cast<std::size_t>(num_proposers_),
                                                   Counts{std::vector<double>(d, 0.0), std::vector<double>(d, 0.0), {}}))
             .first;
  }
  return it->second;
}

int32_t AcceptanceEstimator::tree_class(double strength) {
  const double c = std::floor(std::log2(1.0 + std::max(0.0, strength)));
  return static_cast<int32_t>(std::clamp(c, 0.0, static_cast<double>(kTreeClasses - 1)));
}

Status AcceptanceEstimator::observe_tree(RequestId id, int32_t proposer, double predicted, int32_t accepted,
                                         double strength) {
  SPECD_RETURN_IF_ERROR(check(proposer));
  if (!(predicted >= 0.0) || !std::isfinite(predicted) || accepted < 0 || !(strength >= 0.0) || !std::isfinite(strength))
    return error_status(StatusCode::kInvalidArgument, "observe_tree: need finite predicted and strength >= 0 and "
                        "accepted >= 0, got ", predicted, ", ", strength, " and ", accepted);
  const auto p = static_cast<std::size_t>(proposer);
  const double expected = tree_calibration(proposer, strength) * predicted;
  request_counts(id)[p].tree.add(expected, accepted, config_.request_decay);
  tree_classes_[p][static_cast<std::size_t>(tree_class(strength))].add(predicted, accepted, config_.global_decay);
  return Status::Ok();
}

double AcceptanceEstimator::tree_calibration(int32_t proposer, double strength) const {
  if (proposer < 0 || proposer >= num_proposers_) return 1.0;
  return tree_classes_[static_cast<std::size_t>(proposer)][static_cast<std::size_t>(tree_class(strength))].ratio(
      config_.prior_strength);
}

double AcceptanceEstimator::tree_calibration(RequestId id, int32_t proposer, double strength) const {
  const double global = tree_calibration(proposer, strength);
  const auto it = requests_.find(id);
  if (it == requests_.end() || proposer < 0 || proposer >= num_proposers_) return global;
  return global * it->second[static_cast<std::size_t>(proposer)].tree.ratio(config_.prior_strength);
}

Status AcceptanceEstimator::idle(RequestId id, int32_t proposer) {
  SPECD_RETURN_IF_ERROR(check(proposer));
  const auto it = requests_.find(id);
  if (it == requests_.end()) return Status::Ok();
  Counts& c = it->second[static_cast<std::size_t>(proposer)];
  for (std::size_t d = 0; d < c.trials.size(); ++d) {
    c.successes[d] *= config_.idle_decay;
    c.trials[d] *= config_.idle_decay;
  }
  c.tree.fade(config_.idle_decay);
  return Status::Ok();
}

Status AcceptanceEstimator::idle_global(int32_t proposer, bool speculating) {
  SPECD_RETURN_IF_ERROR(check(proposer));
  const auto p = static_cast<std::size_t>(proposer);
  if (!speculating && explored_[p] && !retrying_[p] && ++idle_steps_[p] >= retry_gap_[p]) {  // a retry (header)
    retrying_[p] = true;
    idle_steps_[p] = 0;
    retry_gap_[p] *= 2;
  }
  Counts& g = global_[p];
  for (std::size_t d = 0; d < g.trials.size(); ++d) {
    if (g.successes[d] >= config_.initial_alpha * g.trials[d]) continue;  // at or above the prior: keep
    g.successes[d] *= config_.idle_decay;
    g.trials[d] *= config_.idle_decay;
  }
  for (TreeSums& c : tree_classes_[p])
    if (c.accepted < c.predicted) c.fade(config_.idle_decay);  // at or above 1, the prior: keep
  return Status::Ok();
}

double AcceptanceEstimator::global_alpha(int32_t proposer, int32_t depth, bool explore) const {
  if (proposer < 0 || proposer >= num_proposers_) return config_.initial_alpha;
  const auto p = static_cast<std::size_t>(proposer);
  const Counts& g = global_[p];
  const auto d = static_cast<std::size_t>(std::clamp(depth, 1, config_.max_depth) - 1);
  if (explore && d == 0 && (!explored_[p] || retrying_[p])) return 1.0;
  const double m = config_.prior_strength;
  const double data = (g.successes[d] + m * config_.initial_alpha) / (g.trials[d] + m);
  if (!explore || d == 0) return data;
  // Exploration one depth deeper (header): the depth above has had its trials, this one not.
  const std::vector<int64_t>& tried = depth_trials_[p];
  const double trials = config_.exploration_trials;
  if (static_cast<double>(tried[d]) >= trials || static_cast<double>(tried[d - 1]) < trials) return data;
  return std::max(data, global_alpha(proposer, depth - 1, /*explore=*/false));
}

bool AcceptanceEstimator::retrying(int32_t proposer) const {
  return proposer >= 0 && proposer < num_proposers_ && retrying_[static_cast<std::size_t>(proposer)];
}

bool AcceptanceEstimator::explored(int32_t proposer) const {
  return proposer >= 0 && proposer < num_proposers_ && explored_[static_cast<std::size_t>(proposer)];
}

Status AcceptanceEstimator::alphas(RequestId id, int32_t proposer, Span<double> out, bool explore) const {
  SPECD_RETURN_IF_ERROR(check(proposer));
  const auto it = requests_.find(id);
  const double m = config_.prior_strength;
  for (std::size_t j = 0; j < out.size(); ++j) {
    const int32_t depth = static_cast<int32_t>(j) + 1;
    const double g = global_alpha(proposer, depth, explore);
    if (it == requests_.end()) {
      out[j] = g;
      continue;
    }
    const Counts& c = it->second[static_cast<std::size_t>(proposer)];
    const auto d = static_cast<std::size_t>(std::min(depth, config_.max_depth) - 1);
    out[j] = (c.successes[d] + m * g) / (c.trials[d] + m);
  }
  return Status::Ok();
}

}  // namespace specd
