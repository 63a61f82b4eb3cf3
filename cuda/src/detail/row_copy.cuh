// Copying K/V rows as opaque bytes in the widest unit (16, 8, 4, 2 or 1 bytes) that every row
// start and the row length allow: a row copy needs no dtype, only aligned addresses.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

namespace specd::cuda::detail {

template <int kBytes>
struct CopyUnit;
template <>
struct CopyUnit<16> { using type = uint4; };
template <>
struct CopyUnit<8> { using type = uint2; };
template <>
struct CopyUnit<4> { using type = uint32_t; };
template <>
struct CopyUnit<2> { using type = uint16_t; };
template <>
struct CopyUnit<1> { using type = uint8_t; };

// The widest unit dividing every value: pass the base addresses and every byte quantity a
// row start is built from (strides, row length), so every row starts on a unit boundary and
// holds a whole number of units.
inline int copy_unit_bytes(std::initializer_list<uint64_t> byte_quantities) {
  for (int unit : {16, 8, 4, 2}) {
    bool ok = true;
    for (uint64_t q : byte_quantities) ok = ok && q % static_cast<uint64_t>(unit) == 0;
    if (ok) return unit;
  }
  return 1;
}

// Calls f(CopyUnit<bytes>{}) (a tag whose ::type is the unit) and returns its result.
template <class F>
cudaError_t dispatch_copy_unit(int bytes, F&& f) {
  switch (bytes) {
    case 16: return f(CopyUnit<16>{});
    case 8: return f(CopyUnit<8>{});
    case 4: return f(CopyUnit<4>{});
    case 2: return f(CopyUnit<2>{});
    default: return f(CopyUnit<1>{});
  }
}

}  // namespace specd::cuda::detail
