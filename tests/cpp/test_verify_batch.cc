// Batched verification on the CPU (the CUDA kernels' per-request algorithm run by one
// thread) against the single-request references verify_greedy / verify_greedy_tokens /
// verify_stochastic: equal tokens, paths and counts on random batches of chains and trees
// with mixed k (0 included), with and without draft rows, both draft sampling modes; the
// per-request statuses of bad inputs; and residual_probs against verify.cc's vector updates.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "block_manager_test_util.h"
#include "specd/detail/verify_walk.h"
#include "specd/detail/logit_rows.h"
#include "specd/verify_batch.h"
#include "threaded_block.h"
#include "verify_batch_test_util.h"
#include "verify_lossless_test_util.h"

namespace specd::testing {
namespace {

// verify.cc's residual updates on whole vectors, for comparison.
void reference_residuals(std::vector<double>* p, std::vector<double>* q, const std::vector<int32_t>& rejected,
                         bool has_draft, bool without_replacement, std::vector<detail::Rejection>* totals) {
  // Normalizing by a sum s is v * (1 / s) (verify.h).
  const auto scale = [](std::vector<double>* v, double total) {
    const double inv = 1.0 / total;
    for (double& x : *v) x = x * inv;
  };
  for (int32_t x : rejected) {
    double p_total = 0, q_total = 0;
    if (has_draft) {
      std::vector<double> residual(p->size());
      for (std::size_t i = 0; i < p->size(); ++i) residual[i] = std::max(0.0, (*p)[i] - (*q)[i]);
      for (double v : residual) p_total += v;
      if (p_total > 0) {
        scale(&residual, p_total);
        p->swap(residual);
      }
      if (without_replacement) {
        (*q)[static_cast<std::size_t>(x)] = 0;
        for (double v : *q) q_total += v;
        if (q_total > 0) scale(q, q_total);
      }
    } else {
      (*p)[static_cast<std::size_t>(x)] = 0;
      for (double v : *p) p_total += v;
      if (p_total > 0) scale(p, p_total);
    }
    totals->push_back(detail::make_rejection(x, p_total, q_total));
  }
}

TEST(VerifyBatchHelpers, ResidualProbsEqualTheVectorUpdates) {
  std::mt19937_64 g(8);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t vocab = 2 + static_cast<int32_t>(g() % 20);
    std::vector<double> p0(static_cast<std::size_t>(vocab)), q0(p0.size());
    double sp = 0, sq = 0;
    for (std::size_t i = 0; i < p0.size(); ++i) {
      p0[i] = g() % 4 == 0 ? 0.0 : static_cast<double>(g() % 1000);
      q0[i] = g() % 4 == 0 ? 0.0 : static_cast<double>(g() % 1000);
      sp += p0[i];
      sq += q0[i];
    }
    if (sp == 0 || sq == 0) continue;
    for (std::size_t i = 0; i < p0.size(); ++i) {
      p0[i] /= sp;
      q0[i] /= sq;
    }
    const bool has_draft = g() % 3 != 0, wor = g() % 2 == 0;
    std::vector<int32_t> rejected;
    for (int32_t j = 0; j < 1 + static_cast<int32_t>(g() % 6); ++j) rejected.push_back(static_cast<int32_t>(g() % static_cast<uint64_t>(vocab)));
    std::vector<double> p = p0, q = q0;
    std::vector<detail::Rejection> totals;
    reference_residuals(&p, &q, rejected, has_draft, wor, &totals);
    for (int32_t i = 0; i < vocab; ++i) {
      double pi = 0, qi = 0;
      detail::residual_probs(p0[static_cast<std::size_t>(i)], q0[static_cast<std::size_t>(i)], i, totals.data(),
                             static_cast<int32_t>(totals.size()), has_draft, wor, &pi, &qi);
      ASSERT_EQ(pi, p[static_cast<std::size_t>(i)]) << "trial " << trial << " token " << i;
      if (has_draft) ASSERT_EQ(qi, q[static_cast<std::size_t>(i)]) << "trial " << trial << " token " << i;
    }
  }
}

class VerifyBatchCpu : public ::testing::TestWithParam<KindCase> {};

TEST_P(VerifyBatchCpu, MatchesSingleRequestReference) {
  const KindCase& k = GetParam();
  for (int32_t vocab : {2, 5, 33, 1000}) {
    const BatchRun run = make_run(100 + static_cast<uint64_t>(vocab), 150, vocab, k.how, k.kind);
    BatchOutputs out(run.c.batch(), run.c.num_nodes());
    run_cpu(run, k.kind, &out);
    EXPECT_EQ(compare_verify(run.c, run.want, out, std::string(k.name) + " vocab " + std::to_string(vocab)), 0);
    expect_error_codes(run, out);
    int64_t accepted = 0;
    for (int32_t a : out.num_accepted) accepted += a;
    EXPECT_GT(accepted, 0) << "no draft was accepted: the case tests little";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, VerifyBatchCpu,
    ::testing::Values(KindCase{"greedy_rows", Proposal::kGreedy, VerifyKind::kGreedyRows},
                      KindCase{"greedy_tokens", Proposal::kGreedy, VerifyKind::kGreedyTokens},
                      KindCase{"draft_without_replacement", Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic},
                      KindCase{"draft_independent", Proposal::kDraftIndependent, VerifyKind::kStochastic},
                      KindCase{"one_hot", Proposal::kOneHot, VerifyKind::kStochasticNoDraft}),
    [](const ::testing::TestParamInfo<KindCase>& info) { return std::string(info.param.name); });

// The per-request algorithm with several threads per request, as the kernels run it.
void run_threaded_batch(const VerifyCase& c, VerifyKind kind, int32_t threads, BatchOutputs* out) {
  const TreeBatchView trees = c.view();
  const VerifyOutputs o = out->view();
  detail::Rejection rejected[kMaxVerifyChildren];
  for (int32_t r = 0; r < c.batch(); ++r) {
    run_threaded(threads, [&](ThreadedBlock& b) {
      const int32_t vocab = kind == VerifyKind::kGreedyTokens ? 0 : c.vocab;
      detail::verify_request(b, trees, r, vocab, o, [&](const detail::RequestNodes& n, detail::Emitter& e) {
        switch (kind) {
          case VerifyKind::kGreedyRows:
            return detail::greedy_walk(b, n, e, [&](int32_t node, int32_t* token) {
              return detail::row_argmax(b, detail::Float32Row::at(c.logits.data(), int64_t{n.begin + node} * c.stride),
                                        c.vocab, token);
            });
          case VerifyKind::kGreedyTokens:
            return detail::greedy_walk(b, n, e, [&](int32_t node, int32_t* token) {
              *token = c.target_tokens[static_cast<std::size_t>(n.begin + node)];
              return *token < 0 ? VerifyStatus::kBadToken : VerifyStatus::kOk;
            });
          case VerifyKind::kStochastic:
            break;
          case VerifyKind::kStochasticNoDraft:
            break;
        }
        detail::ProbTarget target{c.target_rows(), nullptr};
        const ProbRows draft = kind == VerifyKind::kStochastic ? c.draft_rows() : ProbRows{};
        return detail::stochastic_walk(b, n, e, target, draft, {}, c.sampling, c.keys[static_cast<std::size_t>(r)],
                                       rejected);
      });
    });
  }
}

TEST_P(VerifyBatchCpu, PaddedOutputsHoldTheSameResults) {
  const KindCase& k = GetParam();
  const BatchRun run = make_run(400, 80, 20, k.how, k.kind);
  const int32_t stride = max_request_nodes(run.c) + 2;
  BatchOutputs out(run.c.batch(), run.c.num_nodes(), stride);
  run_cpu(run, k.kind, &out);
  EXPECT_EQ(compare_verify(run.c, run.want, out, std::string(k.name) + " padded"), 0);
  expect_error_codes(run, out);
  // A row too short for a request's nodes: kOutputTooSmall, the row all -1.
  BatchOutputs narrow(run.c.batch(), run.c.num_nodes(), 3);
  run_cpu(run, k.kind, &narrow);
  for (int32_t r = 0; r + 1 < run.c.batch(); ++r) {
    const auto ur = static_cast<std::size_t>(r);
    if (run.c.offsets[ur + 1] - run.c.offsets[ur] <= 3) continue;
    EXPECT_EQ(narrow.status[ur], static_cast<int32_t>(VerifyStatus::kOutputTooSmall)) << "request " << r;
    EXPECT_EQ(narrow.num_accepted[ur], 0);
    EXPECT_EQ(std::vector<int32_t>(narrow.tokens.begin() + r * 3, narrow.tokens.begin() + r * 3 + 3), std::vector<int32_t>(3, -1));
  }
}

TEST_P(VerifyBatchCpu, SeveralThreadsPerRequestMatchOneThread) {
  const KindCase& k = GetParam();
  for (int32_t threads : {2, 5}) {
    for (int32_t vocab : {3, 40, 300}) {
      const BatchRun run = make_run(200 + static_cast<uint64_t>(vocab), 60, vocab, k.how, k.kind);
      BatchOutputs serial(run.c.batch(), run.c.num_nodes()), threaded(run.c.batch(), run.c.num_nodes());
      run_cpu(run, k.kind, &serial);
      run_threaded_batch(run.c, k.kind, threads, &threaded);
      const std::string what = std::string(k.name) + " vocab " + std::to_string(vocab) + " threads " + std::to_string(threads);
      EXPECT_EQ(threaded.status, serial.status) << what;
      EXPECT_EQ(threaded.num_accepted, serial.num_accepted) << what;
      EXPECT_EQ(threaded.tokens, serial.tokens) << what;
      EXPECT_EQ(threaded.path, serial.path) << what;
    }
  }
}

// Draft rows found through draft_index (shuffled among junk rows, none for the leaves) give
// the results of the node-ordered rows; a node with children and no row is kBadDraftRow.
TEST(VerifyBatchCpuDraftIndex, IndexedRowsGiveTheNodeOrderedResults) {
  for (const Proposal how : {Proposal::kDraftWithoutReplacement, Proposal::kDraftIndependent}) {
    const BatchRun run = make_run(500, 90, 40, how, VerifyKind::kStochastic);
    const VerifyCase& c = run.c;
    BatchOutputs want(c.batch(), c.num_nodes()), got(c.batch(), c.num_nodes());
    run_cpu(run, VerifyKind::kStochastic, &want);
    IndexedDraft d = shuffled_draft(c, 7);
    const ProbRows rows = d.view(c);
    SPECD_ASSERT_OK(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &rows, c.sampling, c.keys.data(), got.view(),
                                                StochasticRowOptions{d.index.data()}));
    EXPECT_EQ(got.status, want.status);
    EXPECT_EQ(got.num_accepted, want.num_accepted);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.path, want.path);
    // Request 0's root loses its row (-1, then past the rows): only request 0 fails.
    ASSERT_EQ(c.parents[1], 0);  // its root has children
    for (const int32_t bad : {-1, d.num_rows}) {
      d.index[0] = bad;
      BatchOutputs broken(c.batch(), c.num_nodes());
      SPECD_ASSERT_OK(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &rows, c.sampling, c.keys.data(),
                                                  broken.view(), StochasticRowOptions{d.index.data()}));
      EXPECT_EQ(broken.status[0], static_cast<int32_t>(VerifyStatus::kBadDraftRow)) << bad;
      EXPECT_EQ(broken.num_accepted[0], 0);
      EXPECT_EQ(std::vector<int32_t>(broken.status.begin() + 1, broken.status.end()),
                std::vector<int32_t>(want.status.begin() + 1, want.status.end()));
      EXPECT_EQ(std::vector<int32_t>(broken.tokens.begin() + c.offsets[1], broken.tokens.end()),
                std::vector<int32_t>(want.tokens.begin() + c.offsets[1], want.tokens.end()));
    }
  }
}

