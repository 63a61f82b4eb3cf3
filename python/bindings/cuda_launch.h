// What the CUDA launcher bindings share: the stream from the integer torch passes
// (torch.cuda.current_stream().cuda_stream) and a launch error raised as a Python exception.
#pragma once

#ifdef SPECD_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "errors.h"
#include "specd/cuda/runtime.h"

namespace specd::py_bind {

inline cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

inline void check_launch(cudaError_t err, const char* kernel) {
  if (err != cudaSuccess)
    raise_status(error_status(StatusCode::kInternal, kernel, " kernel launch failed: ", cuda::error_string(err)));
}

}  // namespace specd::py_bind
#endif
