// Random batches of token trees with target/draft probability rows, and the expected
// results from the single-request CPU references (verify.h), shared by the CPU and CUDA tests
// of batched verification.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "specd/sampling.h"
#include "specd/token_tree.h"
#include "specd/verify.h"
#include "specd/verify_batch.h"

namespace specd::testing {

struct VerifyCase {
  int32_t vocab = 0;
  int64_t stride = 0;
  std::vector<int32_t> offsets{0}, parents, tokens;
  std::vector<float> target, draft;    // [num_nodes, stride] probability rows
  std::vector<float> logits;           // [num_nodes, stride] greedy scores
  std::vector<int32_t> target_tokens;  // [num_nodes] argmax of logits
  std::vector<RngKey> keys;            // [batch]
  DraftSampling sampling = DraftSampling::kWithoutReplacement;

  int32_t batch() const { return static_cast<int32_t>(offsets.size()) - 1; }
  int32_t num_nodes() const { return static_cast<int32_t>(parents.size()); }
  TreeBatchView view() const {
    return TreeBatchView{offsets.data(), parents.data(), tokens.data(), batch(), num_nodes()};
  }
  ProbRows target_rows() const { return ProbRows{target.data(), num_nodes(), vocab, stride}; }
  ProbRows draft_rows() const { return ProbRows{draft.data(), num_nodes(), vocab, stride}; }
  LogitRows logit_rows() const { return LogitRows{logits.data(), LogitsDtype::kFloat32, num_nodes(), vocab, stride}; }
};

enum class VerifyKind { kGreedyRows, kGreedyTokens, kStochastic, kStochasticNoDraft };

enum class Proposal { kDraftWithoutReplacement, kDraftIndependent, kOneHot, kGreedy };

// A probability row from random logits (some -inf) through the sampling rules.
inline void random_prob_row(std::mt19937_64& g, const std::vector<float>& base, float noise, float* out, int32_t vocab,
                            std::vector<float>* logits_out = nullptr) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> l(static_cast<std::size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) l[static_cast<std::size_t>(i)] = base[static_cast<std::size_t>(i)] + noise * normal(g);
  if (vocab > 2 && g() % 2 == 0) l[g() % static_cast<uint64_t>(vocab)] = -INFINITY;
  if (logits_out != nullptr) *logits_out = l;
  SamplingParams s;
  if (g() % 3 == 0) s.top_k = 1 + static_cast<int32_t>(g() % static_cast<uint64_t>(vocab));
  EXPECT_TRUE(sampling_probs(l, s, Span<float>(out, static_cast<std::size_t>(vocab))).ok());
}

// Tokens of `count` children: drawn from row q (draft proposals), or the most likely tokens
// of p with some random ones (greedy: repeats allowed; one-hot: distinct).
inline std::vector<int32_t> propose_children(std::mt19937_64& g, const float* q, const float* p, int32_t vocab,
                                             int32_t count, Proposal how) {
  std::vector<int32_t> out;
  std::vector<double> w(q, q + vocab);
  for (int32_t j = 0; j < count; ++j) {
    int32_t x = -1;
    if (how == Proposal::kDraftWithoutReplacement || how == Proposal::kDraftIndependent) {
      double total = 0;
      for (double v : w) total += v;
      if (total <= 0) break;
      x = sample_from_weights(w, total, std::uniform_real_distribution<double>(0, 1)(g));
      if (how == Proposal::kDraftWithoutReplacement) w[static_cast<std::size_t>(x)] = 0;
    } else if (how == Proposal::kGreedy) {  // the target's argmax, or a random token
      x = g() % 3 == 0 ? static_cast<int32_t>(g() % static_cast<uint64_t>(vocab))
                       : static_cast<int32_t>(std::max_element(p, p + vocab) - p);
    } else {  // one-hot: the best token of p not proposed yet, or a random one; distinct
      for (int32_t i = 0; i < vocab; ++i)
        if (std::find(out.begin(), out.end(), i) == out.end() && (x < 0 || p[i] > p[x])) x = i;
      if (g() % 4 == 0) x = static_cast<int32_t>(g() % static_cast<uint64_t>(vocab));
      if (x < 0 || std::find(out.begin(), out.end(), x) != out.end()) continue;
    }
    out.push_back(x);
  }
  return out;
}

