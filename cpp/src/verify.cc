// CPU reference of greedy and stochastic (lossless) verification of token trees.
// The rules are in verify.h; this file follows them literally, favouring clarity over speed.
#include "specd/verify.h"

#include <algorithm>
#include <cmath>

#include "specd/philox.h"
#include "specd/sampling.h"

namespace specd {
namespace {

Status check_rows(const ProbRows& rows, const TokenTree& tree, const char* which) {
  if (rows.data == nullptr || rows.vocab <= 0 || rows.stride < rows.vocab)
    return error_status(StatusCode::kInvalidArgument, which, " rows: bad shape (vocab ", rows.vocab,
                        ", stride ", rows.stride, ")");
  if (rows.rows < tree.size())
    return error_status(StatusCode::kInvalidArgument, which, " rows: ", rows.rows,
                        " rows for a tree of ", tree.size(), " nodes (root + ", tree.num_drafts(),
                        " drafts); one row per node is needed");
  return Status::Ok();
}

Status check_inputs(const TokenTree& tree, const ProbRows& target, const ProbRows* draft) {
  SPECD_RETURN_IF_ERROR(check_rows(target, tree, "target"));
  if (draft != nullptr) {
    SPECD_RETURN_IF_ERROR(check_rows(*draft, tree, "draft"));
    if (draft->vocab != target.vocab)
      return error_status(StatusCode::kInvalidArgument, "draft vocab ", draft->vocab,
                          " differs from target vocab ", target.vocab);
  }
  for (int32_t i = 1; i < tree.size(); ++i)
    if (tree.token(i) < 0 || tree.token(i) >= target.vocab)
      return error_status(StatusCode::kInvalidArgument, "draft token ", tree.token(i), " at node ",
                          i, " is outside the vocabulary [0, ", target.vocab, ")");
  return Status::Ok();
}

// The normalized distribution of one row, p_i = row_i / sum(row) in double. load() validates
// the row and sums it (one pass); prob(x) needs nothing more, so an accepted draft costs one
// pass over its row. materialize() fills the full vector, needed only to form a residual or
// for the final draw; values are the same either way.
class LazyDistribution {
 public:
  Status load(const ProbRows& rows, int32_t r, const char* which) {
    row_ = rows.row(r);
    vocab_ = rows.vocab;
    total_ = 0;
    materialized_ = false;
    bool valid = true;
    for (int32_t i = 0; i < vocab_; ++i) {
      const double v = row_[i];
      valid &= std::isfinite(v) && v >= 0;
      total_ += v;
    }
    if (!valid) {
      for (int32_t i = 0; i < vocab_; ++i)
        if (!std::isfinite(row_[i]) || row_[i] < 0)
          return error_status(StatusCode::kInvalidArgument, which, " row ", r, " has value ", row_[i],
                              " at token ", i, " (probabilities must be finite and >= 0)");
    }
    if (!(total_ > 0)) return error_status(StatusCode::kInvalidArgument, which, " row ", r, " sums to 0");
    inv_total_ = 1.0 / total_;
    return Status::Ok();
  }
  double prob(std::size_t x) const { return materialized_ ? p_[x] : static_cast<double>(row_[x]) * inv_total_; }
  std::vector<double>& materialize() {
    if (!materialized_) {
      p_.resize(static_cast<std::size_t>(vocab_));
      for (int32_t i = 0; i < vocab_; ++i) p_[static_cast<std::size_t>(i)] = static_cast<double>(row_[i]) * inv_total_;
      materialized_ = true;
    }
    return p_;
  }

