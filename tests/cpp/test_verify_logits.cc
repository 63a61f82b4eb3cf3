// Stochastic verification from the target's logits (verify_stochastic_logits_batch_cpu,
// verify_batch.h): the results of verify_stochastic_batch_cpu on the rows and totals
// sampling_probs_batch_cpu writes, for float32 / float16 / bfloat16 logits, every proposal
// kind, per-request parameters from greedy to every filter, draft rows through draft_index
// with totals; several threads per request; errors that fail only their request (a bad row
// the walk does not reach fails nothing); the call's checks; and losslessness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "block_manager_test_util.h"
#include "sampling_batch_test_util.h"
#include "specd/detail/logit_rows.h"
#include "specd/detail/verify_walk.h"
#include "specd/philox.h"
#include "specd/verify_batch.h"
#include "threaded_block.h"
#include "verify_batch_test_util.h"
#include "verify_logits_test_util.h"
#include "verify_lossless_test_util.h"

namespace specd::testing {
namespace {

struct ProposalCase {
  const char* name;
  Proposal how;
  bool has_draft;
};
const ProposalCase kProposals[] = {{"draft without replacement", Proposal::kDraftWithoutReplacement, true},
                                   {"draft independent", Proposal::kDraftIndependent, true},
                                   {"one-hot, no draft rows", Proposal::kOneHot, false}};

const char* dtype_name(LogitsDtype d) {
  return d == LogitsDtype::kFloat32 ? "float32" : d == LogitsDtype::kFloat16 ? "float16" : "bfloat16";
}

int32_t count_status(const BatchOutputs& out, VerifyStatus s) {
  int32_t n = 0;
  for (int32_t v : out.status) n += v == static_cast<int32_t>(s);
  return n;
}

TEST(VerifyLogitsCpu, EqualsVerificationOfTheSampledRows) {
  int32_t accepted = 0, ok = 0, bad_params = 0, bad_rows = 0;
  for (const LogitsDtype dtype : {LogitsDtype::kFloat32, LogitsDtype::kFloat16, LogitsDtype::kBFloat16}) {
    for (const ProposalCase& p : kProposals) {
      for (const int32_t vocab : {7, 64, 300}) {
        const LogitVerifyCase lc =
            random_logit_verify_case(1000 + static_cast<uint64_t>(vocab) * 7 + static_cast<uint64_t>(dtype), 40, vocab,
                                     p.how, dtype, 9);
        const VerifyCase& c = lc.c;
        const ProbRows q = c.draft_rows();
        const ProbRows* draft = p.has_draft ? &q : nullptr;
        BatchOutputs want(c.batch(), c.num_nodes()), got(c.batch(), c.num_nodes());
        expected_logit_verify(lc, draft, {}, &want);
        SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), lc.target(), draft, c.sampling, c.keys.data(),
                                                           got.view()));
        const std::string what = std::string(dtype_name(dtype)) + ", " + p.name + ", vocab " + std::to_string(vocab);
        expect_same_outputs(got, want, what);
        for (int32_t a : got.num_accepted) accepted += a;
        ok += count_status(got, VerifyStatus::kOk);
        bad_params += count_status(got, VerifyStatus::kBadSamplingParams);
        bad_rows += count_status(got, VerifyStatus::kBadTargetRow);
      }
    }
  }
  // The cases exercise what they claim: accepted drafts, and both kinds of failed request.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(ok, 500);
  EXPECT_GT(bad_params, 10);
  EXPECT_GT(bad_rows, 10);
}

