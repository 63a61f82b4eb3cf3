// TokenTree: draft tokens proposed for one request in one step, as a tree rooted at the
// request's last token. A chain is the special case of one child per node.
//
// Rules
// - Node 0 is the root: the request's last token (decided, not a draft; its KV is written by
//   the verify pass together with the drafts). Nodes 1..size()-1 are draft tokens.
// - Nodes are in topological order: parent(0) == -1 and 0 <= parent(i) < i for i >= 1.
// - depth(0) == 0 and depth(i) == depth(parent(i)) + 1. A node's position in the sequence is
//   the root's position + depth(i): the verify pass uses it for RoPE ("position offsets").
// - Children of a node are ordered by insertion; verification tries siblings in that order,
//   so builders put the most promising candidate first.
// - Node i attends to node j (the verify pass's tree mask) iff j is i or an ancestor of i.
// - Sibling tokens may repeat only where the proposer samples drafts with replacement;
//   builders from candidate lists merge equal prefixes, so their siblings are distinct.
#pragma once

#include <cstdint>
#include <vector>

#include "specd/span.h"
#include "specd/status.h"

namespace specd {

class TokenTree {
 public:
  explicit TokenTree(int32_t root_token = 0);

  // A chain: root -> drafts[0] -> drafts[1] -> ...
  static TokenTree chain(int32_t root_token, Span<const int32_t> drafts);
  // From parallel arrays (node 0 is the root, parents[0] == -1); validates the rules above.
  static Status from_parents(Span<const int32_t> tokens, Span<const int32_t> parents,
                             TokenTree* out);
  // Prefix-merged trie of candidate continuations, in the order given (earlier candidates'
  // nodes come first among siblings). Stops adding nodes once `max_nodes` drafts exist
  // (max_nodes < 0: no limit); a candidate cut short keeps its prefix.
  static TokenTree from_candidates(int32_t root_token,
                                   const std::vector<std::vector<int32_t>>& candidates,
                                   int32_t max_nodes = -1);

  // Appends a draft node under `parent` and returns its index; -1 (and no change) when
  // `parent` is not a node of the tree.
  int32_t add_node(int32_t parent, int32_t token);
  // Index of the first child of `node` holding `token`; -1 if none or `node` is invalid.
  int32_t find_child(int32_t node, int32_t token) const;

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t num_drafts() const { return size() - 1; }
  int32_t root_token() const { return tokens_[0]; }
  int32_t token(int32_t node) const { return tokens_[static_cast<std::size_t>(node)]; }
  int32_t parent(int32_t node) const { return parents_[static_cast<std::size_t>(node)]; }
  int32_t depth(int32_t node) const { return depths_[static_cast<std::size_t>(node)]; }
  int32_t first_child(int32_t node) const { return first_child_[static_cast<std::size_t>(node)]; }
  int32_t next_sibling(int32_t node) const { return next_sibling_[static_cast<std::size_t>(node)]; }
  int32_t max_depth() const { return max_depth_; }
  bool is_chain() const;

  const std::vector<int32_t>& tokens() const { return tokens_; }    // [size]
  const std::vector<int32_t>& parents() const { return parents_; }  // [size]
  const std::vector<int32_t>& depths() const { return depths_; }    // [size] = position offsets

  // Bit-packed ancestor mask, row-major [size, mask_words()] of uint64: bit (j % 64) of word
  // (j / 64) in row i is set iff node i attends to node j.
  int32_t mask_words() const { return (size() + 63) / 64; }
  std::vector<uint64_t> ancestor_mask() const;
  // Leaves in index order, and each root-to-leaf path as a row of [num_leaves, max_depth()+1]
  // node indices (root first), padded with -1.
  std::vector<int32_t> leaves() const;
  std::vector<int32_t> paths() const;

 private:
  std::vector<int32_t> tokens_, parents_, depths_;
  std::vector<int32_t> first_child_, last_child_, next_sibling_;
  int32_t max_depth_ = 0;
};

// Trees of many requests in one step, concatenated (CSR): request r's nodes are
// [offsets[r], offsets[r+1]); parents are local indices (-1 for each root). node_probs is the
// proposer's estimate, per node, of the probability that the node is accepted (its whole
// path from the root matches the target); 1 for roots. Their sum over a tree's drafts is the
// proposer's expected number of accepted tokens, which the speculation controller uses.
struct TokenTreeBatch {
  std::vector<int32_t> offsets{0};  // [num_requests + 1]
  std::vector<int32_t> tokens;      // [total nodes]
  std::vector<int32_t> parents;     // [total nodes]
  std::vector<float> node_probs;    // [total nodes]

  void clear();
  // Appends a tree; `probs` gives node_probs for its nodes ([tree.size()]), or is empty for
  // "unknown" (stored as 1 for the root and 0 for drafts).
  void append(const TokenTree& tree, Span<const float> probs = {});
  int32_t num_trees() const { return static_cast<int32_t>(offsets.size()) - 1; }
  // Rebuilds tree r (validating it).
  Status tree(int32_t r, TokenTree* out) const;
};

}  // namespace specd
