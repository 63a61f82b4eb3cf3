// The sampling kernels for bfloat16 logits (detail/sampling_launch.h).
#include "detail/sampling_kernels.cuh"

template struct specd::cuda::detail::SamplingLaunch<specd::detail::BFloat16Row>;
