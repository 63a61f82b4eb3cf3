#include "specd/cuda/sampling.h"

#include "detail/device_block.cuh"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sample_row.h"

namespace specd::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kSelectCache = 2048;  // radix_select's candidate cache (32 KiB of shared memory)
using Block = detail::DeviceBlock<kThreads, kSelectCache>;

// One block per row. Arguments by value: their pointers are device pointers.
template <class Row>
__global__ void __launch_bounds__(kThreads)
    sample_tokens_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng, int32_t* tokens,
                         int32_t* status) {
  __shared__ Block::Shared shared;
  Block block(&shared);
  const auto r = static_cast<int32_t>(blockIdx.x);
  const SamplingParams row_params = params[r];
  const RngKey key = rng[r];
  const Row row = Row::at(logits.data, r * logits.stride);
  int32_t token = -1;
  const SampleStatus s = specd::detail::sample_token_row(block, row, logits.vocab, row_params, key, &token);
  if (block.rank() == 0) {
    tokens[r] = token;
    status[r] = static_cast<int32_t>(s);
  }
}

// rng and tokens null: probabilities only; else also the token drawn from each row.
template <class Row>
__global__ void __launch_bounds__(kThreads)
    sampling_probs_kernel(LogitRows logits, const SamplingParams* params, const RngKey* rng, int32_t* tokens,
                          float* probs, int32_t* status) {
  __shared__ Block::Shared shared;
  Block block(&shared);
  const auto r = static_cast<int32_t>(blockIdx.x);
  const SamplingParams row_params = params[r];
  const Row row = Row::at(logits.data, r * logits.stride);
  RngKey key{};
  if (rng != nullptr) key = rng[r];
  int32_t token = -1;
  const SampleStatus s = specd::detail::probs_row(block, row, logits.vocab, row_params,
                                                  probs + int64_t{r} * logits.vocab, rng != nullptr ? &key : nullptr,
                                                  tokens != nullptr ? &token : nullptr);
  if (block.rank() == 0) {
    status[r] = static_cast<int32_t>(s);
    if (tokens != nullptr) tokens[r] = token;
  }
}

}  // namespace

cudaError_t sample_tokens(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                          int32_t* tokens, int32_t* status, cudaStream_t stream) {
  if (!validate_sample_tokens(logits, params, rng, tokens, status).ok()) return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(logits.dtype, [&](auto row) {
    sample_tokens_kernel<decltype(row)><<<static_cast<unsigned>(logits.rows), kThreads, 0, stream>>>(
        logits, params, rng, tokens, status);
    return cudaGetLastError();
  });
}

cudaError_t sampling_probs_batch(const LogitRows& logits, const SamplingParams* params, float* probs,
                                 int32_t* status, cudaStream_t stream) {
  if (!validate_sampling_probs_batch(logits, params, probs, status).ok()) return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(logits.dtype, [&](auto row) {
    sampling_probs_kernel<decltype(row)><<<static_cast<unsigned>(logits.rows), kThreads, 0, stream>>>(
        logits, params, nullptr, nullptr, probs, status);
    return cudaGetLastError();
  });
}

cudaError_t sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                    int32_t* tokens, float* probs, int32_t* status, cudaStream_t stream) {
  if (!validate_sample_tokens_and_probs(logits, params, rng, tokens, probs, status).ok())
    return cudaErrorInvalidValue;
  if (logits.rows == 0) return cudaSuccess;
  return specd::detail::dispatch_logits_dtype(logits.dtype, [&](auto row) {
    sampling_probs_kernel<decltype(row)><<<static_cast<unsigned>(logits.rows), kThreads, 0, stream>>>(
        logits, params, rng, tokens, probs, status);
    return cudaGetLastError();
  });
}

}  // namespace specd::cuda
