// SuffixAutomaton: an online suffix automaton (SAM) over an int32 token stream, with capped
// occurrence counts. It is the index behind the suffix proposer: one per request (over its
// history) and one per cache epoch (over finished requests' outputs).
//
// Words
// - state: a set of substrings of the text that share their end positions (endpos). State 0
//   is the root (the empty string). len(s) is the length of the longest string of s; the
//   strings of s are the suffixes of it longer than len(link(s)).
// - link(s): the suffix link, the state of the longest suffix of s's strings that lies in
//   another state (link(0) == -1). len strictly decreases along links.
// - transition (s, token) -> t: appending `token` to any string of s gives a string of t.
// - count(s): how many times s's strings occur in the text (|endpos(s)|), capped at
//   count_cap. count(0) == min(count_cap, size()).
// - token_total(s): the sum of count(t) over s's transitions (s, token >= 0) -> t, i.e. how
//   many occurrences of s's strings are followed by a token (not a separator), with each
//   continuation's count capped; the top transition is the one with the largest count (the
//   smallest token on ties). A proposer gets P(next = token | s) = count(t) / token_total(s)
//   and the most likely next token without scanning s's transitions: both are kept up to
//   date for high-degree states and computed from the <= kListMax transitions of the others.
//
// Rules
// - Append-only: tokens are never removed (callers rebuild to shorten; see SuffixProposer).
// - Any int32 is a token. Negative tokens act as separators between documents: they are
//   stored like any other, and proposers skip transitions on them, so no proposal crosses a
//   document boundary.
// - Capacity: at most kMaxTokens tokens (state and edge indices are int32); append returns
//   kOutOfRange past it and changes nothing.
// - Not thread-safe for writers; const calls may run concurrently with each other.
//
// Cost
// - append: amortized O(1) for the automaton itself (transition lookups are O(1): see
//   "Transitions" below) plus the count update: the new end position belongs to exactly the
//   states on the new state's suffix-link chain, and the walk up that chain stops at the
//   first state already at count_cap (counts only grow along links, so every state above it
//   is at the cap too). Each step raises a count below the cap, so the update is amortized
//   O(count_cap) even for "aaaa...". A second walk, as long, up the previous last state's
//   chain keeps the summaries (token_total, top transition) of high-degree states current.
// - match(context): O(|context|) amortized; advance(): O(1) amortized. transition() and
//   continuations(): O(1) expected. for_each_transition(s): O(out-degree of s).
// - Memory: at most 2n states and 3n transitions for n tokens; 16 bytes per state plus 12 per
//   transition (plus ~17 per transition of high-degree states, in the hash index); arrays
//   grow by 1.5x. About 1.5 states and 2.1 transitions per token on text: 60-80 bytes per
//   token (see memory_bytes()).
//
// Transitions
// Each state keeps its transitions as a singly linked list in one shared edge array (12 bytes
// per edge, no per-state allocation). Most states have 1-3 transitions, so a short list scan
// is the fastest lookup. States with more than kListMax transitions (the root and the states
// of frequent short strings, whose out-degree can reach the vocabulary size) also have their
// edges in one open-addressing hash table keyed by (state, token), so no lookup scans a long
// list. A per-state std::vector or a hash entry for every edge would cost 2-3x the memory.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "specd/span.h"
#include "specd/status.h"

namespace specd {

class SuffixAutomaton {
 public:
  static constexpr int64_t kMaxTokens = (int64_t{1} << 29) - 1;
  static constexpr int32_t kDefaultCountCap = 1024;
  static constexpr int32_t kMaxCountCap = (1 << 24) - 1;  // counts are stored in 24 bits
  static constexpr int32_t kListMax = 8;  // out-degree above which a state's edges are hashed

  struct Match {
    int32_t state = 0;   // the state of the matched suffix (0: nothing matched)
    int32_t length = 0;  // its length; len(link(state)) < length <= len(state)
  };
  // What may follow a state's strings, summarized (see Words).
  struct Continuations {
    int32_t total = 0;        // token_total(state); 0: no continuation on a token >= 0
    int32_t top_token = -1;   // the most likely next token (largest count, smallest token)
    int32_t top_target = -1;  // its transition's target
  };

  // count_cap is clamped to [1, kMaxCountCap].
  explicit SuffixAutomaton(int32_t count_cap = kDefaultCountCap);

  Status append(int32_t token);
  Status append(Span<const int32_t> tokens);  // all or nothing (capacity checked first)

  int64_t size() const { return size_; }  // tokens appended
  int32_t num_states() const { return static_cast<int32_t>(states_.size()); }
  int64_t num_transitions() const { return static_cast<int64_t>(edges_.size()); }
  int32_t count_cap() const { return count_cap_; }
  int32_t last_state() const { return last_; }  // the state of the whole text

