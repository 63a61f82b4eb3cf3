// Verification: deciding which draft tokens of a TokenTree the target accepts, and the one
// extra token it emits after them — the CPU reference that the CUDA kernels must reproduce.
//
// Inputs: the tree (node 0 = root = the request's last token) and the target's rows
// [tree.size(), vocab]: row v is the target's distribution (or scores, for greedy) of the token
// that follows node v's path. Draft rows, when given, have the same layout: row v is the
// distribution node v's children were sampled from.
//
// Output (VerifyResult): `path` = accepted nodes from the root (path[0] == 0), `num_accepted`
// = path.size() - 1 accepted drafts, and `tokens` = the accepted drafts' tokens followed by
// one more token: the bonus token (sampled from the last accepted node's row) or, when a
// node's children were all rejected, the recovered token (sampled from what remains of that
// row). So every call emits num_accepted + 1 tokens.
//
// Greedy rules: at node v, a = argmax(row v) (lowest id among ties); the first child of v with
// token a is accepted and the walk continues there; otherwise a is emitted and the walk ends.
//
// Stochastic rules (lossless: emitted tokens follow the target rows exactly). At node v with
// target distribution p (row v, normalized) and children c_1..c_m tried in sibling order:
// - with draft rows (children sampled from q = row v of the draft): child c_j with token x is
//   accepted iff u_j * q_j(x) < p_j(x), i.e. with probability min(1, p_j(x) / q_j(x)); on
//   rejection p_{j+1} = normalize(max(0, p_j - q_j)). kIndependent: siblings were drawn i.i.d.
//   from q, so q_j = q (SpecInfer). kWithoutReplacement: siblings were drawn without
//   replacement, so q_{j+1} = q_j with x removed and renormalized (sibling tokens must be
//   distinct). A drafted token with q_j(x) == 0 is an input error.
// - without draft rows (deterministic proposals: n-gram, suffix, top-k trees): q_j is one-hot
//   at x, so c_j is accepted with probability p_j(x), and on rejection p_{j+1} is p_j with x
//   removed and renormalized.
// - accepted: continue at c_j. All rejected: the recovered token is drawn from p_{m+1}. A node
//   without children (a leaf, or the root of an empty tree): the bonus token is drawn from p.
// Randomness (philox.h): u_j for the children of a node at depth d is
// philox_uniform(seed, request, step, position + d, j); the final draw at depth d uses draw
// index kFinalDraw. `position` is the absolute position of the first token the call decides
// (the root's position + 1). Each position is decided once, so no draw is ever reused.
//
// Row validation: rows that are read must be finite with non-negative values and a positive
// sum (probability rows need not be normalized; they are normalized in double).
// Normalizing v by its sum s is v * (1 / s) (one division per row, not per entry), here, in
// the batched CPU versions and in the CUDA kernels alike.
#pragma once

#include <cstdint>
#include <vector>

#include "specd/span.h"
#include "specd/status.h"
#include "specd/token_tree.h"

namespace specd {

// A row-major [rows, vocab] float32 matrix view (row stride in elements, >= vocab).
struct ProbRows {
  const float* data = nullptr;
  int32_t rows = 0;
  int32_t vocab = 0;
  int64_t stride = 0;
  const float* row(int32_t r) const { return data + r * stride; }
};

struct VerifyResult {
  std::vector<int32_t> tokens;  // [num_accepted + 1] accepted drafts, then bonus/recovered
  std::vector<int32_t> path;    // [num_accepted + 1] accepted nodes, root first
  int32_t num_accepted = 0;
};

enum class DraftSampling : int32_t {
  kWithoutReplacement = 0,  // siblings drawn from q without replacement (distinct tokens)
  kIndependent = 1,         // siblings drawn i.i.d. from q
};

// Where a verification's random draws come from (philox.h).
struct RngKey {
  uint64_t seed = 0;
  uint32_t request = 0;
  uint32_t step = 0;
  uint32_t position = 0;  // absolute position of the first token this call decides
};

inline constexpr uint32_t kFinalDraw = 0xFFFFFFFFu;

Status verify_greedy(const TokenTree& tree, const ProbRows& target, VerifyResult* out);
// Greedy verification from the target's argmax per node (target_tokens[v] = argmax of row v,
// e.g. computed on the device): the same walk, O(nodes visited).
Status verify_greedy_tokens(const TokenTree& tree, Span<const int32_t> target_tokens, VerifyResult* out);

// `draft` may be null (deterministic proposals); `sampling` is ignored then.
Status verify_stochastic(const TokenTree& tree, const ProbRows& target, const ProbRows* draft,
                         DraftSampling sampling, const RngKey& rng, VerifyResult* out);

// Plain sampling of one token from a probability row with the verifier's final draw at
// rng.position: equal to verify_stochastic on a root-only tree.
Status sample_token(const float* probs, int32_t vocab, const RngKey& rng, int32_t* token);

}  // namespace specd
