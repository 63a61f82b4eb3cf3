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
SPECD_HOST_DEVICE inline bool is_nan(double x) { return x != x; }

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

// Arithmetic the host and the device round identically: each operation correctly rounded
// on its own (IEEE 754), never fused with another. On the device the _rn intrinsics say so
// (nvcc would otherwise contract a * b + c into one fma); on the host the build compiles C++
// with -ffp-contract=off (CMakeLists.txt), and x86-64 and aarch64 evaluate float and double
// in their own precision.
#if defined(__CUDA_ARCH__)
SPECD_HOST_DEVICE inline double exact_add(double a, double b) { return __dadd_rn(a, b); }
SPECD_HOST_DEVICE inline double exact_sub(double a, double b) { return __dsub_rn(a, b); }
SPECD_HOST_DEVICE inline double exact_mul(double a, double b) { return __dmul_rn(a, b); }
SPECD_HOST_DEVICE inline float exact_mulf(float a, float b) { return __fmul_rn(a, b); }
SPECD_HOST_DEVICE inline float exact_addf(float a, float b) { return __fadd_rn(a, b); }
#else
SPECD_HOST_DEVICE inline double exact_add(double a, double b) { return a + b; }
SPECD_HOST_DEVICE inline double exact_sub(double a, double b) { return a - b; }
SPECD_HOST_DEVICE inline double exact_mul(double a, double b) { return a * b; }
SPECD_HOST_DEVICE inline float exact_mulf(float a, float b) { return a * b; }
SPECD_HOST_DEVICE inline float exact_addf(float a, float b) { return a + b; }
#endif

// exp(x) for x <= 0, the same bits on the host and the device, with a few double-precision
// operations, the polynomial in float and no conversion it can avoid (on the device the
// double units, and their conversions most, are what bound the sampling kernels' passes):
// - x < kExpCutoff (e^-700, about 1e-304; -inf included) gives 0;
// - n = x log2 e rounded to the nearest integer (ties to even, as rint), by adding and
//   subtracting kRoundShift: the sum's unit in the last place is 1, so adding rounds, and its
//   low bits hold n (read as an integer, no float-to-integer conversion);
// - r = x - n ln2_hi, exactly: ln2_hi is ln 2 to 40 bits, so n ln2_hi (|n| <= 1010) is exact
//   and r has the error of ln2_hi alone, under 1e-9 relative in the result;
// - e^r for |r| <= 0.35 by its Taylor polynomial of degree 7 in float (Horner, truncation
//   under 6e-9, then float rounding: over [-700, 0] the result is within 1.1e-7 of e^x,
//   relative, measured on a sweep of 7 million points; tests/cpp/test_sampling.cc);
// - times 2^n, exactly: the polynomial is a normal float in [0.7, 1.42], so the product is
//   the double with its mantissa and its exponent plus n (always normal: n >= -1010),
//   assembled from the bits. The same values as rint and a double product
//   (test_sampling.cc checks it bit for bit against that form).
inline constexpr double kExpCutoff = -700.0;
inline constexpr double kLog2E = 1.4426950408889634;
inline constexpr double kLn2Hi = 0x1.62e42fefa2p-1;  // ln 2 to 40 bits (below it by 7.4e-13): n * it is exact
inline constexpr double kRoundShift = 6755399441055744.0;  // 1.5 * 2^52: ulp 1 for sums within 2^51 of it
SPECD_HOST_DEVICE inline double exp_nonpositive(double x) {
  if (!(x >= kExpCutoff)) return 0.0;
  const double shifted = exact_add(exact_mul(x, kLog2E), kRoundShift);
  const double n = exact_sub(shifted, kRoundShift);
  const int64_t n_int = static_cast<int64_t>(double_bits(shifted) - double_bits(kRoundShift));
  const float r = static_cast<float>(exact_sub(x, exact_mul(n, kLn2Hi)));
  float p = 1.0f / 5040.0f;
  p = exact_addf(exact_mulf(p, r), 1.0f / 720.0f);
  p = exact_addf(exact_mulf(p, r), 1.0f / 120.0f);
  p = exact_addf(exact_mulf(p, r), 1.0f / 24.0f);
  p = exact_addf(exact_mulf(p, r), 1.0f / 6.0f);
  p = exact_addf(exact_mulf(p, r), 0.5f);
  p = exact_addf(exact_mulf(p, r), 1.0f);
  p = exact_addf(exact_mulf(p, r), 1.0f);
  const uint32_t p_bits = float_bits(p);
  const int64_t exponent = static_cast<int64_t>((p_bits >> 23) & 0xFFu) - 127 + n_int + 1023;
  return double_from_bits((static_cast<uint64_t>(exponent) << 52) | (static_cast<uint64_t>(p_bits & 0x7FFFFFu) << 29));
}

