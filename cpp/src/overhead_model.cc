// OverheadModel: the weighted least-squares fit with non-negative coefficients described in
// overhead_model.h.
#include "specd/overhead_model.h"

#include <cmath>
#include <limits>

namespace specd {
namespace {

constexpr int kN = OverheadModel::kFeatures;
constexpr double kNegligibleSeconds = 1e-9;  // per item (refit)

OverheadModel::Coefficients features(const StepShape& s) {
  return {1.0, static_cast<double>(s.requests), static_cast<double>(s.drafting_requests),
          static_cast<double>(s.draft_tokens), static_cast<double>(s.draft_forwards)};
}

// Solves a x = b for the features in `mask` (Gaussian elimination with partial pivoting on
// the sub-system); false when it is singular.
bool solve_subset(const std::array<std::array<double, kN>, kN>& a, const OverheadModel::Coefficients& b,
                  unsigned mask, OverheadModel::Coefficients* x) {
  int idx[kN];
  int m = 0;
  for (int j = 0; j < kN; ++j)
    if (mask & (1u << j)) idx[m++] = j;
  double sys[kN][kN + 1];
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < m; ++c) sys[r][c] = a[static_cast<std::size_t>(idx[r])][static_cast<std::size_t>(idx[c])];
    sys[r][m] = b[static_cast<std::size_t>(idx[r])];
  }
  for (int c = 0; c < m; ++c) {
    int pivot = c;
    for (int r = c + 1; r < m; ++r)
      if (std::abs(sys[r][c]) > std::abs(sys[pivot][c])) pivot = r;
    if (!(std::abs(sys[pivot][c]) > 0.0)) return false;
    if (pivot != c)
      for (int k = 0; k <= m; ++k) std::swap(sys[c][k], sys[pivot][k]);
    for (int r = 0; r < m; ++r) {
      if (r == c) continue;
      const double f = sys[r][c] / sys[c][c];
      for (int k = c; k <= m; ++k) sys[r][k] -= f * sys[c][k];
    }
  }
  x->fill(0.0);
  for (int r = 0; r < m; ++r) (*x)[static_cast<std::size_t>(idx[r])] = sys[r][m] / sys[r][r];
  return true;
}

}  // namespace

OverheadModel::OverheadModel(const OverheadModelConfig& config) : config_(config) {}

Status OverheadModel::observe(const StepShape& shape, double seconds) {
  if (shape.requests < 0 || shape.drafting_requests < 0 || shape.draft_tokens < 0 || shape.draft_forwards < 0)
    return error_status(StatusCode::kInvalidArgument, "OverheadModel::observe: step shape counts must be >= 0, got ",
                        shape.requests, " requests, ", shape.drafting_requests, " drafting, ", shape.draft_tokens,
                        " draft tokens, ", shape.draft_forwards, " draft forwards");
  if (!(seconds >= 0.0) || !std::isfinite(seconds))
    return error_status(StatusCode::kInvalidArgument, "OverheadModel::observe: seconds must be finite and >= 0, got ",
                        seconds);
  const Coefficients x = features(shape);
  const double keep = samples_ > 0 ? config_.decay : 0.0;
  for (std::size_t r = 0; r < kN; ++r) {
    for (std::size_t c = 0; c < kN; ++c) xx_[r][c] = keep * xx_[r][c] + x[r] * x[c];
    xy_[r] = keep * xy_[r] + x[r] * seconds;
  }
  ++samples_;
  refit();
  return Status::Ok();
}

void OverheadModel::refit() {
  // The regularized normal equations (header): a ridge relative to each feature's weight.
  std::array<std::array<double, kN>, kN> a = xx_;
  unsigned seen = 0;
  for (std::size_t j = 0; j < kN; ++j) {
    if (xx_[j][j] > 0.0) seen |= 1u << j;
    a[j][j] *= 1.0 + config_.ridge;
  }
  // One batch size so far: nothing says how host time grows with the batch (header).
  const double w = xx_[0][0], mean = xx_[0][1] / w;
  if (!(xx_[1][1] / w - mean * mean > 1e-9 * (1.0 + mean * mean))) seen &= ~(1u << 1);
  // The convex quadratic q(c) = c^T a c - 2 xy^T c is least at the best non-negative
  // unconstrained optimum over subsets of the seen features (empty subset: c = 0, q = 0).
  Coefficients best{};
  double best_q = 0.0;
  for (unsigned mask = 1; mask < (1u << kN); ++mask) {
    if ((mask & ~seen) != 0) continue;
    Coefficients c{};
    if (!solve_subset(a, xy_, mask, &c)) continue;
    bool feasible = true;
    for (double v : c) feasible = feasible && v >= 0.0 && std::isfinite(v);
    if (!feasible) continue;
    double q = 0.0;
    for (std::size_t r = 0; r < kN; ++r) {
      double row = 0.0;
      for (std::size_t k = 0; k < kN; ++k) row += a[r][k] * c[k];
      q += c[r] * row - 2.0 * xy_[r] * c[r];
    }
    if (q < best_q) {
      best_q = q;
      best = c;
    }
  }
  // Below a nanosecond per item a coefficient is the solve's rounding, not a measurement
  // (host times are known to microseconds): it is 0, so such residue cannot break the
  // optimizer's ties between equally good plans one way or the other.
  for (std::size_t j = 1; j < kN; ++j)
    if (best[j] < kNegligibleSeconds) best[j] = 0.0;
  coef_ = best;
}

double OverheadModel::predict(const StepShape& shape) const {
  const Coefficients x = features(shape);
  double s = 0.0;
  for (std::size_t j = 0; j < kN; ++j) s += coef_[j] * x[j];
  return s;
}

double OverheadModel::fixed(int64_t requests) const { return coef_[0] + coef_[1] * static_cast<double>(requests); }

}  // namespace specd
