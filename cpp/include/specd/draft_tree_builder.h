// DraftTreeBuilder: grows a token tree from a draft model's top-k candidates and keeps the
// nodes most likely to be accepted under a node budget (EAGLE-2's dynamic draft tree).
//
// Use (one request, one step): the engine runs the draft model on the frontier nodes, passes
// each node's top-k (token, probability) pairs to expand(), asks frontier(beam) for the nodes
// to run next, repeats for the wanted depth, then build(budget) returns the tree to verify.
//
// Rules
// - path_prob(root) = 1; a child's path_prob = parent's path_prob * its draft probability.
//   This is the draft's estimate of the probability that the whole path is accepted.
// - frontier(beam): among nodes not yet expanded, at the deepest depth, the `beam` with the
//   largest path_prob (ties: lower index first).
// - build(budget): the `budget` draft nodes with the largest path_prob, ordered by
//   (path_prob desc, depth asc, index asc). Because a child's path_prob never exceeds its
//   parent's, this set contains every kept node's ancestors, so it is a tree. Siblings in the
//   result are ordered by path_prob (best first), which is the order verification tries them.
// - Candidates are deterministic (top-k, not sampled): verify such trees without draft rows
//   (one-hot proposals), which keeps verification lossless.
#pragma once

#include <cstdint>
#include <vector>

#include "specd/span.h"
#include "specd/status.h"
#include "specd/token_tree.h"

namespace specd {

class DraftTreeBuilder {
 public:
  explicit DraftTreeBuilder(int32_t root_token);

  // Adds children of `node` (already in the builder, not yet expanded): tokens[i] with draft
  // probability probs[i] in [0, 1]. Tokens must be distinct.
  Status expand(int32_t node, Span<const int32_t> tokens, Span<const float> probs);
  std::vector<int32_t> frontier(int32_t beam) const;

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  double path_prob(int32_t node) const { return path_prob_[static_cast<std::size_t>(node)]; }
  int32_t depth(int32_t node) const { return depth_[static_cast<std::size_t>(node)]; }
  int32_t parent(int32_t node) const { return parents_[static_cast<std::size_t>(node)]; }  // root: -1
  int32_t token(int32_t node) const { return tokens_[static_cast<std::size_t>(node)]; }

  // Grows a builder that holds only its root from the record of a tree grown on the device
  // (python/specd/engine/draft_tree_graph.py), with the expansions a host loop makes, in its
  // order. record: float64 [forwards, 2 w^2 + w] (w = width), row j holding
  //   [w][w] candidate tokens, then [w][w] their probabilities: entry (f, r) is rank r of the
  //       node forward j fed at frontier position f (row 0: the root's, at f = 0);
  //   [w] the frontier forward j fed: flat indices f * w + r into row j - 1's candidates, -1
  //       none (row 0: unused).
  // A node's candidates are its leading entries with probability > 0 (best first). Forward j's
  // frontier nodes are expanded in order; an empty frontier ends the growth. chain (optional)
  // gets the draft's greedy chain: the root, then the first candidate of each chain node that
  // has one. fed (optional) gets [(forwards - 1) w] the builder node forward j fed at frontier
  // position f, at (j - 1) w + f (the runner's KV layout: the node's draft KV slot), -1 where
  // none. Errors (kInvalidArgument, nothing kept past the failing expansion): a builder that
  // already grew, sizes, a frontier index that names no candidate.
  Status replay(Span<const double> record, int32_t forwards, int32_t width,
                std::vector<int32_t>* chain = nullptr, std::vector<int32_t>* fed = nullptr);

  // The tree of the `budget` best draft nodes. kept[i] (optional) = builder node of tree node i;
  // probs (optional) = path_prob of each tree node (root 1).
  TokenTree build(int32_t budget, std::vector<int32_t>* kept = nullptr,
                  std::vector<float>* probs = nullptr) const;

 private:
  std::vector<int32_t> tokens_, parents_, depth_;
  std::vector<double> path_prob_;
  std::vector<char> expanded_;
};

}  // namespace specd