// A batch of requests with k in {0, 1, 2, 4, 8, 12} drafts, chains and trees.
inline VerifyCase random_verify_case(std::mt19937_64* gen, int32_t batch, int32_t vocab, Proposal how) {
  std::mt19937_64& g = *gen;
  VerifyCase c;
  c.vocab = vocab;
  c.stride = vocab + static_cast<int64_t>(g() % 2);
  c.sampling = how == Proposal::kDraftIndependent ? DraftSampling::kIndependent : DraftSampling::kWithoutReplacement;
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (int32_t r = 0; r < batch; ++r) {
    const int32_t k = std::vector<int32_t>{0, 1, 2, 4, 8, 12}[g() % 6];
    const bool chain = g() % 2 == 0;
    const auto begin = static_cast<int32_t>(c.parents.size());
    std::vector<float> base(static_cast<std::size_t>(vocab));
    for (float& b : base) b = normal(g);
    // Nodes are created level by level: each node's rows, then its children.
    std::vector<int32_t> frontier{0};
    c.parents.push_back(-1);
    c.tokens.push_back(static_cast<int32_t>(g() % static_cast<uint64_t>(vocab)));
    int32_t made = 0;
    for (std::size_t f = 0; f < frontier.size(); ++f) {
      const int32_t node = frontier[f];
      const std::size_t row = static_cast<std::size_t>(begin + node) * static_cast<std::size_t>(c.stride);
      c.target.resize(row + static_cast<std::size_t>(c.stride), 0.0f);
      c.draft.resize(c.target.size(), 0.0f);
      c.logits.resize(c.target.size(), 0.0f);
      std::vector<float> l;
      random_prob_row(g, base, 1.0f, c.target.data() + row, vocab, &l);
      std::copy(l.begin(), l.end(), c.logits.begin() + static_cast<std::ptrdiff_t>(row));
      random_prob_row(g, l, 0.7f, c.draft.data() + row, vocab);
      c.target_tokens.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
      const int32_t want = std::min<int32_t>(k - made, chain ? 1 : 1 + static_cast<int32_t>(g() % 3));
      if (want <= 0) continue;
      for (int32_t x : propose_children(g, c.draft.data() + row, c.target.data() + row, vocab, want, how)) {
        c.parents.push_back(node);
        c.tokens.push_back(x);
        frontier.push_back(static_cast<int32_t>(c.parents.size()) - 1 - begin);
        ++made;
      }
    }
    c.offsets.push_back(static_cast<int32_t>(c.parents.size()));
    c.keys.push_back(RngKey{g(), static_cast<uint32_t>(r), static_cast<uint32_t>(g() % 50), static_cast<uint32_t>(g() % 900)});
  }
  return c;
}

// Appends one request (rows given per node, each of `vocab` values; empty draft rows: zeros).
inline void append_request(VerifyCase* c, const std::vector<int32_t>& parents, const std::vector<int32_t>& tokens,
                           const std::vector<std::vector<float>>& target, const std::vector<std::vector<float>>& draft,
                           int32_t greedy_token = 0) {
  for (std::size_t v = 0; v < parents.size(); ++v) {
    c->parents.push_back(parents[v]);
    c->tokens.push_back(tokens[v]);
    std::vector<float> row(static_cast<std::size_t>(c->stride), 0.0f), drow = row;
    std::copy(target[v].begin(), target[v].end(), row.begin());
    if (v < draft.size()) std::copy(draft[v].begin(), draft[v].end(), drow.begin());
    c->target.insert(c->target.end(), row.begin(), row.end());
    c->logits.insert(c->logits.end(), row.begin(), row.end());
    c->draft.insert(c->draft.end(), drow.begin(), drow.end());
    c->target_tokens.push_back(greedy_token);
  }
  c->offsets.push_back(static_cast<int32_t>(c->parents.size()));
  c->keys.push_back(RngKey{42, static_cast<uint32_t>(c->keys.size()), 0, 0});
}

