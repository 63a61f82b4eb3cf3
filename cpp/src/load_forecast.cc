// Load forecast: the rules of load_forecast.h.
#include "specd/load_forecast.h"

#include <algorithm>
#include <cmath>

namespace specd {
namespace {

void average(std::optional<double>* avg, double value) {
  *avg = avg->has_value() ? LoadForecast::kDecay * **avg + (1 - LoadForecast::kDecay) * value : value;
}

}  // namespace

void LoadForecast::tick(double seconds) { clock_ += std::max(0.0, seconds); }

void LoadForecast::arrive(RequestId id, int64_t prompt_tokens, int64_t remaining_tokens) {
  if (!seen_.insert(id).second) return;
  arrivals_.push_back(clock_);
  if (arrivals_.size() > kWindow) arrivals_.pop_front();
  average(&prompt_tokens_, static_cast<double>(std::max<int64_t>(0, prompt_tokens)));
  average(&arrival_tokens_, static_cast<double>(std::clamp<int64_t>(remaining_tokens, 0, int64_t{1} << 20)));
}

void LoadForecast::finish(RequestId id, int64_t generated_tokens) {
  if (seen_.erase(id) == 0 || generated_tokens <= 0) return;
  average(&generated_tokens_, static_cast<double>(generated_tokens));
  ++finished_;
}

void LoadForecast::queue(int64_t waiting, int32_t max_batch) {
  waiting_ = std::max<int64_t>(0, waiting);
  max_batch_ = std::max(1, max_batch);
}

void LoadForecast::prefill(int64_t prompt_tokens) {
  if (prompt_tokens > 0) average(&prefill_chunk_, static_cast<double>(prompt_tokens));
}

std::optional<double> LoadForecast::rate(double step_seconds) const {
  if (arrivals_.size() < kMinArrivals) return std::nullopt;
  return static_cast<double>(arrivals_.size()) / std::max({clock_ - arrivals_.front(), step_seconds, 1e-9});
}

double LoadForecast::request_tokens() const {
  return std::max(1.0, finished_ >= kMinFinished ? *generated_tokens_ : arrival_tokens_.value_or(1.0));
}

int32_t LoadForecast::batch(int32_t current, const CostModel& target) const {
  current = std::max(current, 1);
  const int32_t limit = max_batch_ > 0 ? max_batch_ : current;
  if (waiting_ > 0) return limit;
  const std::optional<double> lambda = rate(target.predict(current));
  if (!lambda || !target.has_data()) return current;
  const double tokens = request_tokens();
  const auto prompt = static_cast<int64_t>(prompt_tokens_.value_or(0.0));
  double n = current;
  for (int iter = 0; iter < 32; ++iter) {
    const auto base = static_cast<int64_t>(std::llround(n));
    const double prefill = std::max(0.0, target.predict(base + prompt) - target.predict(base));
    const double busy = *lambda * prefill;
    if (busy >= 1.0) return limit;
    const double next = std::min<double>(limit, *lambda * tokens * target.predict(base) / (1.0 - busy));
    const bool settled = std::abs(next - n) < 0.5;
    n = next;
    if (settled) break;
  }
  return static_cast<int32_t>(std::clamp<long long>(std::llround(n), current, std::max(limit, current)));
}

}  // namespace specd
