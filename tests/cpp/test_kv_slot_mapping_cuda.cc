// The CUDA slot-mapping kernel against the CPU reference on random inputs (exact equality),
// including padding, out-of-table tokens and a row stride wider than the table. Skips, saying
// why, when no CUDA device is present (the kernel is still compiled and linked).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>
#include <vector>

#include "specd/cuda/kv_slot_mapping.h"
#include "specd/cuda/runtime.h"
#include "specd/kv_slot_mapping.h"

namespace specd {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

template <class T>
T* to_device(const std::vector<T>& host) {
  T* ptr = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<std::size_t>(1, host.size()) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return ptr;
}

TEST(SlotMappingCuda, MatchesCpuReference) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  std::mt19937 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t rows = 1 + static_cast<int32_t>(rng() % 64);
    const int32_t width = 1 + static_cast<int32_t>(rng() % 32);
    const int32_t stride = width + static_cast<int32_t>(rng() % 3);
    const int32_t block = 1 + static_cast<int32_t>(rng() % 32);
    const int32_t tokens = static_cast<int32_t>(rng() % 5000);
    std::vector<int32_t> table(static_cast<std::size_t>(rows) * stride);
    for (auto& v : table) v = static_cast<int32_t>(rng() % 100000) - 1000;  // some negative
    std::vector<int32_t> seqs(static_cast<std::size_t>(tokens)), pos(static_cast<std::size_t>(tokens));
    for (int32_t t = 0; t < tokens; ++t) {
      seqs[t] = static_cast<int32_t>(rng() % (rows + 2)) - 1;      // -1 and rows out of range
      pos[t] = static_cast<int32_t>(rng() % (width * block + 8)) - 2;  // some past the table
    }
    SlotMappingParams p;
    p.num_seqs = rows;
    p.table_width = width;
    p.table_stride = stride;
    p.num_tokens = tokens;
    p.block_size = block;
    std::vector<int64_t> want(seqs.size());
    p.block_table = table.data();
    p.seq_index = seqs.data();
    p.positions = pos.data();
    p.slots = want.data();
    ASSERT_TRUE(slot_mapping_cpu(p).ok());

    int32_t* d_table = to_device(table);
    int32_t* d_seqs = to_device(seqs);
    int32_t* d_pos = to_device(pos);
    int64_t* d_out = to_device(std::vector<int64_t>(seqs.size(), 777));
    ASSERT_TRUE(d_table && d_seqs && d_pos && d_out);
    p.block_table = d_table;
    p.seq_index = d_seqs;
    p.positions = d_pos;
    p.slots = d_out;
    cudaStream_t stream = nullptr;
    CUDA_OK(cudaStreamCreate(&stream));
    CUDA_OK(cuda::slot_mapping(p, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<int64_t> got(seqs.size());
    CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want) << "trial " << trial;
    cudaStreamDestroy(stream);
    cudaFree(d_table);
    cudaFree(d_seqs);
    cudaFree(d_pos);
    cudaFree(d_out);
  }
}

TEST(SlotMappingCuda, RejectsInvalidSizesWithoutLaunching) {
  // Validation happens on the host, so this runs without a device too.
  SlotMappingParams p;
  p.block_size = 0;
  EXPECT_EQ(cuda::slot_mapping(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace specd
