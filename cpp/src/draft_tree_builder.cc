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

Status DraftTreeBuilder::replay(Span<const double> record, int32_t forwards, int32_t width,
                                std::vector<int32_t>* chain, std::vector<int32_t>* fed) {
  if (size() != 1 || expanded_[0])
    return error_status(StatusCode::kFailedPrecondition, "replay: the builder already grew (", size(), " nodes)");
  if (width < 1 || forwards < 1)
    return error_status(StatusCode::kInvalidArgument, "replay: width (", width, ") and forwards (", forwards,
                        ") must be >= 1");
  const std::size_t w = static_cast<std::size_t>(width), cands = w * w, row = 2 * cands + w;
  if (record.size() != static_cast<std::size_t>(forwards) * row)
    return error_status(StatusCode::kInvalidArgument, "replay: a record of ", forwards, " rows of ", row,
                        " values has ", record.size());
  std::vector<int32_t> tokens(w);
  std::vector<float> probs(w);
  if (chain) chain->assign(1, 0);
  if (fed) fed->assign(static_cast<std::size_t>(forwards - 1) * w, -1);
  int32_t chain_node = 0;
  // Expands `node` with entry row `f` of forward `j`; returns its first child and count.
  auto grow = [&](std::size_t j, std::size_t f, int32_t node, int32_t* first, int32_t* count) -> Status {
    const double* base = record.data() + j * row + f * w;
    std::size_t n = 0;
    while (n < w && base[cands + n] > 0) {
      tokens[n] = static_cast<int32_t>(base[n]);
      probs[n] = static_cast<float>(base[cands + n]);
      ++n;
    }
    *first = size();
    *count = static_cast<int32_t>(n);
    SPECD_RETURN_IF_ERROR(expand(node, Span<const int32_t>(tokens.data(), n), Span<const float>(probs.data(), n)));
    if (node == chain_node && n > 0) {
      chain_node = *first;
      if (chain) chain->push_back(chain_node);
    }
    return Status::Ok();
  };
  std::vector<int32_t> firsts(1), counts(1), next_firsts, next_counts;
  SPECD_RETURN_IF_ERROR(grow(0, 0, 0, &firsts[0], &counts[0]));
  for (int32_t j = 1; j < forwards; ++j) {
    const double* selected = record.data() + static_cast<std::size_t>(j) * row + 2 * cands;
    next_firsts.clear();
    next_counts.clear();
    for (std::size_t f = 0; f < w; ++f) {
      if (selected[f] < 0) continue;
      const auto c = static_cast<int64_t>(selected[f]);
      const auto parent_slot = static_cast<std::size_t>(c / width);
      const auto rank = static_cast<int32_t>(c % width);
      if (static_cast<double>(c) != selected[f] || parent_slot >= firsts.size() || rank >= counts[parent_slot])
        return error_status(StatusCode::kInvalidArgument, "replay: forward ", j, " fed candidate ", selected[f],
                            ", which forward ", j - 1, " did not produce");
      int32_t first = 0, count = 0;
      const int32_t node = firsts[parent_slot] + rank;
      if (fed) (*fed)[static_cast<std::size_t>(j - 1) * w + f] = node;
      SPECD_RETURN_IF_ERROR(grow(static_cast<std::size_t>(j), next_firsts.size(), node, &first, &count));
      next_firsts.push_back(first);
      next_counts.push_back(count);
    }
    if (next_firsts.empty()) break;
    firsts.swap(next_firsts);
    counts.swap(next_counts);
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
