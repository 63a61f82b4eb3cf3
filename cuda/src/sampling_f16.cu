// The sampling kernels for float16 logits (detail/sampling_launch.h).
#include "detail/sampling_kernels.cuh"

template struct specd::cuda::detail::SamplingLaunch<specd::detail::Float16Row>;
