// Hash helpers shared by the core's hash tables (internal).
#pragma once

#include <cstdint>

namespace specd::detail {

// splitmix64 finalizer: a bijective mix that spreads keys over a table's low bits.
inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace specd::detail