// Appends requests that each break one input rule of `kind` and returns their expected
// statuses. The last one has offsets past num_nodes (its range is never written).
inline std::vector<VerifyStatus> append_error_requests(VerifyCase* c, VerifyKind kind) {
  const int32_t V = c->vocab;
  const std::vector<float> uniform(static_cast<std::size_t>(V), 1.0f / static_cast<float>(V));
  std::vector<float> nan_row = uniform, zero_row(static_cast<std::size_t>(V), 0.0f), hot1 = zero_row;
  nan_row[1] = NAN;
  hot1[1] = 1.0f;
  std::vector<VerifyStatus> want;
  append_request(c, {-1, 0, 5}, {0, 1, 1}, {uniform, uniform, uniform}, {uniform, uniform, uniform});
  want.push_back(VerifyStatus::kBadTree);
  append_request(c, {0}, {0}, {uniform}, {uniform});
  want.push_back(VerifyStatus::kBadTree);
  append_request(c, {-1, 0}, {0, V}, {uniform, uniform}, {uniform, uniform});
  want.push_back(kind == VerifyKind::kGreedyTokens ? VerifyStatus::kOk : VerifyStatus::kBadToken);
  if (kind == VerifyKind::kGreedyTokens) {
    append_request(c, {-1, 0}, {0, 1}, {uniform, uniform}, {}, /*greedy_token=*/-3);
    want.push_back(VerifyStatus::kBadToken);
  } else {
    append_request(c, {-1, 0}, {0, 1}, {nan_row, uniform}, {uniform, uniform});
    want.push_back(VerifyStatus::kBadTargetRow);
    // The root accepts token 1 for sure (p and q one-hot on it); node 1's row is bad.
    append_request(c, {-1, 0}, {0, 1}, {hot1, nan_row}, {hot1, uniform}, 1);
    want.push_back(VerifyStatus::kBadTargetRow);
  }
  if (kind == VerifyKind::kStochastic) {
    append_request(c, {-1, 0}, {0, 1}, {uniform, uniform}, {zero_row, uniform});
    want.push_back(VerifyStatus::kBadDraftRow);
    std::vector<float> no1 = uniform;
    no1[1] = 0.0f;
    append_request(c, {-1, 0}, {0, 1}, {uniform, uniform}, {no1, uniform});
    want.push_back(VerifyStatus::kZeroDraftProbability);
    if (c->sampling == DraftSampling::kWithoutReplacement) {
      append_request(c, {-1, 0, 0}, {0, 1, 1}, {uniform, uniform, uniform}, {uniform, uniform, uniform});
      want.push_back(VerifyStatus::kRepeatedSibling);
    }
  }
  if (kind == VerifyKind::kStochastic || kind == VerifyKind::kStochasticNoDraft) {
    std::vector<int32_t> parents{-1}, tokens{0};
    std::vector<std::vector<float>> rows{uniform};
    for (int32_t j = 0; j <= kMaxVerifyChildren; ++j) {
      parents.push_back(0);
      tokens.push_back(j % V);
      rows.push_back(uniform);
    }
    if (c->sampling == DraftSampling::kIndependent || kind == VerifyKind::kStochasticNoDraft) {
      append_request(c, parents, tokens, rows, rows);
      want.push_back(VerifyStatus::kTooManyChildren);  // the single-request reference accepts it
    }
  }
  c->offsets.push_back(c->num_nodes() + 3);
  c->keys.push_back(RngKey{});
  want.push_back(VerifyStatus::kBadTree);
  return want;
}

struct ExpectedVerify {
  std::vector<bool> ok;                     // [batch]
  std::vector<VerifyResult> results;        // [batch]
};

inline ExpectedVerify expected_verify(const VerifyCase& c, VerifyKind kind) {
  ExpectedVerify e;
  for (int32_t r = 0; r < c.batch(); ++r) {
    const int32_t b = c.offsets[static_cast<std::size_t>(r)], end = c.offsets[static_cast<std::size_t>(r) + 1];
    VerifyResult res;
    Status s = Status::Ok();
    TokenTree tree;
    if (!(b >= 0 && b < end && end <= c.num_nodes())) {
      s = error_status(StatusCode::kInvalidArgument, "bad offsets");
    } else {
      const auto n = static_cast<std::size_t>(end - b);
      s = TokenTree::from_parents(Span<const int32_t>(c.tokens.data() + b, n), Span<const int32_t>(c.parents.data() + b, n),
                                  &tree);
    }
    if (s.ok()) {
      const int64_t off = int64_t{b} * c.stride;
      const int32_t rows = end - b;
      const ProbRows p{c.target.data() + off, rows, c.vocab, c.stride}, q{c.draft.data() + off, rows, c.vocab, c.stride};
      switch (kind) {
        case VerifyKind::kGreedyRows:
          s = verify_greedy(tree, ProbRows{c.logits.data() + off, rows, c.vocab, c.stride}, &res);
          break;
        case VerifyKind::kGreedyTokens:
          s = verify_greedy_tokens(tree, Span<const int32_t>(c.target_tokens.data() + b, static_cast<std::size_t>(rows)), &res);
          break;
        case VerifyKind::kStochastic:
          s = verify_stochastic(tree, p, &q, c.sampling, c.keys[static_cast<std::size_t>(r)], &res);
          break;
        case VerifyKind::kStochasticNoDraft:
          s = verify_stochastic(tree, p, nullptr, c.sampling, c.keys[static_cast<std::size_t>(r)], &res);
          break;
      }
    }
    e.ok.push_back(s.ok());
    e.results.push_back(s.ok() ? res : VerifyResult{});
  }
  return e;
}

