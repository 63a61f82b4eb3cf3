// One request of batched verification (verify_batch.h), written against the Block concept
// (detail/serial_block.h): the CUDA kernels run it with a thread block per request (one
// thread per request for greedy tokens), the *_batch_cpu functions with SerialBlock. The
// walks follow verify.cc step by step; what verify.cc keeps in vectors (the residual
// distributions after rejected siblings) is recomputed element by element from the node's
// rows and the per-rejection totals (residual_probs), so no [vocab] workspace is needed.
//
// Every decision (the walk, the accept tests, the draws) is computed by every thread from
// collective results and global reads, so control flow stays uniform; only rank 0 writes
// outputs and the shared rejection list.
#pragma once

#include <cstdint>

#include "specd/detail/block_algorithms.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/sampling_rules.h"
#include "specd/detail/verify_target.h"
#include "specd/host_device.h"
#include "specd/philox.h"
#include "specd/verify.h"
#include "specd/verify_batch.h"

namespace specd::detail {

// A rejected sibling at the current node: its token and the totals that normalized the
// residual target (p_total) and, without replacement, the reduced draft (q_total), with their
// inverses (normalizing is a product, verify.h; 0 where the total is 0).
struct Rejection {
  int32_t token;
  double p_total;
  double q_total;
  double p_inv;
  double q_inv;
};
SPECD_HOST_DEVICE inline Rejection make_rejection(int32_t token, double p_total, double q_total) {
  return Rejection{token, p_total, q_total, p_total > 0 ? 1.0 / p_total : 0.0, q_total > 0 ? 1.0 / q_total : 0.0};
}

// The target (p) and draft (q) probabilities of token i after the first j siblings were
// rejected, from p0 = row_p[i] * (1 / sum(row_p)) and q0 likewise (verify.cc's updates, in
// order):
// - with draft rows: p <- max(0, p - q) * (1 / p_total) (unchanged when p_total == 0);
//   without replacement also q <- (i == token ? 0 : q) * (1 / q_total) (not scaled when
//   q_total == 0);
// - without draft rows: p <- (i == token ? 0 : p) * (1 / p_total) (not scaled when 0).
SPECD_HOST_DEVICE inline void residual_probs(double p0, double q0, int32_t i, const Rejection* rejected, int32_t j,
                                             bool has_draft, bool without_replacement, double* p, double* q) {
  double pv = p0, qv = q0;
  for (int32_t k = 0; k < j; ++k) {
    const Rejection& r = rejected[k];
    if (has_draft) {
      const double residual = pv - qv > 0 ? exact_sub(pv, qv) : 0.0;
      if (r.p_total > 0) pv = exact_mul(residual, r.p_inv);
      if (without_replacement) {
        const double zeroed = i == r.token ? 0.0 : qv;
        qv = r.q_total > 0 ? exact_mul(zeroed, r.q_inv) : zeroed;
      }
    } else {
      const double zeroed = i == r.token ? 0.0 : pv;
      pv = r.p_total > 0 ? exact_mul(zeroed, r.p_inv) : zeroed;
    }
  }
  *p = pv;
  *q = qv;
}

// The accept test of a drafted token x: u * q(x) < p(x).
SPECD_HOST_DEVICE inline bool accepts(double u, double qx, double px) { return u * qx < px; }

// A request's nodes: global [begin, begin + count).
struct RequestNodes {
  int32_t begin;
  int32_t count;
  const int32_t* parents;  // parents + begin
  const int32_t* tokens;   // tokens + begin
};

// The first child of `node` after sibling index `after` (children are in index order).
SPECD_HOST_DEVICE inline int32_t next_child(const RequestNodes& n, int32_t node, int32_t after) {
  for (int32_t c = (after > node ? after : node) + 1; c < n.count; ++c)
    if (n.parents[c] == node) return c;
  return -1;
}
SPECD_HOST_DEVICE inline int32_t find_child(const RequestNodes& n, int32_t node, int32_t token) {
  for (int32_t c = next_child(n, node, node); c >= 0; c = next_child(n, node, c))
    if (n.tokens[c] == token) return c;
  return -1;
}

// Writes the request's results as it walks (rank 0 only), from out position `base`.
struct Emitter {
  const VerifyOutputs* out;
  int64_t base;
  int32_t accepted;

