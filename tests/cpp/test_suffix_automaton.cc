// SuffixAutomaton: worked examples, then randomized comparison with brute force on small
// alphabets with separators (substring membership, capped occurrence counts, state lengths,
// transition sets, match()), the "aaaa..." worst case, and hashed high-degree states.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "block_manager_test_util.h"
#include "specd/suffix_automaton.h"

namespace specd::testing {
namespace {

using Tokens = std::vector<int32_t>;

SuffixAutomaton build(const Tokens& text, int32_t cap = SuffixAutomaton::kDefaultCountCap) {
  SuffixAutomaton sam(cap);
  for (int32_t t : text) EXPECT_TRUE(sam.append(t).ok());
  return sam;
}

// The state reached from the root by `s`, or -1.
int32_t walk(const SuffixAutomaton& sam, const Tokens& s) {
  int32_t state = 0;
  for (int32_t t : s) {
    state = sam.transition(state, t);
    if (state < 0) return -1;
  }
  return state;
}

std::set<int32_t> transition_tokens(const SuffixAutomaton& sam, int32_t state) {
  std::set<int32_t> out;
  sam.for_each_transition(state, [&](int32_t token, int32_t) { out.insert(token); });
  return out;
}

TEST(SuffixAutomaton, WorkedExampleAbcbc) {
  const Tokens text = {0, 1, 2, 1, 2};  // a b c b c
  const SuffixAutomaton sam = build(text);
  EXPECT_EQ(sam.size(), 5);
  EXPECT_LE(sam.num_states(), 2 * 5);
  EXPECT_EQ(sam.len(sam.last_state()), 5);
  EXPECT_EQ(sam.count(walk(sam, {1, 2})), 2);  // "bc" twice
  EXPECT_EQ(sam.count(walk(sam, {2})), 2);
  EXPECT_EQ(sam.count(walk(sam, {0, 1, 2})), 1);
  EXPECT_EQ(sam.count(walk(sam, {2, 1})), 1);
  EXPECT_EQ(sam.count(0), 5);
  EXPECT_EQ(walk(sam, {2, 0}), -1);  // "ca" never occurs
  EXPECT_EQ(walk(sam, {0, 2}), -1);
  // "bc" and "c" share endpos {2, 4}; "abc" has its own state.
  EXPECT_EQ(walk(sam, {1, 2}), walk(sam, {2}));
  EXPECT_NE(walk(sam, {0, 1, 2}), walk(sam, {2}));
  EXPECT_EQ(transition_tokens(sam, walk(sam, {1, 2})), (std::set<int32_t>{1}));  // "bc" -> b
  const SuffixAutomaton::Match m = sam.match(Tokens{7, 0, 1, 2, 1});  // longest suffix: "abcb"
  EXPECT_EQ(m.length, 4);
  EXPECT_EQ(m.state, walk(sam, {0, 1, 2, 1}));
  EXPECT_EQ(sam.match(Tokens{}).length, 0);
  EXPECT_EQ(sam.match(Tokens{1, 9}).length, 0);  // last token never occurs
  EXPECT_EQ(sam.match(Tokens{1, 9}).state, 0);
}

TEST(SuffixAutomaton, CountCapIsApplied) {
  const SuffixAutomaton sam = build({3, 3, 3, 3, 3, 4, 3, 3}, /*cap=*/3);
  EXPECT_EQ(sam.count(walk(sam, {3})), 3);     // 7 occurrences, capped
  EXPECT_EQ(sam.count(walk(sam, {3, 3})), 3);  // 5 occurrences, capped
  EXPECT_EQ(sam.count(walk(sam, {3, 3, 3})), 3);
  EXPECT_EQ(sam.count(walk(sam, {3, 3, 3, 3})), 2);
  EXPECT_EQ(sam.count(walk(sam, {4, 3})), 1);
  EXPECT_EQ(sam.count(0), 3);
}

// Substrings of `text` up to length 8 with their number of occurrences (end positions).
std::map<Tokens, int> substring_counts(const Tokens& text, std::size_t max_len) {
  std::map<Tokens, int> counts;
  for (std::size_t i = 0; i < text.size(); ++i)
    for (std::size_t n = 1; n <= max_len && i + n <= text.size(); ++n)
      ++counts[Tokens(text.begin() + static_cast<long>(i), text.begin() + static_cast<long>(i + n))];
  return counts;
}

// Longest suffix of `context` that occurs in `text` (brute force).
std::size_t brute_match(const Tokens& text, const Tokens& context) {
  for (std::size_t n = context.size(); n > 0; --n) {
    const Tokens suffix(context.end() - static_cast<long>(n), context.end());
    for (std::size_t i = 0; i + n <= text.size(); ++i)
      if (std::equal(suffix.begin(), suffix.end(), text.begin() + static_cast<long>(i))) return n;
  }
  return 0;
}

void check_against_brute(const SuffixAutomaton& sam, const Tokens& text, int32_t cap,
                         int alphabet, std::mt19937& rng) {
  constexpr std::size_t kMaxLen = 8;
  ASSERT_LE(sam.num_states(), std::max<int64_t>(2, 2 * static_cast<int64_t>(text.size())));
  EXPECT_EQ(sam.count(0), std::min<int64_t>(cap, static_cast<int64_t>(text.size())));
  const std::map<Tokens, int> counts = substring_counts(text, kMaxLen + 1);
  for (auto it = counts.begin(); it != counts.end(); ++it) {
    const Tokens& sub = it->first;
    const int n = it->second;
    if (sub.size() > kMaxLen) continue;
    const int32_t s = walk(sam, sub);
    ASSERT_GE(s, 0) << "substring of length " << sub.size() << " not found";
    EXPECT_EQ(sam.count(s), std::min(cap, n));
    EXPECT_LT(sam.len(sam.link(s)), static_cast<int32_t>(sub.size()));
    EXPECT_GE(sam.len(s), static_cast<int32_t>(sub.size()));
    // Its transitions are exactly the tokens that follow it somewhere.
    // (Strings extending `sub` follow it contiguously in the map's lexicographic order.)
    // continuations() summarizes the continuations on tokens >= 0.
    std::set<int32_t> next;
    int total = 0, best = 0;
    for (auto ext = std::next(it); ext != counts.end() && ext->first.size() > sub.size() &&
                                   std::equal(sub.begin(), sub.end(), ext->first.begin());
         ++ext) {
      if (ext->first.size() != sub.size() + 1) continue;
      next.insert(ext->first.back());
      if (ext->first.back() < 0) continue;
      total += std::min(cap, ext->second);
      best = std::max(best, std::min(cap, ext->second));
    }
    EXPECT_EQ(transition_tokens(sam, s), next);
    const SuffixAutomaton::Continuations next_summary = sam.continuations(s);
    EXPECT_EQ(next_summary.total, total);
    EXPECT_EQ(sam.has_token_transition(s), total > 0);
    if (total > 0) {
      // The most frequent continuation, the smallest token among equals.
      EXPECT_EQ(sam.transition(s, next_summary.top_token), next_summary.top_target);
      EXPECT_EQ(sam.count(next_summary.top_target), best);
      for (int32_t t = 0; t < next_summary.top_token; ++t) {
        Tokens other = sub;
        other.push_back(t);
        const auto o = counts.find(other);
        if (o != counts.end()) EXPECT_LT(std::min(cap, o->second), best) << "tie not broken by token";
      }
    } else {
      EXPECT_EQ(next_summary.top_token, -1);
    }
  }
  std::uniform_int_distribution<int> tok(-1, alphabet - 1), len(1, static_cast<int>(kMaxLen));
  for (int q = 0; q < 60; ++q) {
    Tokens s(static_cast<std::size_t>(len(rng)));
    for (int32_t& t : s) t = tok(rng);
    EXPECT_EQ(walk(sam, s) >= 0, counts.count(s) != 0);
    Tokens context(static_cast<std::size_t>(len(rng) + 4));
    for (int32_t& t : context) t = rng() % 16 == 0 ? 99 : tok(rng);  // 99 never occurs
    const SuffixAutomaton::Match m = sam.match(context);
    const std::size_t want = brute_match(text, context);
    ASSERT_EQ(static_cast<std::size_t>(m.length), want);
    EXPECT_EQ(m.state, want == 0 ? 0 : walk(sam, Tokens(context.end() - static_cast<long>(want), context.end())));
    // Streaming with a cap K: after each token, the match of the last K tokens.
    if (q >= 15) continue;
    const int32_t k = 1 + static_cast<int32_t>(rng() % 6);
    SuffixAutomaton::Match streamed;
    for (std::size_t i = 0; i < context.size(); ++i) {
      streamed = sam.advance(streamed, context[i], k);
      const std::size_t lo = i + 1 > static_cast<std::size_t>(k) ? i + 1 - static_cast<std::size_t>(k) : 0;
      const Tokens window(context.begin() + static_cast<long>(lo), context.begin() + static_cast<long>(i + 1));
      const std::size_t w = brute_match(text, window);
      ASSERT_EQ(static_cast<std::size_t>(streamed.length), w);
      ASSERT_EQ(streamed.state, w == 0 ? 0 : walk(sam, Tokens(window.end() - static_cast<long>(w), window.end())));
    }
  }
}

TEST(SuffixAutomaton, RandomTextsMatchBruteForce) {
  std::mt19937 rng(7);
  int checks = 0;
  for (int round = 0; round < 240; ++round) {
    const int alphabet = std::vector<int>{2, 3, 4, 12}[static_cast<std::size_t>(round % 4)];
    const int32_t cap = round % 3 == 0 ? 3 : 1 << 20;
    const int n = 1 + static_cast<int>(rng() % 120);
    Tokens text;
    SuffixAutomaton sam(cap);
    for (int i = 0; i < n; ++i) {
      // Separators (-1) occasionally, like documents in the cache.
      text.push_back(rng() % 17 == 0 ? -1 : static_cast<int32_t>(rng() % static_cast<unsigned>(alphabet)));
      SPECD_ASSERT_OK(sam.append(text.back()));
      // Online: the automaton is right after every prefix, not only at the end.
      if (i == n / 2 || i == n - 1) {
        check_against_brute(sam, text, cap, alphabet, rng);
        ++checks;
      }
      if (::testing::Test::HasFailure()) FAIL() << "round " << round << " prefix " << i + 1;
    }
  }
  EXPECT_GE(checks, 450);  // two per text (one for 1-token texts)
}

TEST(SuffixAutomaton, ExhaustiveShortStringsOverTinyAlphabet) {
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    Tokens text(static_cast<std::size_t>(5 + rng() % 40));
    for (int32_t& t : text) t = static_cast<int32_t>(rng() % 3) - 1;  // {-1, 0, 1}
    const SuffixAutomaton sam = build(text);
    const std::map<Tokens, int> counts = substring_counts(text, 5);
    // Every string of length 1..5 over {-1, 0, 1}: found iff it occurs.
    for (int len = 1; len <= 5; ++len) {
      int total = 1;
      for (int i = 0; i < len; ++i) total *= 3;
      for (int code = 0; code < total; ++code) {
        Tokens s;
        for (int i = 0, c = code; i < len; ++i, c /= 3) s.push_back(c % 3 - 1);
        const auto it = counts.find(s);
        const int32_t state = walk(sam, s);
        ASSERT_EQ(state >= 0, it != counts.end());
        if (state >= 0) EXPECT_EQ(sam.count(state), it->second);
      }
    }
  }
}

TEST(SuffixAutomaton, WorstCaseRepeatedTokenStaysLinear) {
  // "aaaa...": every append walks the whole suffix chain without the count cap; with it the
  // walk stops after count_cap states. (The ctest timeout catches a regression.)
  constexpr int64_t kN = 100000;
  SuffixAutomaton sam(1024);
  for (int64_t i = 0; i < kN; ++i) SPECD_ASSERT_OK(sam.append(5));
  EXPECT_EQ(sam.size(), kN);
  EXPECT_LE(sam.num_states(), 2 * sam.size());
  EXPECT_EQ(sam.len(sam.last_state()), kN);
  EXPECT_EQ(sam.count(sam.last_state()), 1);
  // a^j occurs kN - j + 1 times: the state of a^(kN-9) has 10, a^5 is capped.
  int32_t s = 0;
  for (int64_t j = 1; j <= kN - 9; ++j) s = sam.transition(s, 5);
  EXPECT_EQ(sam.count(s), 10);
  EXPECT_EQ(sam.count(walk(sam, Tokens(5, 5))), 1024);
}

TEST(SuffixAutomaton, HighDegreeStatesUseTheHashIndexAndSurviveCloning) {
  // "a b X_i" for 20 different X: the state of "a b" (and of "b") gets 20 transitions, past
  // kListMax. Then "c b" splits "b" from "a b": the clone copies the hashed transitions.
  Tokens text;
  for (int32_t x = 100; x < 120; ++x) text.insert(text.end(), {1, 2, x});
  text.insert(text.end(), {3, 2, 7});
  const SuffixAutomaton sam = build(text);
  const int32_t ab = walk(sam, {1, 2});
  const int32_t b = walk(sam, {2});
  ASSERT_GE(ab, 0);
  ASSERT_GE(b, 0);
  EXPECT_NE(ab, b);  // split: "b" also ends after "c"
  EXPECT_EQ(sam.out_degree(ab), 20);
  EXPECT_EQ(sam.out_degree(b), 21);  // 20 X plus 7
  for (int32_t x = 100; x < 120; ++x) {
    EXPECT_GE(sam.transition(ab, x), 0);
    EXPECT_EQ(sam.count(sam.transition(b, x)), 1);
  }
  EXPECT_EQ(sam.transition(ab, 7), -1);
  EXPECT_GE(sam.transition(b, 7), 0);
  EXPECT_EQ(sam.count(b), 21);
  EXPECT_EQ(sam.count(ab), 20);
  EXPECT_GT(sam.out_degree(0), SuffixAutomaton::kListMax);
  for (int32_t x = 100; x < 120; ++x) EXPECT_EQ(sam.count(sam.transition(0, x)), 1);
}

TEST(SuffixAutomaton, SummariesOfHighDegreeStatesStayExact) {
  // Skewed tokens over 40 values: frequent ones get many distinct successors, so their
  // states are hashed and keep incremental summaries, through clones and separators.
  std::mt19937 rng(21);
  for (int32_t cap : {2, 1 << 20}) {
    SuffixAutomaton sam(cap);
    Tokens text;
    for (int chunk = 0; chunk < 6; ++chunk) {
      for (int i = 0; i < 400; ++i) {
        const auto r = static_cast<int32_t>(rng() % 64);
        text.push_back(r >= 60 ? -1 : (r < 20 ? r % 4 : r % 40));
        SPECD_ASSERT_OK(sam.append(text.back()));
      }
      const std::map<Tokens, int> counts = substring_counts(text, 3);
      int hashed_checked = 0;
      for (const auto& [sub, n] : counts) {
        if (sub.size() > 2) continue;
        const int32_t s = walk(sam, sub);
        ASSERT_GE(s, 0);
        int total = 0, best = 0, best_token = -1;
        for (int32_t t = 0; t < 40; ++t) {
          Tokens ext = sub;
          ext.push_back(t);
          const auto it = counts.find(ext);
          if (it == counts.end()) continue;
          const int c = std::min(cap, it->second);
          total += c;
          if (c > best) best = c, best_token = t;
        }
        const SuffixAutomaton::Continuations next = sam.continuations(s);
        ASSERT_EQ(next.total, total) << "chunk " << chunk << " cap " << cap;
        ASSERT_EQ(next.top_token, best_token) << "chunk " << chunk << " cap " << cap;
        hashed_checked += sam.out_degree(s) > SuffixAutomaton::kListMax;
      }
      EXPECT_GT(hashed_checked, 5);
    }
  }
}

TEST(SuffixAutomaton, MemoryPerTokenOnZipfText) {
  // Zipf-like tokens over a 1000-token vocabulary with repeated phrases.
  std::mt19937 rng(3);
  SuffixAutomaton sam;
  Tokens text;
  std::uniform_real_distribution<double> u(0, 1);
  while (text.size() < 50000) {
    if (text.size() > 100 && u(rng) < 0.05) {
      const std::size_t from = rng() % (text.size() - 50);
      for (std::size_t i = 0; i < 20; ++i) text.push_back(text[from + i]);
    } else {
      text.push_back(static_cast<int32_t>(std::pow(1000.0, u(rng))));
    }
  }
  SPECD_ASSERT_OK(sam.append(text));
  const double bytes_per_token = static_cast<double>(sam.memory_bytes()) / static_cast<double>(sam.size());
  EXPECT_LT(bytes_per_token, 100.0);
  EXPECT_LE(sam.num_transitions(), 3 * sam.size());
}

TEST(SuffixAutomaton, CountCapBelowOneIsRaisedToOne) {
  const SuffixAutomaton sam = build({1, 1, 1}, 0);
  EXPECT_EQ(sam.count_cap(), 1);
  EXPECT_EQ(sam.count(walk(sam, {1})), 1);
}

}  // namespace
}  // namespace specd::testing