// Output arrays filled with 777 (node layout, or padded rows when stride > 0).
struct BatchOutputs {
  std::vector<int32_t> tokens, path, num_accepted, status;
  int32_t stride = 0;
  BatchOutputs(int32_t batch, int32_t nodes, int32_t padded_stride = 0)
      : tokens(static_cast<std::size_t>(padded_stride > 0 ? int64_t{batch} * padded_stride : nodes), 777),
        path(tokens.size(), 777), num_accepted(static_cast<std::size_t>(batch), 777),
        status(static_cast<std::size_t>(batch), 777), stride(padded_stride) {}
  VerifyOutputs view() { return VerifyOutputs{tokens.data(), path.data(), num_accepted.data(), status.data(), stride}; }
};

// The most nodes of one request (a padded stride that fits every request).
inline int32_t max_request_nodes(const VerifyCase& c) {
  int32_t most = 1;
  for (int32_t r = 0; r < c.batch(); ++r)
    most = std::max(most, c.offsets[static_cast<std::size_t>(r) + 1] - c.offsets[static_cast<std::size_t>(r)]);
  return most;
}

// Checks batch outputs against the references; returns the number of requests that differ.
inline int32_t compare_verify(const VerifyCase& c, const ExpectedVerify& e, const BatchOutputs& got, const std::string& what) {
  int32_t bad = 0;
  for (int32_t r = 0; r < c.batch(); ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const int32_t b = c.offsets[ur], end = c.offsets[ur + 1];
    bool same = (got.status[ur] == 0) == e.ok[ur];
    std::vector<int32_t> want_tokens, want_path;
    if (e.ok[ur]) {
      want_tokens = e.results[ur].tokens;
      want_path = e.results[ur].path;
      same = same && got.num_accepted[ur] == e.results[ur].num_accepted;
    } else {
      same = same && got.num_accepted[ur] == 0;
    }
    const bool range_ok = b >= 0 && b < end && end <= c.num_nodes();
    const int64_t base = got.stride > 0 ? int64_t{r} * got.stride : b;
    const int32_t size = got.stride > 0 ? got.stride : (range_ok ? end - b : 0);
    if (size > 0) {
      want_tokens.resize(static_cast<std::size_t>(size), -1);
      want_path.resize(static_cast<std::size_t>(size), -1);
      same = same && std::equal(want_tokens.begin(), want_tokens.end(), got.tokens.begin() + base) &&
             std::equal(want_path.begin(), want_path.end(), got.path.begin() + base);
    }
    if (!same) {
      ++bad;
      ADD_FAILURE() << what << ": request " << r << " status " << got.status[ur] << " (reference ok " << e.ok[ur]
                    << ") accepted " << got.num_accepted[ur] << " vs "
                    << (e.ok[ur] ? e.results[ur].num_accepted : 0);
    }
  }
  return bad;
}

struct BatchRun {
  VerifyCase c;
  ExpectedVerify want;
  std::vector<VerifyStatus> error_codes;  // of the appended error requests (the last ones)
};

inline BatchRun make_run(uint64_t seed, int32_t batch, int32_t vocab, Proposal how, VerifyKind kind) {
  std::mt19937_64 g(seed);
  BatchRun run{random_verify_case(&g, batch, vocab, how), {}, {}};
  run.error_codes = append_error_requests(&run.c, kind);
  run.want = expected_verify(run.c, kind);
  // kTooManyChildren is a limit of the batched versions only: expect an error there.
  const std::size_t first_error = static_cast<std::size_t>(run.c.batch()) - run.error_codes.size();
  for (std::size_t k = 0; k < run.error_codes.size(); ++k)
    if (run.error_codes[k] == VerifyStatus::kTooManyChildren) run.want.ok[first_error + k] = false;
  return run;
}

