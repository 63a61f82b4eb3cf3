// The per-token pieces of the Gumbel-max draw (DrawRule::kGumbelMax, sampling_batch.h),
// written once for the CPU code and the CUDA kernels (SPECD_HOST_DEVICE) with operations each
// correctly rounded on its own (sampling_rules.h's exact_* helpers), so a token's key has
// the same bits on the host and the device.
//
// Rules (token i of a row, RngKey k)
// - Its 52 random bits b_i: the high 16 are half (i % 8) of the Philox output for counter
//   (k.request, k.step, k.position, kGumbelHighDraw | i / 8) (half h is bits 16 (h % 2) ..
//   +16 of word h / 2); the low 36 are word 0 and the low 4 bits of word 1 of the output for
//   (..., kGumbelLowDraw | i). One Philox call serves 8 tokens' high bits; the low bits are
//   only computed for the few tokens the screen below cannot rule out.
// - u_i = (b_i + 0.5) 2^-52, in (0, 1) and never 0 or 1; g_i = -ln(-ln(u_i)) with ln =
//   deterministic_log (below): Gumbel noise, at most 36.7. (With 52 bits the discrete noise
//   moves a draw's probabilities by about vocab * 2^-52, against the 2^-24 of the float
//   probability rows the inverse-CDF draw reads.)
// - key_i = l_i * (1 / T) + g_i for temperature T >= 1, l_i + T * g_i for T < 1 (in double;
//   the two forms order tokens alike, and neither overflows: 1 / T <= 1 in the first,
//   T * g_i <= 36.7 in the second). The token drawn is the kept token of largest key, the
//   lowest id among equal keys. By the Gumbel-max property, P(token i) is proportional to
//   exp(l_i / T) over the kept tokens: the rule's distribution.
//
// The screen (an optimization that never changes the result): the high 16 bits alone bound
// g_i from above (gumbel_bucket_bound: a table of 208 buckets of the high half's distance
// from the top, log-spaced, 16 per power of two), and screen_upper turns that into a float
// upper bound of key_i. A token whose bound is below a key already found in the row cannot
// be drawn, so its low bits, logs and double key are never computed. Which tokens are
// screened out depends on the thread layout; which token wins does not.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "specd/detail/bits.h"
#include "specd/detail/sampling_rules.h"
#include "specd/host_device.h"
#include "specd/philox.h"
#include "specd/verify.h"