// Draft rows found through draft_index among junk rows, with their totals: the same as the
// node-ordered rows.
TEST(VerifyLogitsCpu, IndexedDraftRowsWithTotalsGiveTheSameResults) {
  for (const Proposal how : {Proposal::kDraftWithoutReplacement, Proposal::kDraftIndependent}) {
    const LogitVerifyCase lc = random_logit_verify_case(77, 50, 40, how, LogitsDtype::kBFloat16, 4);
    const VerifyCase& c = lc.c;
    const ProbRows q = c.draft_rows();
    BatchOutputs want(c.batch(), c.num_nodes()), got(c.batch(), c.num_nodes());
    expected_logit_verify(lc, &q, {}, &want);
    const IndexedDraft d = shuffled_draft(c, 5);
    const std::vector<double> d_totals = row_totals(d.rows, d.num_rows, c.vocab, c.stride);
    const ProbRows rows = d.view(c);
    SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), lc.target(), &rows, c.sampling, c.keys.data(),
                                                       got.view(),
                                                       StochasticRowOptions{d.index.data(), nullptr, d_totals.data()}));
    expect_same_outputs(got, want, how == Proposal::kDraftIndependent ? "independent" : "without replacement");
  }
}

// The walk with several threads per request (as the kernels run it), each thread holding its
// own plan: the one-thread results.
TEST(VerifyLogitsCpu, SeveralThreadsPerRequestMatchOneThread) {
  for (const int32_t threads : {2, 5}) {
    for (const int32_t vocab : {40, 300}) {
      const LogitVerifyCase lc = random_logit_verify_case(300 + static_cast<uint64_t>(vocab), 30, vocab,
                                                          Proposal::kDraftWithoutReplacement, LogitsDtype::kFloat32, 4);
      const VerifyCase& c = lc.c;
      const ProbRows q = c.draft_rows();
      BatchOutputs serial(c.batch(), c.num_nodes()), threaded(c.batch(), c.num_nodes());
      SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), lc.target(), &q, c.sampling, c.keys.data(),
                                                         serial.view()));
      const TreeBatchView trees = c.view();
      const VerifyOutputs o = threaded.view();
      detail::Rejection rejected[kMaxVerifyChildren];
      for (int32_t r = 0; r < c.batch(); ++r) {
        run_threaded(threads, [&](ThreadedBlock& b) {
          detail::RowPlan plan;  // this thread's own (sample_row.h: every thread writes the same values)
          detail::verify_request(b, trees, r, vocab, o, [&](const detail::RequestNodes& n, detail::Emitter& e) {
            detail::LogitTarget<detail::Float32Row> target{lc.logits(), nullptr, lc.params[static_cast<std::size_t>(r)],
                                                           &plan};
            return detail::stochastic_walk(b, n, e, target, q, {}, c.sampling, c.keys[static_cast<std::size_t>(r)],
                                           rejected);
          });
        });
      }
      expect_same_outputs(threaded, serial, "threads " + std::to_string(threads) + ", vocab " + std::to_string(vocab));
    }
  }
}

