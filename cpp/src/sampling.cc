#include "specd/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "specd/detail/sampling_rules.h"

namespace specd {
namespace {

// Normalizes p by its sum, as a product with the sum's inverse (sampling.h; callers
// guarantee a positive sum).
void renormalize(std::vector<double>* p) {
  double total = 0;
  for (double v : *p) total += v;
  const double inv = 1.0 / total;
  for (double& v : *p) v = detail::exact_mul(v, inv);
}

// Token ids ordered by (probability desc, id asc), only those with p > 0.
std::vector<int32_t> ranked(const std::vector<double>& p) {
  std::vector<int32_t> ids;
  ids.reserve(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) ids.push_back(static_cast<int32_t>(i));
  std::sort(ids.begin(), ids.end(), [&p](int32_t a, int32_t b) {
    const double pa = p[static_cast<std::size_t>(a)], pb = p[static_cast<std::size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  return ids;
}

void zero_except_prefix(std::vector<double>* p, const std::vector<int32_t>& ranked_ids, std::size_t keep) {
  for (std::size_t r = keep; r < ranked_ids.size(); ++r) (*p)[static_cast<std::size_t>(ranked_ids[r])] = 0;
}

}  // namespace

Status validate_sampling_params(const SamplingParams& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    return error_status(StatusCode::kInvalidArgument, "temperature must be finite and >= 0, got ", s.temperature);
  if (s.top_k < 0)
    return error_status(StatusCode::kInvalidArgument, "top_k must be >= 0 (0 = off), got ", s.top_k);
  if (!(s.top_p > 0 && s.top_p <= 1))
    return error_status(StatusCode::kInvalidArgument, "top_p must be in (0, 1], got ", s.top_p);
  if (!(s.min_p >= 0 && s.min_p <= 1))
    return error_status(StatusCode::kInvalidArgument, "min_p must be in [0, 1], got ", s.min_p);
  return Status::Ok();
}

int32_t argmax(Span<const float> row) {
  int32_t best = 0;
  for (std::size_t i = 1; i < row.size(); ++i)
    if (row[i] > row[static_cast<std::size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

Status sampling_probs(Span<const float> logits, const SamplingParams& params, Span<float> out) {
  SPECD_RETURN_IF_ERROR(validate_sampling_params(params));
  if (logits.empty() || out.size() != logits.size())
    return error_status(StatusCode::kInvalidArgument, "sampling_probs: ", logits.size(),
                        " logits but ", out.size(), " outputs");
  double max_logit = -INFINITY;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == INFINITY)
      return error_status(StatusCode::kInvalidArgument, "logit ", i, " is ", logits[i]);
    max_logit = std::max(max_logit, static_cast<double>(logits[i]));
  }
  if (max_logit == -INFINITY)
    return error_status(StatusCode::kInvalidArgument, "every logit is -inf");
  if (params.temperature == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    out[static_cast<std::size_t>(argmax(logits))] = 1.0f;
    return Status::Ok();
  }
  std::vector<double> p(logits.size());
  const double inv_temperature = detail::inverse_temperature(params.temperature);
  for (std::size_t i = 0; i < logits.size(); ++i)
    p[i] = detail::softmax_weight(logits[i], max_logit, inv_temperature);
  renormalize(&p);
  const bool filters = params.top_k > 0 || params.top_p < 1 || params.min_p > 0;
  if (filters) {
    std::vector<int32_t> ids = ranked(p);
    if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < ids.size()) {
      zero_except_prefix(&p, ids, static_cast<std::size_t>(params.top_k));
      ids.resize(static_cast<std::size_t>(params.top_k));
      renormalize(&p);
    }
    if (params.top_p < 1) {
      // Mass in 2^-62 fixed point: exact, so the cut does not depend on the order of the
      // additions (the CUDA kernels add in parallel).
      const uint64_t threshold = detail::fixed_threshold(params.top_p);
      uint64_t mass = 0;
      std::size_t keep = 0;
      while (keep < ids.size() && (keep == 0 || mass < threshold))
        mass += detail::fixed_mass(p[static_cast<std::size_t>(ids[keep++])]);
      zero_except_prefix(&p, ids, keep);
      ids.resize(keep);
      renormalize(&p);
    }
    if (params.min_p > 0) {
      const double floor = params.min_p * p[static_cast<std::size_t>(ids[0])];
      for (int32_t id : ids)
        if (p[static_cast<std::size_t>(id)] < floor) p[static_cast<std::size_t>(id)] = 0;
      renormalize(&p);
    }
  }
  for (std::size_t i = 0; i < p.size(); ++i) out[i] = static_cast<float>(p[i]);
  return Status::Ok();
}

Status sampling_probs_rows(const float* logits, int32_t rows, int32_t vocab, int64_t stride,
                           const SamplingParams& params, float* probs_out) {
  if (rows < 0 || vocab <= 0 || stride < vocab)
    return error_status(StatusCode::kInvalidArgument, "sampling_probs_rows: bad shape rows=", rows,
                        " vocab=", vocab, " stride=", stride);
  for (int32_t r = 0; r < rows; ++r) {
    const Status s = sampling_probs(Span<const float>(logits + r * stride, static_cast<std::size_t>(vocab)),
                                    params, Span<float>(probs_out + int64_t{r} * vocab, static_cast<std::size_t>(vocab)));
    if (!s.ok()) return error_status(s.code(), "row ", r, ": ", s.message());
  }
  return Status::Ok();
}

int32_t sample_from_weights(Span<const double> weights, double total, double u) {
  const double target = u * total;
  double running = 0;
  int32_t last_positive = -1;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0) continue;
    running += weights[i];
    last_positive = static_cast<int32_t>(i);
    if (target < running) return last_positive;
  }
  return last_positive;
}

}  // namespace specd
