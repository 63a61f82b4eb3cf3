// CostModel: the time of one forward pass as a function of how many tokens it processes,
// learned online from measured (tokens, seconds) samples, for the speculation controller.
//
// Model
// - Token counts fall into buckets: one per count up to 8, then four per octave (8, 10, 12,
//   14, 16, 20, 24, ...).
//   Each bucket keeps an exponentially weighted average of its samples' token counts and
//   times; predictions interpolate linearly between the nearest buckets with data. This
//   follows flat-then-linear GPU profiles (memory-bound up to a compute knee) as well as the
//   steeper CPU ones, with no shape assumed.
// - Beyond the largest bucket with data, the prediction extrapolates with the slope of an
//   exponentially weighted least-squares line over all samples (never negative). Below the
//   smallest, it extrapolates with the slope between the two smallest buckets (flat with
//   one bucket; never negative, never below 0 seconds).
// - Monotone: a forward over fewer tokens can always be padded to more, so the true time
//   never decreases with the token count. Bucket averages that say otherwise (noise: a
//   2-core CPU measured T(3) = 1.05 s and T(4) = 0.94 s in one load run, which priced a
//   3-request draft step higher than a 4-request one) are pooled before interpolating: the
//   weighted isotonic (pool-adjacent-violators) fit of the averages, refitted at each
//   sample. predict() is therefore non-decreasing in tokens.
// - The local slope below the data matters: a
//   controller that has only seen large forwards must neither believe that a plain decoding
//   step costs as much as they did on a compute-bound machine (CPU), nor that it is far
//   cheaper on a memory-bound one (GPU, flat below a knee).
// - Before the first sample, predict() returns 0 and has_data() is false.
// - Exploration (explored_limit): interpolation is a guess wherever no sample fell, and on
//   some machines a wrong one (a CPU forward of 2 tokens can cost twice one of 1, although
//   one of 1 and one of 100 put a line far below that). A controller should therefore bet
//   at most a factor 2 beyond what it has measured: explored_limit(n) is the largest count
//   it may plan for a step that processes at least n tokens. Starting at n (the step about
//   to run measures it), it climbs through measured buckets while each one's smallest count
//   is at most twice the count reached so far (reaching the bucket's mean count); the limit
//   is twice the count reached. Steps thus grow
//   geometrically into unmeasured sizes (1, 2, 4, 8, ... on a fresh model), each size being
//   measured before the next doubling, and a batch of n can always give every request one
//   draft token (a one-size-at-a-time rule could trap a controller whose smallest bet does
//   not pay for the draft's fixed cost while a larger one would).
// - A model measured at one size only (a draft model that so far ran only a prompt's
//   catch-up) predicts that time flat for every size, which can make its single-token
//   forwards look several times too expensive. shaped_like(target) gives the controller a
//   better guess until a second size is measured: the target's curve scaled so that it
//   passes through the one measurement.
// Nothing needs tuning by a user; the decay is a fixed default.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "specd/status.h"

namespace specd {

struct CostModelConfig {
  double decay = 0.8;           // weight kept by a bucket's average at each new sample
  double line_decay = 0.98;     // weight kept by the least-squares sums at each new sample
  int64_t max_tokens = 1 << 20; // largest token count tracked
};

class CostModel {
 public:
  explicit CostModel(const CostModelConfig& config = CostModelConfig());

  Status observe(int64_t tokens, double seconds);
  // Predicted seconds of a forward of `tokens` tokens (rules above). Results for small counts
  // are memoized until the next observe (the controller asks for the same few counts
  // thousands of times per step), so, although const, calls on one object must not run
  // from several threads at once.
  double predict(int64_t tokens) const {
    if (tokens >= 1 && static_cast<std::size_t>(tokens) < memo_.size()) {
      const double m = memo_[static_cast<std::size_t>(tokens)];
      if (m == m) return m;  // memoized (NaN: not yet)
    }
    return predict_and_memoize(tokens);
  }
  // The largest token count to plan for from a step of `tokens` tokens (rules above); at
  // least `tokens`.
  int64_t explored_limit(int64_t tokens) const;
  bool has_data() const { return samples_ > 0; }
  // (mean tokens, mean seconds) of every bucket with data, by increasing size.
  std::vector<std::pair<double, double>> measured() const;
  // A model with `shape`'s curve scaled through this one's single measured size (rules
  // above); this model itself when it has two sizes or more, or when either has none.
  CostModel shaped_like(const CostModel& shape) const;
  int64_t samples() const { return samples_; }
  // The least-squares line: seconds ~ intercept + slope * tokens.
  double slope() const;
  double intercept() const;

 private:
  struct Bucket {
    double weight = 0;  // accumulated weight (0 = no data)
    double tokens = 0;  // weighted mean token count
    double seconds = 0; // weighted mean time
    double fitted = 0;  // the isotonic fit of `seconds` (rules above)
  };
  // A bucket with data as predict reads it: its mean size and fitted time.
  struct Point {
    double tokens;
    double fitted;
  };
  static constexpr int64_t kMemoTokens = 1024;  // predict memoizes counts below this
  static std::size_t bucket_of(int64_t tokens);
  double predict_and_memoize(int64_t tokens) const;
  void refit();
  double interpolate(double x) const;

  CostModelConfig config_;
  std::vector<Bucket> buckets_;
  std::vector<Point> points_;  // the buckets with data, by increasing size (refit keeps it)
  mutable std::vector<double> memo_;  // predict(t) for t < kMemoTokens, NaN = not yet; refit clears
  double sw_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // weighted sums for the line
  int64_t samples_ = 0;
};

}  // namespace specd
