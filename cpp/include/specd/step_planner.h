// StepPlanner: the continuous-batching scheduler's decisions for one engine step (DESIGN.md,
// "Where decisions live"): which requests run, with how many new tokens and draft nodes, and
// the KV slots they write, reserved in the shared BlockManager. A C++ server embedding specd
// makes exactly the decisions the Python engine makes (its Scheduler is a thin adapter).
//
// Model of a request
// - Its KV for model m covers tokens [0, computed_m) (model 0: target, 1: draft). Its last
//   token never has KV before a step: a step feeds tokens [computed_t, length - 1) (the
//   prefix, chunked by the token budget) and, once that prefix is complete, the root (the
//   last token) plus up to `nodes` draft nodes, verified in the same forward. So the first
//   verify of a request is fused with the end of its prefill.
// - `room`: tokens it may still emit (max_tokens and the context limit); k is capped at
//   room - 1 so that a step cannot emit past it.
//
// Rules of plan()
// - Running requests are planned oldest first, then waiting ones are admitted (oldest first)
//   while the batch has room (max_num_seqs, the token budget) and the pool can hold their
//   first chunk with a page of headroom per running request.
// - A request's item (budget b left, decision k capped to [0, min(k_max, room - 1)]):
//   - nodes = the proposal's node budget for depth k (model-free trees: model_free_tree_nodes
//     or k; draft trees: draft_tree_nodes or k * draft_tree_width; chains: k);
//   - prefix p = length - 1 - computed_t; if p + 1 + nodes <= b: the whole prefix, the root
//     and the nodes (`fits`); else if p > 0: a prefill chunk of min(p, b) tokens only; else
//     the root and a smaller proposal, nodes = b - 1, k = min(k, nodes);
//   - b <= 0: nothing this step.
// - Reservations: the target's new tokens; with the draft model (k > 0, decide), the draft's
//   catch-up [computed_d, length) plus the nodes it feeds past it ((k - 1) * width). If the
//   pool is out of pages, the newest running request is preempted (its KV freed, computed
//   reset to 0, back to the front of the queue) until the reservation fits; older requests
//   are never preempted for newer ones.
// - Copy-on-write page copies of all reservations are returned in order; perform them before
//   the step's forwards.
// - Prefix caching (when the BlockManager caches prefixes): the planner keeps a copy of each
//   request's tokens (sync's new_tokens). Each sync registers the running requests' full
//   committed blocks, target and draft; finish registers the last ones before freeing. On
//   admission a request (unless added with use_prefix_cache = false) first adopts the
//   longest cached prefix of its tokens for the target and the draft, whole blocks of at
//   most length - 1 tokens (the last token is always fed), then is planned from there; the
//   item reports the adopted tokens (cached_target, cached_draft), which become its computed
//   KV. If it is not admitted after all, the adopted pages go back to the cache.
// Requests are identified by RequestId; the caller owns their tokens and tells the planner
// their lengths (sync) before each plan, and commits KV through the BlockManager itself.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "specd/block_manager.h"
#include "specd/proposer.h"
#include "specd/span.h"
#include "specd/status.h"

namespace specd {

struct StepPlannerConfig {
  int32_t max_num_seqs = 32;
  int32_t max_num_batched_tokens = 1024;  // new tokens per step (prefill chunks + verified nodes)
  bool uses_draft_kv = false;             // a draft model runs (model 1 in the pool)
  int32_t k_max = 0;                      // the largest k of the speculation config
  int32_t model_free_tree_nodes = -1;     // node budget of an n-gram/suffix tree of depth k > 0 (-1: k)
  int32_t draft_tree_width = 1;           // > 1: the draft model grows trees of this width
  int32_t draft_tree_nodes = -1;          // node budget of a draft tree of depth k > 0 (-1: k * width)
};

enum class ProposalKind : int32_t { kNone = 0, kModelFree = 1, kDraftModel = 2 };

// What the caller tells the planner about a request before each plan().
struct SequenceState {
  RequestId id = 0;
  int64_t length = 0;           // tokens (prompt + emitted)
  int64_t computed_target = 0;  // committed target KV
  int64_t computed_draft = 0;   // committed draft KV
  int64_t room = 0;             // tokens it may still emit
  // Prefix caching only (else ignored): the request's tokens past its first
  // length - new_tokens.size(), all of them on the first sync, those since the previous sync
  // after that. Read during sync() only.
  Span<const int32_t> new_tokens;
};

// Prefix-cache figures of a planner: tokens asked for and found at admissions.
struct PrefixHitStats {
  int64_t admissions = 0;     // admissions that looked up the cache
  int64_t query_tokens = 0;   // their lengths, summed
  int64_t hit_tokens = 0;     // target tokens adopted from the cache
};

// The policy's decision for a request (requests without one: k = 0).
struct PlannedDecision {
  RequestId id = 0;
  int32_t k = 0;
  ProposalKind kind = ProposalKind::kNone;
};

struct WorkPlan {
  RequestId id = 0;
  int32_t num_prefix = 0;   // prefix tokens prefilled this step
  bool decide = false;      // the prefix is complete: root + nodes verified this step
  int32_t k = 0;            // draft depth (0: plain decoding)
  int32_t nodes = 0;        // draft nodes reserved
  bool fits = false;        // planned as decided (not shrunk to the budget)
  std::vector<int64_t> target_slots;  // [num_prefix + (1 + nodes if decide)]
  int64_t cached_target = 0;          // admitted this step: target KV adopted from the prefix cache
  int64_t cached_draft = 0;           // admitted this step: draft KV adopted from the prefix cache
  int32_t draft_catch_up = 0;         // draft model: tokens [computed_d, length) it processes first
  std::vector<int64_t> draft_slots;   // [draft_catch_up + (k - 1) * width] when the draft runs
  int32_t num_tokens() const { return num_prefix + (decide ? 1 + nodes : 0); }
};

struct StepPlan {
  std::vector<WorkPlan> items;       // running requests first, then admitted ones
  std::vector<PageCopy> copies;      // copy-on-write copies, in order
  std::vector<RequestId> preempted;  // moved back to the queue (KV freed, computed 0)
  std::vector<RequestId> admitted;   // moved from the queue to the running batch
};

class StepPlanner {
 public:
  // `blocks` must outlive the planner. Invalid configs make every call fail with the reason.
  StepPlanner(BlockManager* blocks, StepPlannerConfig config);