// Row totals given (the sums the walk computes, as the sampling kernels write them) give the
// same results, with draft_index too, for every request, the bad ones included (a NaN row
// has a NaN total; a zero row a zero total).
TEST(VerifyBatchCpuTotals, GivenTotalsGiveTheSameResults) {
  for (const auto& [how, kind] : {std::pair{Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic},
                                  std::pair{Proposal::kDraftIndependent, VerifyKind::kStochastic},
                                  std::pair{Proposal::kOneHot, VerifyKind::kStochasticNoDraft}}) {
    const BatchRun run = make_run(700, 90, 40, how, kind);
    const VerifyCase& c = run.c;
    const bool has_draft = kind == VerifyKind::kStochastic;
    BatchOutputs want(c.batch(), c.num_nodes()), got(c.batch(), c.num_nodes());
    run_cpu(run, kind, &want);
    const std::vector<double> p_totals = row_totals(c.target, c.num_nodes(), c.vocab, c.stride);
    const std::vector<double> q_totals = row_totals(c.draft, c.num_nodes(), c.vocab, c.stride);
    const ProbRows q = c.draft_rows();
    SPECD_ASSERT_OK(verify_stochastic_batch_cpu(
        c.view(), c.target_rows(), has_draft ? &q : nullptr, c.sampling, c.keys.data(), got.view(),
        StochasticRowOptions{nullptr, p_totals.data(), has_draft ? q_totals.data() : nullptr}));
    EXPECT_EQ(got.status, want.status);
    EXPECT_EQ(got.num_accepted, want.num_accepted);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.path, want.path);
    expect_error_codes(run, got);
    if (!has_draft) continue;
    const IndexedDraft d = shuffled_draft(c, 3);
    const std::vector<double> d_totals = row_totals(d.rows, d.num_rows, c.vocab, c.stride);
    const ProbRows rows = d.view(c);
    BatchOutputs both(c.batch(), c.num_nodes());
    SPECD_ASSERT_OK(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &rows, c.sampling, c.keys.data(), both.view(),
                                                StochasticRowOptions{d.index.data(), p_totals.data(), d_totals.data()}));
    EXPECT_EQ(both.status, want.status);
    EXPECT_EQ(both.tokens, want.tokens);
    EXPECT_EQ(both.path, want.path);
  }
}