// Request 0: a chain root -> 1 -> 2 whose target and draft both put all their mass on the
// drafted tokens (greedy parameters: the target's argmax; one-hot draft rows), so the walk
// visits every node. Request 1: the same tree with a rejected root (the draft proposes a token
// the target bans), so node 1 and 2 are never visited. A bad logit in a visited row fails
// request 0 only; in request 1's unvisited rows it fails nothing.
TEST(VerifyLogitsCpu, BadRowsFailOnlyTheRequestThatVisitsThem) {
  constexpr int32_t V = 5;
  const std::vector<int32_t> offsets{0, 3, 6}, parents{-1, 0, 1, -1, 0, 1}, tokens{0, 1, 2, 0, 4, 2};
  const TreeBatchView trees{offsets.data(), parents.data(), tokens.data(), 2, 6};
  std::vector<float> logits(6 * V, 0.0f);
  const int32_t best[6] = {1, 2, 3, 1, 2, 3};
  for (int32_t n = 0; n < 6; ++n) logits[static_cast<std::size_t>(n * V + best[n])] = 5.0f;
  logits[3 * V + 4] = -INFINITY;  // request 1's root bans the drafted token 4
  std::vector<float> draft(6 * V, 0.0f);
  for (int32_t n = 0; n < 6; ++n) draft[static_cast<std::size_t>(n * V + tokens[(n % 3 == 2) ? n : n + 1])] = 1.0f;
  const ProbRows q{draft.data(), 6, V, V};
  const std::vector<RngKey> keys{RngKey{1, 0, 0, 3}, RngKey{1, 1, 0, 3}};
  const std::vector<SamplingParams> params(2, SamplingParams{0.9, 1, 1.0, 0.0});  // top-1: the argmax
  const auto run = [&](const std::vector<float>& l, std::vector<int32_t>* accepted_out = nullptr) {
    BatchOutputs out(2, 6);
    EXPECT_TRUE(verify_stochastic_logits_batch_cpu(trees, TargetLogits{LogitRows{l.data(), LogitsDtype::kFloat32, 6, V, V},
                                                                       params.data()},
                                                   &q, DraftSampling::kWithoutReplacement, keys.data(), out.view())
                    .ok());
    if (accepted_out != nullptr) *accepted_out = out.num_accepted;
    return out.status;
  };
  std::vector<int32_t> accepted;
  EXPECT_EQ(run(logits, &accepted), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(accepted, (std::vector<int32_t>{2, 0}));
  for (const float bad : {NAN, INFINITY}) {
    std::vector<float> l = logits;
    l[2 * V + 0] = bad;  // request 0's leaf: visited for the bonus token
    l[5 * V + 0] = bad;  // request 1's leaf: never visited
    l[4 * V + 1] = bad;  // request 1's node 1: never visited
    EXPECT_EQ(run(l, &accepted), (std::vector<int32_t>{static_cast<int32_t>(VerifyStatus::kBadTargetRow), 0}));
    EXPECT_EQ(accepted, (std::vector<int32_t>{0, 0}));
  }
  std::vector<float> all_inf = logits;
  for (int32_t i = 0; i < V; ++i) all_inf[static_cast<std::size_t>(V + i)] = -INFINITY;  // no finite logit
  EXPECT_EQ(run(all_inf), (std::vector<int32_t>{static_cast<int32_t>(VerifyStatus::kBadTargetRow), 0}));
}

// The premise of the walk's accept test without the row's total (verify_target.h,
// kTotalSlack): the total of a row the sampling rules make, its floats summed, is 1 within
// 6.1e-8, for every kind of parameters and logits (ties, -inf, wide and narrow spreads, cuts).
TEST(VerifyLogitsCpu, PlannedRowTotalsLieWithinTheSlackOfOne) {
  std::mt19937_64 g(17);
  double worst = 0;
  for (const int32_t vocab : {1, 2, 7, 300, 5000}) {
    const SamplingCase c = random_sampling_case(&g, 200, vocab);
    std::vector<float> probs(static_cast<std::size_t>(c.rows) * static_cast<std::size_t>(vocab));
    std::vector<int32_t> status(static_cast<std::size_t>(c.rows));
    std::vector<double> totals(static_cast<std::size_t>(c.rows));
    SPECD_ASSERT_OK(sampling_probs_batch_cpu(c.view(), c.params.data(), probs.data(), status.data(), totals.data()));
    for (int32_t r = 0; r < c.rows; ++r) {
      if (status[static_cast<std::size_t>(r)] != 0) continue;
      const double off = std::fabs(totals[static_cast<std::size_t>(r)] - 1.0);
      worst = std::max(worst, off);
      EXPECT_LE(off, 6.1e-8) << "vocab " << vocab << " row " << r;
    }
  }
  EXPECT_LT(worst, detail::kTotalSlack / 10);
}

// Accept tests whose u * q(x) falls inside the slack below p(x) (the walk then sums the row and
// tests exactly), just outside it (accepted without the total) and just above p(x)
// (rejected): the results of verification on the probability rows, every time.
TEST(VerifyLogitsCpu, AcceptTestsNearTheBoundaryMatchTheRows) {
  // Two tokens, equal logits: p = (0.5, 0.5), whose total is exactly 1, so p(0) = 0.5. The
  // root drafts token 0 from a draft row (a, 1 - a) whose q(0) puts u * q(0) at 0.5 (1 + e).
  const std::vector<int32_t> offsets{0, 2}, parents{-1, 0}, tokens{1, 0};
  const TreeBatchView trees{offsets.data(), parents.data(), tokens.data(), 1, 2};
  const std::vector<float> logits(4, 0.0f), p_rows(4, 0.5f);
  const SamplingParams params;
  const std::vector<double> p_totals{1.0, 1.0};
  int32_t cases = 0, accepted = 0;
  for (uint32_t request = 0; request < 200 && cases < 60; ++request) {
    const RngKey key{9, request, 0, 4};
    const double u = philox_uniform(key.seed, key.request, key.step, key.position, 0u);
    if (u < 0.55) continue;  // a = 0.5 (1 + e) / u must stay below 1
    ++cases;
    for (const double e : {-3e-6, -9e-7, -5e-7, -1e-7, -1e-12, 1e-12, 1e-7}) {
      const float a = static_cast<float>(0.5 * (1 + e) / u);
      const std::vector<float> q_rows{a, 1.0f - a, 0.5f, 0.5f};
      const ProbRows q{q_rows.data(), 2, 2, 2};
      BatchOutputs want(1, 2), got(1, 2);
      SPECD_ASSERT_OK(verify_stochastic_batch_cpu(trees, ProbRows{p_rows.data(), 2, 2, 2}, &q,
                                                  DraftSampling::kWithoutReplacement, &key, want.view(),
                                                  StochasticRowOptions{nullptr, p_totals.data(), nullptr}));
      SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(
          trees, TargetLogits{LogitRows{logits.data(), LogitsDtype::kFloat32, 2, 2, 2}, &params}, &q,
          DraftSampling::kWithoutReplacement, &key, got.view()));
      expect_same_outputs(got, want, "e " + std::to_string(e) + ", request " + std::to_string(request));
      accepted += got.num_accepted[0];
    }
  }
  EXPECT_GE(cases, 20);
  EXPECT_GT(accepted, 0);               // the cases below the boundary accept
  EXPECT_LT(accepted, cases * 7);       // and those above it reject
}