  int32_t len(int32_t state) const { return at(state).len; }
  int32_t link(int32_t state) const { return at(state).link; }
  int32_t count(int32_t state) const {
    return state == 0 ? static_cast<int32_t>(std::min<int64_t>(count_cap_, size_))
                      : static_cast<int32_t>(at(state).count);
  }
  // Number of transitions; O(1) up to 254, O(out-degree) beyond.
  int32_t out_degree(int32_t state) const;

  // Target of the transition (state, token), or -1 when there is none.
  int32_t transition(int32_t state, int32_t token) const;
  // Calls fn(token, target) for each transition of `state` (newest first; a clone lists the
  // copied transitions in the original's order).
  template <class Fn>
  void for_each_transition(int32_t state, Fn&& fn) const {
    for (int32_t e = at(state).first_edge; e >= 0; e = edges_[static_cast<std::size_t>(e)].next)
      fn(edges_[static_cast<std::size_t>(e)].token, edges_[static_cast<std::size_t>(e)].target);
  }
  // token_total and the top transition on tokens >= 0; O(1).
  Continuations continuations(int32_t state) const;
  int32_t token_total(int32_t state) const { return continuations(state).total; }
  // Does `state` have a transition on a token >= 0 (a continuation that is not a separator)?
  bool has_token_transition(int32_t state) const { return token_total(state) > 0; }

  // The longest suffix of `context` that occurs in the text (standard walk with suffix-link
  // fallback). {0, 0} when no token of the context's end occurs.
  Match match(Span<const int32_t> context) const;
  // One step of that walk: the match of (matched text + token), its length capped at
  // max_length (the result is then the longest suffix of the last max_length tokens of the
  // context that occurs). Streaming a context through advance() equals match() of it, so a
  // caller can keep a match up to date as its context grows, as long as the automaton does
  // not change in between (appending may split states and invalidate a Match).
  Match advance(Match m, int32_t token, int32_t max_length) const;

  // Approximate heap bytes held (vector capacities).
  int64_t memory_bytes() const;

 private:
  static constexpr uint32_t kDegreeSaturated = 255;
  struct State {
    int32_t len;
    int32_t link;
    int32_t first_edge;   // head of the transition list, -1 for none
    uint32_t count : 24;  // capped occurrence count (unused for the root)
    uint32_t degree : 8;  // transitions in the list, saturating at kDegreeSaturated
  };
  // token_total and top transition of a state (best_edge -1: no transition on a token >= 0).
  struct Summary {
    int32_t token_total = 0;
    int32_t best_edge = -1;
  };
  struct Edge {
    int32_t token;
    int32_t target;
    int32_t next;  // next edge of the same state, -1 at the end
  };
  // Open-addressing (linear probing) map (state, token) -> edge index for high-degree states.
  // Edges are never removed, so there are no tombstones.
  class EdgeHash {
   public:
    int32_t find(uint64_t key) const;
    void insert(uint64_t key, int32_t edge);  // key must be absent
    int64_t memory_bytes() const;

   private:
    void grow();
    std::vector<uint64_t> keys_;
    std::vector<int32_t> edges_;  // -1: empty slot
    std::size_t used_ = 0;
  };

  const State& at(int32_t s) const { return states_[static_cast<std::size_t>(s)]; }
  State& at(int32_t s) { return states_[static_cast<std::size_t>(s)]; }
  static uint64_t edge_key(int32_t state, int32_t token);
  int32_t find_edge(int32_t state, int32_t token) const;
  int32_t new_state(int32_t len, int32_t link, uint32_t count);
  int32_t push_edge(int32_t token, int32_t target, int32_t next);
  void add_edge(int32_t state, int32_t token, int32_t target);
  void index_edges(int32_t state);  // puts all of state's edges into hash_
  int32_t clone_state(int32_t q, int32_t len);
  bool hashed(int32_t s) const { return at(s).degree > kListMax; }
  bool better(int32_t e, int32_t than) const;  // (count desc, token asc) order of edges
  Summary summary(int32_t state) const;        // stored (hashed states) or computed
  Summary scan_summary(int32_t state) const;   // from the transition list
  void extend(int32_t token);
  void add_occurrence(int32_t cur, int32_t prev_last, int32_t token);

  int32_t count_cap_;
  int64_t size_ = 0;
  int32_t last_ = 0;
  std::vector<State> states_;
  std::vector<Edge> edges_;
  EdgeHash hash_;
  std::unordered_map<int32_t, Summary> summaries_;  // of hashed states only (few)
};

}  // namespace specd
