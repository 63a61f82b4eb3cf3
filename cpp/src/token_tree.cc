#include "specd/token_tree.h"

#include <algorithm>

namespace specd {

TokenTree::TokenTree(int32_t root_token)
    : tokens_{root_token}, parents_{-1}, depths_{0}, first_child_{-1}, last_child_{-1},
      next_sibling_{-1} {}

TokenTree TokenTree::chain(int32_t root_token, Span<const int32_t> drafts) {
  TokenTree t(root_token);
  int32_t node = 0;
  for (int32_t token : drafts) node = t.add_node(node, token);
  return t;
}

Status TokenTree::from_parents(Span<const int32_t> tokens, Span<const int32_t> parents,
                               TokenTree* out) {
  if (tokens.empty())
    return error_status(StatusCode::kInvalidArgument, "a token tree needs a root node");
  if (tokens.size() != parents.size())
    return error_status(StatusCode::kInvalidArgument, "token tree: ", tokens.size(),
                        " tokens but ", parents.size(), " parents");
  if (parents[0] != -1)
    return error_status(StatusCode::kInvalidArgument, "token tree: node 0 is the root, its parent must be -1, got ",
                        parents[0]);
  TokenTree t(tokens[0]);
  for (std::size_t i = 1; i < tokens.size(); ++i) {
    if (parents[i] < 0 || static_cast<std::size_t>(parents[i]) >= i)
      return error_status(StatusCode::kInvalidArgument, "token tree: node ", i, " has parent ",
                          parents[i], "; parents must precede their children (0 <= parent < ", i, ")");
    t.add_node(parents[i], tokens[i]);
  }
  *out = std::move(t);
  return Status::Ok();
}

TokenTree TokenTree::from_candidates(int32_t root_token,
                                     const std::vector<std::vector<int32_t>>& candidates,
                                     int32_t max_nodes) {
  TokenTree t(root_token);
  for (const std::vector<int32_t>& cand : candidates) {
    int32_t node = 0;
    for (int32_t token : cand) {
      const int32_t child = t.find_child(node, token);
      if (child >= 0) {
        node = child;
        continue;
      }
      if (max_nodes >= 0 && t.num_drafts() >= max_nodes) return t;
      node = t.add_node(node, token);
    }
  }
  return t;
}

int32_t TokenTree::add_node(int32_t parent, int32_t token) {
  if (parent < 0 || parent >= size()) return -1;
  const auto index = static_cast<int32_t>(tokens_.size());
  const auto p = static_cast<std::size_t>(parent);
  tokens_.push_back(token);
  parents_.push_back(parent);
  depths_.push_back(depths_[p] + 1);
  max_depth_ = std::max(max_depth_, depths_.back());
  first_child_.push_back(-1);
  last_child_.push_back(-1);
  next_sibling_.push_back(-1);
  if (last_child_[p] < 0) {
    first_child_[p] = index;
  } else {
    next_sibling_[static_cast<std::size_t>(last_child_[p])] = index;
  }
  last_child_[p] = index;
  return index;
}

int32_t TokenTree::find_child(int32_t node, int32_t token) const {
  if (node < 0 || node >= size()) return -1;
  for (int32_t c = first_child(node); c >= 0; c = next_sibling(c))
    if (tokens_[static_cast<std::size_t>(c)] == token) return c;
  return -1;
}

bool TokenTree::is_chain() const {
  for (int32_t i = 1; i < size(); ++i)
    if (parents_[static_cast<std::size_t>(i)] != i - 1) return false;
  return true;
}

std::vector<uint64_t> TokenTree::ancestor_mask() const {
  const auto words = static_cast<std::size_t>(mask_words());
  std::vector<uint64_t> mask(static_cast<std::size_t>(size()) * words, 0);
  for (int32_t i = 0; i < size(); ++i) {
    uint64_t* row = mask.data() + static_cast<std::size_t>(i) * words;
    // Row i = row of its parent (already complete: parents precede children) + bit i.
    if (i > 0) {
      const uint64_t* parent_row = mask.data() + static_cast<std::size_t>(parent(i)) * words;
      std::copy(parent_row, parent_row + words, row);
    }
    row[static_cast<std::size_t>(i) / 64] |= uint64_t{1} << (i % 64);
  }
  return mask;
}

std::vector<int32_t> TokenTree::leaves() const {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < size(); ++i)
    if (first_child(i) < 0) out.push_back(i);
  return out;
}

std::vector<int32_t> TokenTree::paths() const {
  const std::vector<int32_t> leaf = leaves();
  const auto width = static_cast<std::size_t>(max_depth_ + 1);
  std::vector<int32_t> out(leaf.size() * width, -1);
  for (std::size_t r = 0; r < leaf.size(); ++r)
    for (int32_t node = leaf[r]; node >= 0; node = parent(node))
      out[r * width + static_cast<std::size_t>(depth(node))] = node;
  return out;
}

void TokenTreeBatch::clear() {
  offsets.assign(1, 0);
  tokens.clear();
  parents.clear();
  node_probs.clear();
}

void TokenTreeBatch::append(const TokenTree& tree, Span<const float> probs) {
  tokens.insert(tokens.end(), tree.tokens().begin(), tree.tokens().end());
  parents.insert(parents.end(), tree.parents().begin(), tree.parents().end());
  if (probs.size() == static_cast<std::size_t>(tree.size())) {
    node_probs.insert(node_probs.end(), probs.begin(), probs.end());
  } else {
    node_probs.push_back(1.0f);
    node_probs.insert(node_probs.end(), static_cast<std::size_t>(tree.num_drafts()), 0.0f);
  }
  offsets.push_back(static_cast<int32_t>(tokens.size()));
}

Status TokenTreeBatch::tree(int32_t r, TokenTree* out) const {
  if (r < 0 || r >= num_trees())
    return error_status(StatusCode::kOutOfRange, "tree ", r, " out of range [0, ", num_trees(), ")");
  const auto b = static_cast<std::size_t>(offsets[static_cast<std::size_t>(r)]);
  const auto e = static_cast<std::size_t>(offsets[static_cast<std::size_t>(r) + 1]);
  return TokenTree::from_parents(Span<const int32_t>(tokens.data() + b, e - b),
                                 Span<const int32_t>(parents.data() + b, e - b), out);
}

}  // namespace specd
