// Pearson chi-square goodness-of-fit test for the statistical tests: statistic, degrees of
// freedom and p-value (upper tail of the chi-square distribution, via the regularized
// incomplete gamma function). Bins whose expected count is below 5 are pooled.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace specd::testing {

// Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0:
// power series of P for x < a + 1, Lentz's continued fraction for Q otherwise.
inline double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double log_prefactor = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1) {
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000 && std::fabs(term) > std::fabs(sum) * 1e-16; ++n) {
      term *= x / (a + n);
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefactor);
  }
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1) < 1e-16) break;
  }
  return std::exp(log_prefactor) * h;
}

inline double chi_square_sf(double statistic, int df) { return gamma_q(df / 2.0, statistic / 2.0); }

struct ChiSquare {
  double statistic = 0;
  int df = 0;
  double p_value = 1;
};

// observed[i] counts against n * probs[i]. Bins with probability 0 are skipped (callers check
// separately that they were never observed); bins expecting fewer than 5 are pooled.
inline ChiSquare chi_square_test(const std::vector<int64_t>& observed, const std::vector<double>& probs) {
  int64_t n = 0;
  for (int64_t o : observed) n += o;
  std::vector<double> exp_bins, obs_bins;
  double pooled_exp = 0, pooled_obs = 0;
  for (std::size_t i = 0; i < observed.size(); ++i) {
    if (probs[i] <= 0) continue;
    const double e = probs[i] * static_cast<double>(n);
    if (e < 5) {
      pooled_exp += e;
      pooled_obs += static_cast<double>(observed[i]);
    } else {
      exp_bins.push_back(e);
      obs_bins.push_back(static_cast<double>(observed[i]));
    }
  }
  if (pooled_exp > 0) {
    if (pooled_exp >= 5 || exp_bins.empty()) {
      exp_bins.push_back(pooled_exp);
      obs_bins.push_back(pooled_obs);
    } else {  // too small on its own: merge into the last regular bin
      exp_bins.back() += pooled_exp;
      obs_bins.back() += pooled_obs;
    }
  }
  ChiSquare r;
  for (std::size_t i = 0; i < exp_bins.size(); ++i)
    r.statistic += (obs_bins[i] - exp_bins[i]) * (obs_bins[i] - exp_bins[i]) / exp_bins[i];
  r.df = static_cast<int>(exp_bins.size()) - 1;
  r.p_value = r.df > 0 ? chi_square_sf(r.statistic, r.df) : 1.0;
  return r;
}

}  // namespace specd::testing
