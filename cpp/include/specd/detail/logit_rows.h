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
// Gumbel-max draw's groups, gumbel_row.h). 16-bit rows also have group8(i0): the same eight
// as loaded, before decoding (the raw words, half the registers of eight floats), and
// decode(group, j) logit i0 + j of it: for_each_group keeps several groups in flight so.
struct WordGroup {
  uint32_t w[4];  // words 2j and 2j + 1 in the low and high halves of w[j]
};
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
// Eight 16-bit words from `words`, undecoded (one 16-byte load on the device where aligned).
SPECD_HOST_DEVICE inline WordGroup load8_raw(const uint16_t* words) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(words) & 15) == 0) {
    const uint4 w = *reinterpret_cast<const uint4*>(words);
    return WordGroup{{w.x, w.y, w.z, w.w}};
  }
#endif
  WordGroup g;
  for (int32_t j = 0; j < 4; ++j)
    g.w[j] = static_cast<uint32_t>(words[2 * j]) | (static_cast<uint32_t>(words[2 * j + 1]) << 16);
  return g;
}
SPECD_HOST_DEVICE inline uint16_t word_of(const WordGroup& g, int32_t j) {
  return static_cast<uint16_t>(g.w[j >> 1] >> ((j & 1) * 16));
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
  SPECD_HOST_DEVICE WordGroup group8(int32_t i0) const { return load8_raw(data + i0); }
  SPECD_HOST_DEVICE static float decode(const WordGroup& g, int32_t j) { return half_to_float(word_of(g, j)); }
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
  SPECD_HOST_DEVICE WordGroup group8(int32_t i0) const { return load8_raw(data + i0); }
  SPECD_HOST_DEVICE static float decode(const WordGroup& g, int32_t j) { return bfloat16_to_float(word_of(g, j)); }
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

template <class Load, class = void>
struct HasGroup8 : std::false_type {};
template <class Load>
struct HasGroup8<Load, decltype(void(std::declval<const Load&>().group8(0)))> : std::true_type {};

// Groups of 8 logits each thread of for_each_group has in flight: 4 for 16-bit rows (one
// 16-byte load each, kept as raw words until used: group8), 2 for float32 rows (two loads
// each, as floats). A greedy pass over a row is a chain of round trips to memory, one per
// round of groups, with little arithmetic between them: with 2 groups in flight for every
// dtype the GPU's greedy verification took about the same time per row for bf16 and float32
// rows (241.6 and 217.5 µs for 64 x 9 rows of 151,936 on an H200), the mark of latency, not
// bandwidth; now both have 64 bytes per thread in flight. 8 and 4 groups made ptxas (sm_90)
// spill in the bf16 greedy verification and the one-pass kernels take 72-76 registers (fewer
// blocks per SM); float32 groups held as raw groups also took 76 there (64 as floats). These
// counts keep every kernel's spills and registers as before.
inline constexpr int32_t kWordGroupsInFlight = 4;
inline constexpr int32_t kFloatGroupsInFlight = 2;

// Calls fn(i, logit i) for every i < n of this thread's groups (group g holds ids 8g ..
// 8g + 7; thread rank takes groups rank, rank + size, ...), the groups' loads of a round
// (above) issued before their first use. The ORDER differs from for_each_strided's (a thread
// visits 8 consecutive ids, then jumps): only for passes whose result does not depend on the
// order (any, max, argmax with its id tie-break), never for sums. With one thread: id order.
template <class Block, class Load, class Fn>
SPECD_HOST_DEVICE void for_each_group(const Block& b, int32_t n, const Load& load, const Fn& fn) {
  const int64_t step = b.size();
  if constexpr (HasGroup8<Load>::value) {
    using Group = decltype(load.group8(0));
    const int64_t whole = int64_t{n} / kLoadGroup;  // groups of 8 ids within the row
    for (int64_t g0 = b.rank(); g0 < whole; g0 += kWordGroupsInFlight * step) {
      Group raw[kWordGroupsInFlight];
      for (int32_t u = 0; u < kWordGroupsInFlight; ++u) {
        const int64_t g = g0 + u * step;
        if (g < whole) raw[u] = load.group8(static_cast<int32_t>(g * kLoadGroup));
      }
      for (int32_t u = 0; u < kWordGroupsInFlight; ++u) {
        const int64_t g = g0 + u * step;
        if (g >= whole) break;
        for (int32_t j = 0; j < kLoadGroup; ++j) fn(static_cast<int32_t>(g * kLoadGroup + j), Load::decode(raw[u], j));
      }
    }
    // The last, partial group (n not a multiple of 8): its thread's turn comes after its
    // whole groups, as above.
    if (whole * kLoadGroup < n && b.rank() == whole % step)
      for (int64_t i = whole * kLoadGroup; i < n; ++i) fn(static_cast<int32_t>(i), load(static_cast<int32_t>(i)));
  } else {
    const int64_t groups = (int64_t{n} + kLoadGroup - 1) / kLoadGroup;
    for (int64_t g0 = b.rank(); g0 < groups; g0 += kFloatGroupsInFlight * step) {
      float v[kFloatGroupsInFlight][kLoadGroup];
      for (int32_t u = 0; u < kFloatGroupsInFlight; ++u) {
        const int64_t g = g0 + u * step;
        if (g < groups) load_group(load, static_cast<int32_t>(g * kLoadGroup), n, v[u]);
      }
      for (int32_t u = 0; u < kFloatGroupsInFlight; ++u) {
        const int64_t g = g0 + u * step;
        if (g >= groups) break;
        for (int32_t j = 0; j < kLoadGroup; ++j) {
          const int64_t i = g * kLoadGroup + j;
          if (i < n) fn(static_cast<int32_t>(i), v[u][j]);
        }
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
