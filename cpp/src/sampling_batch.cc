// Batched sampling on the CPU: the kernels' row algorithm (detail/sample_row.h) run with a
// one-thread block, row after row.
#include "specd/sampling_batch.h"

#include "specd/detail/gumbel_row.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sample_row.h"
#include "specd/detail/serial_block.h"

namespace specd {

Status validate_logit_rows(const LogitRows& logits) {
  if (logits.rows < 0 || logits.vocab <= 0 || logits.vocab > kMaxBatchVocab || logits.stride < logits.vocab)
    return error_status(StatusCode::kInvalidArgument, "logit rows: bad shape (rows ", logits.rows, ", vocab ",
                        logits.vocab, ", stride ", logits.stride, "); need rows >= 0, 1 <= vocab <= ",
                        kMaxBatchVocab, ", stride >= vocab");
  const auto dtype = static_cast<int32_t>(logits.dtype);
  if (dtype < 0 || dtype > 2)
    return error_status(StatusCode::kInvalidArgument, "logit rows: unknown dtype ", dtype);
  if (logits.rows > 0 && logits.data == nullptr)
    return error_status(StatusCode::kInvalidArgument, "logit rows: null data for ", logits.rows, " rows");
  return Status::Ok();
}

Status validate_sample_tokens(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                              const int32_t* tokens, const int32_t* status) {
  SPECD_RETURN_IF_ERROR(validate_logit_rows(logits));
  if (logits.rows > 0 && (params == nullptr || rng == nullptr || tokens == nullptr || status == nullptr))
    return error_status(StatusCode::kInvalidArgument, "sample_tokens: null params, rng, tokens or status");
  return Status::Ok();
}

Status validate_draw_rule(DrawRule draw) {
  const auto code = static_cast<int32_t>(draw);
  if (code < 0 || code > 1) return error_status(StatusCode::kInvalidArgument, "sample_tokens: unknown draw rule ", code);
  return Status::Ok();
}

Status validate_sampling_probs_batch(const LogitRows& logits, const SamplingParams* params, const float* probs,
                                     const int32_t* status) {
  SPECD_RETURN_IF_ERROR(validate_logit_rows(logits));
  if (logits.rows > 0 && (params == nullptr || probs == nullptr || status == nullptr))
    return error_status(StatusCode::kInvalidArgument, "sampling_probs_batch: null params, probs or status");
  return Status::Ok();
}

Status validate_sample_tokens_and_probs(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                        const int32_t* tokens, const float* probs, const int32_t* status) {
  SPECD_RETURN_IF_ERROR(validate_logit_rows(logits));
  if (logits.rows > 0 && (params == nullptr || rng == nullptr || tokens == nullptr || probs == nullptr ||
                          status == nullptr))
    return error_status(StatusCode::kInvalidArgument,
                        "sample_tokens_and_probs: null params, rng, tokens, probs or status");
  return Status::Ok();
}

Status sample_tokens_cpu(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                         int32_t* tokens, int32_t* status, DrawRule draw) {
  SPECD_RETURN_IF_ERROR(validate_sample_tokens(logits, params, rng, tokens, status));
  SPECD_RETURN_IF_ERROR(validate_draw_rule(draw));
  detail::SerialBlock block;
  float bounds[detail::kGumbelBuckets];
  if (draw == DrawRule::kGumbelMax) detail::fill_gumbel_bounds(bounds);
  detail::dispatch_logits_dtype(logits.dtype, [&](auto tag) {
    using Row = decltype(tag);
    detail::RowPlan plan;
    for (int32_t r = 0; r < logits.rows; ++r) {
      const Row row = Row::at(logits.data, r * logits.stride);
      // Rows as the kernels take them: the one-pass rows (greedy; under kGumbelMax, no cut)
      // by their own row code, the rest by the general one (the same tokens and statuses).
      const SamplingParams& p = params[r];
      SampleStatus s;
      if (p.temperature == 0)
        s = detail::greedy_token_row(block, row, logits.vocab, p, &tokens[r]);
      else if (draw == DrawRule::kGumbelMax && detail::takes_one_pass(p, draw))
        s = detail::gumbel_uncut_row(block, row, logits.vocab, p, rng[r], bounds, &tokens[r]);
      else if (draw == DrawRule::kGumbelMax)
        s = detail::gumbel_cut_row(block, row, logits.vocab, p, rng[r], bounds, &tokens[r], plan);
      else
        s = detail::sample_token_row(block, row, logits.vocab, p, rng[r], &tokens[r], plan);
      status[r] = static_cast<int32_t>(s);
    }
  });
  return Status::Ok();
}

Status sampling_probs_batch_cpu(const LogitRows& logits, const SamplingParams* params, float* probs,
                                int32_t* status, double* totals) {
  SPECD_RETURN_IF_ERROR(validate_sampling_probs_batch(logits, params, probs, status));
  detail::SerialBlock block;
  detail::dispatch_logits_dtype(logits.dtype, [&](auto tag) {
    using Row = decltype(tag);
    detail::RowPlan plan;
    for (int32_t r = 0; r < logits.rows; ++r)
      status[r] = static_cast<int32_t>(detail::probs_row(block, Row::at(logits.data, r * logits.stride), logits.vocab,
                                                         params[r], probs + int64_t{r} * logits.vocab, nullptr,
                                                         nullptr, plan, totals != nullptr ? totals + r : nullptr));
  });
  return Status::Ok();
}

Status sample_tokens_and_probs_cpu(const LogitRows& logits, const SamplingParams* params, const RngKey* rng,
                                   int32_t* tokens, float* probs, int32_t* status, DrawRule draw, double* totals) {
  SPECD_RETURN_IF_ERROR(validate_sample_tokens_and_probs(logits, params, rng, tokens, probs, status));
  SPECD_RETURN_IF_ERROR(validate_draw_rule(draw));
  detail::SerialBlock block;
  float bounds[detail::kGumbelBuckets];
  if (draw == DrawRule::kGumbelMax) detail::fill_gumbel_bounds(bounds);
  detail::dispatch_logits_dtype(logits.dtype, [&](auto tag) {
    using Row = decltype(tag);
    detail::RowPlan plan;
    for (int32_t r = 0; r < logits.rows; ++r) {
      const Row row = Row::at(logits.data, r * logits.stride);
      float* out = probs + int64_t{r} * logits.vocab;
      double* total = totals != nullptr ? totals + r : nullptr;
      status[r] = static_cast<int32_t>(
          draw == DrawRule::kGumbelMax
              ? detail::gumbel_probs_row(block, row, logits.vocab, params[r], out, rng[r], bounds, &tokens[r], plan,
                                         total)
              : detail::probs_row(block, row, logits.vocab, params[r], out, &rng[r], &tokens[r], plan, total));
    }
  });
  return Status::Ok();
}

}  // namespace specd
