// Where stochastic_walk (verify_walk.h) reads a visited node's target distribution p, written
// against the Block concept (detail/serial_block.h):
//
//   ProbTarget        float32 probability rows (ProbRows): an entry is read as it is; the row's
//                     total is StochasticRowOptions::target_totals[node] when given, else the
//                     row is read whole, validated and summed (load_prob_row).
//   LogitTarget<Row>  the target's logits and the request's SamplingParams (TargetLogits,
//                     verify_batch.h): visit() plans the row as the sampling kernels do
//                     (plan_row, sample_row.h), total() sums its float probabilities in
//                     for_each_strided's order (probs_row's total: the same ids per thread in
//                     the same order); an entry is float(row_prob(plan, i, logit i)), the float
//                     sampling_probs writes, recomputed from its logit where it is read.
//
// Both offer: vocab(); visit(b, node) -> VerifyStatus (the node's row becomes the current
// one); total(b, node, &total) -> VerifyStatus (the current row's total, > 0 when kOk); raw(i)
// (a pure read for for_each_strided's batches: the entry or the logit) and entry(i, raw) (the
// float probability); prefetch(node, x) (the accept test's reads into L2, before the walk);
// kTotalNearOne: whether every total of a row that visit() accepted lies within kTotalSlack
// of 1.
//
// Why LogitTarget's totals are near 1: the row's entries are f_i = float(d_i), d_i its
// probabilities in double, renormalized after each cut by the inverse of that stage's double
// sum, so sum(d_i) = 1 within vocab * 2^-52 (< 4e-10 for 2^30 tokens); rounding to float
// moves each by at most 2^-24 of itself (subnormals by 2^-150 each), and the double sum of the
// floats adds vocab * 2^-53 at most: the total is 1 within 6e-8 + 1e-9. So the walk's accept
// test u * q(x) < f_x / total holds for every such total when u * q(x) < f_x * (1 - 1e-6),
// and a node whose first child passes that needs no pass over its row for the total: an
// accepted node costs the plan's passes only (kTotalSlack below).
//
// LogitTarget keeps its plan where the caller says (`plan`: shared memory in the kernels, a
// local on the CPU): every thread writes the same values between the same collectives
// (sample_row.h's rule), and visit() first syncs the block so that no thread still reads the
// previous node's plan.
#pragma once

#include <cfloat>
#include <cstdint>

#include "specd/detail/block_algorithms.h"
#include "specd/detail/sample_row.h"
#include "specd/detail/sampling_rules.h"
#include "specd/host_device.h"
#include "specd/verify.h"
#include "specd/verify_batch.h"

namespace specd::detail {

// How far from 1 the totals of a kTotalNearOne target may lie (the bound above is 6.1e-8).
inline constexpr double kTotalSlack = 1e-6;

// Float32 probability rows are read with this many loads in flight per thread (256 threads
// per request on the GPU; row_argmax: 2 * kLoadBatch with 1024 threads).
inline constexpr int32_t kProbLoadBatch = 16;

// Whether a probability entry is valid: finite and >= 0.
SPECD_HOST_DEVICE inline bool valid_prob(float f) { return f >= 0 && f <= FLT_MAX; }

// LazyDistribution::load of verify.cc: validates a probability row and sums it.
template <class Block, class Load>
SPECD_HOST_DEVICE bool load_prob_row(Block& b, const Load& load, int32_t vocab, double* total) {
  bool bad = false;
  double s = 0;
  for_each_strided<2 * kProbLoadBatch>(b, vocab, load, [&](int32_t, float f) {
    const double v = static_cast<double>(f);
    bad = bad || !(is_finite(v) && v >= 0);
    s += v;
  });
  if (b.any(bad)) return false;
  *total = b.sum(s);
  return *total > 0;
}

// A visited row's total: totals[index] when the caller gave totals (it must be finite and
// > 0), else load_prob_row's (the row read whole, validated and summed). False: a bad row.
template <class Block>
SPECD_HOST_DEVICE bool visited_row_total(Block& b, const float* row, int32_t vocab, const double* totals,
                                         int64_t index, double* total) {
  if (totals == nullptr) return load_prob_row(b, [row](int32_t i) { return row[i]; }, vocab, total);
  *total = totals[index];
  return is_finite(*total) && *total > 0;
}

// Asks the device to bring `p` into L2 ahead of a read that depends on others; nothing on the
// host, no effect on any value.
SPECD_HOST_DEVICE inline void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

struct ProbTarget {
  ProbRows rows;
  const double* totals;       // StochasticRowOptions::target_totals (may be null)
  const float* row = nullptr;  // the visited row

