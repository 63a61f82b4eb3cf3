// Philox4x32-10 counter-based random numbers (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), the generator behind every random decision in specd.
//
// Rules
// - Randomness is explicit: a draw is a pure function of (seed, request, step, position,
//   draw index). No hidden generator state exists anywhere, so a CPU reference and a CUDA
//   kernel that ask for the same key get the same bits, and a rerun with the same seed
//   reproduces every decision.
// - Key = the 64-bit seed; counter = (request, step, position, draw). `position` is the
//   absolute position in the sequence of the token being decided; `draw` tells apart the
//   draws made for that position (see verify.h for the verifier's layout).
// - uniform_from_bits turns two 32-bit words into a double in [0, 1) with 53 random bits.
// These functions are header-only and usable from host and device code.
#pragma once

#include <cstdint>

#include "specd/host_device.h"

namespace specd {

struct Philox4x32Out {
  uint32_t v[4];
};

SPECD_HOST_DEVICE inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = uint64_t{a} * uint64_t{b};
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// The 10-round Philox4x32 bijection of `counter` under `key`.
SPECD_HOST_DEVICE inline Philox4x32Out philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                     uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, &hi0, &lo0);
    philox_mulhilo(kM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4x32Out{{c0, c1, c2, c3}};
}

// A double in [0, 1) from 53 bits of two words (27 high bits of a, 26 of b).
SPECD_HOST_DEVICE inline double uniform_from_bits(uint32_t a, uint32_t b) {
  return (static_cast<double>(a >> 5) * 67108864.0 + static_cast<double>(b >> 6)) *
         (1.0 / 9007199254740992.0);
}

// The uniform draw for (seed, request, step, position, draw).
SPECD_HOST_DEVICE inline double philox_uniform(uint64_t seed, uint32_t request, uint32_t step,
                                               uint32_t position, uint32_t draw) {
  const Philox4x32Out r = philox4x32_10(request, step, position, draw,
                                        static_cast<uint32_t>(seed),
                                        static_cast<uint32_t>(seed >> 32));
  return uniform_from_bits(r.v[0], r.v[1]);
}

}  // namespace specd
