// Helpers for the CUDA kernel tests: a device buffer that frees itself, host <-> device
// copies of vectors, fp16/bf16 conversions of host data, and the skip used without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "specd/cuda/runtime.h"
#include "specd/kv_layout.h"

namespace specd::testing {

#define SPECD_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define SPECD_SKIP_WITHOUT_GPU() \
  if (::specd::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine"

// Compute capability major of the current device (0 when it cannot be read).
inline int device_major() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 0;
  return major;
}

// Skips unless the device runs thread-block clusters (sm_90+; the RowSplit::kCluster kernels).
#define SPECD_SKIP_WITHOUT_CLUSTERS()                                                              \
  SPECD_SKIP_WITHOUT_GPU();                                                                        \
  if (::specd::testing::device_major() < 9)                                                        \
  GTEST_SKIP() << "compute capability " << ::specd::testing::device_major() << ".x: no thread-block clusters"

// Device copy of a host vector (freed on destruction; null on allocation failure).
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : size_(host.size()) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(1, size_) * sizeof(T)) != cudaSuccess) {
      ptr_ = nullptr;
      return;
    }
    if (size_ > 0) cudaMemcpy(ptr_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  std::vector<T> to_host() const {
    std::vector<T> host(size_);
    if (size_ > 0) cudaMemcpy(host.data(), ptr_, size_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

// The byte image of a `dtype` array holding `values` rounded to nearest even; `rounded`
// receives the float values the elements hold.
inline std::vector<unsigned char> encode_floats(const std::vector<float>& values, KvDtype dtype,
                                                std::vector<float>* rounded) {
  const std::size_t esize = static_cast<std::size_t>(kv_dtype_size(dtype));
  std::vector<unsigned char> bytes(values.size() * esize);
  rounded->resize(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == KvDtype::kFloat32) {
      std::memcpy(&bytes[i * 4], &values[i], 4);
      (*rounded)[i] = values[i];
    } else if (dtype == KvDtype::kFloat16) {
      const __half h = __float2half_rn(values[i]);
      std::memcpy(&bytes[i * 2], &h, 2);
      (*rounded)[i] = __half2float(h);
    } else {
      const __nv_bfloat16 b = __float2bfloat16_rn(values[i]);
      std::memcpy(&bytes[i * 2], &b, 2);
      (*rounded)[i] = __bfloat162float(b);
    }
  }
  return bytes;
}

// Float values of a dtype array's byte image.
inline std::vector<float> decode_floats(const std::vector<unsigned char>& bytes, KvDtype dtype) {
  const std::size_t esize = static_cast<std::size_t>(kv_dtype_size(dtype));
  std::vector<float> values(bytes.size() / esize);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (dtype == KvDtype::kFloat32) {
      std::memcpy(&values[i], &bytes[i * 4], 4);
    } else if (dtype == KvDtype::kFloat16) {
      __half h;
      std::memcpy(&h, &bytes[i * 2], 2);
      values[i] = __half2float(h);
    } else {
      __nv_bfloat16 b;
      std::memcpy(&b, &bytes[i * 2], 2);
      values[i] = __bfloat162float(b);
    }
  }
  return values;
}

}  // namespace specd::testing