// With totals the walk does not read a row whole before using it, so it validates what it
// reads: a bad total, a bad drafted entry, a bad entry met by a rejection's pass or the final
// draw's: that request's status, the others unchanged.
TEST(VerifyBatchCpuTotals, BadTotalsAndEntriesFailTheirRequest) {
  // One request: root -> token 1. p = q = uniform over 4 tokens: the draft is accepted
  // with probability 1 (u * q < p), then the bonus is drawn from the leaf's row.
  const std::vector<int32_t> offsets{0, 2}, parents{-1, 0}, tokens{0, 1};
  const TreeBatchView trees{offsets.data(), parents.data(), tokens.data(), 1, 2};
  const std::vector<RngKey> keys{RngKey{3, 1, 0, 5}};
  const auto run = [&](std::vector<float> p, std::vector<float> q, std::vector<double> pt, std::vector<double> qt) {
    std::vector<int32_t> out_tokens(2), path(2), accepted(1), status(1);
    const ProbRows pr{p.data(), 2, 4, 4}, qr{q.data(), 2, 4, 4};
    EXPECT_TRUE(verify_stochastic_batch_cpu(trees, pr, &qr, DraftSampling::kIndependent, keys.data(),
                                            VerifyOutputs{out_tokens.data(), path.data(), accepted.data(),
                                                          status.data(), 0},
                                            StochasticRowOptions{nullptr, pt.data(), qt.data()})
                    .ok());
    return static_cast<VerifyStatus>(status[0]);
  };
  const std::vector<float> u(8, 0.25f);
  const std::vector<double> ones{1.0, 1.0};
  EXPECT_EQ(run(u, u, ones, ones), VerifyStatus::kOk);
  EXPECT_EQ(run(u, u, {NAN, 1.0}, ones), VerifyStatus::kBadTargetRow);
  EXPECT_EQ(run(u, u, {0.0, 1.0}, ones), VerifyStatus::kBadTargetRow);
  EXPECT_EQ(run(u, u, ones, {-1.0, 1.0}), VerifyStatus::kBadDraftRow);
  std::vector<float> bad = u;
  bad[1] = NAN;  // the drafted token's entry at the root
  EXPECT_EQ(run(bad, u, ones, ones), VerifyStatus::kBadTargetRow);
  EXPECT_EQ(run(u, bad, ones, ones), VerifyStatus::kBadDraftRow);
  bad = u;
  bad[4 + 2] = -0.5f;  // an entry of the leaf's row, met by the bonus draw's pass
  EXPECT_EQ(run(bad, u, ones, ones), VerifyStatus::kBadTargetRow);
  // A rejection's pass: the root's draft puts all its mass on token 1, the target none.
  std::vector<float> p = u, q(8, 0.0f);
  p[1] = 0.0f;
  q[1] = 1.0f;
  q[4] = 1.0f;
  EXPECT_EQ(run(p, q, {0.75, 1.0}, ones), VerifyStatus::kOk);
  std::vector<float> q_bad = q;
  q_bad[3] = INFINITY;  // not the drafted entry: met by the rejection's pass only
  EXPECT_EQ(run(p, q_bad, {0.75, 1.0}, ones), VerifyStatus::kBadDraftRow);
  std::vector<float> p_bad = p;
  p_bad[2] = NAN;
  EXPECT_EQ(run(p_bad, q, {0.75, 1.0}, ones), VerifyStatus::kBadTargetRow);
}

