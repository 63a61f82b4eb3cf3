// NgramProposer: worked examples (the seeds' "to be or not to be"), candidate order,
// limits, node_probs, truncate, the batch API and errors; then a randomized comparison with
// a brute-force implementation that scans the whole history with the same rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "block_manager_test_util.h"
#include "proposer_test_util.h"
#include "specd/ngram_proposer.h"

namespace specd::testing {
namespace {

using Tokens = std::vector<int32_t>;
using Probs = std::vector<float>;

struct Tree {
  Tokens tokens, parents;
  Probs probs;
};

std::unique_ptr<NgramProposer> make(NgramConfig c) {
  std::unique_ptr<NgramProposer> p;
  const Status s = NgramProposer::create(c, &p);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return p;
}

NgramConfig config(int32_t n_min, int32_t n_max, int32_t w = 4, NgramOrder order = NgramOrder::kRecent) {
  NgramConfig c;
  c.n_min = n_min;
  c.n_max = n_max;
  c.max_candidates = w;
  c.order = order;
  return c;
}

Tree tree_of(const TokenTreeBatch& b, int32_t r) {
  const auto lo = static_cast<std::size_t>(b.offsets[static_cast<std::size_t>(r)]);
  const auto hi = static_cast<std::size_t>(b.offsets[static_cast<std::size_t>(r) + 1]);
  return Tree{Tokens(b.tokens.begin() + static_cast<long>(lo), b.tokens.begin() + static_cast<long>(hi)),
              Tokens(b.parents.begin() + static_cast<long>(lo), b.parents.begin() + static_cast<long>(hi)),
              Probs(b.node_probs.begin() + static_cast<long>(lo), b.node_probs.begin() + static_cast<long>(hi))};
}

Tree propose(NgramProposer& p, RequestId id, int32_t depth, int32_t nodes) {
  TokenTreeBatch b;
  const RequestId ids[] = {id};
  const Status s = p.propose_batch(Span<const RequestId>(ids, 1), Span<const int32_t>(&depth, 1),
                                   Span<const int32_t>(&nodes, 1), &b);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return s.ok() ? tree_of(b, 0) : Tree{};
}

Tree history_proposal(NgramConfig c, const Tokens& history, int32_t depth, int32_t nodes = 64) {
  auto p = make(c);
  EXPECT_TRUE(p->add_request(1, history).ok());
  return propose(*p, 1, depth, nodes);
}

TEST(NgramProposer, ToBeOrNotToBe) {
  // "to be or not to be": the suffix "to be" occurred at the start, followed by "or not to be".
  const Tree t = history_proposal(config(1, 2), {1, 2, 3, 4, 1, 2}, 4);
  EXPECT_EQ(t.tokens, (Tokens{2, 3, 4, 1, 2}));
  EXPECT_EQ(t.parents, (Tokens{-1, 0, 1, 2, 3}));
  EXPECT_EQ(t.probs, (Probs{1, 1, 1, 1, 1}));
}

TEST(NgramProposer, NoMatchGivesTheRootAlone) {
  const Tree t = history_proposal(config(1, 3), {1, 2, 3, 4}, 4);
  EXPECT_EQ(t.tokens, (Tokens{4}));
  EXPECT_EQ(t.parents, (Tokens{-1}));
  EXPECT_EQ(t.probs, (Probs{1}));
  EXPECT_EQ(history_proposal(config(1, 3), {7}, 4).tokens, (Tokens{7}));
}

TEST(NgramProposer, LongerNWinsOverMoreRecentShorterMatch) {
  // "5 1 2" occurred once, followed by 7; "2" alone occurred more recently, followed by 8.
  const Tokens h = {5, 1, 2, 7, 9, 2, 8, 5, 1, 2};
  EXPECT_EQ(history_proposal(config(1, 3, 1), h, 1).tokens, (Tokens{2, 7}));
  EXPECT_EQ(history_proposal(config(1, 1, 1), h, 1).tokens, (Tokens{2, 8}));  // n = 1 only
}

// "a b" was followed by c twice earlier and by d once, most recently.
const Tokens kOneToMany = {1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2};

TEST(NgramProposer, OneToManyRecentOrder) {
  const Tree t = history_proposal(config(1, 2, 2, NgramOrder::kRecent), kOneToMany, 3);
  // d-branch (most recent) first; the walk stops once 2 distinct continuations are found,
  // so 2 occurrences were scanned: each branch holds half of them.
  EXPECT_EQ(t.tokens, (Tokens{2, 4, 1, 2, 3, 1, 2}));
  EXPECT_EQ(t.parents, (Tokens{-1, 0, 1, 2, 0, 4, 5}));
  EXPECT_EQ(t.probs, (Probs{1, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(NgramProposer, OneToManyFrequentOrder) {
  const Tree t = history_proposal(config(1, 2, 2, NgramOrder::kFrequent), kOneToMany, 3);
  // c-branch (2 of 3 scanned occurrences) first.
  EXPECT_EQ(t.tokens, (Tokens{2, 3, 1, 2, 4, 1, 2}));
  EXPECT_EQ(t.parents, (Tokens{-1, 0, 1, 2, 0, 4, 5}));
  const float third = 1.0f / 3.0f, two_thirds = 2.0f / 3.0f;
  EXPECT_EQ(t.probs, (Probs{1, two_thirds, two_thirds, two_thirds, third, third, third}));
  // W = 1 keeps only the most frequent; node_probs still count every scanned occurrence.
  const Tree one = history_proposal(config(1, 2, 1, NgramOrder::kFrequent), kOneToMany, 3);
  EXPECT_EQ(one.tokens, (Tokens{2, 3, 1, 2}));
  EXPECT_EQ(one.probs, (Probs{1, two_thirds, two_thirds, two_thirds}));
}

TEST(NgramProposer, SharedPrefixesMergeAndProbsCountPassingOccurrences) {
  // "x" followed by "5 6", "5 7", "5 6": candidates [5 6], [5 7]; node 5 is on all 3.
  const Tokens h = {9, 5, 6, 9, 5, 7, 9, 5, 6, 9};
  const Tree t = history_proposal(config(1, 1, 4, NgramOrder::kRecent), h, 2);
  EXPECT_EQ(t.tokens, (Tokens{9, 5, 6, 7}));
  EXPECT_EQ(t.parents, (Tokens{-1, 0, 1, 1}));
  EXPECT_EQ(t.probs, (Probs{1, 1, 2.0f / 3.0f, 1.0f / 3.0f}));
}

TEST(NgramProposer, MaxNodesAndMaxDepthTruncate) {
  const NgramConfig c = config(1, 2, 2, NgramOrder::kRecent);
  const Tree cut = history_proposal(c, kOneToMany, 3, /*nodes=*/4);
  EXPECT_EQ(cut.tokens, (Tokens{2, 4, 1, 2, 3}));  // the second candidate keeps its prefix
  EXPECT_EQ(cut.parents, (Tokens{-1, 0, 1, 2, 0}));
  EXPECT_EQ(cut.probs, (Probs{1, 0.5f, 0.5f, 0.5f, 0.5f}));
  const Tree shallow = history_proposal(c, kOneToMany, 2);
  EXPECT_EQ(shallow.tokens, (Tokens{2, 4, 1, 3, 1}));
  EXPECT_EQ(history_proposal(c, kOneToMany, 0).tokens, (Tokens{2}));
  EXPECT_EQ(history_proposal(c, kOneToMany, 3, 0).tokens, (Tokens{2}));
  // A continuation stops at the end of the history: the latest "1 2" has only "4 1 2" after it.
  const Tree end = history_proposal(config(2, 2, 4), {1, 2, 3, 4, 1, 2, 4, 1, 2}, 8);
  EXPECT_EQ(end.tokens, (Tokens{2, 4, 1, 2, 3, 4, 1, 2, 4, 1, 2}));
}

TEST(NgramProposer, HashCollisionsNeverProduceWrongProposals) {
  NgramConfig c = config(1, 2);
  c.hash_bits = 1;  // every n-gram shares one of two chains
  const Tree t = history_proposal(c, {1, 2, 3, 4, 1, 2}, 4);
  EXPECT_EQ(t.tokens, (Tokens{2, 3, 4, 1, 2}));
  EXPECT_EQ(history_proposal(c, {1, 2, 3, 4}, 4).tokens, (Tokens{4}));
}

TEST(NgramProposer, TruncateThenProposeEqualsFreshIndex) {
  std::mt19937 rng(5);
  Tokens h(400);
  for (int32_t& t : h) t = static_cast<int32_t>(rng() % 4);
  for (NgramOrder order : {NgramOrder::kRecent, NgramOrder::kFrequent}) {
    auto p = make(config(1, 4, 3, order));
    SPECD_ASSERT_OK(p->add_request(1, h));
    for (int64_t len : {399, 300, 120, 17, 1}) {
      SPECD_ASSERT_OK(p->truncate(1, len));
      EXPECT_EQ(p->history_length(1), len);
      const Tokens prefix(h.begin(), h.begin() + len);
      auto fresh = make(config(1, 4, 3, order));
      SPECD_ASSERT_OK(fresh->add_request(1, prefix));
      const Tree a = propose(*p, 1, 5, 16), b = propose(*fresh, 1, 5, 16);
      EXPECT_EQ(a.tokens, b.tokens) << "len " << len;
      EXPECT_EQ(a.parents, b.parents);
      EXPECT_EQ(a.probs, b.probs);
      // Regrow differently from the original, then compare again.
      const Tokens more = {3, 3, 0, 1};
      SPECD_ASSERT_OK(p->append(1, more));
      SPECD_ASSERT_OK(fresh->append(1, more));
      EXPECT_EQ(propose(*p, 1, 5, 16).tokens, propose(*fresh, 1, 5, 16).tokens);
      SPECD_ASSERT_OK(p->truncate(1, len));
    }
  }
}

TEST(NgramProposer, BatchOverSeveralRequests) {
  auto p = make(config(1, 2));
  SPECD_ASSERT_OK(p->add_request(10, Tokens{1, 2, 3, 4, 1, 2}));
  SPECD_ASSERT_OK(p->add_request(20, Tokens{5, 6}));
  SPECD_ASSERT_OK(p->add_request(30, Tokens{7, 8, 7}));
  SPECD_ASSERT_OK(p->append(20, Tokens{7, 5, 6}));
  TokenTreeBatch b;
  const RequestId req[] = {30, 10, 20};
  const int32_t depth[] = {2, 4, 3}, nodes[] = {8, 0, 8};
  SPECD_ASSERT_OK(p->propose_batch(Span<const RequestId>(req, 3), Span<const int32_t>(depth, 3),
                                   Span<const int32_t>(nodes, 3), &b));
  ASSERT_EQ(b.num_trees(), 3);
  EXPECT_EQ(b.offsets, (Tokens{0, 3, 4, 8}));
  EXPECT_EQ(tree_of(b, 0).tokens, (Tokens{7, 8, 7}));  // "7" -> "8 7"
  EXPECT_EQ(tree_of(b, 1).tokens, (Tokens{2}));        // max_nodes 0
  EXPECT_EQ(tree_of(b, 2).tokens, (Tokens{6, 7, 5, 6}));
  TokenTree t;
  SPECD_ASSERT_OK(b.tree(2, &t));
  EXPECT_TRUE(t.is_chain());
  // An empty batch is valid and clears `out`.
  SPECD_ASSERT_OK(p->propose_batch({}, {}, {}, &b));
  EXPECT_EQ(b.num_trees(), 0);
  EXPECT_TRUE(b.tokens.empty());
}

TEST(NgramProposer, ErrorsChangeNothing) {
  auto p = make(config(1, 2));
  SPECD_ASSERT_OK(p->add_request(1, Tokens{1, 2, 3, 1, 2}));
  SPECD_EXPECT_CODE(p->add_request(1, Tokens{4}), kAlreadyExists);
  SPECD_EXPECT_CODE(p->add_request(2, Tokens{}), kInvalidArgument);
  SPECD_EXPECT_CODE(p->add_request(2, Tokens{1, -1}), kInvalidArgument);
  EXPECT_FALSE(p->contains(2));
  SPECD_EXPECT_CODE(p->append(1, Tokens{4, -2}), kInvalidArgument);
  SPECD_EXPECT_CODE(p->append(9, Tokens{4}), kNotFound);
  EXPECT_EQ(p->history_length(1), 5);
  EXPECT_EQ(p->history_length(9), -1);
  SPECD_EXPECT_CODE(p->truncate(1, 6), kOutOfRange);
  SPECD_EXPECT_CODE(p->truncate(1, 0), kInvalidArgument);
  SPECD_EXPECT_CODE(p->truncate(9, 1), kNotFound);
  SPECD_EXPECT_CODE(p->remove_request(9, RemoveReason::kFinished), kNotFound);

  expect_batch_errors_leave_output(*p, 1, 9);
  // The request still works and removal forgets it.
  EXPECT_EQ(propose(*p, 1, 3, 8).tokens, (Tokens{2, 3, 1, 2}));
  SPECD_ASSERT_OK(p->remove_request(1, RemoveReason::kAborted));
  EXPECT_FALSE(p->contains(1));
  EXPECT_EQ(p->num_requests(), 0);
}

TEST(NgramProposer, RejectsInvalidConfigs) {
  std::unique_ptr<NgramProposer> p;
  const NgramConfig good;
  SPECD_ASSERT_OK(NgramProposer::create(good, &p));
  auto bad = [&](auto edit) {
    NgramConfig c = good;
    edit(c);
    SPECD_EXPECT_CODE(NgramProposer::create(c, &p), kInvalidArgument);
  };
  bad([](NgramConfig& c) { c.n_min = 0; });
  bad([](NgramConfig& c) { c.n_min = 5; });  // > n_max
  bad([](NgramConfig& c) { c.n_max = 65; });
  bad([](NgramConfig& c) { c.max_candidates = 0; });
  bad([](NgramConfig& c) { c.max_scan = 3; });  // < max_candidates
  bad([](NgramConfig& c) { c.hash_bits = 0; });
}

// ---- randomized comparison with brute force ----

Tree brute_force(const Tokens& h, const NgramConfig& c, int32_t k, int32_t max_nodes) {
  const int32_t L = static_cast<int32_t>(h.size());
  Tree out{{h.back()}, {-1}, {1.0f}};
  if (k == 0 || max_nodes == 0) return out;
  std::vector<int32_t> scanned;
  std::vector<Tokens> conts;
  std::vector<int> counts;
  for (int32_t n = c.n_max; n >= c.n_min && scanned.empty(); --n) {
    if (L <= n) continue;
    for (int32_t e = L - 2; e >= n - 1; --e) {
      if (!std::equal(h.begin() + (e + 1 - n), h.begin() + (e + 1), h.end() - n)) continue;
      scanned.push_back(e);
      const Tokens cont(h.begin() + (e + 1), h.begin() + std::min(L, e + 1 + k));
      const auto it = std::find(conts.begin(), conts.end(), cont);
      if (it == conts.end()) {
        conts.push_back(cont);
        counts.push_back(1);
      } else {
        ++counts[static_cast<std::size_t>(it - conts.begin())];
      }
      if (c.order == NgramOrder::kRecent && static_cast<int32_t>(conts.size()) == c.max_candidates) break;
      if (static_cast<int32_t>(scanned.size()) == c.max_scan) break;
    }
  }
  if (scanned.empty()) return out;
  if (c.order == NgramOrder::kFrequent) {  // selection sort, most frequent, then most recent
    std::vector<Tokens> sorted;
    std::vector<bool> used(conts.size(), false);
    while (sorted.size() < conts.size()) {
      std::size_t best = conts.size();
      for (std::size_t i = 0; i < conts.size(); ++i)
        if (!used[i] && (best == conts.size() || counts[i] > counts[best])) best = i;
      used[best] = true;
      sorted.push_back(conts[best]);
    }
    conts = sorted;
  }
  if (static_cast<int32_t>(conts.size()) > c.max_candidates) conts.resize(static_cast<std::size_t>(c.max_candidates));
  const TokenTree tree = TokenTree::from_candidates(h.back(), conts, max_nodes);
  out = Tree{tree.tokens(), tree.parents(), Probs(static_cast<std::size_t>(tree.size()), 1.0f)};
  for (int32_t i = 1; i < tree.size(); ++i) {
    Tokens path;
    for (int32_t v = i; v > 0; v = tree.parent(v)) path.insert(path.begin(), tree.token(v));
    int hits = 0;
    for (int32_t e : scanned) {
      const Tokens cont(h.begin() + (e + 1), h.begin() + std::min(L, e + 1 + k));
      hits += cont.size() >= path.size() && std::equal(path.begin(), path.end(), cont.begin());
    }
    out.probs[static_cast<std::size_t>(i)] = static_cast<float>(hits) / static_cast<float>(scanned.size());
  }
  return out;
}

TEST(NgramProposer, RandomHistoriesMatchBruteForce) {
  std::mt19937 rng(2024);
  auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int compared = 0, nontrivial = 0;
  for (int round = 0; round < 300; ++round) {
    NgramConfig c;
    c.n_min = rand(1, 3);
    c.n_max = c.n_min + rand(0, 3);
    c.max_candidates = rand(1, 4);
    c.max_scan = c.max_candidates + rand(0, 6);
    c.order = rand(0, 1) ? NgramOrder::kRecent : NgramOrder::kFrequent;
    c.hash_bits = rand(0, 3) == 0 ? rand(1, 4) : 64;  // sometimes force collisions
    const int alphabet = rand(2, 6);
    auto p = make(c);
    std::vector<Tokens> hist(2);
    for (RequestId id = 0; id < 2; ++id) {
      hist[static_cast<std::size_t>(id)].resize(static_cast<std::size_t>(rand(1, 30)));
      for (int32_t& t : hist[static_cast<std::size_t>(id)]) t = rand(0, alphabet - 1);
      SPECD_ASSERT_OK(p->add_request(id, hist[static_cast<std::size_t>(id)]));
    }
    for (int op = 0; op < 12; ++op) {
      const RequestId id = rand(0, 1);
      Tokens& h = hist[static_cast<std::size_t>(id)];
      if (rand(0, 3) == 0) {
        const int64_t len = rand(1, static_cast<int>(h.size()));
        SPECD_ASSERT_OK(p->truncate(id, len));
        h.resize(static_cast<std::size_t>(len));
      } else {
        Tokens more(static_cast<std::size_t>(rand(1, 5)));
        for (int32_t& t : more) t = rand(0, alphabet - 1);
        SPECD_ASSERT_OK(p->append(id, more));
        h.insert(h.end(), more.begin(), more.end());
      }
      const RequestId ids[] = {0, 1};
      const int32_t depth[] = {rand(0, 6), rand(0, 6)}, nodes[] = {rand(0, 12), rand(0, 12)};
      TokenTreeBatch b;
      SPECD_ASSERT_OK(p->propose_batch(Span<const RequestId>(ids, 2), Span<const int32_t>(depth, 2),
                                       Span<const int32_t>(nodes, 2), &b));
      for (int32_t r = 0; r < 2; ++r) {
        const Tree got = tree_of(b, r);
        const Tree want = brute_force(hist[static_cast<std::size_t>(r)], c, depth[r], nodes[r]);
        ASSERT_EQ(got.tokens, want.tokens) << "round " << round << " op " << op << " request " << r;
        ASSERT_EQ(got.parents, want.parents) << "round " << round << " op " << op;
        ASSERT_EQ(got.probs, want.probs) << "round " << round << " op " << op;
        ++compared;
        nontrivial += got.tokens.size() > 1;
      }
    }
  }
  EXPECT_GE(compared, 2000);
  EXPECT_GE(nontrivial, compared / 3);  // many cases do propose something
}

}  // namespace
}  // namespace specd::testing