  template <class Block>
  SPECD_HOST_DEVICE void accept(Block& b, int32_t node, int32_t token) {
    if (b.rank() == 0) {
      out->tokens[base + accepted] = token;
      if (out->path != nullptr) out->path[base + accepted + 1] = node;
    }
    ++accepted;
  }
  template <class Block>
  SPECD_HOST_DEVICE void finish(Block& b, int32_t token) {
    if (b.rank() == 0) out->tokens[base + accepted] = token;
  }
};

// Sets the request's output range [base, base + size) to -1.
template <class Block>
SPECD_HOST_DEVICE void fill_outputs(Block& b, const VerifyOutputs& out, int64_t base, int32_t size) {
  b.sync();  // after any earlier write by rank 0
  for (int32_t v = b.rank(); v < size; v += b.size()) {
    out.tokens[base + v] = -1;
    if (out.path != nullptr) out.path[base + v] = -1;
  }
  b.sync();
}

// Runs walk(nodes, emitter) -> VerifyStatus for request r after the checks every variant
// shares, and writes status / num_accepted. `vocab` > 0 also checks draft tokens against it.
template <class Block, class Walk>
SPECD_HOST_DEVICE void verify_request(Block& b, const TreeBatchView& trees, int32_t r, int32_t vocab,
                                      const VerifyOutputs& out, const Walk& walk) {
  const int32_t begin = trees.node_offsets[r], end = trees.node_offsets[r + 1];
  // Offsets must not decrease up to r (verify_batch.h): every thread reads them all, so all
  // agree; then no valid request's range overlaps another's.
  bool monotonic = true;
  for (int32_t q = 0; q < r; ++q) monotonic = monotonic && trees.node_offsets[q] <= begin;
  const bool range_ok = monotonic && begin >= 0 && begin < end && end <= trees.num_nodes;
  const bool padded = out.stride > 0;
  // Output range: row r of the padded layout, or the request's nodes.
  Emitter emit{&out, padded ? int64_t{r} * out.stride : int64_t{begin}, 0};
  const int32_t out_size = padded ? out.stride : (range_ok ? end - begin : 0);
  if (out_size > 0) fill_outputs(b, out, emit.base, out_size);
  VerifyStatus status = VerifyStatus::kOk;
  if (!range_ok) {
    status = VerifyStatus::kBadTree;
  } else if (end - begin > out_size) {
    status = VerifyStatus::kOutputTooSmall;
  } else {
    const RequestNodes nodes{begin, end - begin, trees.parents + begin, trees.tokens + begin};
    bool bad_tree = false, bad_token = false;
    for (int32_t v = b.rank(); v < nodes.count; v += b.size()) {
      const int32_t p = nodes.parents[v];
      bad_tree = bad_tree || (v == 0 ? p != -1 : (p < 0 || p >= v));
      bad_token = bad_token || (v > 0 && vocab > 0 && (nodes.tokens[v] < 0 || nodes.tokens[v] >= vocab));
    }
    if (b.any(bad_tree)) {
      status = VerifyStatus::kBadTree;
    } else if (b.any(bad_token)) {
      status = VerifyStatus::kBadToken;
    } else {
      if (b.rank() == 0 && out.path != nullptr) out.path[emit.base] = 0;
      status = walk(nodes, emit);
      if (status != VerifyStatus::kOk) fill_outputs(b, out, emit.base, out_size);
    }
  }
  if (b.rank() == 0) {
    out.status[r] = static_cast<int32_t>(status);
    out.num_accepted[r] = status == VerifyStatus::kOk ? emit.accepted : 0;
  }
}

// Greedy walk; best(node, &token) gives the target's choice after a local node (or an error).
template <class Block, class BestFn>
SPECD_HOST_DEVICE VerifyStatus greedy_walk(Block& b, const RequestNodes& nodes, Emitter& emit, const BestFn& best) {
  int32_t node = 0;
  while (true) {
    int32_t token = -1;
    const VerifyStatus s = best(node, &token);
    if (s != VerifyStatus::kOk) return s;
    const int32_t child = find_child(nodes, node, token);
    if (child < 0) {
      emit.finish(b, token);
      return VerifyStatus::kOk;
    }
    emit.accept(b, child, token);
    node = child;
  }
}

// verify_greedy's argmax of one row (lowest id among ties); NaN anywhere is an error.
template <class Block, class Row>
SPECD_HOST_DEVICE VerifyStatus row_argmax(Block& b, const Row& row, int32_t vocab, int32_t* token) {
  ArgMax best = empty_argmax();
  for_each_group(b, vocab, row, [&](int32_t i, float v) {  // order-independent: grouped loads
    best = v != v ? bad_argmax() : better(best, ArgMax{v, i});  // a NaN: index -1 wins
  });
  best = b.argmax(best);
  if (best.index < 0) return VerifyStatus::kBadTargetRow;
  *token = best.index;
  return VerifyStatus::kOk;
}

// Entry i of a node's target (p) and draft (q, 0 without a draft row) rows.
struct ProbPair {
  float p;
  float q;
};

// Whether two children of `node` hold the same token.
template <class Block>
SPECD_HOST_DEVICE bool repeated_sibling(Block& b, const RequestNodes& n, int32_t node) {
  bool repeated = false;
  for (int32_t c = node + 1 + b.rank(); c < n.count; c += b.size()) {
    if (n.parents[c] != node) continue;
    for (int32_t d = c + 1; d < n.count && !repeated; ++d)
      repeated = n.parents[d] == node && n.tokens[d] == n.tokens[c];
  }
  return b.any(repeated);
}

// The draft row of global node `node` (verify_batch.h, draft_index): draft_index[node], or
// row `node` without an index; -1 when that is not a row of `draft`.
SPECD_HOST_DEVICE inline int64_t draft_row_of(const ProbRows& draft, const int32_t* draft_index, int32_t node) {
  const int64_t row = draft_index != nullptr ? draft_index[node] : node;
  return row >= 0 && row < draft.rows ? row : -1;
}

// With the rows' totals given, a node whose draft is accepted costs a few reads that depend on
// one another (the draft row's index, then the totals, p(x) and q(x); the walk's next node
// only after that) and no pass over a row. Before the walk, the threads prefetch those of
// every drafted node (one node per thread), so that the walk's reads find them in L2.
// Parents and tokens are valid here (verify_request checked them).
template <class Block, class Target>
SPECD_HOST_DEVICE void prefetch_accept_inputs(Block& b, const RequestNodes& nodes, const Target& target,
                                              const ProbRows& draft, const StochasticRowOptions& options) {
  for (int32_t v = 1 + b.rank(); v < nodes.count; v += b.size()) {
    const int32_t parent = nodes.begin + nodes.parents[v];
    const int32_t x = nodes.tokens[v];
    target.prefetch(parent, x);
    if (draft.data == nullptr) continue;
    const int64_t row = draft_row_of(draft, options.draft_index, parent);
    if (row < 0) continue;
    prefetch_l2(draft.data + row * draft.stride + x);
    if (options.draft_totals != nullptr) prefetch_l2(options.draft_totals + row);
  }
}

// verify_stochastic's walk. `target`: where p comes from (verify_target.h: ProbTarget,
// LogitTarget). `rejected` holds kMaxVerifyChildren entries (shared memory on the device).
// draft.data == nullptr: no draft rows. options: verify_batch.h's StochasticRowOptions (its
// target_totals are the ProbTarget's). Entries are validated where they are read (with given
// totals a row is not read whole first): an invalid one makes a row pass's sum NaN (target) or
// the draft's sum NaN / the final sum -inf (draft), which the walk reports.
template <class Block, class Target>
SPECD_HOST_DEVICE VerifyStatus stochastic_walk(Block& b, const RequestNodes& nodes, Emitter& emit, Target& target,
                                               const ProbRows& draft, const StochasticRowOptions& options,
                                               DraftSampling sampling, const RngKey& rng, Rejection* rejected) {
  const bool has_draft = draft.data != nullptr;
  const bool without_replacement = sampling == DraftSampling::kWithoutReplacement;
  const int32_t vocab = target.vocab();
  if (options.target_totals != nullptr) prefetch_accept_inputs(b, nodes, target, draft, options);
  int32_t node = 0;
  uint32_t depth = 0;
  while (true) {
    const uint32_t position = rng.position + depth;
    const VerifyStatus visited = target.visit(b, nodes.begin + node);
    if (visited != VerifyStatus::kOk) return visited;
    // The row's total, where needed (verify_target.h: a target whose totals are within
    // kTotalSlack of 1 gets it only when a test needs it exactly, or a pass normalizes by it).
    double p_total = 0, p_inv = 0;
    bool have_total = false;
    const auto need_total = [&]() {
      if (have_total) return VerifyStatus::kOk;
      const VerifyStatus s = target.total(b, nodes.begin + node, &p_total);
      p_inv = 1.0 / p_total;
      have_total = s == VerifyStatus::kOk;
      return s;
    };
    if constexpr (!Target::kTotalNearOne) {
      const VerifyStatus s = need_total();
      if (s != VerifyStatus::kOk) return s;
    }
    const int32_t first = next_child(nodes, node, node);
    const float* q_row = nullptr;
    double q_total = 1.0;
    if (first >= 0) {
      int32_t children = 0;
      for (int32_t c = first; c >= 0; c = next_child(nodes, node, c)) ++children;
      if (children > kMaxVerifyChildren) return VerifyStatus::kTooManyChildren;
      if (has_draft) {
        const int64_t row = draft_row_of(draft, options.draft_index, nodes.begin + node);
        if (row < 0) return VerifyStatus::kBadDraftRow;
        q_row = draft.data + row * draft.stride;
        if (!visited_row_total(b, q_row, vocab, options.draft_totals, row, &q_total)) return VerifyStatus::kBadDraftRow;
        // (one child, a chain's node, cannot repeat a sibling: no collective)
        if (without_replacement && children > 1 && repeated_sibling(b, nodes, node))
          return VerifyStatus::kRepeatedSibling;
      }
    }
    // p and q of token i after j rejections at this node, from its row entries.
    const double q_inv = 1.0 / q_total;
    // `v`: the entries of token i (entries() of load(i): load gives target.raw(i), the entry or
    // the logit, so that the passes batch pure reads; entries() then makes p's entry of it).
    const auto probs_of = [&](int32_t i, const ProbPair& v, int32_t j, double* p, double* q) {
      const double p0 = exact_mul(static_cast<double>(v.p), p_inv);
      const double q0 = has_draft && q_row != nullptr ? exact_mul(static_cast<double>(v.q), q_inv) : 0.0;
      residual_probs(p0, q0, i, rejected, j, has_draft, without_replacement, p, q);
    };
    const auto load = [&](int32_t i) { return ProbPair{target.raw(i), q_row != nullptr ? q_row[i] : 0.0f}; };
    const auto entries = [&](int32_t i, const ProbPair& raw) { return ProbPair{target.entry(i, raw.p), raw.q}; };
    const auto probs_at = [&](int32_t i, int32_t j, double* p, double* q) {
      probs_of(i, entries(i, load(i)), j, p, q);
    };
    int32_t j = 0, accepted = -1;
    for (int32_t c = first; c >= 0; c = next_child(nodes, node, c), ++j) {
      const int32_t x = nodes.tokens[c];
      const ProbPair vx = entries(x, load(x));
      if (!valid_prob(vx.p)) return VerifyStatus::kBadTargetRow;
      if (!valid_prob(vx.q)) return VerifyStatus::kBadDraftRow;
      if constexpr (Target::kTotalNearOne) {
        if (!have_total) {  // the first child (j == 0): the total not summed yet
          // p(x) lies within kTotalSlack of its entry: a test that accepts for every total in
          // that range accepts (the same u, the same q(x) as the exact test below).
          const double q0 = has_draft ? exact_mul(static_cast<double>(vx.q), q_inv) : 1.0;
          if (!(q0 > 0)) return VerifyStatus::kZeroDraftProbability;
          const double u0 = philox_uniform(rng.seed, rng.request, rng.step, position, 0u);
          if (u0 * q0 < static_cast<double>(vx.p) * (1.0 - kTotalSlack)) {
            accepted = c;
            break;
          }
          const VerifyStatus s = need_total();
          if (s != VerifyStatus::kOk) return s;
        }
      }
      double px = 0, qx = 0;
      probs_of(x, vx, j, &px, &qx);
      if (!has_draft) qx = 1.0;
      if (!(qx > 0)) return VerifyStatus::kZeroDraftProbability;
      const double u = philox_uniform(rng.seed, rng.request, rng.step, position, static_cast<uint32_t>(j));
      if (accepts(u, qx, px)) {
        accepted = c;
        break;
      }
      // Rejected: the totals that normalize the residuals of sibling j + 1.
      double p_sum = 0, q_sum = 0;
      for_each_strided<kProbLoadBatch>(b, vocab, load, [&](int32_t i, const ProbPair& raw) {
        const ProbPair v = entries(i, raw);
        double p = 0, q = 0;
        probs_of(i, v, j, &p, &q);
        if (has_draft) {
          p_sum += p - q > 0 ? p - q : 0.0;
          if (without_replacement) q_sum += i == x ? 0.0 : q;
        } else {
          p_sum += i == x ? 0.0 : p;
        }
        if (!valid_prob(v.p)) p_sum = NAN;
        if (!valid_prob(v.q)) q_sum = NAN;
      });
      p_sum = b.sum(p_sum);
      q_sum = b.sum(q_sum);
      if (is_nan(p_sum)) return VerifyStatus::kBadTargetRow;
      if (is_nan(q_sum)) return VerifyStatus::kBadDraftRow;
      if (b.leader()) rejected[j] = make_rejection(x, p_sum, q_sum);  // each block's own scratch
      b.sync();  // rejected[j] visible to all before sibling j + 1
    }
    if (accepted >= 0) {
      emit.accept(b, accepted, nodes.tokens[accepted]);
      node = accepted;
      ++depth;
      continue;
    }
    // Bonus (leaf) or recovered (all children rejected) token: draw from p after j rejections.
    if constexpr (Target::kTotalNearOne) {
      const VerifyStatus s = need_total();
      if (s != VerifyStatus::kOk) return s;
    }
    const auto weight = [&](int32_t i) {
      double p = 0, q = 0;
      probs_at(i, j, &p, &q);
      return p;
    };
    double local = 0;
    for_each_strided<kProbLoadBatch>(b, vocab, load, [&](int32_t i, const ProbPair& raw) {
      const ProbPair v = entries(i, raw);
      double p = 0, q = 0;
      probs_of(i, v, j, &p, &q);
      local += p;
      if (!valid_prob(v.q)) local -= INFINITY;
      if (!valid_prob(v.p)) local = NAN;
    });
    const double total = b.sum(local);
    if (is_nan(total)) return VerifyStatus::kBadTargetRow;
    if (total == -INFINITY) return VerifyStatus::kBadDraftRow;
    const double u = philox_uniform(rng.seed, rng.request, rng.step, position, kFinalDraw);
    emit.finish(b, draw_inverse_cdf<kTileRun>(b, vocab, weight, u * total));  // kDrawRun's note
    return VerifyStatus::kOk;
  }
}

}  // namespace specd::detail