namespace specd::detail {

// Draw indices of the two Philox calls per 8 tokens. Vocabularies hold at most 2^30 tokens,
// so i / 8 < 2^27 and these never meet the verifier's draws (sibling indices < 64,
// kFinalDraw).
inline constexpr uint32_t kGumbelHighDraw = 0x80000000u;
inline constexpr uint32_t kGumbelLowDraw = 0x40000000u;
inline constexpr int32_t kGumbelGroup = 8;  // tokens per high-bits Philox call (= kLoadGroup)

#if defined(__CUDA_ARCH__)
SPECD_HOST_DEVICE inline double exact_div(double a, double b) { return __ddiv_rn(a, b); }
#else
SPECD_HOST_DEVICE inline double exact_div(double a, double b) { return a / b; }
#endif

// ln(x) for a positive, normal, finite double, the same bits on the host and the device:
// x = m 2^e with m in (sqrt(1/2), sqrt(2)], ln m = 2 atanh(s) with s = (m - 1) / (m + 1)
// (|s| <= 0.172) by its odd series to s^23 (truncation below 1e-18, relative), plus e ln 2.
// Within a few ulps of ln; what matters here is that both sides compute the same bits.
SPECD_HOST_DEVICE inline double deterministic_log(double x) {
  constexpr double kSqrt2 = 0x1.6a09e667f3bcdp+0;
  constexpr double kLn2 = 0x1.62e42fefa39efp-1;
  const uint64_t bits = double_bits(x);
  int64_t e = static_cast<int64_t>((bits >> 52) & 0x7FF) - 1023;
  double m = double_from_bits((bits & 0xFFFFFFFFFFFFFull) | (uint64_t{1023} << 52));  // [1, 2)
  if (m > kSqrt2) {
    m = exact_mul(m, 0.5);
    e += 1;
  }
  const double s = exact_div(exact_sub(m, 1.0), exact_add(m, 1.0));
  const double s2 = exact_mul(s, s);
  double p = 2.0 / 23;
  for (int32_t k = 21; k >= 1; k -= 2) p = exact_add(exact_mul(p, s2), 2.0 / k);
  return exact_add(exact_mul(static_cast<double>(e), kLn2), exact_mul(s, p));
}

// Gumbel noise -ln(-ln(u)) for u = (bits + 0.5) 2^-52, bits < 2^52 (the sum is exact).
SPECD_HOST_DEVICE inline double gumbel_from_bits(uint64_t bits) {
  const double u = exact_mul(exact_add(static_cast<double>(bits), 0.5), 0x1p-52);
  return -deterministic_log(-deterministic_log(u));
}
inline constexpr int32_t kGumbelLowBits = 36;

// The 16-bit half h (0-7) of a Philox output.
SPECD_HOST_DEVICE inline uint32_t philox_half(const Philox4x32Out& r, int32_t h) {
  return (r.v[h >> 1] >> (16 * (h & 1))) & 0xFFFFu;
}

SPECD_HOST_DEVICE inline Philox4x32Out gumbel_philox(const RngKey& k, uint32_t draw) {
  return philox4x32_10(k.request, k.step, k.position, draw, static_cast<uint32_t>(k.seed),
                       static_cast<uint32_t>(k.seed >> 32));
}
// The Philox output holding the high bits of group g's tokens (ids 8g .. 8g + 7).
SPECD_HOST_DEVICE inline Philox4x32Out gumbel_high_bits(const RngKey& k, int32_t group) {
  return gumbel_philox(k, kGumbelHighDraw | static_cast<uint32_t>(group));
}
// Token i's 52 bits, given its high half.
SPECD_HOST_DEVICE inline uint64_t gumbel_bits(const RngKey& k, int32_t i, uint32_t high) {
  const Philox4x32Out r = gumbel_philox(k, kGumbelLowDraw | static_cast<uint32_t>(i));
  return (uint64_t{high} << kGumbelLowBits) | (uint64_t{r.v[1] & 0xFu} << 32) | r.v[0];
}

// The highest set bit of x > 0.
SPECD_HOST_DEVICE inline int32_t highest_bit(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(x);
#elif defined(__GNUC__) || defined(__clang__)
  return 31 - __builtin_clz(x);
#else
  int32_t b = 0;
  while (x >>= 1) ++b;
  return b;
#endif
}

// Screen buckets of the high half hi: by d = 0xFFFF - hi, its distance from the top.
// d < 16: bucket d; else bucket 16 + 16 (top bit of d - 4) + the 4 bits below d's top bit.
inline constexpr int32_t kGumbelBuckets = 208;
SPECD_HOST_DEVICE inline int32_t gumbel_bucket(uint32_t hi) {
  const uint32_t d = 0xFFFFu - hi;
  if (d < 16) return static_cast<int32_t>(d);
  const int32_t top = highest_bit(d);
  return 16 + 16 * (top - 4) + static_cast<int32_t>((d >> (top - 4)) & 15u);
}
// The least distance d of bucket b.
SPECD_HOST_DEVICE inline uint32_t gumbel_bucket_floor(int32_t b) {
  if (b < 16) return static_cast<uint32_t>(b);
  return (16u + static_cast<uint32_t>((b - 16) & 15)) << ((b - 16) / 16);
}

// The least float >= x (x finite).
SPECD_HOST_DEVICE inline float float_at_least(double x) {
  const float f = static_cast<float>(x);
  if (static_cast<double>(f) >= x) return f;
  return f >= 0 ? float_from_bits(float_bits(f) + 1) : float_from_bits(float_bits(f) - 1);
}
// The largest float <= x (x finite or -inf).
SPECD_HOST_DEVICE inline float float_at_most(double x) {
  const float f = static_cast<float>(x);
  if (static_cast<double>(f) <= x) return f;
  return f > 0 ? float_from_bits(float_bits(f) - 1) : float_from_bits(float_bits(f) + 1);
}

// Entry b of the screen table: an upper bound of g over the tokens of bucket b, the noise of
// the largest u the bucket holds (high half 0xFFFF - gumbel_bucket_floor(b), low bits all
// ones) rounded up to float.
SPECD_HOST_DEVICE inline float gumbel_bucket_bound(int32_t b) {
  const uint64_t hi = 0xFFFFu - gumbel_bucket_floor(b);
  return float_at_least(gumbel_from_bits((hi << kGumbelLowBits) | ((uint64_t{1} << kGumbelLowBits) - 1)));
}

// How a row's keys are formed (the rule's two forms, by temperature), with the float
// factors the screen uses.
struct GumbelScale {
  bool divide;      // temperature >= 1: key = l * inv_t + g; else key = l + t * g
  double factor;    // inv_t (divide) or t
  float factor_f;   // factor rounded to float (the screen's; its error is in the margin)
};
SPECD_HOST_DEVICE inline GumbelScale gumbel_scale(double temperature) {
  const bool divide = temperature >= 1;
  const double factor = divide ? inverse_temperature(temperature) : temperature;
  return GumbelScale{divide, factor, static_cast<float>(factor)};
}

// key_i, exactly as the rule says.
SPECD_HOST_DEVICE inline double gumbel_key(const GumbelScale& s, float logit, double g) {
  const double l = static_cast<double>(logit);
  return s.divide ? exact_add(exact_mul(l, s.factor), g) : exact_add(l, exact_mul(s.factor, g));
}

// A float at least a + c computed in double from values within a few 2^-24 of a and c
// (relative): their float sum plus 2^-20 of their magnitudes plus FLT_MIN (a term below
// float's range). Overflow gives +inf: not screened out.
SPECD_HOST_DEVICE inline float sum_upper(float a, float c) {
  const float magnitude = exact_addf(a >= 0 ? a : -a, c >= 0 ? c : -c);
  return exact_addf(exact_addf(a, c), exact_addf(exact_mulf(magnitude, 0x1p-20f), FLT_MIN));
}

// A float upper bound of gumbel_key(s, logit, g) for any g <= g_bound (logit finite): the
// float form of the key (the float factor is off by 2^-24 of it), bounded by sum_upper.
SPECD_HOST_DEVICE inline float screen_upper(const GumbelScale& s, float logit, float g_bound) {
  return s.divide ? sum_upper(exact_mulf(logit, s.factor_f), g_bound) : sum_upper(logit, exact_mulf(s.factor_f, g_bound));
}

// A float upper bound of ln(q) for a float probability q > 0 (the screen of the probability
// rows' draw; their keys use deterministic_log): the fast float log plus 2^-12 of its
// magnitude plus 2^-12 (the device's __logf is within 3 ulp, the host's within 1), and for q
// below float's normal range ln(FLT_MIN) = -87.34 rounded up.
SPECD_HOST_DEVICE inline float log_upper(float q) {
  if (!(q >= FLT_MIN)) return -87.3f;
#if defined(__CUDA_ARCH__)
  const float v = __logf(q);
#else
  const float v = std::log(q);
#endif
  return exact_addf(v, exact_mulf(exact_addf(v >= 0 ? v : -v, 1.0f), 0x1p-12f));
}

}  // namespace specd::detail
