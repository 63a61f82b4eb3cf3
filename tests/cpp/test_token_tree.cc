// TokenTree (representation, masks, paths, builders) and DraftTreeBuilder (EAGLE-2 style).
#include <gtest/gtest.h>

#include "block_manager_test_util.h"
#include "specd/draft_tree_builder.h"
#include "specd/token_tree.h"

namespace specd::testing {
namespace {

using V = std::vector<int32_t>;

// root(9) -> a(1) -> c(3)
//         -> b(2) -> d(4)
//                 -> e(5)
TokenTree example_tree() {
  TokenTree t(9);
  const int32_t a = t.add_node(0, 1);
  const int32_t b = t.add_node(0, 2);
  t.add_node(a, 3);
  t.add_node(b, 4);
  t.add_node(b, 5);
  return t;
}

TEST(TokenTree, RepresentationOfAnExampleTree) {
  const TokenTree t = example_tree();
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.num_drafts(), 5);
  EXPECT_EQ(t.tokens(), (V{9, 1, 2, 3, 4, 5}));
  EXPECT_EQ(t.parents(), (V{-1, 0, 0, 1, 2, 2}));
  EXPECT_EQ(t.depths(), (V{0, 1, 1, 2, 2, 2}));
  EXPECT_EQ(t.max_depth(), 2);
  EXPECT_FALSE(t.is_chain());
  EXPECT_EQ(t.find_child(0, 2), 2);
  EXPECT_EQ(t.find_child(2, 5), 5);
  EXPECT_EQ(t.find_child(1, 4), -1);
  EXPECT_EQ(t.find_child(6, 4), -1);  // not a node
  TokenTree copy = t;
  EXPECT_EQ(copy.add_node(6, 1), -1);
  EXPECT_EQ(copy.add_node(-1, 1), -1);
  EXPECT_EQ(copy.size(), 6);
  // Siblings in insertion order.
  EXPECT_EQ(t.first_child(2), 4);
  EXPECT_EQ(t.next_sibling(4), 5);
  EXPECT_EQ(t.next_sibling(5), -1);
}

TEST(TokenTree, AncestorMaskAndPaths) {
  const TokenTree t = example_tree();
  ASSERT_EQ(t.mask_words(), 1);
  const std::vector<uint64_t> mask = t.ancestor_mask();
  // Node i attends to itself and its ancestors.
  EXPECT_EQ(mask, (std::vector<uint64_t>{0b000001, 0b000011, 0b000101, 0b001011, 0b010101, 0b100101}));
  EXPECT_EQ(t.leaves(), (V{3, 4, 5}));
  EXPECT_EQ(t.paths(), (V{0, 1, 3, 0, 2, 4, 0, 2, 5}));
}

TEST(TokenTree, MaskSpansSeveralWords) {
  std::vector<int32_t> drafts(99);
  for (int32_t i = 0; i < 99; ++i) drafts[static_cast<std::size_t>(i)] = i;
  const TokenTree t = TokenTree::chain(7, drafts);
  ASSERT_EQ(t.mask_words(), 2);
  const std::vector<uint64_t> mask = t.ancestor_mask();
  // Node 99 (last) attends to all 100 nodes: word 0 full, word 1 has 36 bits.
  EXPECT_EQ(mask[99 * 2], ~uint64_t{0});
  EXPECT_EQ(mask[99 * 2 + 1], (uint64_t{1} << 36) - 1);
  // Node 64 attends to 0..64.
  EXPECT_EQ(mask[64 * 2], ~uint64_t{0});
  EXPECT_EQ(mask[64 * 2 + 1], uint64_t{1});
  EXPECT_TRUE(t.is_chain());
  EXPECT_EQ(t.paths().size(), 100u);  // one leaf, path of all nodes
}

TEST(TokenTree, ChainIsATreeWithOneChildPerNode) {
  const TokenTree t = TokenTree::chain(5, V{6, 7, 8});
  EXPECT_EQ(t.tokens(), (V{5, 6, 7, 8}));
  EXPECT_EQ(t.parents(), (V{-1, 0, 1, 2}));
  EXPECT_EQ(t.depths(), (V{0, 1, 2, 3}));
  EXPECT_TRUE(t.is_chain());
  EXPECT_TRUE(TokenTree(5).is_chain());
}

TEST(TokenTree, FromCandidatesMergesPrefixesInOrder) {
  const TokenTree t = TokenTree::from_candidates(0, {{1, 2, 3}, {1, 2, 4}, {5}, {1, 6}});
  EXPECT_EQ(t.tokens(), (V{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t.parents(), (V{-1, 0, 1, 2, 2, 0, 1}));
  // Node budget: candidates are cut, keeping prefixes.
  const TokenTree cut = TokenTree::from_candidates(0, {{1, 2, 3}, {1, 2, 4}, {5}}, 4);
  EXPECT_EQ(cut.tokens(), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(TokenTree::from_candidates(0, {{1, 2}}, 0).size(), 1);
}

TEST(TokenTree, FromParentsValidates) {
  TokenTree t;
  SPECD_ASSERT_OK(TokenTree::from_parents(V{9, 1, 2, 3}, V{-1, 0, 0, 1}, &t));
  EXPECT_EQ(t.depths(), (V{0, 1, 1, 2}));
  SPECD_EXPECT_CODE(TokenTree::from_parents(V{}, V{}, &t), kInvalidArgument);
  SPECD_EXPECT_CODE(TokenTree::from_parents(V{1, 2}, V{-1}, &t), kInvalidArgument);
  SPECD_EXPECT_CODE(TokenTree::from_parents(V{1, 2}, V{0, 0}, &t), kInvalidArgument);
  SPECD_EXPECT_CODE(TokenTree::from_parents(V{1, 2, 3}, V{-1, 2, 0}, &t), kInvalidArgument);
  SPECD_EXPECT_CODE(TokenTree::from_parents(V{1, 2}, V{-1, -1}, &t), kInvalidArgument);
}

TEST(TokenTreeBatch, ConcatenatesAndRebuilds) {
  TokenTreeBatch b;
  b.append(example_tree());
  b.append(TokenTree(3));
  const std::vector<float> probs{1.0f, 0.5f};
  b.append(TokenTree::chain(1, V{2}), probs);
  EXPECT_EQ(b.num_trees(), 3);
  EXPECT_EQ(b.offsets, (V{0, 6, 7, 9}));
  EXPECT_EQ(b.node_probs.size(), 9u);
  EXPECT_EQ(b.node_probs[0], 1.0f);   // unknown estimates: root 1,
  EXPECT_EQ(b.node_probs[1], 0.0f);   // drafts 0
  EXPECT_EQ(b.node_probs[8], 0.5f);
  TokenTree t;
  SPECD_ASSERT_OK(b.tree(0, &t));
  EXPECT_EQ(t.tokens(), example_tree().tokens());
  SPECD_ASSERT_OK(b.tree(2, &t));
  EXPECT_EQ(t.tokens(), (V{1, 2}));
  SPECD_EXPECT_CODE(b.tree(3, &t), kOutOfRange);
}

TEST(DraftTreeBuilder, KeepsTheMostProbablePathsUnderABudget) {
  DraftTreeBuilder b(0);
  // Depth 1: tokens 1 (0.6), 2 (0.3), 3 (0.1).
  SPECD_ASSERT_OK(b.expand(0, V{1, 2, 3}, std::vector<float>{0.6f, 0.3f, 0.1f}));
  EXPECT_EQ(b.frontier(2), (V{1, 2}));
  // Depth 2 under 1: 4 (0.9 -> 0.54), 5 (0.1 -> 0.06); under 2: 6 (0.5 -> 0.15).
  SPECD_ASSERT_OK(b.expand(1, V{4, 5}, std::vector<float>{0.9f, 0.1f}));
  SPECD_ASSERT_OK(b.expand(2, V{6}, std::vector<float>{0.5f}));
  EXPECT_NEAR(b.path_prob(4), 0.54, 1e-6);
  EXPECT_EQ(b.frontier(1), (V{4}));  // the deepest open level
  std::vector<int32_t> kept;
  std::vector<float> probs;
  const TokenTree t = b.build(4, &kept, &probs);
  // Best 4 drafts: 1 (0.6), 4 (0.54), 2 (0.3), 6 (0.15); 3 (0.1) and 5 (0.06) are dropped.
  EXPECT_EQ(t.tokens(), (V{0, 1, 4, 2, 6}));
  EXPECT_EQ(t.parents(), (V{-1, 0, 1, 0, 3}));
  EXPECT_EQ(kept, (V{0, 1, 4, 2, 6}));
  EXPECT_NEAR(probs[2], 0.54f, 1e-6);
  // Siblings come best first: under the root, 1 before 2.
  EXPECT_EQ(t.first_child(0), 1);
  EXPECT_EQ(b.build(0).size(), 1);
  EXPECT_EQ(b.build(100).size(), 7);
}

TEST(DraftTreeBuilder, EqualProbabilitiesKeepAncestorsFirst) {
  DraftTreeBuilder b(0);
  SPECD_ASSERT_OK(b.expand(0, V{1}, std::vector<float>{1.0f}));
  SPECD_ASSERT_OK(b.expand(1, V{2}, std::vector<float>{1.0f}));
  const TokenTree t = b.build(1);
  EXPECT_EQ(t.tokens(), (V{0, 1}));  // the child of equal probability does not displace its parent
}

TEST(DraftTreeBuilder, Errors) {
  DraftTreeBuilder b(0);
  SPECD_EXPECT_CODE(b.expand(1, V{1}, std::vector<float>{0.5f}), kInvalidArgument);
  SPECD_EXPECT_CODE(b.expand(0, V{1, 1}, std::vector<float>{0.5f, 0.5f}), kInvalidArgument);
  SPECD_EXPECT_CODE(b.expand(0, V{1}, std::vector<float>{1.5f}), kInvalidArgument);
  SPECD_EXPECT_CODE(b.expand(0, V{1}, std::vector<float>{}), kInvalidArgument);
  SPECD_ASSERT_OK(b.expand(0, V{1}, std::vector<float>{0.5f}));
  SPECD_EXPECT_CODE(b.expand(0, V{2}, std::vector<float>{0.5f}), kFailedPrecondition);
}

// A record (draft_tree_builder.h) of width 2 and 3 forwards, built entry by entry.
struct Record {
  static constexpr int32_t kW = 2, kRow = 2 * kW * kW + kW;
  std::vector<double> values = std::vector<double>(3 * kRow, 0.0);
  Record() {
    for (int32_t j = 0; j < 3; ++j) fed(j, {});  // no frontier unless given
  }
  void candidates(int32_t j, int32_t f, std::vector<double> tokens, std::vector<double> probs) {
    for (std::size_t r = 0; r < tokens.size(); ++r) {
      values[static_cast<std::size_t>(j * kRow + f * kW) + r] = tokens[r];
      values[static_cast<std::size_t>(j * kRow + kW * kW + f * kW) + r] = probs[r];
    }
  }
  void fed(int32_t j, std::vector<double> flat) {
    for (int32_t f = 0; f < kW; ++f)
      values[static_cast<std::size_t>(j * kRow + 2 * kW * kW + f)] = f < static_cast<int32_t>(flat.size()) ? flat[static_cast<std::size_t>(f)] : -1;
  }
};

TEST(DraftTreeBuilder, ReplayMakesTheHostLoopsExpansions) {
  Record rec;
  rec.candidates(0, 0, {7, 8}, {0.75, 0.25});           // root -> 7 (node 1), 8 (node 2)
  rec.fed(1, {0, 1});                                   // forward 1 feeds nodes 1 and 2
  rec.candidates(1, 0, {9, 10}, {0.5, 0.5});            // node 1 -> 9 (3), 10 (4)
  rec.candidates(1, 1, {11, 0}, {1.0, 0.0});            // node 2 -> 11 (5) only
  rec.fed(2, {2, 0});                                   // forward 2 feeds node 5 (flat 2 = f 1, r 0), then 3
  rec.candidates(2, 0, {12, 13}, {0.5, 0.25});          // node 5 -> 12 (6), 13 (7)
  rec.candidates(2, 1, {0, 0}, {0.0, 0.0});             // node 3: none
  DraftTreeBuilder got(5);
  std::vector<int32_t> chain, fed;
  SPECD_ASSERT_OK(got.replay(rec.values, 3, 2, &chain, &fed));
  DraftTreeBuilder want(5);  // the same expansions by hand, in the host loop's order
  SPECD_ASSERT_OK(want.expand(0, V{7, 8}, std::vector<float>{0.75f, 0.25f}));
  SPECD_ASSERT_OK(want.expand(1, V{9, 10}, std::vector<float>{0.5f, 0.5f}));
  SPECD_ASSERT_OK(want.expand(2, V{11}, std::vector<float>{1.0f}));
  SPECD_ASSERT_OK(want.expand(5, V{12, 13}, std::vector<float>{0.5f, 0.25f}));
  SPECD_ASSERT_OK(want.expand(3, V{}, std::vector<float>{}));
  ASSERT_EQ(got.size(), want.size());
  for (int32_t v = 0; v < want.size(); ++v) {
    EXPECT_EQ(got.parent(v), want.parent(v)) << v;
    EXPECT_EQ(got.token(v), want.token(v)) << v;
    EXPECT_EQ(got.depth(v), want.depth(v)) << v;
    EXPECT_EQ(got.path_prob(v), want.path_prob(v)) << v;
  }
  EXPECT_EQ(got.build(4).tokens(), want.build(4).tokens());
  EXPECT_EQ(chain, (V{0, 1, 3}));  // root, its first child, that one's first child (no children)
  EXPECT_EQ(fed, (V{1, 2, 5, 3}));  // forward 1 fed nodes 1, 2; forward 2 fed 5, 3 (KV positions 0..3)
  Record one = rec;
  one.fed(2, {2});  // forward 2 feeds node 5 alone: its second KV position stays empty
  DraftTreeBuilder narrow(5);
  SPECD_ASSERT_OK(narrow.replay(one.values, 3, 2, nullptr, &fed));
  EXPECT_EQ(fed, (V{1, 2, 5, -1}));
  // Fewer forwards than rows: the growth stops after forward 1.
  DraftTreeBuilder short_tree(5);
  SPECD_ASSERT_OK(short_tree.replay(Span<const double>(rec.values.data(), 2 * Record::kRow), 2, 2));
  EXPECT_EQ(short_tree.size(), 6);
}

TEST(DraftTreeBuilder, ReplayErrors) {
  Record rec;
  rec.candidates(0, 0, {7, 8}, {0.75, 0.25});
  rec.fed(1, {3});  // names rank 1 of frontier node 1: forward 0 had one node
  DraftTreeBuilder b(5);
  EXPECT_EQ(b.replay(rec.values, 3, 2).code(), StatusCode::kInvalidArgument);
  DraftTreeBuilder sized(5);
  SPECD_EXPECT_CODE(sized.replay(Span<const double>(rec.values.data(), 5), 1, 2), kInvalidArgument);
  SPECD_EXPECT_CODE(sized.replay(rec.values, 3, 0), kInvalidArgument);
  rec.fed(1, {1.5});  // not an index
  DraftTreeBuilder half(5);
  SPECD_EXPECT_CODE(half.replay(rec.values, 3, 2), kInvalidArgument);
  rec.fed(1, {0});
  DraftTreeBuilder ok(5);
  SPECD_ASSERT_OK(ok.replay(rec.values, 3, 2));
  SPECD_EXPECT_CODE(ok.replay(rec.values, 3, 2), kFailedPrecondition);  // it already grew
}

}  // namespace
}  // namespace specd::testing
