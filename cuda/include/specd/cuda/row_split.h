// RowSplit: how many thread blocks work on one row (a logits / probability row of the
// sampling and stochastic verification kernels, cuda/sampling.h and cuda/verify.h).
//
// - kOneBlock: one thread block per row (per request for verification). Every GPU. These are
//   the kernels validated and timed on an H100 (docs/benchmarks.md).
// - kCluster: a thread-block cluster of kRowSplitClusterBlocks blocks per row (sm_90+): the
//   row's passes spread over that many multiprocessors, the collectives combined through
//   distributed shared memory (cuda/src/detail/cluster_block.cuh). The same row algorithm and
//   rules; sums fold in another fixed order, so the CPU-equality caveats of the kernels hold
//   alike (deterministic run to run). Where clusters cannot run (the device cannot launch
//   them, or the loaded code predates sm_90), kOneBlock runs instead.
//   Compiled and tested here; NOT YET RUN ON A GPU.
#pragma once

#include <cstdint>

namespace specd::cuda {

enum class RowSplit : int32_t { kOneBlock = 0, kCluster = 1 };
inline constexpr int kRowSplitClusterBlocks = 8;

}  // namespace specd::cuda
