// The CUDA batched-verification kernels against the CPU: every output (tokens, path, counts,
// statuses) equal to the batched CPU version, and results equal to the single-request
// references, on random batches of chains and trees with mixed k (0 included), with and
// without draft rows, both draft sampling modes, plus requests with bad inputs; and a
// statistical check that GPU stochastic verification is lossless (the first emitted token
// follows the target distribution, chi-square). Stochastic verification and greedy verification
// from rows run with one block and with a thread-block cluster per request (RowSplit);
// stochastic verification from probability rows and from the target's logits
// (verify_stochastic_logits_batch). Skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "block_manager_test_util.h"
#include "cuda_test_util.h"
#include "specd/cuda/verify.h"
#include "specd/verify_batch.h"
#include "verify_batch_test_util.h"
#include "verify_logits_test_util.h"
#include "verify_lossless_test_util.h"

namespace specd::testing {
namespace {

// Host versions of StochasticRowOptions for run_gpu (null: not given).
struct HostRowOptions {
  const IndexedDraft* indexed = nullptr;  // kStochastic's draft rows through its draft_index
  const std::vector<double>* target_totals = nullptr;
  const std::vector<double>* draft_totals = nullptr;
};

// Waits for `stream`, destroys it and copies the outputs' device buffers into `out`.
void download_outputs(cudaStream_t stream, const DeviceBuffer<int32_t>& tokens, const DeviceBuffer<int32_t>& path,
                      const DeviceBuffer<int32_t>& accepted, const DeviceBuffer<int32_t>& status, BatchOutputs* out) {
  SPECD_CUDA_OK(cudaStreamSynchronize(stream));
  SPECD_CUDA_OK(cudaStreamDestroy(stream));
  out->tokens = tokens.to_host();
  out->path = path.to_host();
  out->num_accepted = accepted.to_host();
  out->status = status.to_host();
}

// Uploads the run's inputs, runs the kernel of `kind` (the kinds from rows with `split`), downloads `out`.
void run_gpu(const VerifyCase& c, VerifyKind kind, BatchOutputs* out, bool with_path = true,
             cuda::RowSplit split = cuda::RowSplit::kOneBlock, const HostRowOptions& host_options = {}) {
  const IndexedDraft* indexed = host_options.indexed;
  DeviceBuffer<int32_t> offsets(c.offsets), parents(c.parents), tokens(c.tokens), target_tokens(c.target_tokens);
  DeviceBuffer<float> target(c.target), draft(indexed != nullptr ? indexed->rows : c.draft), logits(c.logits);
  DeviceBuffer<int32_t> draft_index(indexed != nullptr ? indexed->index : std::vector<int32_t>{0});
  const std::vector<double> none{0.0};
  const auto* tt = host_options.target_totals;
  const auto* dt = host_options.draft_totals;
  DeviceBuffer<double> target_totals(tt != nullptr ? *tt : none), draft_totals(dt != nullptr ? *dt : none);
  const StochasticRowOptions options{indexed != nullptr ? draft_index.get() : nullptr,
                                     tt != nullptr ? target_totals.get() : nullptr,
                                     dt != nullptr ? draft_totals.get() : nullptr};
  DeviceBuffer<RngKey> keys(c.keys);
  DeviceBuffer<int32_t> o_tokens(out->tokens), o_path(out->path), o_accepted(out->num_accepted), o_status(out->status);
  ASSERT_TRUE(offsets.get() && parents.get() && tokens.get() && target_tokens.get() && target.get() && draft.get() &&
              logits.get() && keys.get() && o_tokens.get() && o_path.get() && o_accepted.get() && o_status.get());
  const TreeBatchView trees{offsets.get(), parents.get(), tokens.get(), c.batch(), c.num_nodes()};
  const VerifyOutputs o{o_tokens.get(), with_path ? o_path.get() : nullptr, o_accepted.get(), o_status.get(),
                        out->stride};
  const ProbRows p{target.get(), c.num_nodes(), c.vocab, c.stride},
      q{draft.get(), indexed != nullptr ? indexed->num_rows : c.num_nodes(), c.vocab, c.stride};
  cudaStream_t stream = nullptr;
  SPECD_CUDA_OK(cudaStreamCreate(&stream));
  switch (kind) {
    case VerifyKind::kGreedyRows:
      SPECD_CUDA_OK(cuda::verify_greedy_batch(
          trees, LogitRows{logits.get(), LogitsDtype::kFloat32, c.num_nodes(), c.vocab, c.stride}, o, stream, split));
      break;
    case VerifyKind::kGreedyTokens:
      SPECD_CUDA_OK(cuda::verify_greedy_tokens_batch(trees, target_tokens.get(), o, stream));
      break;
    case VerifyKind::kStochastic:
      SPECD_CUDA_OK(cuda::verify_stochastic_batch(trees, p, &q, c.sampling, keys.get(), o, stream, split, options));
      break;
    case VerifyKind::kStochasticNoDraft:
      SPECD_CUDA_OK(cuda::verify_stochastic_batch(trees, p, nullptr, c.sampling, keys.get(), o, stream, split,
                                                  StochasticRowOptions{nullptr, options.target_totals, nullptr}));
      break;
  }
  download_outputs(stream, o_tokens, o_path, o_accepted, o_status, out);
}

class VerifyCuda : public ::testing::TestWithParam<KindCase> {};

bool stochastic(VerifyKind kind) { return kind == VerifyKind::kStochastic || kind == VerifyKind::kStochasticNoDraft; }

// The splits a kind runs with: verification from rows also with a cluster per request.
std::vector<cuda::RowSplit> splits_of(VerifyKind kind) {
  if (kind != VerifyKind::kGreedyTokens) return {cuda::RowSplit::kOneBlock, cuda::RowSplit::kCluster};
  return {cuda::RowSplit::kOneBlock};
}

std::string split_name(cuda::RowSplit split) {
  return split == cuda::RowSplit::kOneBlock ? "" : ", a cluster per request";
}

TEST_P(VerifyCuda, MatchesCpuBatchAndReference) {
  SPECD_SKIP_WITHOUT_GPU();
  const KindCase& k = GetParam();
  for (int32_t vocab : {2, 5, 33, 257, 1000, 32000}) {
    const BatchRun run = make_run(300 + static_cast<uint64_t>(vocab), vocab >= 32000 ? 24 : 150, vocab, k.how, k.kind);
    for (cuda::RowSplit split : splits_of(k.kind)) {
      const std::string what = std::string(k.name) + " vocab " + std::to_string(vocab) + split_name(split);
      BatchOutputs gpu(run.c.batch(), run.c.num_nodes()), cpu(run.c.batch(), run.c.num_nodes());
      run_gpu(run.c, k.kind, &gpu, true, split);
      run_cpu(run, k.kind, &cpu);
      if (HasFatalFailure()) return;
      EXPECT_EQ(gpu.status, cpu.status) << what;
      EXPECT_EQ(gpu.num_accepted, cpu.num_accepted) << what;
      EXPECT_EQ(gpu.tokens, cpu.tokens) << what;
      EXPECT_EQ(gpu.path, cpu.path) << what;
      EXPECT_EQ(compare_verify(run.c, run.want, gpu, what), 0);
      expect_error_codes(run, gpu);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, VerifyCuda,
    ::testing::Values(KindCase{"greedy_rows", Proposal::kGreedy, VerifyKind::kGreedyRows},
                      KindCase{"greedy_tokens", Proposal::kGreedy, VerifyKind::kGreedyTokens},
                      KindCase{"draft_without_replacement", Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic},
                      KindCase{"draft_independent", Proposal::kDraftIndependent, VerifyKind::kStochastic},
                      KindCase{"one_hot", Proposal::kOneHot, VerifyKind::kStochasticNoDraft}),
    [](const ::testing::TestParamInfo<KindCase>& info) { return std::string(info.param.name); });

// Greedy verification from 16-bit logits (their grouped pass keeps raw words, more groups in
// flight than float32 rows): the CPU batch version's outputs on the same words, with one block
// and with a cluster per request, for fp16 and bf16 rows (the greedy case's logits truncated
// to 16 bits: many ties, which the lowest id breaks).
TEST(VerifyCudaGreedy, SixteenBitLogitsMatchCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  for (int32_t vocab : {7, 33, 1000, 151936}) {
    const BatchRun run = make_run(900 + static_cast<uint64_t>(vocab), vocab > 1000 ? 12 : 60, vocab,
                                  Proposal::kGreedy, VerifyKind::kGreedyRows);
    const VerifyCase& c = run.c;
    for (LogitsDtype dtype : {LogitsDtype::kFloat16, LogitsDtype::kBFloat16}) {
      std::vector<uint16_t> words(c.logits.size());
      for (std::size_t i = 0; i < words.size(); ++i) {
        uint32_t bits = 0;
        std::memcpy(&bits, &c.logits[i], 4);
        words[i] = dtype == LogitsDtype::kBFloat16 ? static_cast<uint16_t>(bits >> 16)
                                                   : static_cast<uint16_t>(0x3C00 + (bits >> 20) % 0x400);
      }
      BatchOutputs cpu(c.batch(), c.num_nodes());
      SPECD_ASSERT_OK(verify_greedy_batch_cpu(c.view(), LogitRows{words.data(), dtype, c.num_nodes(), c.vocab, c.stride},
                                              cpu.view()));
      for (cuda::RowSplit split : {cuda::RowSplit::kOneBlock, cuda::RowSplit::kCluster}) {
        const std::string what = std::string(dtype == LogitsDtype::kBFloat16 ? "bf16" : "fp16") + ", vocab " +
                                 std::to_string(vocab) + split_name(split);
        DeviceBuffer<int32_t> offsets(c.offsets), parents(c.parents), tokens(c.tokens);
        DeviceBuffer<uint16_t> logits(words);
        BatchOutputs gpu(c.batch(), c.num_nodes());
        DeviceBuffer<int32_t> o_tokens(gpu.tokens), o_path(gpu.path), o_accepted(gpu.num_accepted), o_status(gpu.status);
        ASSERT_TRUE(offsets.get() && parents.get() && tokens.get() && logits.get() && o_tokens.get() && o_path.get() &&
                    o_accepted.get() && o_status.get());
        const TreeBatchView trees{offsets.get(), parents.get(), tokens.get(), c.batch(), c.num_nodes()};
        const VerifyOutputs o{o_tokens.get(), o_path.get(), o_accepted.get(), o_status.get(), gpu.stride};
        cudaStream_t stream = nullptr;
        SPECD_CUDA_OK(cudaStreamCreate(&stream));
        SPECD_CUDA_OK(cuda::verify_greedy_batch(trees, LogitRows{logits.get(), dtype, c.num_nodes(), c.vocab, c.stride},
                                                o, stream, split));
        download_outputs(stream, o_tokens, o_path, o_accepted, o_status, &gpu);
        EXPECT_EQ(gpu.status, cpu.status) << what;
        EXPECT_EQ(gpu.num_accepted, cpu.num_accepted) << what;
        EXPECT_EQ(gpu.tokens, cpu.tokens) << what;
        EXPECT_EQ(gpu.path, cpu.path) << what;
      }
    }
  }
}

// Draft rows found through draft_index (shuffled among NaN rows, none for the leaves), and
// with the rows' totals given: the CPU's results with the same options, which equal those
// of node-ordered rows summed by the walk (test_verify_batch.cc).
void expect_row_options_match_cpu(const BatchRun& run, const IndexedDraft& d, const HostRowOptions& given,
                                  const std::string& what) {
  const ProbRows rows = d.view(run.c);
  BatchOutputs cpu(run.c.batch(), run.c.num_nodes());
  SPECD_ASSERT_OK(verify_stochastic_batch_cpu(
      run.c.view(), run.c.target_rows(), &rows, run.c.sampling, run.c.keys.data(), cpu.view(),
      StochasticRowOptions{d.index.data(), given.target_totals != nullptr ? given.target_totals->data() : nullptr,
                           given.draft_totals != nullptr ? given.draft_totals->data() : nullptr}));
  for (cuda::RowSplit split : splits_of(VerifyKind::kStochastic)) {
    BatchOutputs gpu(run.c.batch(), run.c.num_nodes());
    run_gpu(run.c, VerifyKind::kStochastic, &gpu, true, split, given);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(gpu.status, cpu.status) << what << split_name(split);
    EXPECT_EQ(gpu.num_accepted, cpu.num_accepted) << what << split_name(split);
    EXPECT_EQ(gpu.tokens, cpu.tokens) << what << split_name(split);
    EXPECT_EQ(gpu.path, cpu.path) << what << split_name(split);
    EXPECT_EQ(compare_verify(run.c, run.want, gpu, what), 0);
  }
}

TEST(VerifyCudaRowOptions, IndexedRowsAndTotalsMatchCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  for (const Proposal how : {Proposal::kDraftWithoutReplacement, Proposal::kDraftIndependent}) {
    for (int32_t vocab : {33, 32000}) {
      const BatchRun run = make_run(600 + static_cast<uint64_t>(vocab), vocab >= 32000 ? 24 : 120, vocab, how,
                                    VerifyKind::kStochastic);
      const IndexedDraft d = shuffled_draft(run.c, 11);
      const std::vector<double> p_totals = row_totals(run.c.target, run.c.num_nodes(), vocab, run.c.stride);
      const std::vector<double> d_totals = row_totals(d.rows, d.num_rows, vocab, run.c.stride);
      const std::string what = "vocab " + std::to_string(vocab);
      expect_row_options_match_cpu(run, d, HostRowOptions{&d}, what);
      expect_row_options_match_cpu(run, d, HostRowOptions{&d, &p_totals, &d_totals}, what + ", totals");
    }
  }
}

TEST_P(VerifyCuda, PaddedOutputsMatchCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  const KindCase& k = GetParam();
  const BatchRun run = make_run(500, 80, 20, k.how, k.kind);
  for (int32_t stride : {max_request_nodes(run.c) + 2, 3}) {
    for (cuda::RowSplit split : splits_of(k.kind)) {
      BatchOutputs gpu(run.c.batch(), run.c.num_nodes(), stride), cpu(run.c.batch(), run.c.num_nodes(), stride);
      run_gpu(run.c, k.kind, &gpu, true, split);
      run_cpu(run, k.kind, &cpu);
      if (HasFatalFailure()) return;
      EXPECT_EQ(gpu.status, cpu.status) << "stride " << stride << split_name(split);
      EXPECT_EQ(gpu.num_accepted, cpu.num_accepted) << "stride " << stride << split_name(split);
      EXPECT_EQ(gpu.tokens, cpu.tokens) << "stride " << stride << split_name(split);
      EXPECT_EQ(gpu.path, cpu.path) << "stride " << stride << split_name(split);
    }
  }
}

TEST(VerifyCudaOutputs, PathIsOptional) {
  SPECD_SKIP_WITHOUT_GPU();
  const BatchRun run = make_run(9, 40, 17, Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic);
  BatchOutputs with(run.c.batch(), run.c.num_nodes()), without(run.c.batch(), run.c.num_nodes());
  run_gpu(run.c, VerifyKind::kStochastic, &with);
  run_gpu(run.c, VerifyKind::kStochastic, &without, /*with_path=*/false);
  if (HasFatalFailure()) return;
  EXPECT_EQ(with.tokens, without.tokens);
  EXPECT_EQ(without.path, std::vector<int32_t>(without.path.size(), 777));  // untouched
}

// ---- losslessness of GPU stochastic verification ----

int64_t num_trials() {
  const char* env = std::getenv("SPECD_STAT_TRIALS");
  return env ? std::atoll(env) : 100000;
}

void check_lossless(Proposal how, VerifyKind kind, cuda::RowSplit split = cuda::RowSplit::kOneBlock) {
  const LosslessBatch batch = make_lossless_batch(how, num_trials());
  BatchOutputs gpu(batch.run.c.batch(), batch.run.c.num_nodes()), cpu(batch.run.c.batch(), batch.run.c.num_nodes());
  run_gpu(batch.run.c, kind, &gpu, true, split);
  run_cpu(batch.run, kind, &cpu);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(gpu.tokens, cpu.tokens) << "GPU and CPU batched verification differ";
  expect_first_token_follows_target(batch, gpu, "GPU");
}

TEST(VerifyCudaLossless, TreeWithDraftRowsWithoutReplacement) {
  SPECD_SKIP_WITHOUT_GPU();
  check_lossless(Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic);
}

TEST(VerifyCudaLossless, TreeWithDraftRowsIndependent) {
  SPECD_SKIP_WITHOUT_GPU();
  check_lossless(Proposal::kDraftIndependent, VerifyKind::kStochastic);
}

TEST(VerifyCudaLossless, TreeWithoutDraftRows) {
  SPECD_SKIP_WITHOUT_GPU();
  check_lossless(Proposal::kOneHot, VerifyKind::kStochasticNoDraft);
}

TEST(VerifyCudaLossless, ClusteredTreeWithDraftRowsWithoutReplacement) {
  SPECD_SKIP_WITHOUT_GPU();
  check_lossless(Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic, cuda::RowSplit::kCluster);
}

// ---- stochastic verification from the target's logits ----

// Uploads the case, runs verify_stochastic_logits_batch (draft rows in node order, or none),
// downloads `out`.
void run_gpu_logits(const LogitVerifyCase& lc, bool has_draft, cuda::RowSplit split, BatchOutputs* out) {
  const VerifyCase& c = lc.c;
  DeviceBuffer<int32_t> offsets(c.offsets), parents(c.parents), tokens(c.tokens);
  DeviceBuffer<float> draft(c.draft), logits32(c.logits);
  DeviceBuffer<uint16_t> words(lc.words.empty() ? std::vector<uint16_t>{0} : lc.words);
  DeviceBuffer<SamplingParams> params(lc.params);
  DeviceBuffer<RngKey> keys(c.keys);
  DeviceBuffer<int32_t> o_tokens(out->tokens), o_path(out->path), o_accepted(out->num_accepted), o_status(out->status);
  ASSERT_TRUE(offsets.get() && parents.get() && tokens.get() && draft.get() && logits32.get() && words.get() &&
              params.get() && keys.get() && o_tokens.get() && o_path.get() && o_accepted.get() && o_status.get());
  const TreeBatchView trees{offsets.get(), parents.get(), tokens.get(), c.batch(), c.num_nodes()};
  const VerifyOutputs o{o_tokens.get(), o_path.get(), o_accepted.get(), o_status.get(), out->stride};
  LogitRows l = lc.logits();
  l.data = lc.dtype == LogitsDtype::kFloat32 ? static_cast<const void*>(logits32.get())
                                             : static_cast<const void*>(words.get());
  const ProbRows q{draft.get(), c.num_nodes(), c.vocab, c.stride};
  cudaStream_t stream = nullptr;
  SPECD_CUDA_OK(cudaStreamCreate(&stream));
  SPECD_CUDA_OK(cuda::verify_stochastic_logits_batch(trees, TargetLogits{l, params.get()}, has_draft ? &q : nullptr,
                                                     c.sampling, keys.get(), o, stream, split));
  download_outputs(stream, o_tokens, o_path, o_accepted, o_status, out);
}

// The kernels' results equal verify_stochastic_logits_batch_cpu's (which equal verification of
// sampling_probs' rows, test_verify_logits.cc), for every dtype, proposal kind and split, with
// requests that fail (bad parameters, bad logits) among them.
TEST(VerifyCudaLogits, MatchesCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  for (const LogitsDtype dtype : {LogitsDtype::kFloat32, LogitsDtype::kFloat16, LogitsDtype::kBFloat16}) {
    for (const Proposal how : {Proposal::kDraftWithoutReplacement, Proposal::kDraftIndependent, Proposal::kOneHot}) {
      for (const int32_t vocab : {5, 300, 32000}) {
        const bool has_draft = how != Proposal::kOneHot;
        const LogitVerifyCase lc = random_logit_verify_case(
            4000 + static_cast<uint64_t>(vocab) + static_cast<uint64_t>(dtype) * 11, vocab >= 32000 ? 24 : 100, vocab,
            how, dtype, 6);
        const ProbRows q = lc.c.draft_rows();
        BatchOutputs cpu(lc.c.batch(), lc.c.num_nodes());
        SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(lc.c.view(), lc.target(), has_draft ? &q : nullptr,
                                                           lc.c.sampling, lc.c.keys.data(), cpu.view()));
        for (cuda::RowSplit split : splits_of(VerifyKind::kStochastic)) {
          BatchOutputs gpu(lc.c.batch(), lc.c.num_nodes());
          run_gpu_logits(lc, has_draft, split, &gpu);
          if (HasFatalFailure()) return;
          expect_same_outputs(gpu, cpu, "dtype " + std::to_string(static_cast<int>(dtype)) + ", vocab " +
                                            std::to_string(vocab) + split_name(split));
        }
      }
    }
  }
}

// Losslessness of the kernels from logits (default parameters and temperature 0.7 with top-k 6).
TEST(VerifyCudaLogitsLossless, FirstTokenFollowsTheTarget) {
  SPECD_SKIP_WITHOUT_GPU();
  for (const SamplingParams params : {SamplingParams{}, SamplingParams{0.7, 6, 1.0, 0.0}}) {
    for (cuda::RowSplit split : splits_of(VerifyKind::kStochastic)) {
      LosslessBatch batch = make_lossless_batch(Proposal::kDraftWithoutReplacement, num_trials());
      LogitVerifyCase lc;
      lc.c = batch.run.c;
      lc.params.assign(static_cast<std::size_t>(lc.c.batch()), params);
      const std::vector<float> root(lc.c.logits.begin(), lc.c.logits.begin() + lc.c.vocab);
      std::vector<float> root_probs(root.size());
      ASSERT_TRUE(sampling_probs(root, params, Span<float>(root_probs.data(), root_probs.size())).ok());
      batch.root_target.assign(root_probs.begin(), root_probs.end());
      BatchOutputs gpu(lc.c.batch(), lc.c.num_nodes());
      run_gpu_logits(lc, true, split, &gpu);
      if (HasFatalFailure()) return;
      expect_first_token_follows_target(batch, gpu, split == cuda::RowSplit::kOneBlock ? "GPU logits" : "GPU logits, cluster");
    }
  }
}

// On an sm_90+ GPU the clustered kernel really runs (not the one-block fallback).
TEST(VerifyCudaOutputs, ClustersRunOnHopperAndLater) {
  SPECD_SKIP_WITHOUT_CLUSTERS();
  EXPECT_TRUE(cuda::verify_clusters_available());
}

TEST(VerifyCuda, RejectsInvalidSizesWithoutLaunching) {
  // Validation happens on the host, so this runs without a device too.
  int32_t offsets[2] = {0, 1}, parents[1] = {-1}, tokens[1] = {0}, out[4] = {};
  float rows[4] = {};
  RngKey key;
  const TreeBatchView trees{offsets, parents, tokens, 1, 1};
  const VerifyOutputs o{out, out + 1, out + 2, out + 3};
  EXPECT_EQ(cuda::verify_stochastic_batch(trees, ProbRows{rows, 0, 4, 4}, nullptr, DraftSampling::kIndependent, &key, o,
                                          nullptr),
            cudaErrorInvalidValue);  // fewer rows than nodes
  EXPECT_EQ(cuda::verify_stochastic_batch(trees, ProbRows{rows, 1, 4, 4}, nullptr, DraftSampling::kIndependent,
                                          nullptr, o, nullptr),
            cudaErrorInvalidValue);  // no rng
  const ProbRows other{rows, 1, 2, 2};
  EXPECT_EQ(cuda::verify_stochastic_batch(trees, ProbRows{rows, 1, 4, 4}, &other, DraftSampling::kIndependent, &key,
                                          o, nullptr),
            cudaErrorInvalidValue);  // vocab mismatch
  EXPECT_EQ(cuda::verify_greedy_tokens_batch(trees, nullptr, o, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::verify_greedy_batch(trees, LogitRows{rows, LogitsDtype::kFloat32, 1, 4, 3}, o, nullptr),
            cudaErrorInvalidValue);  // stride < vocab
  EXPECT_EQ(cuda::verify_greedy_tokens_batch(TreeBatchView{}, nullptr, VerifyOutputs{}, nullptr), cudaSuccess);
  const SamplingParams params;
  const LogitRows logits{rows, LogitsDtype::kFloat32, 1, 4, 4};
  EXPECT_EQ(cuda::verify_stochastic_logits_batch(trees, TargetLogits{logits, nullptr}, nullptr,
                                                 DraftSampling::kIndependent, &key, o, nullptr),
            cudaErrorInvalidValue);  // no params
  const double total = 1.0;
  EXPECT_EQ(cuda::verify_stochastic_logits_batch(trees, TargetLogits{logits, &params}, nullptr,
                                                 DraftSampling::kIndependent, &key, o, nullptr,
                                                 cuda::RowSplit::kOneBlock, StochasticRowOptions{nullptr, &total}),
            cudaErrorInvalidValue);  // target totals with logits
}

}  // namespace
}  // namespace specd::testing
