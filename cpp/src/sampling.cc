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

// Token ids with p > 0 in ranking order (probability desc, id asc), ranked lazily: only a
// prefix is ordered, and ensure(m) extends it to the first m by a selection of the rest and a
// sort of what it selected. The filters read a short prefix (top_k tokens, the top-p
// nucleus, the most probable token), so a 152k-token row is not sorted whole. The order is
// total, so every prefix is the one a full sort gives. Ranks by the probabilities it was
// built from (copied beside the ids): renormalizing p afterwards does not reorder it.
class Ranking {
 public:
  explicit Ranking(const std::vector<double>& p) {
    entries_.reserve(p.size());
    for (std::size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0) entries_.push_back(Entry{p[i], static_cast<int32_t>(i)});
  }

  std::size_t size() const { return entries_.size(); }
  int32_t id(std::size_t rank) const { return entries_[rank].id; }
  std::size_t ordered() const { return sorted_; }  // how many leading entries are in ranking order
  // Orders the first min(m, size()) entries. Once more than a quarter would be ordered,
  // all are (a selection that keeps growing costs more than one sort).
  void ensure(std::size_t m) {
    m = std::min(m, entries_.size());
    if (m <= sorted_) return;
    if (m > entries_.size() / 4) m = entries_.size();
    const auto first = entries_.begin() + static_cast<std::ptrdiff_t>(sorted_);
    const auto last = entries_.begin() + static_cast<std::ptrdiff_t>(m);
    if (last != entries_.end()) std::nth_element(first, last - 1, entries_.end(), before);
    std::sort(first, last, before);
    sorted_ = m;
  }
  // Drops every entry after the first m (call ensure(m) first).
  void truncate(std::size_t m) {
    entries_.resize(std::min(m, entries_.size()));
    sorted_ = std::min(sorted_, entries_.size());
  }

 private:
  struct Entry {
    double p;
    int32_t id;
  };
  static bool before(const Entry& a, const Entry& b) { return a.p != b.p ? a.p > b.p : a.id < b.id; }

  std::vector<Entry> entries_;
  std::size_t sorted_ = 0;
};

// Keeps the m most probable tokens: zeroes the probabilities of the others and drops them
// from the ranking.
void keep_prefix(std::vector<double>* p, Ranking* ranking, std::size_t m) {
  ranking->ensure(m);
  for (std::size_t r = m; r < ranking->size(); ++r) (*p)[static_cast<std::size_t>(ranking->id(r))] = 0;
  ranking->truncate(m);
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
    Ranking ranking(p);
    if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < ranking.size()) {
      keep_prefix(&p, &ranking, static_cast<std::size_t>(params.top_k));
      renormalize(&p);
    }
    if (params.top_p < 1) {
      // Mass in 2^-62 fixed point: exact, so the cut does not depend on the order of the
      // additions (the CUDA kernels add in parallel). The ranking grows by doubling.
      const uint64_t threshold = detail::fixed_threshold(params.top_p);
      uint64_t mass = 0;
      std::size_t keep = 0;
      while (keep < ranking.size() && (keep == 0 || mass < threshold)) {
        if (keep == ranking.ordered()) ranking.ensure(std::max<std::size_t>(64, 2 * keep));
        mass += detail::fixed_mass(p[static_cast<std::size_t>(ranking.id(keep++))]);
      }
      keep_prefix(&p, &ranking, keep);
      renormalize(&p);
    }
    if (params.min_p > 0) {
      ranking.ensure(1);
      const double floor = params.min_p * p[static_cast<std::size_t>(ranking.id(0))];
      for (std::size_t r = 0; r < ranking.size(); ++r)
        if (p[static_cast<std::size_t>(ranking.id(r))] < floor) p[static_cast<std::size_t>(ranking.id(r))] = 0;
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
