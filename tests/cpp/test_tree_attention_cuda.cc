// The CUDA tree-attention kernel against the CPU reference on random batches: fp32, fp16 and
// bf16 (inputs rounded on the host, the reference computed from the rounded values), head_dim
// from 1 to 256, GQA groups, trees past 64 nodes (two mask words), causal (no mask), wider
// q/out token strides, and keys past the block table (skipped by both). The grouped, split
// kernel (cuda/tree_attention_grouped.h) against the same reference: groups of 1 to 16 query
// heads per kv head (two blocks per group past 8), 1 to 64 splits, histories up to 3000 keys. Tolerances: fp32 1e-4,
// fp16 4e-3, bf16 3e-2 (relative to 1 + |expected|: the output is rounded to the dtype and the
// kernel accumulates in float). Skips without a CUDA device; argument validation runs anyway.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "specd/cuda/tree_attention.h"
#include "specd/cuda/tree_attention_grouped.h"
#include "specd/tree_attention.h"
#include "tree_attention_test_util.h"

namespace specd::testing {
namespace {

double tolerance(KvDtype dtype) {
  return dtype == KvDtype::kFloat32 ? 1e-4 : dtype == KvDtype::kFloat16 ? 4e-3 : 3e-2;
}

// Runs one batch in `dtype` on the device and through the CPU reference; compares.
// grouped_splits 0: the per-head kernel; else the grouped kernel with that max_splits.
void check_batch(AttnBatch b, KvDtype dtype, bool with_mask, int64_t extra_stride, const char* label,
                 int32_t grouped_splits = 0) {
  const int64_t esize = kv_dtype_size(dtype);
  const int32_t dim = b.cache.layout.head_dim;
  const int64_t row = int64_t{b.q_heads} * dim, stride = row + extra_stride;
  const int32_t tokens = b.query_start.back();
  // q with the wider stride (padding filled with garbage the kernel must not read into out).
  std::vector<float> q_strided(static_cast<std::size_t>(tokens * stride), 1e4f);
  for (int32_t t = 0; t < tokens; ++t)
    for (int64_t e = 0; e < row; ++e)
      q_strided[static_cast<std::size_t>(t * stride + e)] = b.q[static_cast<std::size_t>(t * row + e)];
  std::vector<float> q_rounded, k_rounded, v_rounded;
  const std::vector<unsigned char> q_bytes = encode_floats(q_strided, dtype, &q_rounded);
  const std::vector<unsigned char> k_bytes = encode_floats(b.cache.k, dtype, &k_rounded);
  const std::vector<unsigned char> v_bytes = encode_floats(b.cache.v, dtype, &v_rounded);
  b.cache.k = k_rounded;
  b.cache.v = v_rounded;

  std::vector<float> want;
  TreeAttentionParams p = attn_params(b, &want, with_mask);
  want.assign(static_cast<std::size_t>(tokens * stride), 0.f);
  p.q = q_rounded.data();
  p.q_token_stride = stride;
  p.out = want.data();
  p.out_token_stride = stride;
  ASSERT_TRUE(tree_attention_cpu(p).ok());

  const std::vector<unsigned char> out_init(static_cast<std::size_t>(tokens * stride * esize), 0);
  DeviceBuffer<unsigned char> d_q(q_bytes), d_k(k_bytes), d_v(v_bytes), d_out(out_init);
  DeviceBuffer<int32_t> d_table(b.cache.table), d_start(b.query_start), d_lens(b.kv_lens);
  DeviceBuffer<uint64_t> d_mask(b.mask);
  DeviceBuffer<int32_t> d_trees(b.tree_lens.empty() ? std::vector<int32_t>{0} : b.tree_lens);
  ASSERT_TRUE(d_q.get() && d_k.get() && d_v.get() && d_out.get() && d_table.get() && d_start.get() &&
              d_lens.get() && d_mask.get() && d_trees.get());
  p.dtype = dtype;
  p.q = d_q.get();
  p.k_cache = d_k.get();
  p.v_cache = d_v.get();
  p.out = d_out.get();
  p.block_table = d_table.get();
  p.query_start = d_start.get();
  p.kv_lens = d_lens.get();
  p.tree_mask = with_mask ? d_mask.get() : nullptr;
  p.tree_lens = b.tree_lens.empty() ? nullptr : d_trees.get();
  if (grouped_splits == 0) {
    SPECD_CUDA_OK(cuda::tree_attention(p, nullptr));
  } else {
    // Workspace filled with NaN: a merge that read a split the kernel did not write shows.
    const int64_t floats = cuda::tree_attention_grouped_workspace_floats(p, grouped_splits);
    DeviceBuffer<float> d_ws(std::vector<float>(static_cast<std::size_t>(floats), std::nanf("")));
    ASSERT_TRUE(d_ws.get());
    cuda::TreeAttentionWorkspace ws;
    ws.data = floats > 0 ? d_ws.get() : nullptr;
    ws.floats = floats;
    ws.max_splits = grouped_splits;
    SPECD_CUDA_OK(cuda::tree_attention_grouped(p, ws, nullptr));
  }
  SPECD_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = decode_floats(d_out.to_host(), dtype);
  ASSERT_EQ(got.size(), want.size());
  const double tol = tolerance(dtype);
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i])))
        << label << " dtype " << kv_dtype_name(dtype) << " splits " << grouped_splits << " element " << i << " of "
        << got.size();
}