  // A new request joins the back of the queue. Its id must be new. use_prefix_cache = false:
  // it never adopts cached KV (e.g. it needs the prefill's logits of every prompt token).
  Status add(RequestId id, bool use_prefix_cache = true);
  // A finished or aborted request leaves the planner; its KV is freed. With prefix caching,
  // `new_tokens` are its tokens since the last sync (its last full blocks get registered).
  Status finish(RequestId id, Span<const int32_t> new_tokens = {});
  // Lengths and committed KV of the requests before plan() (unknown ids are an error).
  Status sync(Span<const SequenceState> states);

  // The running requests and the waiting ones this step may admit, in planning order: the
  // requests the policy decides for.
  std::vector<RequestId> candidates() const;
  // The KV a waiting request would adopt from the prefix cache if admitted now (admit()'s
  // match, target and draft tokens; 0 for a running request, without prefix caching or for a
  // request added with use_prefix_cache = false). The policy is told a waiting request's
  // work net of it (a prompt mostly cached costs little to admit). Unknown ids: an error.
  Status cached_prefix(RequestId id, int64_t* target, int64_t* draft) const;
  // What a candidate brings to the step, as the policy is told it (ControllerRequest's
  // base_tokens and draft_catch_up): its length less its committed target / draft KV, where
  // a waiting request's committed KV is taken as at least what it would adopt from the prefix
  // cache (cached_prefix). From the last sync. Unknown ids: an error.
  Status candidate_work(RequestId id, int64_t* base_tokens, int64_t* draft_catch_up) const;
  Status plan(Span<const PlannedDecision> decisions, StepPlan* out);

  const std::vector<RequestId>& running() const { return running_; }
  const std::deque<RequestId>& waiting() const { return waiting_; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const PrefixHitStats& prefix_hit_stats() const { return hit_stats_; }
  // Draft KV slots past the catch-up of a depth-k draft proposal (rules above).
  int64_t draft_fed(int32_t k) const;

 private:
  struct Sequence {
    SequenceState state;  // (new_tokens not kept)
    bool in_blocks = false;
    bool use_prefix_cache = true;
    std::vector<int32_t> tokens;  // prefix caching only
  };
  Status validate() const;
  int32_t nodes_for(int32_t k, ProposalKind kind) const;
  bool plan_item(const Sequence& s, int32_t budget, const PlannedDecision* d, WorkPlan* item) const;
  // true: reserved; false: out of pages (nothing reserved). Other errors propagate.
  Status reserve(Sequence& s, WorkPlan* item, ProposalKind kind, StepPlan* out, bool* ok);
  Status reserve_or_preempt(Sequence& s, WorkPlan* item, ProposalKind kind, StepPlan* out, bool* ok);
  bool caching() const { return blocks_->prefix_caching(); }
  Status take_tokens(Sequence& s, Span<const int32_t> new_tokens, int64_t length);
  Status cache_blocks(const Sequence& s);
  // Plans and admits the front waiting request (adopting its cached prefix first).
  Status admit(Sequence& s, int32_t budget, const PlannedDecision* d, WorkPlan* item, StepPlan* out, bool* ok);
  Status forget_blocks(Sequence& s);  // undoes admit()'s add_sequence and prefix match
  Status preempt(RequestId id, StepPlan* out);

  BlockManager* blocks_;
  StepPlannerConfig config_;
  std::unordered_map<RequestId, Sequence> seqs_;
  std::vector<RequestId> running_;
  std::deque<RequestId> waiting_;
  Reservation scratch_;
  PrefixHitStats hit_stats_;
};

}  // namespace specd
