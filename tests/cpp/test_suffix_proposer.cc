// SuffixProposer: worked examples with hand-computed frequencies, the global cache (finished
// requests feed it, aborted ones do not, the oldest epoch is evicted), limits, truncate,
// errors; then a randomized comparison of node_probs with brute-force empirical conditional
// frequencies computed by scanning the history.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "block_manager_test_util.h"
#include "proposer_test_util.h"
#include "specd/suffix_proposer.h"

namespace specd::testing {
namespace {

using Tokens = std::vector<int32_t>;
using Paths = std::map<Tokens, float>;  // root path of each draft node -> node_prob

struct Tree {
  Tokens tokens, parents;
  std::vector<float> probs;
  int32_t drafts() const { return static_cast<int32_t>(tokens.size()) - 1; }
  Tokens path(int32_t node) const {
    Tokens p;
    for (int32_t v = node; v > 0; v = parents[static_cast<std::size_t>(v)])
      p.insert(p.begin(), tokens[static_cast<std::size_t>(v)]);
    return p;
  }
  Paths paths() const {
    Paths out;
    for (int32_t i = 1; i < static_cast<int32_t>(tokens.size()); ++i) out[path(i)] = probs[static_cast<std::size_t>(i)];
    return out;
  }
};

std::unique_ptr<SuffixProposer> make(SuffixConfig c = {}) {
  std::unique_ptr<SuffixProposer> p;
  const Status s = SuffixProposer::create(c, &p);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return p;
}

SuffixConfig with_factor(float spec_factor, float min_token_prob = 0.1f) {
  SuffixConfig c;
  c.spec_factor = spec_factor;
  c.min_token_prob = min_token_prob;
  return c;
}

Tree propose(SuffixProposer& p, RequestId id, int32_t depth = 8, int32_t nodes = 16) {
  TokenTreeBatch b;
  const RequestId ids[] = {id};
  const Status s = p.propose_batch(Span<const RequestId>(ids, 1), Span<const int32_t>(&depth, 1),
                                   Span<const int32_t>(&nodes, 1), &b);
  EXPECT_TRUE(s.ok()) << s.to_string();
  if (!s.ok()) return Tree{};
  EXPECT_EQ(b.num_trees(), 1);
  return Tree{b.tokens, b.parents, b.node_probs};
}

// A request that ran: `prompt`, then `output` generated, then finished (feeding the cache).
void finish(SuffixProposer& p, RequestId id, const Tokens& prompt, const Tokens& output) {
  SPECD_ASSERT_OK(p.add_request(id, prompt));
  SPECD_ASSERT_OK(p.append(id, output));
  SPECD_ASSERT_OK(p.remove_request(id, RemoveReason::kFinished));
}

Tree propose_history(SuffixConfig c, const Tokens& h, int32_t depth = 8, int32_t nodes = 16) {
  auto p = make(c);
  EXPECT_TRUE(p->add_request(1, h).ok());
  return propose(*p, 1, depth, nodes);
}

TEST(SuffixProposer, WorkedExampleABCABDAB) {
  // a b c a b d a b: the suffix "a b" occurred twice before, followed once by c, once by d.
  const Tokens h = {0, 1, 2, 0, 1, 3, 0, 1};
  const Tree t = propose_history(with_factor(1.0f), h);  // budget ceil(1 x 2) = 2
  EXPECT_EQ(t.tokens[0], 1);
  EXPECT_EQ(t.paths(), (Paths{{{2}, 0.5f}, {{3}, 0.5f}}));
  // Budget 8: every further step has a single continuation (prob stays 1/2 on each branch);
  // "a b c a b d a" -> "b" is the 9th node and is cut.
  const Tree big = propose_history(with_factor(4.0f), h);
  EXPECT_EQ(big.drafts(), 8);
  for (std::size_t i = 1; i < big.probs.size(); ++i) EXPECT_FLOAT_EQ(big.probs[i], 0.5f);
  EXPECT_EQ(big.paths().count(Tokens{2, 0, 1, 3, 0}), 1u);
  EXPECT_EQ(big.paths().count(Tokens{3, 0, 1}), 1u);
  EXPECT_EQ(big.paths().count(Tokens{3, 0, 1, 3}), 0u);  // "a b d a b" is the current end
}

// "5 6 7 8 9" twice (followed by 1, then by 2), then "5 6": a confident 3-token chain.
const Tokens kRepetitive = {5, 6, 7, 8, 9, 1, 5, 6, 7, 8, 9, 2, 5, 6};

TEST(SuffixProposer, RepetitiveHistoryGivesConfidentChain) {
  EXPECT_EQ(propose_history(with_factor(1.5f), kRepetitive).paths(),
            (Paths{{{7}, 1}, {{7, 8}, 1}, {{7, 8, 9}, 1}}));
  const Tree t = propose_history(with_factor(2.5f), kRepetitive);  // budget 5
  EXPECT_EQ(t.paths(), (Paths{{{7}, 1}, {{7, 8}, 1}, {{7, 8, 9}, 1}, {{7, 8, 9, 1}, 0.5f},
                              {{7, 8, 9, 2}, 0.5f}}));
  EXPECT_EQ(t.parents, (Tokens{-1, 0, 1, 2, 3, 3}));  // best-first: the chain, then its fork
}

TEST(SuffixProposer, LimitsBudgetDepthAndMinProb) {
  const SuffixConfig wide = with_factor(2.5f);
  EXPECT_EQ(propose_history(wide, kRepetitive, /*depth=*/2).paths(), (Paths{{{7}, 1}, {{7, 8}, 1}}));
  EXPECT_EQ(propose_history(wide, kRepetitive, 8, /*nodes=*/1).paths(), (Paths{{{7}, 1}}));
  EXPECT_EQ(propose_history(wide, kRepetitive, 0).drafts(), 0);
  EXPECT_EQ(propose_history(wide, kRepetitive, 8, 0).drafts(), 0);
  EXPECT_EQ(propose_history(with_factor(2.5f, 0.6f), kRepetitive).paths(),
            (Paths{{{7}, 1}, {{7, 8}, 1}, {{7, 8, 9}, 1}}));
  SuffixConfig short_match = with_factor(1.0f);
  short_match.max_match = 1;  // match_len 1 -> budget 1
  EXPECT_EQ(propose_history(short_match, kRepetitive).paths(), (Paths{{{7}, 1}}));
  EXPECT_EQ(propose_history({}, {4, 5, 6}).drafts(), 0);  // no repetition, empty cache
}

TEST(SuffixProposer, FinishedRequestFeedsTheCache) {
  auto p = make(with_factor(1.0f));
  const Tokens x = {10, 11, 12, 13, 14, 15};
  SPECD_ASSERT_OK(p->add_request(1, Tokens{100, 101}));
  SPECD_ASSERT_OK(p->append(1, x));
  SPECD_ASSERT_OK(p->add_request(2, Tokens{50, 10, 11, 12}));
  EXPECT_EQ(propose(*p, 2).drafts(), 0);  // A is still running: nothing cached yet
  SPECD_ASSERT_OK(p->remove_request(1, RemoveReason::kFinished));
  EXPECT_EQ(p->num_cache_epochs(), 1);
  EXPECT_EQ(p->cache_tokens(), 7);  // 6 generated + separator; the prompt is not cached
  // B never saw 13 14 15; matched "10 11 12" (length 3) -> budget 3.
  const Tree t = propose(*p, 2);
  EXPECT_EQ(t.tokens, (Tokens{12, 13, 14, 15}));
  EXPECT_EQ(t.probs, (std::vector<float>{1, 1, 1, 1}));
  // A larger budget stops at the separator: nothing followed X.
  auto wide = make(with_factor(8.0f));
  finish(*wide, 1, {100, 101}, x);
  SPECD_ASSERT_OK(wide->add_request(2, Tokens{50, 10, 11, 12}));
  EXPECT_EQ(propose(*wide, 2).tokens, (Tokens{12, 13, 14, 15}));
}

TEST(SuffixProposer, PromptsAreCachedOnlyWhenAsked) {
  for (bool cache_prompts : {false, true}) {
    SuffixConfig c;
    c.cache_prompts = cache_prompts;
    auto p = make(c);
    finish(*p, 1, {100, 101, 102}, {103});
    SPECD_ASSERT_OK(p->add_request(2, Tokens{7, 100, 101}));
    EXPECT_EQ(propose(*p, 2).tokens, cache_prompts ? (Tokens{101, 102, 103}) : (Tokens{101}));
  }
}

TEST(SuffixProposer, AbortedRequestsDoNotFeedTheCache) {
  auto p = make();
  SPECD_ASSERT_OK(p->add_request(1, Tokens{100}));
  SPECD_ASSERT_OK(p->append(1, Tokens{10, 11, 12, 13}));
  SPECD_ASSERT_OK(p->remove_request(1, RemoveReason::kAborted));
  EXPECT_FALSE(p->contains(1));
  EXPECT_EQ(p->cache_tokens(), 0);
  SPECD_ASSERT_OK(p->add_request(2, Tokens{10, 11}));
  EXPECT_EQ(propose(*p, 2).drafts(), 0);
}

TEST(SuffixProposer, OldestEpochIsEvicted) {
  SuffixConfig c;
  c.cache_max_tokens = 20;  // 2 epochs of 10 tokens
  c.cache_epochs = 2;
  auto p = make(c);
  auto finish8 = [&](RequestId id, int32_t first) {  // outputs first, ..., first + 7
    Tokens out;
    for (int32_t t = first; t < first + 8; ++t) out.push_back(t);
    finish(*p, id, {1}, out);
  };
  SPECD_ASSERT_OK(p->add_request(99, Tokens{9, 200, 201}));
  finish8(1, 200);  // epoch 0: 9 tokens
  finish8(2, 300);  // epoch 0: 18 (it held <= 10 before)
  finish8(3, 400);  // epoch 1: 9
  finish8(4, 500);  // epoch 1: 18
  EXPECT_EQ(p->num_cache_epochs(), 2);
  EXPECT_EQ(propose(*p, 99).tokens, (Tokens{201, 202, 203}));  // still cached
  finish8(5, 600);  // epoch 2 starts, epoch 0 (outputs 1 and 2) is dropped
  EXPECT_EQ(p->num_cache_epochs(), 2);
  EXPECT_EQ(p->cache_tokens(), 27);
  EXPECT_EQ(propose(*p, 99).drafts(), 0);
  SPECD_ASSERT_OK(p->add_request(98, Tokens{400, 401}));  // output 3 is still there
  EXPECT_EQ(propose(*p, 98).tokens, (Tokens{401, 402, 403}));
}

TEST(SuffixProposer, BestSourceWinsAndTiesKeepOwnHistory) {
  const Tokens b = {1, 2, 3, 1, 2, 4, 1, 2};  // own: "1 2" -> 3 or 4 (1/2 each), score 1
  for (const Tokens& doc : {Tokens{1, 2, 5, 6}, Tokens{1, 2, 5}}) {
    auto p = make();
    finish(*p, 1, {0}, doc);
    SPECD_ASSERT_OK(p->add_request(2, b));
    // cache: score 2 beats 1; or score 1, a tie that the own history wins
    EXPECT_EQ(propose(*p, 2).paths(), doc.size() == 4 ? (Paths{{{5}, 1}, {{5, 6}, 1}})
                                                      : (Paths{{{3}, 0.5f}, {{4}, 0.5f}}));
  }
}

TEST(SuffixProposer, TruncateEqualsFreshAndShortensThePrompt) {
  std::mt19937 rng(9);
  Tokens h(300);
  for (int32_t& t : h) t = static_cast<int32_t>(rng() % 3);
  auto p = make(with_factor(3.0f));
  SPECD_ASSERT_OK(p->add_request(1, h));
  for (int64_t len : {299, 150, 40, 2}) {
    SPECD_ASSERT_OK(p->truncate(1, len));
    EXPECT_EQ(p->history_length(1), len);
    const Tree a = propose(*p, 1);
    const Tree b = propose_history(with_factor(3.0f), Tokens(h.begin(), h.begin() + len));
    EXPECT_EQ(a.tokens, b.tokens) << len;
    EXPECT_EQ(a.parents, b.parents) << len;
    EXPECT_EQ(a.probs, b.probs) << len;
  }
  // Truncating into the prompt: what follows counts as generated when the request finishes.
  auto q = make(with_factor(4.0f));
  SPECD_ASSERT_OK(q->add_request(1, Tokens{1, 2, 3, 4, 5, 6}));
  SPECD_ASSERT_OK(q->truncate(1, 3));
  SPECD_ASSERT_OK(q->append(1, Tokens{20, 21, 22}));
  SPECD_ASSERT_OK(q->remove_request(1, RemoveReason::kFinished));
  EXPECT_EQ(q->cache_tokens(), 4);
  SPECD_ASSERT_OK(q->add_request(2, Tokens{9, 20}));
  EXPECT_EQ(propose(*q, 2).tokens, (Tokens{20, 21, 22}));
  SPECD_ASSERT_OK(q->add_request(3, Tokens{9, 2}));
  EXPECT_EQ(propose(*q, 3).drafts(), 0);
}

TEST(SuffixProposer, ErrorsChangeNothing) {
  auto p = make();
  SPECD_ASSERT_OK(p->add_request(1, kRepetitive));
  SPECD_EXPECT_CODE(p->add_request(1, Tokens{4}), kAlreadyExists);
  SPECD_EXPECT_CODE(p->add_request(2, Tokens{}), kInvalidArgument);
  SPECD_EXPECT_CODE(p->add_request(2, Tokens{3, -1}), kInvalidArgument);
  EXPECT_FALSE(p->contains(2));
  SPECD_EXPECT_CODE(p->append(1, Tokens{4, -1}), kInvalidArgument);
  SPECD_EXPECT_CODE(p->append(7, Tokens{4}), kNotFound);
  EXPECT_EQ(p->history_length(1), static_cast<int64_t>(kRepetitive.size()));
  SPECD_EXPECT_CODE(p->truncate(1, 100), kOutOfRange);
  SPECD_EXPECT_CODE(p->truncate(1, 0), kInvalidArgument);
  SPECD_EXPECT_CODE(p->remove_request(7, RemoveReason::kFinished), kNotFound);
  expect_batch_errors_leave_output(*p, 1, 7);
  EXPECT_EQ(propose(*p, 1).tokens[0], 6);
}

TEST(SuffixProposer, RejectsInvalidConfigs) {
  std::unique_ptr<SuffixProposer> p;
  const SuffixConfig good;
  SPECD_ASSERT_OK(SuffixProposer::create(good, &p));
  auto bad = [&](auto edit) {
    SuffixConfig c = good;
    edit(c);
    SPECD_EXPECT_CODE(SuffixProposer::create(c, &p), kInvalidArgument);
  };
  bad([](SuffixConfig& c) { c.max_match = 0; });
  bad([](SuffixConfig& c) { c.spec_factor = 0; });
  bad([](SuffixConfig& c) { c.spec_factor = NAN; });
  bad([](SuffixConfig& c) { c.min_token_prob = 1.5f; });
  bad([](SuffixConfig& c) { c.min_token_prob = -0.1f; });
  bad([](SuffixConfig& c) { c.cache_max_tokens = -1; });
  bad([](SuffixConfig& c) { c.cache_epochs = 0; });
  bad([](SuffixConfig& c) { c.count_cap = 0; });
}

TEST(SuffixProposer, RememberedCacheMatchesEqualFreshMatching) {
  // Request 0 proposes at every step, so its match in each epoch is advanced from the last
  // one; a proposer rebuilt from the same finished documents matches from scratch. Other
  // requests finish meanwhile (epochs grow, rotate and drop), and request 0 is truncated
  // now and then. The proposals must be identical.
  std::mt19937 rng(31);
  auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  SuffixConfig c = with_factor(2.0f, 0.05f);
  c.max_match = 6;
  c.cache_max_tokens = 120;
  c.cache_epochs = 3;
  auto random_tokens = [&](int n) {
    Tokens t(static_cast<std::size_t>(n));
    for (int32_t& x : t) x = rand(0, 3);
    return t;
  };
  auto p = make(c);
  std::vector<Tokens> finished;  // documents in finishing order (prompt of 1 token + output)
  Tokens history = random_tokens(5);
  SPECD_ASSERT_OK(p->add_request(0, history));
  int with_cache = 0;
  for (int step = 0; step < 300; ++step) {
    const int op = rand(0, 9);
    if (op < 6) {
      const Tokens more = random_tokens(rand(1, op == 0 ? 9 : 3));  // sometimes > max_match
      SPECD_ASSERT_OK(p->append(0, more));
      history.insert(history.end(), more.begin(), more.end());
    } else if (op < 9) {
      finished.push_back(random_tokens(rand(2, 12)));
      finish(*p, 1, {finished.back()[0]}, Tokens(finished.back().begin() + 1, finished.back().end()));
    } else {
      const int64_t len = rand(1, static_cast<int>(history.size()));
      SPECD_ASSERT_OK(p->truncate(0, len));
      history.resize(static_cast<std::size_t>(len));
    }
    auto fresh = make(c);
    for (const Tokens& doc : finished) finish(*fresh, 1, {doc[0]}, Tokens(doc.begin() + 1, doc.end()));
    SPECD_ASSERT_OK(fresh->add_request(0, history));
    ASSERT_EQ(fresh->cache_tokens(), p->cache_tokens());
    const Tree a = propose(*p, 0, 4, 8), b = propose(*fresh, 0, 4, 8);
    ASSERT_EQ(a.tokens, b.tokens) << "step " << step;
    ASSERT_EQ(a.parents, b.parents) << "step " << step;
    ASSERT_EQ(a.probs, b.probs) << "step " << step;
    with_cache += p->num_cache_epochs() > 1;
  }
  EXPECT_GT(with_cache, 100);
}

// ---- randomized comparison with empirical frequencies ----

// Occurrences of y in h (end positions), and those followed by a token.
void occurrences(const Tokens& h, const Tokens& y, int* occ, int* followed) {
  *occ = *followed = 0;
  for (std::size_t e = y.size() - 1; e < h.size(); ++e)
    if (std::equal(y.begin(), y.end(), h.begin() + static_cast<long>(e + 1 - y.size()))) {
      ++*occ;
      *followed += e + 1 < h.size();
    }
}

TEST(SuffixProposer, RandomHistoriesMatchEmpiricalFrequencies) {
  std::mt19937 rng(77);
  auto rand = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int nontrivial = 0;
  constexpr int kCases = 1500;
  for (int round = 0; round < kCases; ++round) {
    const float factors[] = {0.5f, 1.0f, 2.0f, 4.0f}, min_probs[] = {0.0f, 0.07f, 0.13f, 0.29f};
    SuffixConfig c = with_factor(factors[rand(0, 3)], min_probs[rand(0, 3)]);
    c.max_match = std::vector<int>{1, 2, 3, 32}[static_cast<std::size_t>(rand(0, 3))];
    c.count_cap = 1 << 20;
    const int alphabet = rand(2, 4);
    Tokens h(static_cast<std::size_t>(rand(2, 50)));
    for (int32_t& t : h) t = rand(0, alphabet - 1);
    const int32_t depth = rand(0, 5), nodes = rand(0, 12);
    const Tree t = propose_history(c, h, depth, nodes);
    ASSERT_EQ(t.tokens[0], h.back());

    // m: the longest suffix of h that occurred earlier with a following token.
    int m = 0;
    for (int len = static_cast<int>(h.size()) - 1; len >= 1 && m == 0; --len) {
      int occ, followed;
      occurrences(h, Tokens(h.end() - len, h.end()), &occ, &followed);
      if (followed > 0) m = len;
    }
    const Tokens x(h.end() - m, h.end());
    const int budget = (m == 0 || depth == 0)
                           ? 0 : std::min(nodes, static_cast<int>(std::ceil(c.spec_factor * static_cast<float>(std::min(m, c.max_match)))));
    // P(path) = prod over steps of occ(x + path[:i+1]) / followed(x + path[:i]).
    auto brute_prob = [&](const Tokens& path) {
      double p = 1.0;
      Tokens y = x;
      for (int32_t tok : path) {
        int occ, followed, occ_next, unused;
        occurrences(h, y, &occ, &followed);
        if (followed == 0) return 0.0;  // y only ends the history: no continuation
        y.push_back(tok);
        occurrences(h, y, &occ_next, &unused);
        p *= static_cast<double>(occ_next) / followed;
      }
      return p;
    };
    ASSERT_LE(t.drafts(), budget) << "round " << round;
    std::set<Tokens> in_tree;
    float min_prob = 1.0f;
    for (int32_t i = 1; i <= t.drafts(); ++i) {
      const Tokens path = t.path(i);
      ASSERT_TRUE(in_tree.insert(path).second) << "duplicate sibling, round " << round;
      ASSERT_LE(static_cast<int32_t>(path.size()), depth);
      const float p = t.probs[static_cast<std::size_t>(i)];
      ASSERT_NEAR(p, brute_prob(path), 1e-6) << "round " << round << " node " << i;
      ASSERT_GE(p, c.min_token_prob);
      if (i >= 2) ASSERT_LE(p, t.probs[static_cast<std::size_t>(i) - 1] + 1e-6f);  // best-first
      min_prob = std::min(min_prob, p);
    }
    // Best-first is complete: a node left out (parent in the tree, prob above the threshold)
    // means the budget was spent on nodes at least as likely.
    for (int32_t i = 0; i <= t.drafts(); ++i) {
      const Tokens path = t.path(i);
      if (static_cast<int32_t>(path.size()) >= depth || budget == 0) continue;
      for (int32_t tok = 0; tok < alphabet; ++tok) {
        Tokens child = path;
        child.push_back(tok);
        if (in_tree.count(child)) continue;
        const double p = brute_prob(child);
        if (p <= 0 || p < c.min_token_prob + 1e-5) continue;
        ASSERT_EQ(t.drafts(), budget) << "missing node with p " << p << ", round " << round;
        ASSERT_LE(p, min_prob + 1e-6) << "round " << round;
      }
    }
    nontrivial += t.drafts() >= 2;
  }
  EXPECT_GE(nontrivial, kCases / 4);
}

}  // namespace
}  // namespace specd::testing