// check_batch in fp32, fp16 and bf16; the trial number picks the mask (none every fifth) and
// a wider token stride (every third).
void check_dtypes(const AttnBatch& b, int trial, const std::string& label, int32_t grouped_splits = 0) {
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kFloat16, KvDtype::kBFloat16}) {
    check_batch(b, dtype, /*with_mask=*/trial % 5 != 4, /*extra_stride=*/trial % 3 == 0 ? 3 : 0, label.c_str(),
                grouped_splits);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(TreeAttentionCuda, MatchesCpuReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(53);
  const int32_t dims[] = {1, 7, 32, 64, 80, 128, 256};
  for (int trial = 0; trial < 42; ++trial) {
    const int32_t dim = dims[trial % 7];
    const int32_t max_drafts = trial % 6 == 5 ? 80 : 1 + static_cast<int32_t>(rng() % 16);
    const int32_t history = trial % 4 == 3 ? 1000 : 60;
    AttnBatch b = random_attn_batch(rng, 1 + static_cast<int32_t>(rng() % 6), max_drafts,
                                    1 + static_cast<int32_t>(rng() % 4), dim, history);
    check_dtypes(b, trial, "trial " + std::to_string(trial));
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(TreeAttentionCuda, TreeLensMatchCpuReference) {
  // Only the newest nodes of each tree as queries (tree_lens = the tree): both kernels follow
  // the reference, with and without a mask, in every dtype.
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(61);
  for (int trial = 0; trial < 12; ++trial) {
    const int32_t max_drafts = trial % 6 == 5 ? 80 : 1 + static_cast<int32_t>(rng() % 16);
    const AttnBatch full = random_attn_batch(rng, 1 + static_cast<int32_t>(rng() % 6), max_drafts,
                                             1 + static_cast<int32_t>(rng() % 4), trial % 2 ? 64 : 0, 60);
    std::vector<int32_t> keep;
    for (std::size_t s = 0; s < full.trees.size(); ++s)
      keep.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(full.query_start[s + 1] - full.query_start[s] + 1)));
    const AttnBatch part = newest_queries(full, keep);
    for (int32_t splits : {0, 1, 4}) {
      check_dtypes(part, trial, "tree_lens trial " + std::to_string(trial), splits);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// A batch whose request `r` has its last `uncovered` positions past its block table: both the
// kernel and the reference skip them.
void check_uncovered_keys(std::mt19937& rng, int32_t seqs, int32_t group, int32_t dim, int32_t history, int32_t r,
                          int32_t uncovered, KvDtype dtype, int32_t grouped_splits = 0) {
  AttnBatch b = random_attn_batch(rng, seqs, 6, group, dim, history);
  b.kv_lens[static_cast<std::size_t>(r)] = b.cache.width * b.cache.layout.block_size + uncovered;
  check_batch(b, dtype, true, 0, "uncovered keys", grouped_splits);
}

TEST(TreeAttentionCuda, SkipsKeysPastTheBlockTableLikeTheReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(59);
  check_uncovered_keys(rng, 3, 2, 64, 30, 1, 5, KvDtype::kFloat32);
}

TEST(TreeAttentionCuda, WarpCountFollowsTheGridSize) {
  EXPECT_EQ(cuda::tree_attention_warps(1, 132), cuda::kTreeAttentionWarpsMany);
  EXPECT_EQ(cuda::tree_attention_warps(4 * 132, 132), cuda::kTreeAttentionWarpsMany);
  EXPECT_EQ(cuda::tree_attention_warps(4 * 132 + 1, 132), cuda::kTreeAttentionWarpsFew);
  EXPECT_EQ(cuda::tree_attention_warps(1, 0), cuda::kTreeAttentionWarpsFew);  // no device: the safe choice
}

// Grids on both sides of the rule's threshold on this GPU: both kernel widths match the CPU.
TEST(TreeAttentionCuda, BothWarpCountsMatchCpuReference) {
  SPECD_SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  SPECD_CUDA_OK(cudaGetDevice(&device));
  SPECD_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::mt19937 rng(67);
  bool saw[2] = {false, false};
  for (int trial = 0; trial < 40 && !(saw[0] && saw[1]); ++trial) {
    const bool large = trial % 2 == 1;
    AttnBatch b = random_attn_batch(rng, large ? 24 : 1, large ? 80 : 8, large ? 8 : 2, 64, 300);
    const int64_t grid = int64_t{b.query_start.back()} * b.q_heads;
    const bool many = cuda::tree_attention_warps(grid, sms) == cuda::kTreeAttentionWarpsMany;
    saw[many ? 1 : 0] = true;
    for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBFloat16}) {
      check_batch(b, dtype, /*with_mask=*/true, 0, many ? "16 warps" : "4 warps");
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  EXPECT_TRUE(saw[0] && saw[1]) << "the trials did not cover both warp counts";
}

TEST(TreeAttentionGroupedCuda, MatchesCpuReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(79);
  const int32_t dims[] = {1, 7, 32, 64, 80, 128, 256};
  const int32_t groups[] = {1, 2, 7, 8, 12, 16};
  const int32_t splits[] = {1, 3, 64, 5};
  for (int trial = 0; trial < 48; ++trial) {
    const int32_t dim = dims[trial % 7];
    const int32_t group = groups[trial % 6];
    const int32_t max_drafts = trial % 8 == 7 ? 80 : 1 + static_cast<int32_t>(rng() % 16);
    const int32_t history = trial % 8 == 3 ? 3000 : trial % 4 == 1 ? 600 : 60;
    AttnBatch b = random_attn_batch(rng, 1 + static_cast<int32_t>(rng() % 5), max_drafts, group, dim, history);
    check_dtypes(b, trial, "grouped trial " + std::to_string(trial) + " group " + std::to_string(group),
                 splits[(trial / 7) % 4]);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(TreeAttentionGroupedCuda, SkipsKeysPastTheBlockTableLikeTheReference) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(83);
  check_uncovered_keys(rng, 3, 4, 64, 400, 1, 5, KvDtype::kFloat32, 8);
  if (HasFatalFailure()) return;
  check_uncovered_keys(rng, 2, 8, 128, 2000, 0, 40, KvDtype::kBFloat16, 16);  // in a later split
}

TEST(TreeAttentionGroupedCuda, SplitsAndWorkspaceFollowTheGrid) {
  EXPECT_EQ(cuda::tree_attention_grouped_blocks(5, 14, 2), 10);   // group 7: one block per kv head
  EXPECT_EQ(cuda::tree_attention_grouped_blocks(1, 32, 2), 4);    // group 16: two blocks per kv head
  EXPECT_EQ(cuda::tree_attention_grouped_blocks(0, 14, 2), 0);
  EXPECT_EQ(cuda::tree_attention_grouped_max_splits(10, 132), 53);  // ceil(4 * 132 / 10)
  EXPECT_EQ(cuda::tree_attention_grouped_max_splits(1, 132), cuda::kTreeAttentionMaxSplits);
  EXPECT_EQ(cuda::tree_attention_grouped_max_splits(64 * 9 * 2, 132), 1);
  EXPECT_EQ(cuda::tree_attention_grouped_max_splits(10, 0), 1);
  std::mt19937 rng(89);
  const AttnBatch b = random_attn_batch(rng, 2, 3, 2, 16, 10);
  std::vector<float> out;
  const TreeAttentionParams p = attn_params(b, &out);
  EXPECT_EQ(cuda::tree_attention_grouped_workspace_floats(p, 1), 0);
  EXPECT_EQ(cuda::tree_attention_grouped_workspace_floats(p, 3), int64_t{p.num_tokens} * p.q_heads * 3 * 18);
}

TEST(TreeAttentionGroupedCuda, RejectsBadSplitsAndMissingWorkspaceWithoutLaunching) {
  std::mt19937 rng(97);
  const AttnBatch b = random_attn_batch(rng, 1, 2, 2, 8, 4);
  std::vector<float> out;
  const TreeAttentionParams p = attn_params(b, &out);
  cuda::TreeAttentionWorkspace ws;
  EXPECT_TRUE(cuda::validate_tree_attention_grouped_launch(p, ws).ok());  // one split: no workspace
  ws.max_splits = 0;
  EXPECT_FALSE(cuda::validate_tree_attention_grouped_launch(p, ws).ok());
  ws.max_splits = cuda::kTreeAttentionMaxSplits + 1;
  EXPECT_FALSE(cuda::validate_tree_attention_grouped_launch(p, ws).ok());
  ws.max_splits = 4;
  const Status missing = cuda::validate_tree_attention_grouped_launch(p, ws);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("workspace"), std::string::npos) << missing.message();
  EXPECT_EQ(cuda::tree_attention_grouped(p, ws, nullptr), cudaErrorInvalidValue);
  std::vector<float> small(static_cast<std::size_t>(cuda::tree_attention_grouped_workspace_floats(p, 4) - 1));
  ws.data = small.data();
  ws.floats = static_cast<int64_t>(small.size());
  EXPECT_FALSE(cuda::validate_tree_attention_grouped_launch(p, ws).ok());
  ws.floats += 1;
  EXPECT_TRUE(cuda::validate_tree_attention_grouped_launch(p, ws).ok());
}

TEST(TreeAttentionCuda, RejectsUnsupportedShapesWithoutLaunching) {
  std::mt19937 rng(61);
  const AttnBatch b = random_attn_batch(rng, 1, 2, 1, 8, 4);
  std::vector<float> out;
  TreeAttentionParams p = attn_params(b, &out);
  EXPECT_TRUE(cuda::validate_tree_attention_launch(p).ok());
  p.layout.head_dim = cuda::kTreeAttentionMaxHeadDim + 1;
  p.layout.page_stride = int64_t{p.layout.block_size} * p.layout.kv_heads * p.layout.head_dim;
  p.q_token_stride = p.out_token_stride = int64_t{p.q_heads} * p.layout.head_dim;
  EXPECT_FALSE(cuda::validate_tree_attention_launch(p).ok());
  EXPECT_EQ(cuda::tree_attention(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace specd::testing
