#include "specd/draft_tree_builder.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specd {

DraftTreeBuilder::DraftTreeBuilder(int32_t root_token)
    : tokens_{root_token}, parents_{-1}, depth_{0}, path_prob_{1.0}, expanded_{0} {}

Status DraftTreeBuilder::expand(int32_t node, Span<const int32_t> tokens, Span<const float> probs) {
  if (node < 0 || node >= size())
    return error_status(StatusCode::kInvalidArgument, "expand: node ", node, " is not in [0, ", size(), ")");
  if (expanded_[static_cast<std::size_t>(node)])
    return error_status(StatusCode::kFailedPrecondition, "expand: node ", node, " was already expanded");
  if (tokens.size() != probs.size())
    return error_status(StatusCode::kInvalidArgument, "expand: ", tokens.size(), " tokens but ",
                        probs.size(), " probabilities");
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (!(probs[i] >= 0 && probs[i] <= 1))
      return error_status(StatusCode::kInvalidArgument, "expand: probability ", probs[i],
                          " of token ", tokens[i], " is not in [0, 1]");
    if (tokens[i] < 0)
      return error_status(StatusCode::kInvalidArgument, "expand: negative token ", tokens[i]);
    for (std::size_t j = 0; j < i; ++j)
      if (tokens[j] == tokens[i])
        return error_status(StatusCode::kInvalidArgument, "expand: token ", tokens[i], " given twice");
  }
  expanded_[static_cast<std::size_t>(node)] = 1;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens_.push_back(tokens[i]);
    parents_.push_back(node);
    depth_.push_back(depth(node) + 1);
    path_prob_.push_back(path_prob(node) * static_cast<double>(probs[i]));
    expanded_.push_back(0);
  }
  return Status::Ok();
}

std::vector<int32_t> DraftTreeBuilder::frontier(int32_t beam) const {
  int32_t deepest = 0;
  for (int32_t i = 0; i < size(); ++i)
    if (!expanded_[static_cast<std::size_t>(i)]) deepest = std::max(deepest, depth(i));
  std::vector<int32_t> open;
  for (int32_t i = 0; i < size(); ++i)
    if (!expanded_[static_cast<std::size_t>(i)] && depth(i) == deepest) open.push_back(i);
  std::stable_sort(open.begin(), open.end(),
                   [this](int32_t a, int32_t b) { return path_prob(a) > path_prob(b); });
  if (beam >= 0 && open.size() > static_cast<std::size_t>(beam)) open.resize(static_cast<std::size_t>(beam));
  return open;
}

TokenTree DraftTreeBuilder::build(int32_t budget, std::vector<int32_t>* kept,
                                  std::vector<float>* probs) const {
  std::vector<int32_t> order(static_cast<std::size_t>(size()) - 1);
  std::iota(order.begin(), order.end(), 1);
  std::sort(order.begin(), order.end(), [this](int32_t a, int32_t b) {
    if (path_prob(a) != path_prob(b)) return path_prob(a) > path_prob(b);
    if (depth(a) != depth(b)) return depth(a) < depth(b);
    return a < b;
  });
  if (budget >= 0 && order.size() > static_cast<std::size_t>(budget)) order.resize(static_cast<std::size_t>(budget));
  // `order` lists parents before children (see the header), so nodes can be added in order.
  std::vector<int32_t> tree_index(static_cast<std::size_t>(size()), -1);
  tree_index[0] = 0;
  TokenTree tree(tokens_[0]);
  if (kept) kept->assign(1, 0);
  if (probs) probs->assign(1, 1.0f);
  for (int32_t b : order) {
    const int32_t parent = tree_index[static_cast<std::size_t>(parents_[static_cast<std::size_t>(b)])];
    tree_index[static_cast<std::size_t>(b)] = tree.add_node(parent, tokens_[static_cast<std::size_t>(b)]);
    if (kept) kept->push_back(b);
    if (probs) probs->push_back(static_cast<float>(path_prob(b)));
  }
  return tree;
}

}  // namespace specd
