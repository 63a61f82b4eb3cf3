// Philox4x32-10 against the known-answer vectors published with Random123, and the
// properties the verifier relies on (determinism, independence of keys, uniform range).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "specd/philox.h"

namespace specd {
namespace {

void expect_philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                   uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  const Philox4x32Out out = philox4x32_10(c0, c1, c2, c3, k0, k1);
  EXPECT_EQ(out.v[0], r0);
  EXPECT_EQ(out.v[1], r1);
  EXPECT_EQ(out.v[2], r2);
  EXPECT_EQ(out.v[3], r3);
}

TEST(Philox, KnownAnswerVectors) {
  expect_philox(0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  expect_philox(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  expect_philox(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
                0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

TEST(Philox, UniformsAreDeterministicDistinctAndInRange) {
  std::set<double> seen;
  double sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double u = philox_uniform(42, 1, 2, static_cast<uint32_t>(i), 0);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(u, philox_uniform(42, 1, 2, static_cast<uint32_t>(i), 0));
    seen.insert(u);
    sum += u;
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
  EXPECT_NEAR(sum / n, 0.5, 0.01);  // 4.5 standard errors
  // Every key component changes the draw.
  const double base = philox_uniform(7, 1, 2, 3, 4);
  EXPECT_NE(base, philox_uniform(8, 1, 2, 3, 4));
  EXPECT_NE(base, philox_uniform(7 + (uint64_t{1} << 32), 1, 2, 3, 4));
  EXPECT_NE(base, philox_uniform(7, 9, 2, 3, 4));
  EXPECT_NE(base, philox_uniform(7, 1, 9, 3, 4));
  EXPECT_NE(base, philox_uniform(7, 1, 2, 9, 4));
  EXPECT_NE(base, philox_uniform(7, 1, 2, 3, 9));
}

TEST(Philox, UniformFromBitsExtremes) {
  EXPECT_EQ(uniform_from_bits(0, 0), 0.0);
  const double top = uniform_from_bits(0xffffffffu, 0xffffffffu);
  EXPECT_LT(top, 1.0);
  EXPECT_EQ(top, 1.0 - std::ldexp(1.0, -53));
}

}  // namespace
}  // namespace specd