// Logits rows found through row_index (shuffled among junk rows, as a step's rows where the
// group's requests are not next to one another) give the node-ordered results; a visited
// node without a row fails its request alone.
TEST(VerifyLogitsCpu, RowIndexGivesTheNodeOrderedResults) {
  const LogitVerifyCase lc = random_logit_verify_case(91, 40, 50, Proposal::kDraftWithoutReplacement,
                                                      LogitsDtype::kFloat32, 3);
  const VerifyCase& c = lc.c;
  const ProbRows q = c.draft_rows();
  BatchOutputs want(c.batch(), c.num_nodes()), got(c.batch(), c.num_nodes());
  SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), lc.target(), &q, c.sampling, c.keys.data(),
                                                     want.view()));
  const int32_t rows = c.num_nodes() + 9;
  std::vector<float> junk(static_cast<std::size_t>(rows) * static_cast<std::size_t>(c.stride), NAN);
  std::vector<int32_t> slot(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < slot.size(); ++i) slot[i] = static_cast<int32_t>(i);
  std::mt19937_64 g(4);
  std::shuffle(slot.begin(), slot.end(), g);
  std::vector<int32_t> index(static_cast<std::size_t>(c.num_nodes()));
  for (int32_t n = 0; n < c.num_nodes(); ++n) {
    index[static_cast<std::size_t>(n)] = slot[static_cast<std::size_t>(n)];
    std::copy_n(c.logits.begin() + static_cast<std::ptrdiff_t>(n) * c.stride, c.stride,
                junk.begin() + static_cast<std::ptrdiff_t>(slot[static_cast<std::size_t>(n)]) * c.stride);
  }
  TargetLogits t{LogitRows{junk.data(), LogitsDtype::kFloat32, rows, c.vocab, c.stride}, lc.params.data(),
                 index.data()};
  SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), t, &q, c.sampling, c.keys.data(), got.view()));
  expect_same_outputs(got, want, "row_index");
  for (const int32_t bad : {-1, rows}) {
    std::vector<int32_t> broken = index;
    broken[0] = bad;  // request 0's root: always visited
    t.row_index = broken.data();
    BatchOutputs out(c.batch(), c.num_nodes());
    SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), t, &q, c.sampling, c.keys.data(), out.view()));
    EXPECT_EQ(out.status[0], static_cast<int32_t>(VerifyStatus::kBadTargetRow)) << bad;
    EXPECT_EQ(std::vector<int32_t>(out.status.begin() + 1, out.status.end()),
              std::vector<int32_t>(want.status.begin() + 1, want.status.end()));
  }
  // With an index the logits may have fewer rows than there are nodes.
  std::vector<int32_t> first_rows(static_cast<std::size_t>(c.num_nodes()), 0);
  t = TargetLogits{LogitRows{c.logits.data(), LogitsDtype::kFloat32, 1, c.vocab, c.stride}, lc.params.data(),
                   first_rows.data()};
  EXPECT_TRUE(verify_stochastic_logits_batch_cpu(c.view(), t, &q, c.sampling, c.keys.data(), got.view()).ok());
}

