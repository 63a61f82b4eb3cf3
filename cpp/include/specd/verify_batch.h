// Batched verification: the token trees of many requests, flattened (CSR), verified in one
// call. This is the interface of the CUDA verification kernels
// (cuda/include/specd/cuda/verify.h); the *_batch_cpu functions run the kernels' per-request
// algorithm (detail/verify_walk.h) on one CPU thread.
//
// Rules
// - Request r owns nodes [node_offsets[r], node_offsets[r+1]) of the flattened arrays (at
//   least its root); its local node v is global node node_offsets[r] + v, which is also v's
//   row in every node-indexed input (target rows, draft rows, target tokens). parents are
//   local indices (TokenTree::from_parents rules: -1 for the root, 0 <= parent(v) < v).
// - node_offsets must be non-decreasing. Request r's offsets are invalid (kBadTree) when its
//   range is empty or outside [0, num_nodes], or node_offsets[r] is below an earlier offset;
//   so the ranges of valid requests never overlap, and their outputs cannot collide.
// - Each request's result equals verify_greedy / verify_greedy_tokens / verify_stochastic
//   (verify.h) on TokenTree::from_parents of its nodes, with the same rows and rng[r]; the
//   random draws are keyed by rng[r] exactly as there.
// - Outputs: request r's num_accepted[r] + 1 emitted tokens (accepted drafts, then the bonus
//   or recovered token) are tokens[base_r + k], and its accepted path (local nodes, root
//   first) is path[base_r + k], for k in [0, num_accepted[r] + 1); the rest of the request's
//   output range is -1. Node layout (stride 0): base_r = node_offsets[r], range = the
//   request's nodes (a request never emits more tokens than it has nodes). Padded layout
//   (stride > 0, e.g. the [batch, path_stride] paths kv_compact.h takes): base_r = r *
//   stride, range = the row; a request with more than `stride` nodes gets kOutputTooSmall.
// - Per-request input errors do not fail the call: status[r] (VerifyStatus) is non-zero,
//   num_accepted[r] is 0 and the request's tokens/path range is all -1 (in the node layout,
//   left untouched when the offsets themselves are invalid). The verify.h function on that
//   request returns the error with a message, if one is wanted.
// - A call that does not fail writes status[r] and num_accepted[r] of every request and, in the
//   padded layout, every entry of every row of tokens and path; in the node layout, every
//   node in a valid request's range (callers fill the rest, if they read it).
// - The call fails (Status / cudaErrorInvalidValue) only for bad sizes or pointers (the
//   validate_verify_* functions): negative sizes, null arrays, fewer rows than num_nodes,
//   draft vocab != target vocab, an unknown DraftSampling.
// - Stochastic verification's options (StochasticRowOptions; all null by default):
//   - draft_index ([num_nodes], int32): node n's draft row is row draft_index[n] of `draft`
//     instead of row n, so the draft's distributions can stay where the draft wrote them
//     (the draft loop's [steps, batch, vocab] buffers) with no gather into node order;
//     `draft.rows` may then be fewer than the nodes. The walk reads the draft row of a node
//     only when it verifies that node's children: an index of -1 (or any value outside
//     [0, draft.rows)) is fine for a leaf and gives kBadDraftRow at a node with children.
//   - target_totals ([target.rows]) / draft_totals ([draft.rows]), double: each row's total,
//     the sum of its floats as doubles, as sampling_probs_batch / sample_tokens_and_probs
//     write them (sampling_batch.h). Without them the walk reads a visited row whole to
//     validate and sum it; with them a node whose first child is accepted costs two reads
//     (the drafted token's p and q), and a row is read whole only where a rejection's
//     residual or the final draw needs it. The walk then validates what it reads: a total
//     that is not finite and > 0, or an entry read that is not finite and >= 0, gives
//     kBadTargetRow / kBadDraftRow. A total must be its row's sum: with a wrong one the
//     result is wrong. With the producers' totals on the CPU the results are the same bits
//     as without (the same sums); on the GPU a total may differ from the walk's own sum in
//     the order of its additions (docs/cuda.md's exactness note).
// - Stochastic verification from the target's logits (verify_stochastic_logits_batch): the
//   target distribution of node n of request r is sampling_probs(logits row n, params[r])
//   (sampling.h rules), computed where the walk needs it instead of given as a probability row:
//   at each node it visits, the walk plans that row (the sampling kernels' row plan,
//   detail/sample_row.h: the softmax normalizer and any top-k / top-p / min-p cut) and sums its
//   float probabilities; an entry is then the float sampling_probs_batch would write, recomputed
//   from its logit where a test, a residual or the draw reads it. The results equal
//   verify_stochastic_batch's on sampling_probs_batch's rows and totals (the same bits on the
//   CPU; on the GPU where the sums are folded alike, as for the totals above), while only the
//   rows of visited nodes are read, and no [num_nodes, vocab] float32 rows are written. A
//   visited row with a NaN or +inf logit, or no finite one, gives kBadTargetRow, bad
//   params[r] kBadSamplingParams; rows of nodes the walk does not visit are not read (as
//   greedy verification). options.target_totals must be null (the walk sums the rows it
//   plans); draft_index and draft_totals apply as above.
// - Stochastic verification handles at most kMaxVerifyChildren children per visited node
//   (the residual distributions are recomputed from the per-sibling totals, which a block
//   keeps in shared memory): a request over the limit gets kTooManyChildren, on the CPU too.
#pragma once