// The losslessness harness of the GPU test, run on the batched CPU version.
TEST(VerifyBatchCpuLossless, FirstTokenFollowsTheTarget) {
  for (const auto& [how, kind] : {std::pair{Proposal::kDraftWithoutReplacement, VerifyKind::kStochastic},
                                  std::pair{Proposal::kDraftIndependent, VerifyKind::kStochastic},
                                  std::pair{Proposal::kOneHot, VerifyKind::kStochasticNoDraft}}) {
    const LosslessBatch batch = make_lossless_batch(how, 30000);
    BatchOutputs out(batch.run.c.batch(), batch.run.c.num_nodes());
    run_cpu(batch.run, kind, &out);
    expect_first_token_follows_target(batch, out, "CPU batch");
  }
}

TEST(VerifyBatchCpuValidation, DecreasingOffsetsInvalidateTheRequestsThatCouldOverlap) {
  // Offsets 0, 2, 0, 2: request 2 names the same nodes as request 0 (a valid tree on its
  // own), which would make two requests write one output range (a race on the GPU, where
  // requests run in parallel). Offsets must not decrease: request 1 (empty, reversed) and
  // request 2 (starts below an earlier offset) are kBadTree; request 0 is verified.
  const std::vector<int32_t> offsets{0, 2, 0, 2}, parents{-1, 0}, tokens{5, 1}, target{1, 3};
  const TreeBatchView trees{offsets.data(), parents.data(), tokens.data(), 3, 2};
  std::vector<int32_t> out_tokens(2, 7), path(2, 7), accepted(3, 9), status(3, 9);
  SPECD_ASSERT_OK(verify_greedy_tokens_batch_cpu(
      trees, target.data(), VerifyOutputs{out_tokens.data(), path.data(), accepted.data(), status.data(), 0}));
  EXPECT_EQ(status[0], static_cast<int32_t>(VerifyStatus::kOk));
  EXPECT_EQ(status[1], static_cast<int32_t>(VerifyStatus::kBadTree));
  EXPECT_EQ(status[2], static_cast<int32_t>(VerifyStatus::kBadTree));
  EXPECT_EQ(accepted[0], 1);
  EXPECT_EQ(out_tokens, (std::vector<int32_t>{1, 3}));  // the accepted draft, then the bonus
  EXPECT_EQ(accepted[2], 0);
}