 private:
  const float* row_ = nullptr;
  int32_t vocab_ = 0;
  double total_ = 0;
  double inv_total_ = 0;  // normalizing is a product (verify.h)
  bool materialized_ = false;
  std::vector<double> p_;
};

// Normalizes by the sum (v * (1 / sum), verify.h) when it is positive; returns false (leaving
// p as is) when it is 0.
bool normalize(std::vector<double>* p) {
  double total = 0;
  for (double v : *p) total += v;
  if (!(total > 0)) return false;
  const double inv = 1.0 / total;
  for (double& v : *p) v = v * inv;
  return true;
}

Status check_distinct_siblings(const TokenTree& tree, int32_t node) {
  for (int32_t a = tree.first_child(node); a >= 0; a = tree.next_sibling(a))
    for (int32_t b = tree.next_sibling(a); b >= 0; b = tree.next_sibling(b))
      if (tree.token(a) == tree.token(b))
        return error_status(StatusCode::kInvalidArgument, "nodes ", a, " and ", b,
                            " are siblings with the same token ", tree.token(a),
                            "; drafts sampled without replacement are distinct");
  return Status::Ok();
}

void start(VerifyResult* out) {
  out->tokens.clear();
  out->path.assign(1, 0);
  out->num_accepted = 0;
}

void accept(const TokenTree& tree, int32_t node, VerifyResult* out) {
  out->tokens.push_back(tree.token(node));
  out->path.push_back(node);
  ++out->num_accepted;
}

}  // namespace

// Greedy walk: `best(node)` gives the target's argmax after node (or an error).
template <class BestFn>
Status greedy_walk(const TokenTree& tree, BestFn best, VerifyResult* out) {
  start(out);
  int32_t node = 0;
  while (true) {
    int32_t token = -1;
    SPECD_RETURN_IF_ERROR(best(node, &token));
    const int32_t child = tree.find_child(node, token);
    if (child < 0) {
      out->tokens.push_back(token);  // bonus token (or the correction of a rejected draft)
      return Status::Ok();
    }
    accept(tree, child, out);
    node = child;
  }
}

Status verify_greedy(const TokenTree& tree, const ProbRows& target, VerifyResult* out) {
  SPECD_RETURN_IF_ERROR(check_inputs(tree, target, nullptr));
  return greedy_walk(tree, [&target](int32_t node, int32_t* token) {
    // One pass: argmax (lowest index among ties) and NaN detection.
    const float* row = target.row(node);
    int32_t best = 0;
    float best_value = row[0];
    bool nan = std::isnan(best_value);
    for (int32_t i = 1; i < target.vocab; ++i) {
      const float v = row[i];
      nan |= std::isnan(v);
      if (v > best_value) {
        best_value = v;
        best = i;
      }
    }
    if (nan) return error_status(StatusCode::kInvalidArgument, "target row ", node, " has NaN");
    *token = best;
    return Status::Ok();
  }, out);
}

Status verify_greedy_tokens(const TokenTree& tree, Span<const int32_t> target_tokens, VerifyResult* out) {
  if (target_tokens.size() < static_cast<std::size_t>(tree.size()))
    return error_status(StatusCode::kInvalidArgument, "verify_greedy_tokens: ", target_tokens.size(),
                        " target tokens for a tree of ", tree.size(), " nodes");
  return greedy_walk(tree, [&target_tokens](int32_t node, int32_t* token) {
    *token = target_tokens[static_cast<std::size_t>(node)];
    if (*token < 0)
      return error_status(StatusCode::kInvalidArgument, "target token ", *token, " of node ", node, " is negative");
    return Status::Ok();
  }, out);
}

Status verify_stochastic(const TokenTree& tree, const ProbRows& target, const ProbRows* draft,
                         DraftSampling sampling, const RngKey& rng, VerifyResult* out) {
  SPECD_RETURN_IF_ERROR(check_inputs(tree, target, draft));
  start(out);
  LazyDistribution p, q;
  int32_t node = 0;
  while (true) {
    const uint32_t position = rng.position + static_cast<uint32_t>(tree.depth(node));
    SPECD_RETURN_IF_ERROR(p.load(target, node, "target"));
    int32_t accepted = -1;
    if (tree.first_child(node) >= 0 && draft != nullptr) {
      SPECD_RETURN_IF_ERROR(q.load(*draft, node, "draft"));
      if (sampling == DraftSampling::kWithoutReplacement)
        SPECD_RETURN_IF_ERROR(check_distinct_siblings(tree, node));
    }
    uint32_t j = 0;
    for (int32_t c = tree.first_child(node); c >= 0 && accepted < 0; c = tree.next_sibling(c), ++j) {
      const auto x = static_cast<std::size_t>(tree.token(c));
      const double qx = draft != nullptr ? q.prob(x) : 1.0;
      if (!(qx > 0))
        return error_status(StatusCode::kInvalidArgument, "draft token ", x, " at node ", c,
                            " has draft probability 0 in draft row ", node,
                            " (drafts must be sampled from the draft rows)");
      const double u = philox_uniform(rng.seed, rng.request, rng.step, position, j);
      if (u * qx < p.prob(x)) {
        accepted = c;
        break;
      }
      // Rejected: continue with the residual distribution (the rows are materialized now).
      std::vector<double>& pv = p.materialize();
      if (draft != nullptr) {
        std::vector<double>& qv = q.materialize();
        std::vector<double> residual(pv.size());
        for (std::size_t i = 0; i < pv.size(); ++i) residual[i] = std::max(0.0, pv[i] - qv[i]);
        if (normalize(&residual)) pv.swap(residual);  // all-zero residual: probability-0 event
        if (sampling == DraftSampling::kWithoutReplacement) {
          qv[x] = 0;
          normalize(&qv);
        }
      } else {
        pv[x] = 0;
        normalize(&pv);
      }
    }
    if (accepted >= 0) {
      accept(tree, accepted, out);
      node = accepted;
      continue;
    }
    const std::vector<double>& pv = p.materialize();
    double total = 0;
    for (double v : pv) total += v;
    const double u = philox_uniform(rng.seed, rng.request, rng.step, position, kFinalDraw);
    out->tokens.push_back(sample_from_weights(Span<const double>(pv.data(), pv.size()), total, u));
    return Status::Ok();
  }
}

Status sample_token(const float* probs, int32_t vocab, const RngKey& rng, int32_t* token) {
  const TokenTree root_only(0);
  const ProbRows rows{probs, 1, vocab, vocab};
  VerifyResult result;
  SPECD_RETURN_IF_ERROR(verify_stochastic(root_only, rows, nullptr, DraftSampling::kIndependent, rng, &result));
  *token = result.tokens[0];
  return Status::Ok();
}

}  // namespace specd
