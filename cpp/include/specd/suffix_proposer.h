// SuffixProposer: SuffixDecoding-style drafts from suffix automata over the request's own
// history and over a global cache of earlier requests' outputs, expanded into a token tree
// by best-first search on empirical continuation frequencies.
//
// Sources
// - own: a SuffixAutomaton over the request's history (prompt + appended tokens).
// - cache epochs: finished requests' generated tokens (and prompts when cache_prompts), each
//   document followed by the separator -1, in a few SuffixAutomaton "epochs", newest last.
//   remove_request(id, kFinished) adds the request to the newest epoch; a new epoch starts
//   when the newest holds more than cache_max_tokens / cache_epochs tokens, and past
//   cache_epochs epochs the oldest is dropped whole. So the cache holds at most about
//   cache_max_tokens tokens (plus one document per epoch) and forgets the oldest outputs
//   first. kAborted forgets the request without caching it.
//
// Proposal for request i (history h of length L, depth limit D, budget max_nodes)
// - Match state per source: own: from last_state() follow suffix links to the first state
//   with a transition on a token >= 0 (the longest suffix of h seen earlier with a
//   continuation). Epoch: match(the last max_match tokens of h), then fall back along suffix
//   links to the first state with a transition on a token >= 0. The root means "no match"
//   and the source is skipped. match_len = min(matched length, max_match) sets the budget;
//   the own source's state may stand for a longer suffix (its counts are those of it).
// - Expansion (best-first): a max-heap of (path_prob, state, parent node, token); children of
//   a state s get prob = parent's path_prob x count(target) / (sum of count over s's
//   transitions on tokens >= 0), pushed only if prob >= min_token_prob and depth <= D. A
//   popped entry becomes a tree node. It stops after budget = min(max_nodes,
//   ceil(spec_factor x match_len)) nodes or when the heap is empty. Ties pop in push order
//   (a node's children are pushed most likely first, then in transition order), so the
//   result is deterministic.
//   Children are pushed lazily, so that a state with thousands of continuations (a frequent
//   short string in a long history) costs O(1) unless several of them can make the tree: the
//   most likely child is pushed at once (SuffixAutomaton::continuations), the others only
//   as one marker whose priority bounds theirs (min(top child's prob, share of the rest));
//   the scan of the state's transitions happens when the marker is popped. If the top child
//   is below min_token_prob, so is every child, and nothing is pushed. The nodes popped are
//   the same as with eager pushing (the most likely ones), up to the order of ties.
// - node_probs = each node's path_prob (root 1). A source's score is the sum of its drafts'
//   node_probs (expected accepted tokens); the best source wins (ties: own history first,
//   then newer epochs).
//
// Rules
// - Histories hold tokens >= 0 and are never empty (as for NgramProposer). Errors and
//   "failed calls change nothing" as in proposer.h; propose_batch leaves `out` untouched on
//   error. Unknown request -> kNotFound; duplicate add -> kAlreadyExists; bad argument ->
//   kInvalidArgument; truncate past the length -> kOutOfRange.
// - truncate rebuilds the request's automaton from the shorter history: O(new length), the
//   rare path (the engine only appends in normal operation). A truncate into the prompt
//   shortens the prompt: what follows new_len counts as generated.
// - Not thread-safe: one scheduler thread owns a proposer.
//
// Cost
// - append: amortized O(count_cap) per token (SuffixAutomaton::append), usually O(1).
// - remove_request(kFinished): O(tokens cached) amortized.
// - propose: O(E x a + budget x log budget) per request for E epochs and a tokens appended
//   since its previous proposal (each request remembers its match in each epoch and
//   advances it; max_match tokens when the epoch changed or a >= max_match), plus
//   O(out-degree) per state whose children beyond the most likely one may still enter the
//   tree. Independent of the history and cache lengths except through those out-degrees.
// - Memory: per live request, 4 bytes per token of history plus its automaton (60-85 bytes
//   per token on text); the cache's automata about the same per cached token.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "specd/detail/request_table.h"
#include "specd/proposer.h"
#include "specd/suffix_automaton.h"

