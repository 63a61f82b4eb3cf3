// Readers of one row of a LogitRows matrix (sampling_batch.h) for each LogitsDtype, the
// dispatch from the runtime dtype to a reader type, shared by the CPU functions and the CUDA
// launchers of batched sampling and verification, and the grouped (vector-load) walk of a row.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "specd/detail/bits.h"
#include "specd/host_device.h"
#include "specd/sampling_batch.h"

namespace specd::detail {

// Row readers: logit i of one row as float, for each LogitsDtype. at(data, offset) is the
// row starting `offset` elements into `data`. load8(i0, v): logits i0 .. i0 + 7 (all within
// the row), on the device with 16-byte loads where data + i0 is 16-byte aligned (the
// Gumbel-max draw's groups, gumbel_row.h).
struct Float32Row {
  const float* data;
  SPECD_HOST_DEVICE static Float32Row at(const void* base, int64_t offset) {
    return Float32Row{static_cast<const float*>(base) + offset};
  }
  SPECD_HOST_DEVICE float operator()(int32_t i) const { return data[i]; }
  SPECD_HOST_DEVICE void load8(int32_t i0, float (&v)[8]) const {
#if defined(__CUDA_ARCH__)
    if ((reinterpret_cast<uintptr_t>(data + i0) & 15) == 0) {
      const float4 a = *reinterpret_cast<const float4*>(data + i0);
      const float4 b = *reinterpret_cast<const float4*>(data + i0 + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      return;
    }
#endif
    for (int32_t j = 0; j < 8; ++j) v[j] = data[i0 + j];
  }
};
// Eight 16-bit words from `words` decoded to floats (one 16-byte load on the device where
// `words` is 16-byte aligned).
template <class Decode>
SPECD_HOST_DEVICE void load8_words(const uint16_t* words, float (&v)[8], const Decode& decode) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(words) & 15) == 0) {
    const uint4 w = *reinterpret_cast<const uint4*>(words);
    const uint32_t pairs[4] = {w.x, w.y, w.z, w.w};
    for (int32_t j = 0; j < 4; ++j) {
      v[2 * j] = decode(static_cast<uint16_t>(pairs[j] & 0xFFFFu));
      v[2 * j + 1] = decode(static_cast<uint16_t>(pairs[j] >> 16));
    }
    return;
  }
#endif
  for (int32_t j = 0; j < 8; ++j) v[j] = decode(words[j]);
}

struct Float16Row {
  const uint16_t* data;
  SPECD_HOST_DEVICE static Float16Row at(const void* base, int64_t offset) {
    return Float16Row{static_cast<const uint16_t*>(base) + offset};
  }
  SPECD_HOST_DEVICE float operator()(int32_t i) const { return half_to_float(data[i]); }
  SPECD_HOST_DEVICE void load8(int32_t i0, float (&v)[8]) const {
    load8_words(data + i0, v, [](uint16_t w) { return half_to_float(w); });
  }
};
struct BFloat16Row {
  const uint16_t* data;
  SPECD_HOST_DEVICE static BFloat16Row at(const void* base, int64_t offset) {
    return BFloat16Row{static_cast<const uint16_t*>(base) + offset};
  }
  SPECD_HOST_DEVICE float operator()(int32_t i) const { return bfloat16_to_float(data[i]); }
  SPECD_HOST_DEVICE void load8(int32_t i0, float (&v)[8]) const {
    load8_words(data + i0, v, [](uint16_t w) { return bfloat16_to_float(w); });
  }
};

// Logits i0 .. i0 + 7 of a row of `n` (-inf past its end). Readers with load8 take it for
// whole groups (on the device: vector loads); others, and a last partial group, read each.
inline constexpr int32_t kLoadGroup = 8;
template <class Load, class = void>
struct HasLoad8 : std::false_type {};
template <class Load>
struct HasLoad8<Load, decltype(void(std::declval<const Load&>().load8(0, std::declval<float (&)[kLoadGroup]>())))>
    : std::true_type {};

template <class Load>
SPECD_HOST_DEVICE void load_group(const Load& load, int32_t i0, int32_t n, float (&v)[kLoadGroup]) {
  if constexpr (HasLoad8<Load>::value) {
    if (i0 + kLoadGroup <= n) {
      load.load8(i0, v);
      return;
    }
  }
  for (int32_t j = 0; j < kLoadGroup; ++j) v[j] = i0 + j < n ? load(i0 + j) : -INFINITY;
}

// Groups of kLoadGroup consecutive logits in flight per thread in for_each_group.
inline constexpr int32_t kGroupsInFlight = 2;

// Calls fn(i, logit i) for every i < n of this thread's groups (group g holds ids 8g ..
// 8g + 7; thread rank takes groups rank, rank + size, ...), kGroupsInFlight groups' loads
// issued before their first use. The ORDER differs from for_each_strided's (a thread visits
// 8 consecutive ids, then jumps): only for passes whose result does not depend on the order
// (any, max, argmax with its id tie-break), never for sums. With one thread: id order.
template <class Block, class Load, class Fn>
SPECD_HOST_DEVICE void for_each_group(const Block& b, int32_t n, const Load& load, const Fn& fn) {
  const int64_t groups = (int64_t{n} + kLoadGroup - 1) / kLoadGroup;
  const int64_t step = b.size();
  for (int64_t g0 = b.rank(); g0 < groups; g0 += kGroupsInFlight * step) {
    float v[kGroupsInFlight][kLoadGroup];
    for (int32_t u = 0; u < kGroupsInFlight; ++u) {
      const int64_t g = g0 + u * step;
      if (g < groups) load_group(load, static_cast<int32_t>(g * kLoadGroup), n, v[u]);
    }
    for (int32_t u = 0; u < kGroupsInFlight; ++u) {
      const int64_t g = g0 + u * step;
      if (g >= groups) break;
      for (int32_t j = 0; j < kLoadGroup; ++j) {
        const int64_t i = g * kLoadGroup + j;
        if (i < n) fn(static_cast<int32_t>(i), v[u][j]);
      }
    }
  }
}

// Calls fn(Row{}) with the reader type of `dtype` and returns its result (the argument only
// carries the type; rows are made with Row::at). dtype must be valid (validate_logit_rows).
template <class Fn>
decltype(auto) dispatch_logits_dtype(LogitsDtype dtype, Fn&& fn) {
  switch (dtype) {
    case LogitsDtype::kFloat16:
      return fn(Float16Row{});
    case LogitsDtype::kBFloat16:
      return fn(BFloat16Row{});
    case LogitsDtype::kFloat32:
    default:
      return fn(Float32Row{});
  }
}

}  // namespace specd::detail
