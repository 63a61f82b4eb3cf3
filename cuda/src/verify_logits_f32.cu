// Verification from the target's float32 logits (detail/verify_logits_launch.h).
#include "detail/verify_logits_kernels.cuh"

template struct specd::cuda::detail::VerifyLogitsLaunch<specd::detail::Float32Row>;