#include <cstdint>

#include "specd/sampling_batch.h"
#include "specd/status.h"
#include "specd/verify.h"

namespace specd {

// The token trees of a batch of requests (device or host memory, per the function).
struct TreeBatchView {
  const int32_t* node_offsets = nullptr;  // [batch + 1]
  const int32_t* parents = nullptr;       // [num_nodes] local parent; -1 for each root
  const int32_t* tokens = nullptr;        // [num_nodes] root: the request's last token
  int32_t batch = 0;
  int32_t num_nodes = 0;                  // length of the node-indexed arrays
};

struct VerifyOutputs {
  int32_t* tokens = nullptr;        // [num_nodes] (node layout) or [batch, stride] (padded)
  int32_t* path = nullptr;          // same layout as tokens; may be null
  int32_t* num_accepted = nullptr;  // [batch]
  int32_t* status = nullptr;        // [batch] VerifyStatus
  int32_t stride = 0;               // 0: node layout; > 0: padded rows of `stride` elements
};

enum class VerifyStatus : int32_t {
  kOk = 0,
  kBadTree = 1,               // offsets out of [0, num_nodes] or empty; parents break the rules
  kBadToken = 2,              // a draft token outside [0, vocab); greedy tokens: negative target token
  kBadTargetRow = 3,          // a visited target row: NaN (greedy); non-finite, negative or zero sum; from logits: NaN / +inf or no finite logit
  kBadDraftRow = 4,           // a visited draft row: non-finite, negative or zero sum, or no row (draft_index)
  kZeroDraftProbability = 5,  // a drafted token has draft probability 0
  kRepeatedSibling = 6,       // kWithoutReplacement siblings with the same token
  kTooManyChildren = 7,       // a visited node has more than kMaxVerifyChildren children
  kOutputTooSmall = 8,        // padded outputs: the request has more nodes than `stride`
  kBadSamplingParams = 9,     // verification from logits: the request's SamplingParams are invalid
};

inline constexpr int32_t kMaxVerifyChildren = 64;

// Stochastic verification's optional inputs (the rules above; device memory for the kernels).
struct StochasticRowOptions {
  const int32_t* draft_index = nullptr;   // [num_nodes] node n's draft row; null: row n
  const double* target_totals = nullptr;  // [target.rows] each target row's total; null: summed by the walk
  const double* draft_totals = nullptr;   // [draft.rows] each draft row's total; null: summed by the walk
};

// The target of stochastic verification from logits (the rules above; device memory for the
// kernels).
struct TargetLogits {
  LogitRows logits;                       // [rows, stride] the target's logits: node n's row is row n
  const SamplingParams* params = nullptr;  // [batch] each request's sampling parameters
  // [num_nodes] node n's row of `logits` instead of row n (e.g. a step's logits where the
  // group's requests are not next to one another), so that nothing is gathered; then any
  // number of rows will do, and a visited node whose index is outside [0, logits.rows) gives
  // kBadTargetRow (an unvisited node's index is not read). null: row n (logits.rows >= num_nodes).
  const int32_t* row_index = nullptr;
};

// The checks of each call (sizes and pointers, not contents), shared by the CPU functions and
// the CUDA launchers.
Status validate_verify_greedy(const TreeBatchView& trees, const LogitRows& target, const VerifyOutputs& out);
Status validate_verify_greedy_tokens(const TreeBatchView& trees, const int32_t* target_tokens,
                                     const VerifyOutputs& out);
Status validate_verify_stochastic(const TreeBatchView& trees, const ProbRows& target, const ProbRows* draft,
                                  DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                  const StochasticRowOptions& options = {});
Status validate_verify_stochastic_logits(const TreeBatchView& trees, const TargetLogits& target,
                                         const ProbRows* draft, DraftSampling sampling, const RngKey* rng,
                                         const VerifyOutputs& out, const StochasticRowOptions& options = {});

// Greedy from the target's logits/scores: target.rows >= num_nodes.
Status verify_greedy_batch_cpu(const TreeBatchView& trees, const LogitRows& target, const VerifyOutputs& out);
// Greedy from the target's argmax per node: target_tokens [num_nodes].
Status verify_greedy_tokens_batch_cpu(const TreeBatchView& trees, const int32_t* target_tokens,
                                      const VerifyOutputs& out);
// Stochastic from probability rows (float32, [rows >= num_nodes, vocab]); draft may be null
// (deterministic proposals; `sampling` is ignored then); rng [batch]; options: the rules above.
Status verify_stochastic_batch_cpu(const TreeBatchView& trees, const ProbRows& target, const ProbRows* draft,
                                   DraftSampling sampling, const RngKey* rng, const VerifyOutputs& out,
                                   const StochasticRowOptions& options = {});

// Stochastic from the target's logits and each request's SamplingParams (the rules above);
// draft, sampling, rng, options as verify_stochastic_batch_cpu's (options.target_totals null).
Status verify_stochastic_logits_batch_cpu(const TreeBatchView& trees, const TargetLogits& target,
                                          const ProbRows* draft, DraftSampling sampling, const RngKey* rng,
                                          const VerifyOutputs& out, const StochasticRowOptions& options = {});

}  // namespace specd