inline void expect_error_codes(const BatchRun& run, const BatchOutputs& got) {
  const std::size_t first = static_cast<std::size_t>(run.c.batch()) - run.error_codes.size();
  for (std::size_t k = 0; k < run.error_codes.size(); ++k)
    EXPECT_EQ(got.status[first + k], static_cast<int32_t>(run.error_codes[k])) << "error request " << k;
}

// The batched CPU version of `kind` on the run's inputs.
inline void run_cpu(const BatchRun& run, VerifyKind kind, BatchOutputs* out) {
  const VerifyCase& c = run.c;
  switch (kind) {
    case VerifyKind::kGreedyRows:
      ASSERT_TRUE(verify_greedy_batch_cpu(c.view(), c.logit_rows(), out->view()).ok());
      break;
    case VerifyKind::kGreedyTokens:
      ASSERT_TRUE(verify_greedy_tokens_batch_cpu(c.view(), c.target_tokens.data(), out->view()).ok());
      break;
    case VerifyKind::kStochastic: {
      const ProbRows q = c.draft_rows();
      ASSERT_TRUE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &q, c.sampling, c.keys.data(), out->view()).ok());
      break;
    }
    case VerifyKind::kStochasticNoDraft:
      ASSERT_TRUE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), nullptr, c.sampling, c.keys.data(), out->view()).ok());
      break;
  }
}

// The case's draft rows moved into a larger buffer in a shuffled order, among rows of junk
// (NaN), with the draft_index that finds them (verify_batch.h): nodes without children get
// -1 and no row, as the draft loop's leaves do.
struct IndexedDraft {
  std::vector<float> rows;     // [num_rows, stride]
  std::vector<int32_t> index;  // [num_nodes]
  int32_t num_rows = 0;
  ProbRows view(const VerifyCase& c) const { return ProbRows{rows.data(), num_rows, c.vocab, c.stride}; }
};

inline IndexedDraft shuffled_draft(const VerifyCase& c, uint64_t seed) {
  // (the error requests' offsets and parents may be anything: only valid ones are followed)
  std::vector<bool> has_children(static_cast<std::size_t>(c.num_nodes()), false);
  for (int32_t r = 0; r < c.batch(); ++r) {
    const int32_t begin = c.offsets[static_cast<std::size_t>(r)], end = c.offsets[static_cast<std::size_t>(r) + 1];
    if (begin < 0 || end > c.num_nodes()) continue;
    for (int32_t v = begin + 1; v < end; ++v) {
      const int32_t parent = c.parents[static_cast<std::size_t>(v)];
      if (parent >= 0 && parent < v - begin) has_children[static_cast<std::size_t>(begin + parent)] = true;
    }
  }
  IndexedDraft d;
  d.num_rows = c.num_nodes() + 7;
  d.rows.assign(static_cast<std::size_t>(d.num_rows) * static_cast<std::size_t>(c.stride),
                std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> slot(static_cast<std::size_t>(d.num_rows));
  for (std::size_t i = 0; i < slot.size(); ++i) slot[i] = static_cast<int32_t>(i);
  std::mt19937_64 g(seed);
  std::shuffle(slot.begin(), slot.end(), g);
  d.index.assign(static_cast<std::size_t>(c.num_nodes()), -1);
  for (int32_t n = 0; n < c.num_nodes(); ++n) {
    if (!has_children[static_cast<std::size_t>(n)]) continue;
    const int32_t row = slot[static_cast<std::size_t>(n)];
    d.index[static_cast<std::size_t>(n)] = row;
    std::copy_n(c.draft.begin() + static_cast<std::ptrdiff_t>(n) * c.stride, c.stride,
                d.rows.begin() + static_cast<std::ptrdiff_t>(row) * c.stride);
  }
  return d;
}

// Each of the first `rows` rows' total: its floats summed as doubles in id order (what
// sampling_probs_batch_cpu writes as totals, and what the walk's one-thread sum gives).
inline std::vector<double> row_totals(const std::vector<float>& data, int32_t rows, int32_t vocab, int64_t stride) {
  std::vector<double> totals(static_cast<std::size_t>(rows), 0.0);
  for (int32_t r = 0; r < rows; ++r)
    for (int32_t i = 0; i < vocab; ++i)
      totals[static_cast<std::size_t>(r)] += static_cast<double>(data[static_cast<std::size_t>(r * stride + i)]);
  return totals;
}

struct KindCase {
  const char* name;
  Proposal how;
  VerifyKind kind;
};

inline void PrintTo(const KindCase& k, std::ostream* os) { *os << k.name; }

}  // namespace specd::testing
