// Device-side element types of specd::KvDtype: conversion to and from float, and a dispatch
// from the runtime dtype to a template parameter. Used by the KV and attention kernels only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "specd/kv_layout.h"

namespace specd::cuda::detail {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the CUDA type of `dtype` and returns its result;
// cudaErrorInvalidValue for a value that is not a KvDtype enumerator.
template <class F>
cudaError_t dispatch_kv_dtype(KvDtype dtype, F&& f) {
  switch (dtype) {
    case KvDtype::kFloat32: return f(TypeTag<float>{});
    case KvDtype::kFloat16: return f(TypeTag<__half>{});
    case KvDtype::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace specd::cuda::detail
