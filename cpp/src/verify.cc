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

// Copies row r as doubles and normalizes it, validating values.
Status load_distribution(const ProbRows& rows, int32_t r, const char* which, std::vector<double>* p) {
  const float* row = rows.row(r);
  p->resize(static_cast<std::size_t>(rows.vocab));
  double total = 0;
  for (int32_t i = 0; i < rows.vocab; ++i) {
    const double v = row[i];
    if (!std::isfinite(v) || v < 0)
      return error_status(StatusCode::kInvalidArgument, which, " row ", r, " has value ", v,
                          " at token ", i, " (probabilities must be finite and >= 0)");
    (*p)[static_cast<std::size_t>(i)] = v;
    total += v;
  }
  if (!(total > 0))
    return error_status(StatusCode::kInvalidArgument, which, " row ", r, " sums to 0");
  for (double& v : *p) v /= total;
  return Status::Ok();
}

// Divides by the sum when it is positive; returns false (leaving p as is) when it is 0.
bool normalize(std::vector<double>* p) {
  double total = 0;
  for (double v : *p) total += v;
  if (!(total > 0)) return false;
  for (double& v : *p) v /= total;
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

Status verify_greedy(const TokenTree& tree, const ProbRows& target, VerifyResult* out) {
  SPECD_RETURN_IF_ERROR(check_inputs(tree, target, nullptr));
  start(out);
  int32_t node = 0;
  while (true) {
    const Span<const float> row(target.row(node), static_cast<std::size_t>(target.vocab));
    for (std::size_t i = 0; i < row.size(); ++i)
      if (std::isnan(row[i]))
        return error_status(StatusCode::kInvalidArgument, "target row ", node, " has NaN at token ", i);
    const int32_t best = argmax(row);
    const int32_t child = tree.find_child(node, best);
    if (child < 0) {
      out->tokens.push_back(best);  // bonus token (or the correction of a rejected draft)
      return Status::Ok();
    }
    accept(tree, child, out);
    node = child;
  }
}

Status verify_stochastic(const TokenTree& tree, const ProbRows& target, const ProbRows* draft,
                         DraftSampling sampling, const RngKey& rng, VerifyResult* out) {
  SPECD_RETURN_IF_ERROR(check_inputs(tree, target, draft));
  start(out);
  std::vector<double> p, q;
  int32_t node = 0;
  while (true) {
    const uint32_t position = rng.position + static_cast<uint32_t>(tree.depth(node));
    SPECD_RETURN_IF_ERROR(load_distribution(target, node, "target", &p));
    int32_t accepted = -1;
    if (tree.first_child(node) >= 0 && draft != nullptr) {
      SPECD_RETURN_IF_ERROR(load_distribution(*draft, node, "draft", &q));
      if (sampling == DraftSampling::kWithoutReplacement)
        SPECD_RETURN_IF_ERROR(check_distinct_siblings(tree, node));
    }
    uint32_t j = 0;
    for (int32_t c = tree.first_child(node); c >= 0 && accepted < 0; c = tree.next_sibling(c), ++j) {
      const auto x = static_cast<std::size_t>(tree.token(c));
      const double qx = draft != nullptr ? q[x] : 1.0;
      if (!(qx > 0))
        return error_status(StatusCode::kInvalidArgument, "draft token ", x, " at node ", c,
                            " has draft probability 0 in draft row ", node,
                            " (drafts must be sampled from the draft rows)");
      const double u = philox_uniform(rng.seed, rng.request, rng.step, position, j);
      if (u * qx < p[x]) {
        accepted = c;
        break;
      }
      // Rejected: continue with the residual distribution.
      if (draft != nullptr) {
        std::vector<double> residual(p.size());
        for (std::size_t i = 0; i < p.size(); ++i) residual[i] = std::max(0.0, p[i] - q[i]);
        if (normalize(&residual)) p.swap(residual);  // all-zero residual: probability-0 event
        if (sampling == DraftSampling::kWithoutReplacement) {
          q[x] = 0;
          normalize(&q);
        }
      } else {
        p[x] = 0;
        normalize(&p);
      }
    }
    if (accepted >= 0) {
      accept(tree, accepted, out);
      node = accepted;
      continue;
    }
    double total = 0;
    for (double v : p) total += v;
    const double u = philox_uniform(rng.seed, rng.request, rng.step, position, kFinalDraw);
    out->tokens.push_back(sample_from_weights(Span<const double>(p.data(), p.size()), total, u));
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
