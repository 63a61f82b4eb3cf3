// The CUDA batched-sampling kernels against the CPU: tokens equal to sampling_probs +
// sample_token (same seed, same token) and to sample_tokens_cpu, probabilities equal to
// sampling_probs_batch_cpu within one float ulp, per-row statuses equal, on random rows with
// ties, -inf logits and every filter combination, fp16/bf16 logits, and large vocabularies
// (many chunks per thread); sample_tokens_and_probs equal to both, bit for bit. Every check
// runs with one block per row and with a cluster of blocks per row (RowSplit); the
// Gumbel-max draw's tokens equal the CPU's exactly, and so do the one-pass rows' (greedy rows,
// and Gumbel-max rows without a cut). Skips, saying why, without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "sampling_batch_test_util.h"
#include "specd/cuda/sampling.h"
#include "specd/detail/bits.h"
#include "specd/sampling_batch.h"

namespace specd::testing {
namespace {

struct GpuSampling {
  std::vector<int32_t> tokens, token_status, probs_status;
  std::vector<float> probs;
  std::vector<int32_t> both_tokens, both_status;  // sample_tokens_and_probs
  std::vector<float> both_probs;
  std::vector<double> both_totals;  // its rows' totals
};

// The rows' totals the kernels write agree with the rows: each a sum of the row's floats
// (in the kernel's order: within 1e-12 relative of the sequential sum; 0 for a failed row).
void expect_totals_match_rows(const std::vector<double>& totals, const std::vector<float>& probs,
                              const std::vector<int32_t>& status, int32_t vocab, const std::string& what) {
  for (std::size_t r = 0; r < totals.size(); ++r) {
    double want = 0;
    for (int32_t i = 0; i < vocab; ++i) want += static_cast<double>(probs[r * static_cast<std::size_t>(vocab) + i]);
    if (status[r] != 0) {
      EXPECT_EQ(totals[r], 0.0) << what << " row " << r;
    } else {
      EXPECT_NEAR(totals[r], want, 1e-12 * want) << what << " row " << r;
    }
  }
}

constexpr cuda::RowSplit kSplits[] = {cuda::RowSplit::kOneBlock, cuda::RowSplit::kCluster};

std::string split_name(cuda::RowSplit split) {
  return split == cuda::RowSplit::kOneBlock ? "one block per row" : "a cluster per row";
}

// Runs the three kernels on `logits` (host data of `bytes` bytes, described by `rows`).
template <class T>
void run_gpu(const std::vector<T>& host_logits, LogitRows rows, const SamplingCase& c, GpuSampling* out,
             cuda::RowSplit split = cuda::RowSplit::kOneBlock) {
  DeviceBuffer<T> logits(host_logits);
  DeviceBuffer<SamplingParams> params(c.params);
  DeviceBuffer<RngKey> keys(c.keys);
  DeviceBuffer<int32_t> tokens(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
  DeviceBuffer<int32_t> st1(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
  DeviceBuffer<int32_t> st2(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
  DeviceBuffer<float> probs(std::vector<float>(static_cast<std::size_t>(c.rows) * c.vocab, -1.0f));
  DeviceBuffer<int32_t> both_tokens(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
  DeviceBuffer<int32_t> st3(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
  DeviceBuffer<float> both_probs(std::vector<float>(static_cast<std::size_t>(c.rows) * c.vocab, -1.0f));
  DeviceBuffer<double> both_totals(std::vector<double>(static_cast<std::size_t>(c.rows), -1.0));
  ASSERT_TRUE(logits.get() && params.get() && keys.get() && tokens.get() && st1.get() && st2.get() && probs.get() &&
              both_tokens.get() && st3.get() && both_probs.get() && both_totals.get());
  rows.data = logits.get();
  cudaStream_t stream = nullptr;
  SPECD_CUDA_OK(cudaStreamCreate(&stream));
  SPECD_CUDA_OK(cuda::sample_tokens(rows, params.get(), keys.get(), tokens.get(), st1.get(), stream, split));
  SPECD_CUDA_OK(cuda::sampling_probs_batch(rows, params.get(), probs.get(), st2.get(), stream, split));
  SPECD_CUDA_OK(cuda::sample_tokens_and_probs(rows, params.get(), keys.get(), both_tokens.get(), both_probs.get(),
                                              st3.get(), stream, split, DrawRule::kInverseCdf, both_totals.get()));
  SPECD_CUDA_OK(cudaStreamSynchronize(stream));
  SPECD_CUDA_OK(cudaStreamDestroy(stream));
  out->tokens = tokens.to_host();
  out->token_status = st1.to_host();
  out->probs_status = st2.to_host();
  out->probs = probs.to_host();
  out->both_tokens = both_tokens.to_host();
  out->both_status = st3.to_host();
  out->both_probs = both_probs.to_host();
  out->both_totals = both_totals.to_host();
}

// Distance in float ulps (same sign assumed: probabilities are >= 0).
int64_t ulps(float a, float b) {
  int32_t ia = 0, ib = 0;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(int64_t{ia} - int64_t{ib});
}

// GPU vs the batch CPU version and the references, for rows decoded to `decoded` floats.
void expect_gpu_matches(const SamplingCase& decoded, const LogitRows& cpu_rows, const GpuSampling& gpu,
                        const std::string& what) {
  const SamplingExpected want = expected_sampling(decoded);
  std::vector<int32_t> cpu_tokens(static_cast<std::size_t>(decoded.rows)), cpu_status(cpu_tokens.size());
  std::vector<float> cpu_probs(want.probs.size());
  ASSERT_TRUE(sample_tokens_cpu(cpu_rows, decoded.params.data(), decoded.keys.data(), cpu_tokens.data(), cpu_status.data()).ok());
  EXPECT_EQ(gpu.token_status, cpu_status) << what;
  EXPECT_EQ(gpu.probs_status, cpu_status) << what;
  EXPECT_EQ(gpu.tokens, cpu_tokens) << what;
  // sample_tokens_and_probs: the two kernels' outputs, bit for bit (the same row code).
  EXPECT_EQ(gpu.both_status, gpu.token_status) << what;
  EXPECT_EQ(gpu.both_tokens, gpu.tokens) << what;
  EXPECT_TRUE(gpu.both_probs == gpu.probs) << what << ": sample_tokens_and_probs' rows differ from sampling_probs_batch's";
  expect_totals_match_rows(gpu.both_totals, gpu.both_probs, gpu.both_status, decoded.vocab, what + ", totals");
  ASSERT_TRUE(sampling_probs_batch_cpu(cpu_rows, decoded.params.data(), cpu_probs.data(), cpu_status.data()).ok());
  int64_t worst = 0;
  for (std::size_t k = 0; k < cpu_probs.size(); ++k) worst = std::max(worst, ulps(gpu.probs[k], cpu_probs[k]));
  EXPECT_LE(worst, 1) << what << ": probabilities differ by " << worst << " float ulps";
  for (std::size_t r = 0; r < want.tokens.size(); ++r)
    EXPECT_EQ(gpu.tokens[r], want.tokens[r]) << what << " row " << r << " (reference sampling_probs + sample_token)";
}

TEST(SamplingCuda, MatchesCpuOnRandomRows) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(21);
  for (int32_t vocab : {1, 2, 3, 31, 32, 33, 511, 512, 513, 5000}) {
    const SamplingCase c = random_sampling_case(&g, vocab >= 5000 ? 64 : 300, vocab);
    for (cuda::RowSplit split : kSplits) {
      GpuSampling gpu;
      run_gpu(c.logits, c.view(), c, &gpu, split);
      if (HasFatalFailure()) return;
      expect_gpu_matches(c, c.view(), gpu, "vocab " + std::to_string(vocab) + ", " + split_name(split));
    }
  }
}

TEST(SamplingCuda, LargeVocabulariesMatchCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(22);
  for (int32_t vocab : {32000, 151936}) {
    const SamplingCase c = random_sampling_case(&g, 12, vocab);
    for (cuda::RowSplit split : kSplits) {
      GpuSampling gpu;
      run_gpu(c.logits, c.view(), c, &gpu, split);
      if (HasFatalFailure()) return;
      expect_gpu_matches(c, c.view(), gpu, "vocab " + std::to_string(vocab) + ", " + split_name(split));
    }
  }
}

TEST(SamplingCuda, HalfAndBFloat16Logits) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(23);
  const SamplingCase c = random_sampling_case(&g, 200, 300);
  for (LogitsDtype dtype : {LogitsDtype::kFloat16, LogitsDtype::kBFloat16}) {
    std::vector<uint16_t> words(c.logits.size());
    SamplingCase decoded = c;
    for (std::size_t i = 0; i < words.size(); ++i) {
      words[i] = dtype == LogitsDtype::kFloat16 ? static_cast<uint16_t>(g() % 0x5000) | static_cast<uint16_t>(g() % 2 << 15)
                                                : static_cast<uint16_t>(0x3800 + g() % 0x800) | static_cast<uint16_t>(g() % 2 << 15);
      if (g() % 13 == 0) words[i] = dtype == LogitsDtype::kFloat16 ? 0xFC00 : 0xFF80;  // -inf
      decoded.logits[i] = dtype == LogitsDtype::kFloat16 ? detail::half_to_float(words[i]) : detail::bfloat16_to_float(words[i]);
    }
    const LogitRows rows{words.data(), dtype, c.rows, c.vocab, c.stride};
    for (cuda::RowSplit split : kSplits) {
      GpuSampling gpu;
      run_gpu(words, rows, c, &gpu, split);
      if (HasFatalFailure()) return;
      expect_gpu_matches(decoded, rows, gpu, std::string(dtype == LogitsDtype::kFloat16 ? "fp16" : "bf16") + ", " +
                                                 split_name(split));
    }
  }
}

// Rows with a NaN, a +inf, no finite logit, and bad parameters (statuses 2, 2, 3, 1).
SamplingCase bad_rows_case() {
  SamplingCase c;
  c.rows = 4;
  c.vocab = 3;
  c.stride = 3;
  c.logits = {0, NAN, 1, /**/ 0, INFINITY, 1, /**/ -INFINITY, -INFINITY, -INFINITY, /**/ 0, 1, 2};
  SamplingParams bad;
  bad.temperature = -1;
  c.params = {SamplingParams{}, SamplingParams{}, SamplingParams{}, bad};
  c.keys.assign(4, RngKey{});
  return c;
}

TEST(SamplingCuda, BadRowsGetStatusesNotErrors) {
  SPECD_SKIP_WITHOUT_GPU();
  const SamplingCase c = bad_rows_case();
  for (cuda::RowSplit split : kSplits) {
    GpuSampling gpu;
    run_gpu(c.logits, c.view(), c, &gpu, split);
    if (HasFatalFailure()) return;
    EXPECT_EQ(gpu.token_status, (std::vector<int32_t>{2, 2, 3, 1})) << split_name(split);
    EXPECT_EQ(gpu.probs_status, gpu.token_status) << split_name(split);
    EXPECT_EQ(gpu.tokens, std::vector<int32_t>(4, -1)) << split_name(split);
    EXPECT_EQ(gpu.probs, std::vector<float>(12, 0.0f)) << split_name(split);
  }
}

TEST(SamplingCuda, SameSeedSameTokensAcrossRuns) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(24);
  const SamplingCase c = random_sampling_case(&g, 100, 2000);
  for (cuda::RowSplit split : kSplits) {
    GpuSampling a, b;
    run_gpu(c.logits, c.view(), c, &a, split);
    run_gpu(c.logits, c.view(), c, &b, split);
    if (HasFatalFailure()) return;
    EXPECT_EQ(a.tokens, b.tokens) << split_name(split);
    EXPECT_EQ(a.probs, b.probs) << split_name(split);
  }
}

// sample_tokens' tokens and statuses equal sample_tokens_cpu's exactly with `draw`, for both
// splits. DrawRule::kGumbelMax: an argmax, no sum whose order differs; greedy rows (either
// rule): greedy_token_row's argmax. Used for fp32/bf16, odd vocabularies (a last partial
// group), unaligned rows (stride not a multiple of 8: scalar loads) and 151,936-token rows.
template <class T>
void expect_tokens_match_cpu(const std::vector<T>& host_logits, LogitRows rows, const SamplingCase& c,
                             const std::string& what, DrawRule draw = DrawRule::kGumbelMax) {
  std::vector<int32_t> cpu_tokens(static_cast<std::size_t>(c.rows)), cpu_status(cpu_tokens.size());
  rows.data = host_logits.data();
  ASSERT_TRUE(sample_tokens_cpu(rows, c.params.data(), c.keys.data(), cpu_tokens.data(), cpu_status.data(), draw)
                  .ok());
  DeviceBuffer<T> logits(host_logits);
  DeviceBuffer<SamplingParams> params(c.params);
  DeviceBuffer<RngKey> keys(c.keys);
  for (cuda::RowSplit split : kSplits) {
    DeviceBuffer<int32_t> tokens(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
    DeviceBuffer<int32_t> status(std::vector<int32_t>(static_cast<std::size_t>(c.rows), 99));
    ASSERT_TRUE(logits.get() && params.get() && keys.get() && tokens.get() && status.get());
    rows.data = logits.get();
    SPECD_CUDA_OK(cuda::sample_tokens(rows, params.get(), keys.get(), tokens.get(), status.get(), nullptr, split,
                                      draw));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(status.to_host(), cpu_status) << what << ", " << split_name(split);
    EXPECT_EQ(tokens.to_host(), cpu_tokens) << what << ", " << split_name(split);
  }
}

// sample_tokens_and_probs under kGumbelMax: the rows equal the inverse-CDF kernel's bit for
// bit, and every row equal to the CPU's gets the CPU's token (the keys are computed alike).
template <class T>
void expect_gumbel_probs_match_cpu(const std::vector<T>& host_logits, LogitRows rows, const SamplingCase& c,
                                   const std::string& what) {
  const auto n = static_cast<std::size_t>(c.rows);
  const std::size_t cells = n * static_cast<std::size_t>(c.vocab);
  std::vector<int32_t> cpu_tokens(n), cpu_status(n);
  std::vector<float> cpu_probs(cells);
  rows.data = host_logits.data();
  ASSERT_TRUE(sample_tokens_and_probs_cpu(rows, c.params.data(), c.keys.data(), cpu_tokens.data(), cpu_probs.data(),
                                          cpu_status.data(), DrawRule::kGumbelMax)
                  .ok());
  DeviceBuffer<T> logits(host_logits);
  DeviceBuffer<SamplingParams> params(c.params);
  DeviceBuffer<RngKey> keys(c.keys);
  for (cuda::RowSplit split : kSplits) {
    DeviceBuffer<int32_t> tokens(std::vector<int32_t>(n, 99)), status(std::vector<int32_t>(n, 99));
    DeviceBuffer<int32_t> icdf_tokens(std::vector<int32_t>(n, 99)), icdf_status(std::vector<int32_t>(n, 99));
    DeviceBuffer<float> probs(std::vector<float>(cells, -1.0f)), icdf_probs(std::vector<float>(cells, -2.0f));
    DeviceBuffer<double> totals(std::vector<double>(n, -1.0));
    ASSERT_TRUE(logits.get() && tokens.get() && probs.get() && icdf_probs.get() && totals.get());
    rows.data = logits.get();
    SPECD_CUDA_OK(cuda::sample_tokens_and_probs(rows, params.get(), keys.get(), tokens.get(), probs.get(),
                                                status.get(), nullptr, split, DrawRule::kGumbelMax, totals.get()));
    SPECD_CUDA_OK(cuda::sample_tokens_and_probs(rows, params.get(), keys.get(), icdf_tokens.get(), icdf_probs.get(),
                                                icdf_status.get(), nullptr, split));
    SPECD_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> got_probs = probs.to_host();
    const std::vector<int32_t> got_tokens = tokens.to_host();
    EXPECT_EQ(status.to_host(), cpu_status) << what << ", " << split_name(split);
    EXPECT_TRUE(got_probs == icdf_probs.to_host()) << what << ", " << split_name(split) << ": rows differ";
    expect_totals_match_rows(totals.to_host(), got_probs, status.to_host(), c.vocab,
                             what + ", " + split_name(split) + ", totals");
    int32_t equal_rows = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const auto at = static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(c.vocab));
      if (!std::equal(got_probs.begin() + at, got_probs.begin() + at + c.vocab, cpu_probs.begin() + at)) continue;
      ++equal_rows;
      EXPECT_EQ(got_tokens[r], cpu_tokens[r]) << what << ", " << split_name(split) << ", row " << r;
    }
    EXPECT_GT(equal_rows, c.rows / 2) << what << ", " << split_name(split);
  }
}

TEST(SamplingCuda, GumbelDrawOfProbabilityRowsEqualsCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(26);
  for (int32_t vocab : {7, 9, 513, 151936}) {
    const SamplingCase c = random_sampling_case(&g, vocab >= 5000 ? 16 : 150, vocab);
    expect_gumbel_probs_match_cpu(c.logits, c.view(), c, "vocab " + std::to_string(vocab));
    if (HasFatalFailure()) return;
  }
}

TEST(SamplingCuda, GumbelDrawEqualsCpuExactly) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(25);
  for (int32_t vocab : {1, 7, 8, 9, 33, 513, 5000, 151936}) {
    const SamplingCase c = random_sampling_case(&g, vocab >= 5000 ? 24 : 200, vocab);
    expect_tokens_match_cpu(c.logits, c.view(), c, "fp32, vocab " + std::to_string(vocab));
    if (HasFatalFailure()) return;
    std::vector<uint16_t> words(c.logits.size());
    for (std::size_t i = 0; i < words.size(); ++i) {
      words[i] = static_cast<uint16_t>(0x3800 + g() % 0x900) | static_cast<uint16_t>(g() % 2 << 15);
      if (g() % 13 == 0) words[i] = 0xFF80;  // -inf
    }
    expect_tokens_match_cpu(words, LogitRows{nullptr, LogitsDtype::kBFloat16, c.rows, c.vocab, c.stride}, c,
                              "bf16, vocab " + std::to_string(vocab));
    if (HasFatalFailure()) return;
  }
  // Rows without a cut (the one-pass path), 64 x 151,936 at temperatures from 0.05 to 2.
  SamplingCase wide = random_sampling_case(&g, 64, 151936);
  for (std::size_t r = 0; r < wide.params.size(); ++r) wide.params[r] = SamplingParams{0.05 + 0.03 * r, 0, 1.0, 0.0};
  expect_tokens_match_cpu(wide.logits, wide.view(), wide, "64 rows without a cut");
}

TEST(SamplingCuda, GumbelBadRowsGetStatuses) {
  SPECD_SKIP_WITHOUT_GPU();
  const SamplingCase c = bad_rows_case();
  expect_tokens_match_cpu(c.logits, c.view(), c, "bad rows");
}

// The rows that take one pass (takes_one_pass: greedy rows; under kGumbelMax, rows without a
// cut): under kInverseCdf in the general kernel (one launch), under kGumbelMax in a kernel of
// their own that runs before the general one, which skips them. All-greedy batches,
// batches where greedy and sampled rows alternate, batches mixing greedy rows, sampled rows
// without a cut and rows with each cut, bad one-pass rows (NaN, +inf, no finite logit, bad
// parameters), bf16 and fp32, 64 x 151,936, both splits and both draws: the CPU's tokens and
// statuses.
TEST(SamplingCuda, OnePassRowsEqualCpu) {
  SPECD_SKIP_WITHOUT_GPU();
  std::mt19937_64 g(27);
  for (DrawRule draw : {DrawRule::kInverseCdf, DrawRule::kGumbelMax}) {
    const std::string rule = draw == DrawRule::kGumbelMax ? "Gumbel-max" : "inverse CDF";
    for (double temperature : {0.0, 0.7}) {  // greedy; without a cut (one pass under kGumbelMax)
      SamplingCase bad = bad_rows_case();
      for (SamplingParams& p : bad.params) p = SamplingParams{temperature, 0, 1.0, 0.0};
      bad.params[3].top_p = 2.0;  // invalid parameters (no cut: top_p >= 1)
      expect_tokens_match_cpu(bad.logits, bad.view(), bad,
                              "bad rows at temperature " + std::to_string(temperature) + ", " + rule, draw);
      if (HasFatalFailure()) return;
    }
    for (int32_t mix : {0, 1, 2}) {  // all greedy; greedy and sampled alternate; five kinds of row
      SamplingCase c = random_sampling_case(&g, 64, 151936);
      for (std::size_t r = 0; r < c.params.size(); ++r) {
        if (mix == 0 || (mix == 1 && r % 2 == 0)) c.params[r].temperature = 0.0;
        if (mix == 2) {
          const double t = 0.2 + 0.05 * static_cast<double>(r);
          const SamplingParams kinds[5] = {{0.0, 0, 1.0, 0.0}, {t, 0, 1.0, 0.0}, {t, 50, 1.0, 0.0},
                                           {t, 0, 0.9, 0.0}, {t, 0, 1.0, 0.05}};
          c.params[r] = kinds[r % 5];
        }
      }
      const std::string what = std::string(mix == 0 ? "all greedy" : mix == 1 ? "alternating rows" : "five kinds") +
                               ", " + rule;
      expect_tokens_match_cpu(c.logits, c.view(), c, "fp32, " + what, draw);
      if (HasFatalFailure()) return;
      std::vector<uint16_t> words(c.logits.size());
      for (std::size_t i = 0; i < words.size(); ++i)
        words[i] = static_cast<uint16_t>(0x3800 + g() % 0x900) | static_cast<uint16_t>(g() % 2 << 15);
      expect_tokens_match_cpu(words, LogitRows{nullptr, LogitsDtype::kBFloat16, c.rows, c.vocab, c.stride}, c,
                              "bf16, " + what, draw);
      if (HasFatalFailure()) return;
    }
  }
}

// On an sm_90+ GPU the clustered kernels really run (not the one-block fallback).
TEST(SamplingCuda, ClustersRunOnHopperAndLater) {
  SPECD_SKIP_WITHOUT_CLUSTERS();
  EXPECT_TRUE(cuda::sampling_clusters_available());
}

TEST(SamplingCuda, RejectsInvalidSizesWithoutLaunching) {
  // Validation happens on the host, so this runs without a device too.
  float x = 0;
  SamplingParams s;
  RngKey k;
  int32_t t = 0, st = 0;
  EXPECT_EQ(cuda::sample_tokens(LogitRows{&x, LogitsDtype::kFloat32, 1, 4, 3}, &s, &k, &t, &st, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::sample_tokens(LogitRows{&x, LogitsDtype::kFloat32, 1, 1, 1}, &s, nullptr, &t, &st, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::sampling_probs_batch(LogitRows{nullptr, LogitsDtype::kFloat32, 1, 1, 1}, &s, &x, &st, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::sampling_probs_batch(LogitRows{&x, static_cast<LogitsDtype>(5), 1, 1, 1}, &s, &x, &st, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::sample_tokens(LogitRows{nullptr, LogitsDtype::kFloat32, 0, 1, 1}, nullptr, nullptr, nullptr, nullptr,
                                nullptr),
            cudaSuccess);
  EXPECT_EQ(cuda::sample_tokens(LogitRows{&x, LogitsDtype::kFloat32, 1, 1, 1}, &s, &k, &t, &st, nullptr,
                                cuda::RowSplit::kOneBlock, static_cast<DrawRule>(3)),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace specd::testing