TEST(VerifyLogitsCpuValidation, RejectsBadSizesAndPointers) {
  const LogitVerifyCase lc = random_logit_verify_case(3, 4, 9, Proposal::kDraftWithoutReplacement, LogitsDtype::kFloat32);
  const VerifyCase& c = lc.c;
  const ProbRows q = c.draft_rows();
  BatchOutputs out(c.batch(), c.num_nodes());
  const auto call = [&](const TargetLogits& t, const ProbRows* d, const StochasticRowOptions& o = {}) {
    return verify_stochastic_logits_batch_cpu(c.view(), t, d, c.sampling, c.keys.data(), out.view(), o);
  };
  EXPECT_TRUE(call(lc.target(), &q).ok());
  const std::vector<double> totals(static_cast<std::size_t>(c.num_nodes()), 1.0);
  EXPECT_FALSE(call(lc.target(), &q, StochasticRowOptions{nullptr, totals.data(), nullptr}).ok());
  EXPECT_FALSE(call(TargetLogits{lc.logits(), nullptr}, &q).ok());
  LogitRows few = lc.logits();
  few.rows = c.num_nodes() - 1;
  EXPECT_FALSE(call(TargetLogits{few, lc.params.data()}, &q).ok());
  LogitRows bad_dtype = lc.logits();
  bad_dtype.dtype = static_cast<LogitsDtype>(7);
  EXPECT_FALSE(call(TargetLogits{bad_dtype, lc.params.data()}, &q).ok());
  ProbRows narrow = q;
  narrow.vocab = c.vocab - 1;
  EXPECT_FALSE(call(lc.target(), &narrow).ok());
  const std::vector<int32_t> index(static_cast<std::size_t>(c.num_nodes()), 0);
  EXPECT_FALSE(call(lc.target(), nullptr, StochasticRowOptions{index.data()}).ok());
  EXPECT_FALSE(verify_stochastic_logits_batch_cpu(c.view(), lc.target(), &q, c.sampling, nullptr, out.view()).ok());
}

// The first emitted token follows the target distribution the parameters make of the root's
// logits (chi-square), with default parameters and with temperature and top-k.
TEST(VerifyLogitsCpuLossless, FirstTokenFollowsTheTarget) {
  for (const SamplingParams params : {SamplingParams{}, SamplingParams{0.7, 6, 1.0, 0.0}}) {
    for (const ProposalCase& p : kProposals) {
      LosslessBatch batch = make_lossless_batch(p.how, 30000);
      const VerifyCase& c = batch.run.c;
      const std::vector<float> root(c.logits.begin(), c.logits.begin() + c.vocab);
      std::vector<float> root_probs(root.size());
      ASSERT_TRUE(sampling_probs(root, params, Span<float>(root_probs.data(), root_probs.size())).ok());
      batch.root_target.assign(root_probs.begin(), root_probs.end());
      const std::vector<SamplingParams> per_request(static_cast<std::size_t>(c.batch()), params);
      const ProbRows q = c.draft_rows();
      BatchOutputs out(c.batch(), c.num_nodes());
      SPECD_ASSERT_OK(verify_stochastic_logits_batch_cpu(c.view(), TargetLogits{c.logit_rows(), per_request.data()},
                                                         p.has_draft ? &q : nullptr, c.sampling, c.keys.data(),
                                                         out.view()));
      expect_first_token_follows_target(batch, out, p.name);
    }
  }
}

}  // namespace
}  // namespace specd::testing
