// NgramProposer: prompt-lookup drafts. The request's own history is searched for earlier
// occurrences of its last n tokens, and what followed them is proposed (one chain per
// distinct continuation, merged into a token tree).
//
// Index (per request, per n in [n_min, n_max])
// - a rolling hash of the n-gram ending at each position (from prefix hashes: O(1) each);
// - head: a hash table n-gram hash -> the most recent end position with that hash;
// - prev[pos]: the previous end position with the same hash (-1: none), so the occurrences of
//   an n-gram form a chain, most recent first. Equal hashes do not imply equal n-grams: every
//   occurrence is verified token by token before it is used, so a collision costs time, never
//   a wrong proposal.
//
// Proposal for a request with history h (length L), depth k = max_depth, budget max_nodes
// - n = the LONGEST n in [n_max .. n_min] with L > n such that the suffix n-gram h[L-n, L)
//   occurred earlier ending at some e <= L-2 (so at least one token follows it). The suffix
//   itself is not an occurrence.
// - Walk n's chain from the most recent occurrence, verifying each, examining at most
//   max_scan verified occurrences. Each gives a continuation h[e+1, min(e+1+k, L)) (1..k
//   tokens; shorter where the history ends). Candidates are distinct continuations:
//   kRecent: the first W = max_candidates distinct ones in recency order (the walk stops as
//     soon as W are found);
//   kFrequent: the W most frequent among all scanned occurrences (ties: more recent first).
// - The tree is TokenTree::from_candidates(h[L-1], candidates, max_nodes).
// - node_probs: for each draft node, the fraction of the scanned occurrences whose
//   continuation passes through it (starts with the node's root path); 1 for the root.
//   With kRecent that is only the occurrences seen before the walk stopped (W = 1 gives 1
//   along the whole chain), so kFrequent, which scans max_scan, estimates better.
// - No match, k == 0 or max_nodes == 0: the root alone.
//
// Rules
// - Histories hold tokens >= 0 (negative values are reserved for separators elsewhere) and
//   are never empty: add_request needs >= 1 token and truncate keeps >= 1 (the tree's root
//   is the last token).
// - Errors: unknown request -> kNotFound; duplicate add -> kAlreadyExists; bad argument
//   (negative token, empty prompt, new_len < 1, mismatched sizes, duplicate ids in a batch,
//   max_depth/max_nodes < 0) -> kInvalidArgument; truncate past the length -> kOutOfRange.
//   Every failed call changes nothing (propose_batch leaves `out` untouched).
// - Not thread-safe: one scheduler thread owns a proposer.
//
// Cost (R = n_max - n_min + 1)
// - append: O(R) expected per token (a hash, one table update, one prev entry per n); never
//   a scan of the history.
// - truncate(new_len): O(removed x R): removed positions are the newest of their chains, so
//   undoing them restores exactly the index a fresh build over the shorter history has.
// - propose: O(R + n + max_scan x (k + d)) per request for d distinct continuations seen
//   (d <= W for kRecent, <= max_scan for kFrequent), independent of the history length.
//   (A chain entry failing verification is a 64-bit hash collision: expected never.)
// - Memory: 12 + 4R bytes per token (token, prefix hash, prev entries) plus 17-34 bytes per
//   distinct n-gram in each of the R head tables: ~115 bytes per token for R = 4 on text
//   whose n-grams are mostly distinct (see memory_bytes()).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "specd/detail/request_table.h"
#include "specd/proposer.h"

namespace specd {

enum class NgramOrder {
  kRecent,    // most recent distinct continuations first
  kFrequent,  // most frequent distinct continuations first
};

struct NgramConfig {
  int32_t n_min = 1;           // shortest n-gram matched (>= 1)
  int32_t n_max = 4;           // longest n-gram matched (n_min <= n_max <= 64)
  int32_t max_candidates = 4;  // W: distinct continuations per proposal (>= 1)
  NgramOrder order = NgramOrder::kRecent;
  int32_t max_scan = 32;       // verified occurrences examined per proposal (>= W)
  // Bits of the n-gram hash kept (1..64). Only tests lower it, to force collisions.
  int32_t hash_bits = 64;
};

class NgramProposer final : public Proposer {
 public:
  static Status create(const NgramConfig& config, std::unique_ptr<NgramProposer>* out);
  ~NgramProposer() override;

  Status add_request(RequestId id, Span<const int32_t> prompt) override;
  Status append(RequestId id, Span<const int32_t> tokens) override;
  Status truncate(RequestId id, int64_t new_len) override;
  Status remove_request(RequestId id, RemoveReason reason) override;
  bool contains(RequestId id) const override;
  int64_t history_length(RequestId id) const override;

  // ids [n], max_depth [n], max_nodes [n]; out gets n trees in the order of ids.
  Status propose_batch(Span<const RequestId> ids, Span<const int32_t> max_depth,
                       Span<const int32_t> max_nodes, TokenTreeBatch* out) override;

  const NgramConfig& config() const { return config_; }
  int64_t num_requests() const { return requests_.size(); }
  // Approximate heap bytes of all request indexes.
  int64_t memory_bytes() const;

  static constexpr int32_t kMaxN = 64;
  static constexpr int64_t kMaxHistory = (int64_t{1} << 31) - 2;  // positions are int32

 private:
  class Index;  // per-request index (ngram_proposer.cc)
  struct Continuation {
    int32_t start;   // first token's position in the history
    int32_t length;  // 1..k tokens
    int32_t count;   // scanned occurrences with this continuation
    uint64_t hash;   // rolling hash of its tokens (a cheap inequality test)
  };

  explicit NgramProposer(const NgramConfig& config);
  // Fills scan_ (verified occurrence end positions) and conts_ (distinct continuations,
  // selected and ordered). Returns false when no n-gram matches.
  bool collect(const Index& ix, int32_t k);
  void add_continuation(const Index& ix, int32_t end, int32_t k);
  void select_frequent();
  void propose_one(const Index& ix, int32_t k, int32_t max_nodes, TokenTreeBatch* out);

  NgramConfig config_;
  detail::RequestTable<Index> requests_;  // initialized in the .cc, where Index is complete
  // Scratch of propose_batch, reused so that a step allocates little.
  std::vector<int32_t> scan_;
  std::vector<Continuation> conts_;
  std::vector<std::vector<int32_t>> candidates_;
  std::vector<int32_t> node_hits_;
  std::vector<float> probs_;
  std::vector<Index*> batch_;
};

}  // namespace specd