TEST(VerifyBatchCpuValidation, RejectsBadSizesAndPointers) {
  std::mt19937_64 g(1);
  VerifyCase c = random_verify_case(&g, 3, 7, Proposal::kDraftWithoutReplacement);
  BatchOutputs out(c.batch(), c.num_nodes());
  ProbRows short_rows = c.target_rows();
  short_rows.rows = c.num_nodes() - 1;
  SPECD_EXPECT_CODE(verify_stochastic_batch_cpu(c.view(), short_rows, nullptr, c.sampling, c.keys.data(), out.view()),
                    kInvalidArgument);
  ProbRows other_vocab = c.draft_rows();
  other_vocab.vocab = 6;
  SPECD_EXPECT_CODE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &other_vocab, c.sampling, c.keys.data(),
                                                out.view()), kInvalidArgument);
  SPECD_EXPECT_CODE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), nullptr, c.sampling, nullptr, out.view()),
                    kInvalidArgument);
  // An index needs draft rows; with one, fewer draft rows than nodes are fine.
  const std::vector<int32_t> index(static_cast<std::size_t>(c.num_nodes()), -1);
  SPECD_EXPECT_CODE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), nullptr, c.sampling, c.keys.data(),
                                                out.view(), StochasticRowOptions{index.data()}), kInvalidArgument);
  ProbRows few = c.draft_rows();
  few.rows = 1;
  SPECD_EXPECT_CODE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &few, c.sampling, c.keys.data(), out.view()),
                    kInvalidArgument);
  SPECD_ASSERT_OK(verify_stochastic_batch_cpu(c.view(), c.target_rows(), &few, c.sampling, c.keys.data(), out.view(),
                                              StochasticRowOptions{index.data()}));
  // Draft totals need draft rows too.
  const std::vector<double> totals(static_cast<std::size_t>(c.num_nodes()), 1.0);
  SPECD_EXPECT_CODE(verify_stochastic_batch_cpu(c.view(), c.target_rows(), nullptr, c.sampling, c.keys.data(),
                                                out.view(), StochasticRowOptions{nullptr, nullptr, totals.data()}),
                    kInvalidArgument);
  VerifyOutputs no_status = out.view();
  no_status.status = nullptr;
  SPECD_EXPECT_CODE(verify_greedy_tokens_batch_cpu(c.view(), c.target_tokens.data(), no_status), kInvalidArgument);
  TreeBatchView negative = c.view();
  negative.batch = -1;
  SPECD_EXPECT_CODE(verify_greedy_tokens_batch_cpu(negative, c.target_tokens.data(), out.view()), kInvalidArgument);
  SPECD_EXPECT_CODE(verify_greedy_batch_cpu(c.view(), LogitRows{c.logits.data(), LogitsDtype::kFloat32, 1, 7, 7}, out.view()),
                    kInvalidArgument);
  // Path is optional; an empty batch is fine.
  VerifyOutputs no_path = out.view();
  no_path.path = nullptr;
  SPECD_ASSERT_OK(verify_greedy_tokens_batch_cpu(c.view(), c.target_tokens.data(), no_path));
  SPECD_ASSERT_OK(verify_greedy_tokens_batch_cpu(TreeBatchView{}, nullptr, VerifyOutputs{}));
}

}  // namespace
}  // namespace specd::testing
