// CUDA runtime facts for the rest of specd. The runtime is linked statically, so these calls
// work (and answer "no device") on machines without a GPU or driver.
#pragma once

#include <cuda_runtime_api.h>

namespace specd::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int device_count();

// Human-readable text of a CUDA error code (for error messages).
const char* error_string(cudaError_t err);

}  // namespace specd::cuda