// 1 / temperature, the factor softmax_weight takes (temperature > 0).
SPECD_HOST_DEVICE inline double inverse_temperature(double temperature) { return 1.0 / temperature; }

// The exponent of a softmax weight: (logit - max_logit) * inv_temperature (inv_temperature
// from inverse_temperature), <= 0; exactly 0 for the largest logit, even where
// 1 / temperature overflows (a subnormal temperature); -inf for a -inf logit.
SPECD_HOST_DEVICE inline double softmax_exponent(float logit, double max_logit, double inv_temperature) {
  const double below = exact_sub(static_cast<double>(logit), max_logit);
  return below == 0.0 ? 0.0 : exact_mul(below, inv_temperature);
}

// Unnormalized softmax weight exp((logit - max_logit) / temperature): the value of
// exp_nonpositive(softmax_exponent(...)), with the largest logit weighing 1 without the
// exponential; in [0, 1], 0 for -inf.
SPECD_HOST_DEVICE inline double softmax_weight(float logit, double max_logit, double inv_temperature) {
  const double below = exact_sub(static_cast<double>(logit), max_logit);
  return below == 0.0 ? 1.0 : exp_nonpositive(exact_mul(below, inv_temperature));
}

SPECD_HOST_DEVICE inline double natural_log(double x) {
#if defined(__CUDA_ARCH__)
  return log(x);
#else
  return std::log(x);
#endif
}

// Bounds on the exponent x = softmax_exponent(...) of a token whose softmax probability
// exact_mul(exp_nonpositive(x), 1 / total) lies in [p_lo, p_hi], for a row whose weights sum
// to total (log_total = natural_log(total)): exp_nonpositive is within 2e-7 of e^x, relative
// (test_sampling.cc), and the product and 1 / total round by 1e-16, so such an x lies within
// 2.2e-7 of ln(p) + ln(total); the bounds leave kExponentMargin (45x that) on each side,
// enough for any log's last-place error too. A token whose x falls outside them cannot have
// its probability in the range, so the sampling passes skip its exponential (they still
// decide every token that passes by its exact probability; only the skipping is approximate,
// never the result).
inline constexpr double kExponentMargin = 1e-5;
// The least x a probability >= p can come from (-inf for p <= 0).
SPECD_HOST_DEVICE inline double exponent_floor(double p, double log_total) {
  return p > 0 ? natural_log(p) + log_total - kExponentMargin : -INFINITY;
}
// The largest x a probability <= p can come from (+inf for p >= 1: every x <= 0).
SPECD_HOST_DEVICE inline double exponent_ceiling(double p, double log_total) {
  return p < 1 ? natural_log(p) + log_total + kExponentMargin : INFINITY;
}

// The best (value, index) pair: larger value, then lower index (the argmax rule). Values
// must not be NaN. The empty pair is (-inf, INT32_MAX).
struct ArgMax {
  float value;
  int32_t index;
};
SPECD_HOST_DEVICE inline ArgMax empty_argmax() { return ArgMax{-INFINITY, INT32_MAX}; }
// What a thread that read an invalid value contributes to the argmax collective: it beats
// every pair (+inf, and the lowest index among +inf values), so the collective's index < 0
// reports the invalid value with no collective of its own.
SPECD_HOST_DEVICE inline ArgMax bad_argmax() { return ArgMax{INFINITY, -1}; }
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
