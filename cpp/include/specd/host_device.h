// SPECD_HOST_DEVICE marks small inline functions that state a rule once for both the CPU
// reference (g++) and the CUDA kernel (nvcc), so the two cannot drift apart.
#pragma once

#if defined(__CUDACC__)
#define SPECD_HOST_DEVICE __host__ __device__
#else
#define SPECD_HOST_DEVICE
#endif
