#include "specd/cost_model.h"

#include <algorithm>
#include <cmath>

namespace specd {

namespace {
// Lower edges of the grid: every count up to 8, then four buckets per octave
// (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...).
int64_t edge(std::size_t i) {
  if (i < 8) return static_cast<int64_t>(i) + 1;
  const int64_t base = int64_t{8} << ((i - 8) / 4);
  return base + static_cast<int64_t>((i - 8) % 4) * (base / 4);
}
}  // namespace

CostModel::CostModel(const CostModelConfig& config) : config_(config) {
  std::size_t n = 0;
  while (edge(n) <= config_.max_tokens) ++n;
  buckets_.resize(n + 1);
}

std::size_t CostModel::bucket_of(int64_t tokens) {
  std::size_t i = 0;
  while (edge(i + 1) <= tokens) ++i;
  return i;
}

Status CostModel::observe(int64_t tokens, double seconds) {
  if (tokens < 1 || tokens > config_.max_tokens)
    return error_status(StatusCode::kInvalidArgument, "cost sample of ", tokens, " tokens is outside [1, ",
                        config_.max_tokens, "]");
  if (!std::isfinite(seconds) || seconds < 0)
    return error_status(StatusCode::kInvalidArgument, "cost sample of ", seconds, " seconds is not a duration");
  Bucket& b = buckets_[std::min(bucket_of(tokens), buckets_.size() - 1)];
  const double keep = b.weight > 0 ? config_.decay : 0.0;
  b.tokens = keep * b.tokens + (1 - keep) * static_cast<double>(tokens);
  b.seconds = keep * b.seconds + (1 - keep) * seconds;
  b.weight = keep * b.weight + 1;
  const double x = static_cast<double>(tokens), d = config_.line_decay;
  sw_ = d * sw_ + 1;
  sx_ = d * sx_ + x;
  sy_ = d * sy_ + seconds;
  sxx_ = d * sxx_ + x * x;
  sxy_ = d * sxy_ + x * seconds;
  ++samples_;
  refit();
  return Status::Ok();
}

void CostModel::refit() {
  // Pool adjacent violators over the buckets with data, weighted by their weights.
  struct Block {
    double weight, sum;
    std::size_t count;
  };
  std::vector<Block> blocks;
  std::vector<Bucket*> used;
  for (Bucket& b : buckets_) {
    if (b.weight <= 0) continue;
    used.push_back(&b);
    blocks.push_back({b.weight, b.weight * b.seconds, 1});
    while (blocks.size() > 1) {
      const Block& hi = blocks.back();
      const Block& lo = blocks[blocks.size() - 2];
      if (lo.sum / lo.weight <= hi.sum / hi.weight) break;
      const Block merged{lo.weight + hi.weight, lo.sum + hi.sum, lo.count + hi.count};
      blocks.pop_back();
      blocks.back() = merged;
    }
  }
  std::size_t at = 0;
  for (const Block& block : blocks)
    for (std::size_t j = 0; j < block.count; ++j) used[at++]->fitted = block.sum / block.weight;
  points_.clear();
  for (const Bucket* b : used) points_.push_back({b->tokens, b->fitted});
  memo_.clear();
}

int64_t CostModel::explored_limit(int64_t tokens) const {
  const int64_t from = std::clamp<int64_t>(tokens, 1, config_.max_tokens);
  // Climb from `from` (the step about to run measures it) through measured buckets, each at
  // most twice the count reached so far; the limit is twice the count reached.
  double reached = static_cast<double>(from);
  for (std::size_t b = std::min(bucket_of(from), buckets_.size() - 1) + 1; b < buckets_.size(); ++b) {
    if (buckets_[b].weight <= 0) continue;
    if (static_cast<double>(edge(b)) > 2.0 * reached) break;  // its smallest count: a mean may sit higher
    reached = std::max(reached, buckets_[b].tokens);
  }
  const double limit = std::floor(2.0 * reached);
  return limit >= static_cast<double>(config_.max_tokens) ? config_.max_tokens : std::max(from, static_cast<int64_t>(limit));
}

std::vector<std::pair<double, double>> CostModel::measured() const {
  std::vector<std::pair<double, double>> out;
  for (const Bucket& b : buckets_)
    if (b.weight > 0) out.emplace_back(b.tokens, b.seconds);
  return out;
}

CostModel CostModel::shaped_like(const CostModel& shape) const {
  const auto own = measured();
  if (own.size() != 1 || !shape.has_data()) return *this;
  const double at = shape.predict(static_cast<int64_t>(std::llround(own[0].first)));
  if (!(at > 0)) return *this;
  const double ratio = own[0].second / at;
  CostModel scaled(config_);
  for (const auto& [tokens, seconds] : shape.measured())
    (void)scaled.observe(std::clamp<int64_t>(std::llround(tokens), 1, config_.max_tokens), seconds * ratio);
  (void)scaled.observe(std::clamp<int64_t>(std::llround(own[0].first), 1, config_.max_tokens), own[0].second);
  return scaled;
}

double CostModel::slope() const {
  const double var = sxx_ * sw_ - sx_ * sx_;
  if (sw_ <= 0 || var <= 1e-12 * std::max(1.0, sxx_ * sw_)) return 0.0;
  return std::max(0.0, (sxy_ * sw_ - sx_ * sy_) / var);
}

double CostModel::intercept() const { return sw_ > 0 ? (sy_ - slope() * sx_) / sw_ : 0.0; }

double CostModel::predict_and_memoize(int64_t tokens) const {
  if (!has_data()) return 0.0;
  const int64_t t = std::max<int64_t>(tokens, 1);
  if (t >= kMemoTokens) return interpolate(static_cast<double>(t));
  if (memo_.empty()) memo_.assign(static_cast<std::size_t>(kMemoTokens), std::nan(""));
  double& m = memo_[static_cast<std::size_t>(t)];
  if (std::isnan(m)) m = interpolate(static_cast<double>(t));
  return m;
}

double CostModel::interpolate(double x) const {
  // The buckets' means increase with their index (disjoint ranges), so one binary search
  // finds the last point at or below x and the first two above it. The controller calls
  // this thousands of times per step.
  const auto first_above = std::upper_bound(points_.begin(), points_.end(), x,
                                            [](double v, const Point& p) { return v < p.tokens; });
  const Point* below = first_above == points_.begin() ? nullptr : &*(first_above - 1);
  const Point* above = first_above == points_.end() ? nullptr : &*first_above;
  const Point* second = (above && first_above + 1 != points_.end()) ? &*(first_above + 1) : nullptr;
  if (below && above) {
    const double t = (x - below->tokens) / (above->tokens - below->tokens);
    return below->fitted + t * (above->fitted - below->fitted);
  }
  if (above) {  // below the smallest bucket: the slope of the two smallest (flat with one)
    const double local =
        second ? std::max(0.0, (second->fitted - above->fitted) / (second->tokens - above->tokens)) : 0.0;
    return std::max(0.0, above->fitted - local * (above->tokens - x));
  }
  return below->fitted + slope() * (x - below->tokens);  // beyond the largest bucket
}

}  // namespace specd
