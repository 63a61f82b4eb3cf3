// Launching a kernel as thread-block clusters of kRowSplitClusterBlocks blocks per row
// (specd/cuda/row_split.h), and whether it can run that way on the current device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "specd/cuda/row_split.h"

namespace specd::cuda::detail {

// Whether `kernel` can run as clusters here: the device launches clusters and the code loaded
// for it was built for sm_90 or later (a build for older GPUs has an empty body only).
template <class Kernel>
bool cluster_ready(Kernel kernel) {
  int device = 0, supported = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrClusterLaunch, device) != cudaSuccess || supported == 0)
    return false;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) return false;
  return attributes.binaryVersion >= 90;
}

// `rows` clusters of kRowSplitClusterBlocks blocks of `threads` threads (cluster c: row c).
template <class Kernel, class... Args>
cudaError_t launch_clustered(Kernel kernel, int32_t rows, int threads, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows) * kRowSplitClusterBlocks);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = kRowSplitClusterBlocks;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// The clustered kernel where `split` asks for it and cluster_ready says it can run, else the
// one-block kernel (`rows` blocks of `one_block_threads`); returns the launch error.
template <class OneBlock, class Clustered, class... Args>
cudaError_t launch_rows(RowSplit split, OneBlock one_block, int one_block_threads, Clustered clustered,
                        int cluster_threads, int32_t rows, cudaStream_t stream, Args... args) {
  if (split == RowSplit::kCluster && cluster_ready(clustered)) {
    const cudaError_t err = launch_clustered(clustered, rows, cluster_threads, stream, args...);
    if (err != cudaSuccess) return err;
  } else {
    one_block<<<static_cast<unsigned>(rows), one_block_threads, 0, stream>>>(args...);
  }
  return cudaGetLastError();
}

}  // namespace specd::cuda::detail
