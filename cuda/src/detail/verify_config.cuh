// The verification kernels' launch shapes and block types, shared by verify.cu and the
// per-dtype translation units of verification from the logits (verify_logits_kernels.cuh).
#pragma once

#include "cluster_block.cuh"
#include "device_block.cuh"
#include "specd/cuda/row_split.h"

namespace specd::cuda {
namespace {

constexpr int kThreads = 256;         // stochastic: threads per request (fixes its sums' order)
constexpr int kGreedyThreads = 1024;  // greedy from logits: the argmax does not depend on it
constexpr int kTokensThreads = 128;   // greedy tokens: requests per block, one thread each
// Stochastic, a cluster per request: blocks per SM the registers must allow (80 registers:
// 64 requests' 512 blocks in 1.3 waves on an H100, the configuration timed there; left to
// itself ptxas takes 127 since the row options, 2 blocks per SM).
constexpr int kStochasticClusterMinBlocks = 3;
using Block = detail::DeviceBlock<kThreads>;
using ClusterBlk = detail::ClusterBlock<kThreads, kRowSplitClusterBlocks>;
// From logits: the row plan's radix selections (top-k / top-p) keep their candidates once they
// fit, as in the sampling kernels (32 KiB of shared memory per block), so their later levels
// read the cache instead of the row. The sums fold as without it.
constexpr int kPlanCache = 2048;
using PlanBlock = detail::DeviceBlock<kThreads, kPlanCache>;
using PlanClusterBlk = detail::ClusterBlock<kThreads, kRowSplitClusterBlocks, kPlanCache>;
using GreedyBlock = detail::DeviceBlock<kGreedyThreads>;

}  // namespace
}  // namespace specd::cuda
