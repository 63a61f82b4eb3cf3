#include "specd/cuda/runtime.h"

namespace specd::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver"/"no device" error
    return 0;
  }
  return n;
}

const char* error_string(cudaError_t err) { return cudaGetErrorString(err); }

}  // namespace specd::cuda