namespace specd {

struct SuffixConfig {
  int32_t max_match = 32;        // longest suffix pattern used (>= 1)
  float spec_factor = 1.0f;      // budget = min(max_nodes, ceil(spec_factor x match_len)) (> 0)
  float min_token_prob = 0.1f;   // drop nodes whose path probability is below this ([0, 1])
  int64_t cache_max_tokens = int64_t{1} << 20;  // global cache size (0: no cache)
  int32_t cache_epochs = 4;      // the cache is split in this many epochs (>= 1)
  bool cache_prompts = false;    // cache prompts too, not only generated tokens
  int32_t count_cap = 1024;      // SuffixAutomaton count cap (1 .. 2^24 - 1)
};

class SuffixProposer final : public Proposer {
 public:
  static constexpr int32_t kSeparator = -1;

  static Status create(const SuffixConfig& config, std::unique_ptr<SuffixProposer>* out);
  ~SuffixProposer() override;

  Status add_request(RequestId id, Span<const int32_t> prompt) override;
  Status append(RequestId id, Span<const int32_t> tokens) override;
  Status truncate(RequestId id, int64_t new_len) override;
  Status remove_request(RequestId id, RemoveReason reason) override;
  bool contains(RequestId id) const override;
  int64_t history_length(RequestId id) const override;

  // ids [n], max_depth [n], max_nodes [n]; out gets n trees in the order of ids.
  Status propose_batch(Span<const RequestId> ids, Span<const int32_t> max_depth,
                       Span<const int32_t> max_nodes, TokenTreeBatch* out) override;

  const SuffixConfig& config() const { return config_; }
  int64_t num_requests() const { return requests_.size(); }
  int32_t num_cache_epochs() const { return static_cast<int32_t>(epochs_.size()); }
  // Tokens held by the cache (separators included).
  int64_t cache_tokens() const;
  // Approximate heap bytes of the request automata and the cache.
  int64_t memory_bytes() const;

 private:
  struct Request;  // suffix_proposer.cc
  struct Epoch {
    uint64_t id;  // never reused, so a request's remembered match names its epoch safely
    SuffixAutomaton sam;
  };
  // A heap entry: a candidate node, or a "siblings" marker standing for the children of a
  // tree node other than its most likely one, whose scan is deferred until they could
  // still make the budget (see expand()).
  struct Candidate {
    double prob;     // node: its path_prob; marker: an upper bound of the children's
    double base;     // marker: path_prob of the node the children hang under
    int32_t state;   // node: its automaton state; marker: the parent node's state
    int32_t parent;  // tree node the node (the marker's children) hang under
    int32_t token;   // node: its token; marker: the top child's token (already pushed)
    int32_t depth;   // depth of the node (of the marker's children)
    uint64_t seq;    // push order: the tie-break
    bool siblings;   // a marker
  };
  // One source's expansion, as parallel arrays (node 0 is the root).
  struct Draft {
    std::vector<int32_t> tokens, parents;
    std::vector<float> probs;
    double score = 0;
  };

  explicit SuffixProposer(const SuffixConfig& config);
  Status add_to_cache(const Request& r);
  int32_t budget(int32_t match_len, int32_t max_nodes) const;
  void propose_one(Request& r, int32_t max_depth, int32_t max_nodes, TokenTreeBatch* out);
  // The match of r's last max_match tokens in epoch e, advanced from the one remembered at
  // the previous proposal when e has not changed since (O(tokens appended since)).
  SuffixAutomaton::Match epoch_match(Request& r, const Epoch& e) const;
  // Expands `sam` from `state` into draft_ (root token `root`) and returns its score.
  double expand(const SuffixAutomaton& sam, int32_t state, int32_t root, int32_t max_depth,
                int32_t budget);
  // Max-heap order: higher prob first, then earlier push.
  static bool heap_order(const Candidate& a, const Candidate& b) {
    return a.prob < b.prob || (a.prob == b.prob && a.seq > b.seq);
  }
  void push(const Candidate& c);
  void push_children(const SuffixAutomaton& sam, int32_t state, double prob, int32_t node,
                     int32_t depth, int32_t max_depth);
  void push_siblings(const SuffixAutomaton& sam, const Candidate& marker);

  SuffixConfig config_;
  detail::RequestTable<Request> requests_;  // initialized in the .cc, where Request is complete
  std::deque<Epoch> epochs_;  // oldest first
  uint64_t next_epoch_id_ = 0;
  // Scratch of propose_batch, reused across calls.
  std::vector<Request*> batch_;
  std::vector<Candidate> heap_;
  uint64_t push_seq_ = 0;
  Draft draft_, best_;
};

}  // namespace specd
