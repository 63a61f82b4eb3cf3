// Bit-level helpers shared by CPU code and CUDA kernels (SPECD_HOST_DEVICE), so both read
// logits and order probabilities identically.
//
// Rules
// - double_bits(x) for x >= +0 is a uint64 whose unsigned order equals the numeric order of
//   x (IEEE 754 layout), which is what the radix selections of sampling rank by.
// - half_to_float / bfloat16_to_float convert raw 16-bit words exactly (every fp16 and bf16
//   value, subnormals, infinities and NaNs included, is representable as a float).
#pragma once

#include <cstdint>
#include <cstring>

#include "specd/host_device.h"

namespace specd::detail {

SPECD_HOST_DEVICE inline uint64_t double_bits(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPECD_HOST_DEVICE inline double double_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x = 0;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

SPECD_HOST_DEVICE inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

SPECD_HOST_DEVICE inline float float_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x = 0;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
SPECD_HOST_DEVICE inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h >> 15) << 31;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1Fu) return float_from_bits(sign | 0x7F800000u | (mantissa << 13));  // inf / NaN
  return float_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));  // rebias 15 -> 127
}

// bfloat16 is the upper half of a float.
SPECD_HOST_DEVICE inline float bfloat16_to_float(uint16_t b) {
  return float_from_bits(static_cast<uint32_t>(b) << 16);
}

}  // namespace specd::detail
