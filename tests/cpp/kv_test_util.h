// Helpers shared by the KV kernel tests (CPU references and CUDA kernels): a random paged
// cache with shuffled pages and padded block tables, random token trees and accepted paths,
// and a direct "dense" view of a sequence's rows written without the kv_layout.h helpers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "specd/kv_layout.h"
#include "specd/token_tree.h"

namespace specd::testing {

// A cache of `num_pages` pages, each `page_stride` elements (>= block_size * kv_heads *
// head_dim: the gap is filled with sentinel values that must survive every kernel), and one
// block-table row per sequence: distinct random pages, padded with -1 up to `stride`.
struct RandomPagedCache {
  PagedKvLayout layout;
  std::vector<float> k, v;       // [num_pages * page_stride]
  std::vector<int32_t> table;    // [num_seqs, stride]
  int32_t width = 0, stride = 0;
};

inline RandomPagedCache random_paged_cache(std::mt19937& rng, int32_t num_seqs,
                                           int32_t blocks_per_seq, int32_t block_size,
                                           int32_t kv_heads, int32_t head_dim,
                                           int32_t spare_pages = 3, int32_t page_gap = 5) {
  RandomPagedCache c;
  c.layout.block_size = block_size;
  c.layout.kv_heads = kv_heads;
  c.layout.head_dim = head_dim;
  c.layout.num_pages = num_seqs * blocks_per_seq + spare_pages;
  c.layout.page_stride = int64_t{block_size} * kv_heads * head_dim + page_gap;
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::size_t elems = static_cast<std::size_t>(c.layout.num_pages * c.layout.page_stride);
  c.k.resize(elems);
  c.v.resize(elems);
  for (auto& x : c.k) x = normal(rng);
  for (auto& x : c.v) x = normal(rng);
  std::vector<int32_t> pages(static_cast<std::size_t>(c.layout.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  c.width = blocks_per_seq;
  c.stride = blocks_per_seq + 1;
  c.table.assign(static_cast<std::size_t>(num_seqs * c.stride), -1);
  for (int32_t s = 0; s < num_seqs; ++s)
    for (int32_t b = 0; b < blocks_per_seq; ++b)
      c.table[static_cast<std::size_t>(s * c.stride + b)] = pages[static_cast<std::size_t>(s * blocks_per_seq + b)];
  return c;
}

// Element offset of (sequence s, position pos)'s row, computed directly from the layout
// description (not through kv_layout.h), for checking the kernels' addressing.
inline int64_t dense_row(const RandomPagedCache& c, int32_t s, int32_t pos) {
  const int32_t page = c.table[static_cast<std::size_t>(s * c.stride + pos / c.layout.block_size)];
  return page * c.layout.page_stride +
         int64_t{pos % c.layout.block_size} * c.layout.kv_heads * c.layout.head_dim;
}

// A random tree with `drafts` draft nodes: each new node's parent is a uniformly chosen
// earlier node, or (with probability `chain_bias`) the previous node.
inline TokenTree random_tree(std::mt19937& rng, int32_t drafts, double chain_bias = 0.3) {
  TokenTree tree(static_cast<int32_t>(rng() % 1000));
  std::bernoulli_distribution chain(chain_bias);
  for (int32_t i = 1; i <= drafts; ++i) {
    const int32_t parent = chain(rng) ? i - 1 : static_cast<int32_t>(rng() % static_cast<uint32_t>(i));
    tree.add_node(parent, static_cast<int32_t>(rng() % 1000));
  }
  return tree;
}

// A random accepted path: root first, then a random walk down the tree stopping at a random
// depth (possibly 0).
inline std::vector<int32_t> random_path(std::mt19937& rng, const TokenTree& tree) {
  std::vector<int32_t> path{0};
  while (true) {
    std::vector<int32_t> children;
    for (int32_t c = tree.first_child(path.back()); c >= 0; c = tree.next_sibling(c)) children.push_back(c);
    if (children.empty() || rng() % 4 == 0) break;
    path.push_back(children[rng() % children.size()]);
  }
  return path;
}

// Whether node j is node i or one of its ancestors, by walking parents.
inline bool is_ancestor_or_self(const TokenTree& tree, int32_t j, int32_t i) {
  for (int32_t n = i; n >= 0; n = tree.parent(n))
    if (n == j) return true;
  return false;
}

}  // namespace specd::testing
