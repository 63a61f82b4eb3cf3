// The per-element pieces of the sampling rules (sampling.h), written once for the CPU code and
// the CUDA kernels (SPECD_HOST_DEVICE). sampling.cc uses softmax_weight and
// sampling_params_code too, so the reference and the kernels compute each weight with the
// same expression.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "specd/detail/bits.h"
#include "specd/host_device.h"
#include "specd/sampling.h"

namespace specd::detail {

SPECD_HOST_DEVICE inline bool is_finite(double x) { return x >= -DBL_MAX && x <= DBL_MAX; }

// 0 when valid; otherwise which rule of validate_sampling_params fails (1 temperature,
// 2 top_k, 3 top_p, 4 min_p).
SPECD_HOST_DEVICE inline int32_t sampling_params_code(const SamplingParams& s) {
  if (!is_finite(s.temperature) || s.temperature < 0) return 1;
  if (s.top_k < 0) return 2;
  if (!(s.top_p > 0 && s.top_p <= 1)) return 3;
  if (!(s.min_p >= 0 && s.min_p <= 1)) return 4;
  return 0;
}

SPECD_HOST_DEVICE inline bool has_filters(const SamplingParams& s) {
  return s.top_k > 0 || s.top_p < 1 || s.min_p > 0;
}

// NaN or +inf: logits sampling cannot use (-inf is allowed: probability 0).
SPECD_HOST_DEVICE inline bool is_bad_logit(float x) { return x != x || x > FLT_MAX; }

// Unnormalized softmax weight exp((logit - max_logit) / temperature), in double.
SPECD_HOST_DEVICE inline double softmax_weight(float logit, double max_logit, double temperature) {
  const double x = (static_cast<double>(logit) - max_logit) / temperature;
#if defined(__CUDA_ARCH__)
  return exp(x);
#else
  return std::exp(x);
#endif
}

// The best (value, index) pair: larger value, then lower index (the argmax rule). Values
// must not be NaN. The empty pair is (-inf, INT32_MAX).
struct ArgMax {
  float value;
  int32_t index;
};
SPECD_HOST_DEVICE inline ArgMax empty_argmax() { return ArgMax{-INFINITY, INT32_MAX}; }
SPECD_HOST_DEVICE inline ArgMax better(ArgMax a, ArgMax b) {
  return (a.value > b.value || (a.value == b.value && a.index < b.index)) ? a : b;
}

// Probability mass in fixed point: floor(p * 2^62) for p in [0, 1]. Sums of up to 2^30 such
// values that add up to about 1 stay below 2^63.
inline constexpr double kFixedOne = 4611686018427387904.0;  // 2^62
SPECD_HOST_DEVICE inline uint64_t fixed_mass(double p) { return static_cast<uint64_t>(p * kFixedOne); }
// The smallest fixed-point mass M with M / 2^62 >= top_p (top_p in (0, 1]).
SPECD_HOST_DEVICE inline uint64_t fixed_threshold(double top_p) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(ceil(top_p * kFixedOne));
#else
  return static_cast<uint64_t>(std::ceil(top_p * kFixedOne));
#endif
}

}  // namespace specd::detail