  static constexpr bool kTotalNearOne = false;  // the caller's rows: any positive total
  SPECD_HOST_DEVICE int32_t vocab() const { return rows.vocab; }
  template <class Block>
  SPECD_HOST_DEVICE VerifyStatus visit(Block&, int32_t node) {
    row = rows.data + int64_t{node} * rows.stride;
    return VerifyStatus::kOk;
  }
  template <class Block>
  SPECD_HOST_DEVICE VerifyStatus total(Block& b, int32_t node, double* total) const {
    return visited_row_total(b, row, rows.vocab, totals, node, total) ? VerifyStatus::kOk
                                                                       : VerifyStatus::kBadTargetRow;
  }
  SPECD_HOST_DEVICE float raw(int32_t i) const { return row[i]; }
  SPECD_HOST_DEVICE float entry(int32_t, float raw_value) const { return raw_value; }
  SPECD_HOST_DEVICE void prefetch(int32_t node, int32_t x) const {
    prefetch_l2(rows.data + int64_t{node} * rows.stride + x);
    if (totals != nullptr) prefetch_l2(totals + node);
  }
};

template <class Row>
struct LogitTarget {
  LogitRows logits;
  const int32_t* row_index;  // TargetLogits::row_index (may be null)
  SamplingParams params;     // the request's
  RowPlan* plan;             // the caller's slot (the rules above)
  Row row{};                 // the visited row

  static constexpr bool kTotalNearOne = true;  // (the rule above)
  SPECD_HOST_DEVICE int32_t vocab() const { return logits.vocab; }
  template <class Block>
  SPECD_HOST_DEVICE VerifyStatus visit(Block& b, int32_t node) {
    b.sync();  // no thread still reads the previous node's plan
    const int64_t r = row_index != nullptr ? row_index[node] : node;
    if (r < 0 || r >= logits.rows) return VerifyStatus::kBadTargetRow;
    row = Row::at(logits.data, r * logits.stride);
    const SampleStatus s = plan_row(b, row, logits.vocab, params, plan);
    if (s == SampleStatus::kBadParams) return VerifyStatus::kBadSamplingParams;
    return s == SampleStatus::kOk ? VerifyStatus::kOk : VerifyStatus::kBadTargetRow;
  }
  template <class Block>
  SPECD_HOST_DEVICE VerifyStatus total(Block& b, int32_t, double* total) const {
    double local = 0;  // probs_row's float total: the same ids per thread, the same order
    for_each_strided(b, logits.vocab, row, [&](int32_t i, float l) {
      local += static_cast<double>(static_cast<float>(row_prob(*plan, i, l)));
    });
    *total = b.sum(local);
    return *total > 0 ? VerifyStatus::kOk : VerifyStatus::kBadTargetRow;  // > 0: the top token keeps >= 1 / vocab
  }
  SPECD_HOST_DEVICE float raw(int32_t i) const { return row(i); }
  SPECD_HOST_DEVICE float entry(int32_t i, float logit) const {
    return static_cast<float>(row_prob(*plan, i, logit));
  }
  SPECD_HOST_DEVICE void prefetch(int32_t, int32_t) const {}  // a visited row is read whole first
};

}  // namespace specd::detail
