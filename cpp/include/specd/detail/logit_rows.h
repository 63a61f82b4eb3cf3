// Readers of one row of a LogitRows matrix (sampling_batch.h) for each LogitsDtype, and the
// dispatch from the runtime dtype to a reader type, shared by the CPU functions and the CUDA
// launchers of batched sampling and verification.
#pragma once

#include <cstdint>

#include "specd/detail/bits.h"
#include "specd/host_device.h"
#include "specd/sampling_batch.h"

namespace specd::detail {

// Row readers: logit i of one row as float, for each LogitsDtype. at(data, offset) is the
// row starting `offset` elements into `data`.
struct Float32Row {
  const float* data;
  SPECD_HOST_DEVICE static Float32Row at(const void* base, int64_t offset) {
    return Float32Row{static_cast<const float*>(base) + offset};
  }
  SPECD_HOST_DEVICE float operator()(int32_t i) const { return data[i]; }
};
struct Float16Row {
  const uint16_t* data;
  SPECD_HOST_DEVICE static Float16Row at(const void* base, int64_t offset) {
    return Float16Row{static_cast<const uint16_t*>(base) + offset};
  }
  SPECD_HOST_DEVICE float operator()(int32_t i) const { return half_to_float(data[i]); }
};
struct BFloat16Row {
  const uint16_t* data;
  SPECD_HOST_DEVICE static BFloat16Row at(const void* base, int64_t offset) {
    return BFloat16Row{static_cast<const uint16_t*>(base) + offset};
  }
  SPECD_HOST_DEVICE float operator()(int32_t i) const { return bfloat16_to_float(data[i]); }
};

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
